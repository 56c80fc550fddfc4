"""The runtime's tunables: a frozen value read from a settings source.

    from pipeline.runtime.settings import runtime_settings
    runtime_settings().compression_threshold

Without a server the source is the environment: the same `CTXLENS_*` variables and defaults as
the server's settings, relative paths resolved against the working directory, read once and
kept. A server installs its own source with `use_settings_source(callable)` (ctxlens's does in
`PipelineConfig.ready()`, building the value from its settings); code always calls
`runtime_settings()` rather than keeping the value, so a source that changes is seen at once.

Artifacts: without a server the sandbox defaults to `var/agent-artifacts`, never the server's
`var/artifacts`, whose files must each have a row in the server's database.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from pipeline.runtime.env import env_bool, env_dict, env_float, env_int, env_str


@dataclass(frozen=True)
class RuntimeSettings:
    artifact_dir: Path = Path("var/agent-artifacts")
    artifact_threshold_bytes: int = 1024 * 1024
    artifact_ttl_hours: float = 24.0
    artifact_cleanup_on_session_end: bool = False  # Agent.close() removes the session's artifacts
    skills_dir: Path = Path("skills")
    compression_threshold: float = 0.8
    token_encoders_file: Path = Path("config/token_encoders.yaml")
    sampling: str = "always"
    sampling_scope: str = "turn"  # turn | tool_call
    otlp_endpoint: str = ""
    otlp_headers: str = ""  # k1=v1,k2=v2, values percent-decoded (OTEL_EXPORTER_OTLP_HEADERS format)
    otlp_compression: str = "gzip"
    otlp_protocol: str = "http/protobuf"  # http/protobuf, http/json, grpc
    service_name: str = "ctxlens-agent"
    environment: str = "development"
    default_output_level: str = "standard"
    tool_output_levels: Mapping[str, str] = field(default_factory=dict)
    max_tool_input_bytes: int = 1024 * 1024
    metrics_enabled: bool = True
    metrics_export_interval_s: float = 60.0
    metrics_export_timeout_ms: int = 3000
    model_factory: str = ""  # "package.module:callable": model name -> LangChain chat model, for skills' model switch

    @classmethod
    def from_env(cls) -> RuntimeSettings:
        """The `CTXLENS_*` environment variables; a value that does not parse raises EnvError."""
        data_dir = Path(env_str("CTXLENS_DATA_DIR", "var"))
        defaults = cls()
        return cls(
            artifact_dir=Path(env_str("CTXLENS_ARTIFACT_DIR", str(data_dir / "agent-artifacts"))).resolve(),
            artifact_threshold_bytes=env_int("CTXLENS_ARTIFACT_THRESHOLD_BYTES", defaults.artifact_threshold_bytes),
            artifact_ttl_hours=env_float("CTXLENS_ARTIFACT_TTL_HOURS", defaults.artifact_ttl_hours),
            artifact_cleanup_on_session_end=env_bool(
                "CTXLENS_ARTIFACT_CLEANUP_ON_SESSION_END", defaults.artifact_cleanup_on_session_end),
            skills_dir=Path(env_str("CTXLENS_SKILLS_DIR", str(defaults.skills_dir))).resolve(),
            compression_threshold=env_float("CTXLENS_COMPRESSION_THRESHOLD", defaults.compression_threshold),
            token_encoders_file=Path(env_str("CTXLENS_TOKEN_ENCODERS_FILE", str(defaults.token_encoders_file))).resolve(),
            sampling=env_str("CTXLENS_SAMPLING", defaults.sampling),
            sampling_scope=env_str("CTXLENS_SAMPLING_SCOPE", defaults.sampling_scope),
            otlp_endpoint=env_str("CTXLENS_OTLP_ENDPOINT"),
            otlp_headers=env_str("CTXLENS_OTLP_HEADERS"),
            otlp_compression=env_str("CTXLENS_OTLP_COMPRESSION", defaults.otlp_compression),
            otlp_protocol=env_str("CTXLENS_OTLP_PROTOCOL", defaults.otlp_protocol),
            service_name=env_str("CTXLENS_SERVICE_NAME", defaults.service_name),
            environment=env_str("CTXLENS_ENVIRONMENT", defaults.environment),
            default_output_level=env_str("CTXLENS_DEFAULT_OUTPUT_LEVEL", defaults.default_output_level).strip().lower(),
            tool_output_levels={
                tool: level.lower() for tool, level in env_dict("CTXLENS_TOOL_OUTPUT_LEVELS", {}).items()
            },
            max_tool_input_bytes=env_int("CTXLENS_MAX_TOOL_INPUT_BYTES", defaults.max_tool_input_bytes),
            metrics_enabled=env_bool("CTXLENS_METRICS", defaults.metrics_enabled),
            metrics_export_interval_s=env_float("CTXLENS_METRICS_EXPORT_INTERVAL_S", defaults.metrics_export_interval_s),
            metrics_export_timeout_ms=env_int("CTXLENS_METRICS_EXPORT_TIMEOUT_MS", defaults.metrics_export_timeout_ms),
            model_factory=env_str("CTXLENS_MODEL_FACTORY"),
        )


SettingsSource = Callable[[], RuntimeSettings]


@cache
def settings_from_env() -> RuntimeSettings:
    """The environment's settings, read on first use and kept for the life of the process."""
    return RuntimeSettings.from_env()


_source: SettingsSource = settings_from_env


def runtime_settings() -> RuntimeSettings:
    """The current settings, from the installed source (the environment unless a server installed one)."""
    return _source()


def use_settings_source(source: SettingsSource | None) -> SettingsSource:
    """Install `source` (None: back to the environment); returns the source it replaces."""
    global _source
    previous, _source = _source, source or settings_from_env
    return previous
