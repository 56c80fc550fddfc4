"""ctxlens settings, read from the environment.

Defaults serve `make run` on one machine: SQLite in WAL mode, the in-memory channel
layer and the local-memory cache. DATABASE_URL and REDIS_URL switch to PostgreSQL and
Redis for the scale path; nothing else changes.
"""

from __future__ import annotations

import os
import secrets
from datetime import timedelta
from pathlib import Path

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from config.env import env_bool, env_dict, env_float, env_int, env_list, env_str

BASE_DIR = Path(__file__).resolve().parent.parent
DATA_DIR = Path(env_str("CTXLENS_DATA_DIR", str(BASE_DIR / "var"))).resolve()
DATA_DIR.mkdir(parents=True, exist_ok=True)


def _secret_key() -> str:
    """SECRET_KEY from the environment, else one generated once and kept in the data dir."""
    key = env_str("SECRET_KEY")
    if key:
        return key
    path = DATA_DIR / "secret_key"
    if not path.exists():
        path.write_text(secrets.token_urlsafe(50))
        path.chmod(0o600)
    return path.read_text().strip()


SECRET_KEY = _secret_key()
# Off unless asked for: a DEBUG server shows a traceback (settings, local variables) for any 500.
DEBUG = env_bool("DEBUG", False)
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [])

INSTALLED_APPS = [
    "daphne",
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "axes",
    "channels",
    "rest_framework",
    "drf_spectacular",
    "pipeline",
    "dashboard",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    # Last: turns a locked-out login into dashboard.views.login.lockout_response.
    "axes.middleware.AxesMiddleware",
]

# Django's database sessions, with forged keys refused before they reach the database.
SESSION_ENGINE = "dashboard.sessions"

ROOT_URLCONF = "config.urls"
ASGI_APPLICATION = "config.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]

# --- database --------------------------------------------------------------------------
SQLITE_OPTIONS = {
    # WAL lets readers run beside the one writer; IMMEDIATE takes the write lock at BEGIN so
    # concurrent writers queue on the busy timeout instead of failing with "database is locked"
    # when a read transaction tries to upgrade.
    "transaction_mode": "IMMEDIATE",
    "timeout": env_int("CTXLENS_SQLITE_BUSY_TIMEOUT", 30),
    "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
}
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    # Under ASGI each request's sync code runs on a thread of its own, so a connection kept past
    # the request would stay open in a thread that is gone, one per request, until PostgreSQL
    # refuses clients: requests close theirs (CONN_MAX_AGE 0, as Django's docs advise for ASGI).
    # The ingest writer thread keeps its own (pipeline.ingest.write.writer_threads). Connections
    # are checked before reuse, so a database restart costs one reconnect, not a failed request.
    DATABASES = {
        "default": dj_database_url.parse(
            DATABASE_URL, conn_max_age=env_int("CONN_MAX_AGE", 0), conn_health_checks=True
        )
    }
else:
    DATABASES = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": DATA_DIR / "db.sqlite3"}}
DATABASE_REPLICA_URL = env_str("DATABASE_REPLICA_URL")
if DATABASE_REPLICA_URL:
    # The dashboard's reads of trace data (dashboard.replica); in tests, the primary itself.
    DATABASES["replica"] = {
        **dj_database_url.parse(DATABASE_REPLICA_URL, conn_max_age=env_int("CONN_MAX_AGE", 0),
                                conn_health_checks=True),
        "TEST": {"MIRROR": "default"},
    }
    DATABASE_ROUTERS = ["dashboard.replica.ReplicaRouter"]
    MIDDLEWARE.insert(1, "dashboard.replica.ReplicaReadsMiddleware")
if DATABASES["default"]["ENGINE"].endswith("sqlite3"):
    if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
        DATABASES["default"]["ENGINE"] = "config.sqlite3"  # Django's, its statements' placeholders converted once
    DATABASES["default"]["OPTIONS"] = {**SQLITE_OPTIONS, **DATABASES["default"].get("OPTIONS", {})}
    # A file, not memory, so a live server in another process shares it; the pid keeps test
    # runs that happen at once from sharing one file.
    DATABASES["default"]["TEST"] = {"NAME": str(DATA_DIR / f"test-{os.getpid()}.sqlite3")}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- channels and cache ----------------------------------------------------------------
