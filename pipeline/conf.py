"""ctxlens tunables, read once from Django settings and cached.

`override_settings` in tests clears the cache through the `setting_changed` receiver, so
code always calls `ctxlens_config()` rather than keeping the value around.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from django.conf import settings
from django.core.signals import setting_changed
from django.dispatch import receiver


@dataclass(frozen=True)
class CtxlensConfig:
    artifact_dir: Path
    artifact_threshold_bytes: int
    artifact_ttl_hours: float
    artifact_max_total_bytes: int
    skills_dir: Path
    compression_threshold: float
    max_ingest_bytes: int
    retention_days: int
    ingest_rate_limit: float
    ingest_rate_window: int
    otlp_grpc_port: int
    token_encoders_file: Path
    sampling: str
    otlp_endpoint: str
    otlp_headers: str
    otlp_compression: str
    otlp_protocol: str
    service_name: str
    environment: str
    live_interval_ms: int
    default_output_level: str
    tool_output_levels: dict[str, str]
    max_tool_input_bytes: int


@cache
def ctxlens_config() -> CtxlensConfig:
    return CtxlensConfig(
        artifact_dir=Path(settings.CTXLENS_ARTIFACT_DIR),
        artifact_threshold_bytes=settings.CTXLENS_ARTIFACT_THRESHOLD_BYTES,
        artifact_ttl_hours=settings.CTXLENS_ARTIFACT_TTL_HOURS,
        artifact_max_total_bytes=settings.CTXLENS_ARTIFACT_MAX_TOTAL_BYTES,
        skills_dir=Path(settings.CTXLENS_SKILLS_DIR),
        compression_threshold=settings.CTXLENS_COMPRESSION_THRESHOLD,
        max_ingest_bytes=settings.CTXLENS_MAX_INGEST_BYTES,
        retention_days=settings.CTXLENS_RETENTION_DAYS,
        ingest_rate_limit=settings.CTXLENS_INGEST_RATE_LIMIT,
        ingest_rate_window=settings.CTXLENS_INGEST_RATE_WINDOW,
        otlp_grpc_port=settings.CTXLENS_OTLP_GRPC_PORT,
        token_encoders_file=Path(settings.CTXLENS_TOKEN_ENCODERS_FILE),
        sampling=settings.CTXLENS_SAMPLING,
        otlp_endpoint=settings.CTXLENS_OTLP_ENDPOINT,
        otlp_headers=settings.CTXLENS_OTLP_HEADERS,
        otlp_compression=settings.CTXLENS_OTLP_COMPRESSION,
        otlp_protocol=settings.CTXLENS_OTLP_PROTOCOL,
        service_name=settings.CTXLENS_SERVICE_NAME,
        environment=settings.CTXLENS_ENVIRONMENT,
        live_interval_ms=settings.CTXLENS_LIVE_INTERVAL_MS,
        default_output_level=settings.CTXLENS_DEFAULT_OUTPUT_LEVEL,
        tool_output_levels=dict(settings.CTXLENS_TOOL_OUTPUT_LEVELS),
        max_tool_input_bytes=settings.CTXLENS_MAX_TOOL_INPUT_BYTES,
    )


@receiver(setting_changed)
def _clear_config_cache(*, setting: str, **kwargs: object) -> None:
    if setting.startswith("CTXLENS_"):
        ctxlens_config.cache_clear()
