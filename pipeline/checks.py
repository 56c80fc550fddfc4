"""System checks for ctxlens settings: bad values stop `manage.py` with a clear message."""

from __future__ import annotations

from django.conf import settings
from django.core.checks import Error, Warning, register

SAMPLING_CHOICES = ("always", "high", "medium", "low", "never")
SAMPLING_SCOPE_CHOICES = ("turn", "tool_call")
OTLP_COMPRESSION_CHOICES = ("gzip", "deflate", "none")
OUTPUT_LEVEL_CHOICES = ("brief", "standard", "full")


@register()
def check_ctxlens_settings(app_configs: object = None, **kwargs: object) -> list:
    errors: list = []

    def positive(name: str, eid: str) -> None:
        if getattr(settings, name) <= 0:
            errors.append(Error(f"{name} must be greater than 0.", id=eid))

    positive("CTXLENS_ARTIFACT_THRESHOLD_BYTES", "pipeline.E001")
    positive("CTXLENS_ARTIFACT_TTL_HOURS", "pipeline.E002")
    positive("CTXLENS_ARTIFACT_MAX_TOTAL_BYTES", "pipeline.E003")
    positive("CTXLENS_MAX_INGEST_BYTES", "pipeline.E004")
    positive("CTXLENS_RETENTION_DAYS", "pipeline.E005")
    positive("CTXLENS_ROLLUP_MINUTE_HOURS", "pipeline.E080")
    positive("CTXLENS_ROLLUP_HOUR_DAYS", "pipeline.E081")
    positive("CTXLENS_LIVE_INTERVAL_MS", "pipeline.E082")
    if settings.CTXLENS_LIVE_REFRESH_MS < 0:
        errors.append(Error("CTXLENS_LIVE_REFRESH_MS must be 0 or more.", id="pipeline.E083"))
    if not 0 < settings.CTXLENS_COMPRESSION_THRESHOLD <= 1:
        errors.append(Error("CTXLENS_COMPRESSION_THRESHOLD must be in (0, 1].", id="pipeline.E006"))
    if not 0 < settings.CTXLENS_OVERSIZED_OBSERVATION_RATIO <= 1:
        errors.append(Error("CTXLENS_OVERSIZED_OBSERVATION_RATIO must be in (0, 1]: the share of a model's context "
                            "window past which one tool observation is reported as oversized.", id="pipeline.E073"))
    if settings.CTXLENS_SAMPLING not in SAMPLING_CHOICES:
        errors.append(
            Error(f"CTXLENS_SAMPLING must be one of {', '.join(SAMPLING_CHOICES)}.", id="pipeline.E007")
        )
    if settings.CTXLENS_SAMPLING_SCOPE not in SAMPLING_SCOPE_CHOICES:
        errors.append(
            Error(f"CTXLENS_SAMPLING_SCOPE must be one of {', '.join(SAMPLING_SCOPE_CHOICES)}.", id="pipeline.E071")
        )
    if settings.CTXLENS_OTLP_COMPRESSION not in OTLP_COMPRESSION_CHOICES:
        errors.append(
            Error(
                f"CTXLENS_OTLP_COMPRESSION must be one of {', '.join(OTLP_COMPRESSION_CHOICES)}.",
                id="pipeline.E008",
            )
        )
    if not settings.CTXLENS_TOKEN_ENCODERS_FILE.exists():
        errors.append(Warning("CTXLENS_TOKEN_ENCODERS_FILE does not exist; built-in defaults apply.", id="pipeline.W001"))
    positive("CTXLENS_MAX_TOOL_INPUT_BYTES", "pipeline.E030")
    if settings.CTXLENS_DEFAULT_OUTPUT_LEVEL not in OUTPUT_LEVEL_CHOICES:
        errors.append(
            Error(f"CTXLENS_DEFAULT_OUTPUT_LEVEL must be one of {', '.join(OUTPUT_LEVEL_CHOICES)}.", id="pipeline.E031")
        )
    bad_levels = sorted(
        tool for tool, level in settings.CTXLENS_TOOL_OUTPUT_LEVELS.items() if level not in OUTPUT_LEVEL_CHOICES
    )
    if bad_levels:
        errors.append(
            Error(
                f"CTXLENS_TOOL_OUTPUT_LEVELS has an unknown level for {', '.join(bad_levels)}; "
                f"use one of {', '.join(OUTPUT_LEVEL_CHOICES)}.",
                id="pipeline.E032",
            )
        )
    if settings.CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S < 0:
        errors.append(Error("CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S must be 0 (off) or more.", id="pipeline.E068"))
    positive("CTXLENS_METRICS_EXPORT_INTERVAL_S", "pipeline.E066")
    positive("CTXLENS_METRICS_EXPORT_TIMEOUT_MS", "pipeline.E067")
    if not settings.DEBUG and not settings.ALLOWED_HOSTS:
        errors.append(Error("ALLOWED_HOSTS must be set when DEBUG is off.", id="pipeline.E009"))
    return errors