REDIS_URL = env_str("REDIS_URL")
if REDIS_URL:
    CHANNEL_LAYERS = {
        "default": {
            "BACKEND": "channels_redis.core.RedisChannelLayer",
            "CONFIG": {"hosts": [REDIS_URL], "prefix": "ctxlens"},
        }
    }
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.redis.RedisCache",
            "LOCATION": REDIS_URL,
            "KEY_PREFIX": "ctxlens",
        }
    }
else:
    CHANNEL_LAYERS = {"default": {"BACKEND": "channels.layers.InMemoryChannelLayer"}}
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": "ctxlens"}}

# --- auth, i18n, static ----------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
]
# Login throttling (django-axes, dashboard/views/login.py): failures per user name and per client
# address are counted in the database (shared by every worker, and a lock's end is judged against the
# clock, not a cache entry's expiry); at the limit within the window both are refused until it ends.
AUTHENTICATION_BACKENDS = ["axes.backends.AxesStandaloneBackend", "django.contrib.auth.backends.ModelBackend"]
CTXLENS_LOGIN_FAILURE_LIMIT = env_int("CTXLENS_LOGIN_FAILURE_LIMIT", 5)
CTXLENS_LOGIN_LOCKOUT_MINUTES = env_int("CTXLENS_LOGIN_LOCKOUT_MINUTES", 15)
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_DISABLE_ACCESS_LOG = True  # count failures only: no table of every successful log-in to prune
AXES_FAILURE_LIMIT = CTXLENS_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = timedelta(minutes=CTXLENS_LOGIN_LOCKOUT_MINUTES)
AXES_LOCKOUT_PARAMETERS = ["username", "ip_address"]
AXES_RESET_ON_SUCCESS = True
AXES_CLIENT_IP_CALLABLE = "dashboard.views.login.client_address"
AXES_LOCKOUT_CALLABLE = "dashboard.views.login.lockout_response"
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "/"
LOGOUT_REDIRECT_URL = "login"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = DATA_DIR / "staticfiles"
# WhiteNoise serves STATIC_ROOT (filled by `manage.py collectstatic`, which `make run` runs) from
# the ASGI app itself (config/staticfiles.py): hashed names cached for a year, gzip/brotli copies.
# With DEBUG on it serves the source files through the finders, without collectstatic.
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "config.staticfiles.StaticFilesStorage"},
}

# --- behind a TLS-terminating proxy (README, Deployment) -------------------------------
# CTXLENS_BEHIND_TLS_PROXY=1: trust the proxy's X-Forwarded-Proto and send the session and
# CSRF cookies over HTTPS only. HSTS is sent on HTTPS responses once SECURE_HSTS_SECONDS > 0.
CTXLENS_BEHIND_TLS_PROXY = env_bool("CTXLENS_BEHIND_TLS_PROXY", False)
if CTXLENS_BEHIND_TLS_PROXY:
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
    SESSION_COOKIE_SECURE = True
    CSRF_COOKIE_SECURE = True
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
SECURE_HSTS_PRELOAD = env_bool("SECURE_HSTS_PRELOAD", False)

REST_FRAMEWORK = {
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 50,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ctxlens API",
    "DESCRIPTION": "Ingest and read API of ctxlens, the context debugger for LLM agents.",
    "VERSION": "1.0.0",
    "SERVE_INCLUDE_SCHEMA": False,
    "ENUM_NAME_OVERRIDES": {
        "RecordStatusEnum": "pipeline.models.conversations.Status",
        "EventStatusEnum": "pipeline.ingest.decode.rest_schema.STATUS_CHOICES",
    },
}

