"""ctxlens tunables, read once from Django settings and cached; the runtime's settings source.

`override_settings` in tests clears the caches through the `setting_changed` receiver, so
code always calls `ctxlens_config()` (or, in the runtime, `runtime_settings()`) rather than
keeping the value around. `PipelineConfig.ready()` installs `server_runtime_settings` as the
runtime's settings source: inside the server, the agent runtime reads the server's settings.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver

from pipeline.runtime.settings import RuntimeSettings, use_settings_source
from pipeline.tokens.counting import clear_token_caches


@dataclass(frozen=True)
class CtxlensConfig:
    artifact_dir: Path
    artifact_threshold_bytes: int
    artifact_ttl_hours: float
    artifact_max_total_bytes: int
    artifact_cleanup_interval_s: float
    artifact_cleanup_on_session_end: bool
    skills_dir: Path
    compression_threshold: float
    oversized_observation_ratio: float
    max_ingest_bytes: int
    max_inflight_bytes: int
    ingest_chunk_spans: int
    retention_days: int
    ingest_rate_limit: float
    ingest_rate_window: int
    otlp_grpc_port: int
    token_encoders_file: Path
    sampling: str
    sampling_scope: str
    otlp_endpoint: str
    otlp_headers: str
    otlp_compression: str
    otlp_protocol: str
    service_name: str
    environment: str
    live_interval_ms: int
    live_refresh_ms: int
    default_output_level: str
    tool_output_levels: dict[str, str]
    max_tool_input_bytes: int
    metrics_enabled: bool
    metrics_export_interval_s: float
    metrics_export_timeout_ms: int
    model_factory: str
    prices_file: str  # CTXLENS_PRICES_FILE: YAML price overrides (pipeline.insight.pricing), "" for none
    rollup_minute_hours: int  # CTXLENS_ROLLUP_MINUTE_HOURS: minute rollups kept this long (pipeline.rollups)
    rollup_hour_days: int  # CTXLENS_ROLLUP_HOUR_DAYS: hour rollups kept this long


@cache
def ctxlens_config() -> CtxlensConfig:
    return CtxlensConfig(
        artifact_dir=Path(settings.CTXLENS_ARTIFACT_DIR),
        artifact_threshold_bytes=settings.CTXLENS_ARTIFACT_THRESHOLD_BYTES,
        artifact_ttl_hours=settings.CTXLENS_ARTIFACT_TTL_HOURS,
        artifact_max_total_bytes=settings.CTXLENS_ARTIFACT_MAX_TOTAL_BYTES,
        artifact_cleanup_interval_s=settings.CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S,
        artifact_cleanup_on_session_end=settings.CTXLENS_ARTIFACT_CLEANUP_ON_SESSION_END,
        skills_dir=Path(settings.CTXLENS_SKILLS_DIR),
        compression_threshold=settings.CTXLENS_COMPRESSION_THRESHOLD,
        oversized_observation_ratio=settings.CTXLENS_OVERSIZED_OBSERVATION_RATIO,
        max_ingest_bytes=settings.CTXLENS_MAX_INGEST_BYTES,
        max_inflight_bytes=settings.CTXLENS_MAX_INFLIGHT_BYTES,
        ingest_chunk_spans=settings.CTXLENS_INGEST_CHUNK_SPANS,
        retention_days=settings.CTXLENS_RETENTION_DAYS,
        ingest_rate_limit=settings.CTXLENS_INGEST_RATE_LIMIT,
        ingest_rate_window=settings.CTXLENS_INGEST_RATE_WINDOW,
        otlp_grpc_port=settings.CTXLENS_OTLP_GRPC_PORT,
        token_encoders_file=Path(settings.CTXLENS_TOKEN_ENCODERS_FILE),
        sampling=settings.CTXLENS_SAMPLING,
        sampling_scope=settings.CTXLENS_SAMPLING_SCOPE,
        otlp_endpoint=settings.CTXLENS_OTLP_ENDPOINT,
        otlp_headers=settings.CTXLENS_OTLP_HEADERS,
        otlp_compression=settings.CTXLENS_OTLP_COMPRESSION,
        otlp_protocol=settings.CTXLENS_OTLP_PROTOCOL,
        service_name=settings.CTXLENS_SERVICE_NAME,
        environment=settings.CTXLENS_ENVIRONMENT,
        live_interval_ms=settings.CTXLENS_LIVE_INTERVAL_MS,
        live_refresh_ms=settings.CTXLENS_LIVE_REFRESH_MS,
        default_output_level=settings.CTXLENS_DEFAULT_OUTPUT_LEVEL,
        tool_output_levels=dict(settings.CTXLENS_TOOL_OUTPUT_LEVELS),
        max_tool_input_bytes=settings.CTXLENS_MAX_TOOL_INPUT_BYTES,
        metrics_enabled=settings.CTXLENS_METRICS,
        metrics_export_interval_s=settings.CTXLENS_METRICS_EXPORT_INTERVAL_S,
        metrics_export_timeout_ms=settings.CTXLENS_METRICS_EXPORT_TIMEOUT_MS,
        model_factory=settings.CTXLENS_MODEL_FACTORY,
        prices_file=settings.CTXLENS_PRICES_FILE,
        rollup_minute_hours=settings.CTXLENS_ROLLUP_MINUTE_HOURS,
        rollup_hour_days=settings.CTXLENS_ROLLUP_HOUR_DAYS,
    )


@cache
def server_runtime_settings() -> RuntimeSettings:
    """The runtime's settings (pipeline.runtime.settings) built from Django settings."""
    config = ctxlens_config()  # every runtime setting is one of the server's, under the same name
    return RuntimeSettings(**{field.name: getattr(config, field.name) for field in fields(RuntimeSettings)})


def install_runtime_settings() -> None:
    """Make the runtime read the server's settings (called from PipelineConfig.ready())."""
    use_settings_source(server_runtime_settings)
    clear_token_caches()  # anything counted before now used the environment's encoder file


@receiver(setting_changed)
def _clear_config_cache(*, setting: str, **kwargs: object) -> None:
    if setting.startswith("CTXLENS_"):
        ctxlens_config.cache_clear()
        server_runtime_settings.cache_clear()
    if setting == "CTXLENS_TOKEN_ENCODERS_FILE":
        clear_token_caches()
    if setting == "CTXLENS_PRICES_FILE":
        from pipeline.insight.pricing import load_overrides

        load_overrides.cache_clear()