@register()
def check_token_encoders_file(app_configs: object = None, **kwargs: object) -> list:
    """A bad token encoders YAML file is reported here; counting ignores it (pipeline/tokens/counting.py)."""
    from pipeline.conf import ctxlens_config
    from pipeline.tokens.families import TokenConfigError, load_token_config

    try:
        load_token_config(ctxlens_config().token_encoders_file)
    except TokenConfigError as exc:
        return [Error(f"CTXLENS_TOKEN_ENCODERS_FILE: {exc}; built-in token defaults apply until it is fixed.",
                      id="pipeline.E010")]
    return []


@register()
def check_ingest_limits(app_configs: object = None, **kwargs: object) -> list:
    """Rate limit, in-flight bytes and gRPC port settings (pipeline.ingest, manage.py serve_otlp_grpc)."""
    errors: list = []
    if settings.CTXLENS_INGEST_RATE_LIMIT < 0:
        errors.append(Error("CTXLENS_INGEST_RATE_LIMIT must be 0 (no limit) or a number of spans per second.",
                            id="pipeline.E060"))
    if settings.CTXLENS_INGEST_RATE_WINDOW < 1:
        errors.append(Error("CTXLENS_INGEST_RATE_WINDOW must be at least 1 second.", id="pipeline.E061"))
    if settings.CTXLENS_OTLP_PROTOCOL not in ("http/protobuf", "http/json", "grpc"):
        errors.append(Error("CTXLENS_OTLP_PROTOCOL must be http/protobuf, http/json or grpc.", id="pipeline.E063"))
    if not 0 <= settings.CTXLENS_OTLP_GRPC_PORT <= 65535:
        errors.append(Error("CTXLENS_OTLP_GRPC_PORT must be a TCP port (1-65535), or 0 for 4317.", id="pipeline.E062"))
    if settings.CTXLENS_INGEST_CHUNK_SPANS < 1:
        errors.append(Error("CTXLENS_INGEST_CHUNK_SPANS must be at least 1", id="pipeline.E065"))
    if settings.CTXLENS_MAX_INFLIGHT_BYTES < settings.CTXLENS_MAX_INGEST_BYTES:
        errors.append(Error("CTXLENS_MAX_INFLIGHT_BYTES must be at least CTXLENS_MAX_INGEST_BYTES, or a request of "
                            "the largest accepted size could never be admitted.", id="pipeline.E064"))
    return errors


@register()
def check_model_factory(app_configs: object = None, **kwargs: object) -> list:
    """CTXLENS_MODEL_FACTORY, when set, names an importable callable (pipeline.runtime.model_factory)."""
    from pipeline.runtime.model_factory import ModelFactoryError, configured_factory

    try:
        configured_factory()
    except ModelFactoryError as exc:
        return [Error(f"{exc}; use 'package.module:callable' (model name -> LangChain chat model).",
                      id="pipeline.E070")]
    return []


@register()
def check_prices_file(app_configs: object = None, **kwargs: object) -> list:
    """CTXLENS_PRICES_FILE, when set, is a readable YAML file of valid price entries."""
    from pipeline.insight.pricing import PricesFileError, load_overrides

    try:
        load_overrides(settings.CTXLENS_PRICES_FILE)
    except PricesFileError as exc:
        return [Error(f"CTXLENS_PRICES_FILE: {exc}.", id="pipeline.E072")]
    return []