# CTXLENS_LOG_FORMAT: `text` for people, `json` (one object per line, with the current trace and
# span id) for log shippers; the seeds' ObservabilityConfig.log_format.
CTXLENS_LOG_FORMAT = env_str("CTXLENS_LOG_FORMAT", "text").strip().lower()
if CTXLENS_LOG_FORMAT not in ("text", "json"):
    raise ImproperlyConfigured(f"CTXLENS_LOG_FORMAT must be text or json, not {CTXLENS_LOG_FORMAT!r}")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "text": {"format": "%(asctime)s %(levelname)s %(name)s: %(message)s"},
        "json": {"()": "pipeline.runtime.telemetry.log_format.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": CTXLENS_LOG_FORMAT}},
    "root": {"handlers": ["console"], "level": env_str("LOG_LEVEL", "INFO")},
    "loggers": {"django.channels.server": {"level": "WARNING"}, "axes": {"level": "WARNING"}},
}

# --- ctxlens tunables (read through pipeline.conf.ctxlens_config()) --------------------
CTXLENS_ARTIFACT_DIR = Path(env_str("CTXLENS_ARTIFACT_DIR", str(DATA_DIR / "artifacts"))).resolve()
CTXLENS_ARTIFACT_THRESHOLD_BYTES = env_int("CTXLENS_ARTIFACT_THRESHOLD_BYTES", 1024 * 1024)
CTXLENS_ARTIFACT_TTL_HOURS = env_float("CTXLENS_ARTIFACT_TTL_HOURS", 24.0)
CTXLENS_ARTIFACT_MAX_TOTAL_BYTES = env_int("CTXLENS_ARTIFACT_MAX_TOTAL_BYTES", 1024 * 1024 * 1024)
# The server runs the artifact cleanup itself at most once per this many seconds (0: only cron).
CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S = env_float("CTXLENS_ARTIFACT_CLEANUP_INTERVAL_S", 3600.0)
# An agent session (pipeline.runtime.agent.Agent.close) removes the artifacts it stored.
CTXLENS_ARTIFACT_CLEANUP_ON_SESSION_END = env_bool("CTXLENS_ARTIFACT_CLEANUP_ON_SESSION_END", False)
CTXLENS_SKILLS_DIR = Path(env_str("CTXLENS_SKILLS_DIR", str(BASE_DIR / "skills"))).resolve()
# "package.module:callable" taking a model name and returning a LangChain chat model (a skill's `model`).
CTXLENS_MODEL_FACTORY = env_str("CTXLENS_MODEL_FACTORY", "")
# YAML prices that add to or override genai-prices' offline data (pipeline.insight.pricing).
CTXLENS_PRICES_FILE = env_str("CTXLENS_PRICES_FILE", "")
CTXLENS_COMPRESSION_THRESHOLD = env_float("CTXLENS_COMPRESSION_THRESHOLD", 0.8)
# Findings: a tool observation over this share of the model's context window is oversized.
CTXLENS_OVERSIZED_OBSERVATION_RATIO = env_float("CTXLENS_OVERSIZED_OBSERVATION_RATIO", 0.25)
CTXLENS_MAX_INGEST_BYTES = env_int("CTXLENS_MAX_INGEST_BYTES", 64 * 1024 * 1024)
# Request bodies this process holds at once, over all ingest requests; over it → 503 + Retry-After.
CTXLENS_MAX_INFLIGHT_BYTES = env_int("CTXLENS_MAX_INFLIGHT_BYTES", 256 * 1024 * 1024)
# Spans one ingest transaction stores at most; a larger OTLP request is stored in several, so it cannot hold the writer.
CTXLENS_INGEST_CHUNK_SPANS = env_int("CTXLENS_INGEST_CHUNK_SPANS", 2000)
CTXLENS_RETENTION_DAYS = env_int("CTXLENS_RETENTION_DAYS", 30)
# Rollups (pipeline.rollups): minute rows are kept this many hours, hour rows this many days; older
# data is read by the hour or the day (compact_rollups, also run by prune).
CTXLENS_ROLLUP_MINUTE_HOURS = env_int("CTXLENS_ROLLUP_MINUTE_HOURS", 48)
CTXLENS_ROLLUP_HOUR_DAYS = env_int("CTXLENS_ROLLUP_HOUR_DAYS", 30)
# Spans per second per ingest key, averaged over the window (0 = no limit); over it → 503 + Retry-After.
CTXLENS_INGEST_RATE_LIMIT = env_float("CTXLENS_INGEST_RATE_LIMIT", 0.0)
CTXLENS_INGEST_RATE_WINDOW = env_int("CTXLENS_INGEST_RATE_WINDOW", 10)
# Port of `manage.py serve_otlp_grpc` (OTLP/gRPC ingest); 0 = its default, 4317.
CTXLENS_OTLP_GRPC_PORT = env_int("CTXLENS_OTLP_GRPC_PORT", 0)
CTXLENS_TOKEN_ENCODERS_FILE = Path(
    env_str("CTXLENS_TOKEN_ENCODERS_FILE", str(BASE_DIR / "config" / "token_encoders.yaml"))
)
CTXLENS_SAMPLING = env_str("CTXLENS_SAMPLING", "always")
CTXLENS_SAMPLING_SCOPE = env_str("CTXLENS_SAMPLING_SCOPE", "turn")  # or tool_call
CTXLENS_OTLP_ENDPOINT = env_str("CTXLENS_OTLP_ENDPOINT")
CTXLENS_OTLP_HEADERS = env_str("CTXLENS_OTLP_HEADERS")
CTXLENS_OTLP_COMPRESSION = env_str("CTXLENS_OTLP_COMPRESSION", "gzip")
CTXLENS_OTLP_PROTOCOL = env_str("CTXLENS_OTLP_PROTOCOL", "http/protobuf")  # http/protobuf, http/json, grpc
CTXLENS_SERVICE_NAME = env_str("CTXLENS_SERVICE_NAME", "ctxlens-agent")
CTXLENS_ENVIRONMENT = env_str("CTXLENS_ENVIRONMENT", "development")
# Live views: a websocket gets at most one update per CTXLENS_LIVE_INTERVAL_MS sustained, a few
# back to back after a quiet spell (dashboard/hub.py), so a change reaches the page at once or
# within about that; and a page re-fetches what changed at most once per
# CTXLENS_LIVE_REFRESH_MS (the first change after a quiet spell at once).
CTXLENS_LIVE_INTERVAL_MS = env_int("CTXLENS_LIVE_INTERVAL_MS", 25)
CTXLENS_LIVE_REFRESH_MS = env_int("CTXLENS_LIVE_REFRESH_MS", 250)
# Tool observations: the global output level (brief | standard | full), per-tool defaults
# ("query_sales=brief,web_search=full"), and the largest accepted tool-call arguments.
CTXLENS_DEFAULT_OUTPUT_LEVEL = env_str("CTXLENS_DEFAULT_OUTPUT_LEVEL", "standard").strip().lower()
CTXLENS_TOOL_OUTPUT_LEVELS = {
    tool: level.lower() for tool, level in env_dict("CTXLENS_TOOL_OUTPUT_LEVELS", {}).items()
}
CTXLENS_MAX_TOOL_INPUT_BYTES = env_int("CTXLENS_MAX_TOOL_INPUT_BYTES", 1024 * 1024)
# The pipeline's OTel metrics, exported to CTXLENS_OTLP_ENDPOINT every interval (seeds: 60 s, 3000 ms).
CTXLENS_METRICS = env_bool("CTXLENS_METRICS", True)
CTXLENS_METRICS_EXPORT_INTERVAL_S = env_float("CTXLENS_METRICS_EXPORT_INTERVAL_S", 60.0)
CTXLENS_METRICS_EXPORT_TIMEOUT_MS = env_int("CTXLENS_METRICS_EXPORT_TIMEOUT_MS", 3000)

# The body of one OTLP request may be as large as CTXLENS_MAX_INGEST_BYTES.
DATA_UPLOAD_MAX_MEMORY_SIZE = CTXLENS_MAX_INGEST_BYTES + 1024 * 1024
