"""Read values from the environment, failing loudly on values that do not parse.

Shared by the runtime (`RuntimeSettings.from_env`) and the server's settings module, which
turns an `EnvError` into its own configuration error.
"""

from __future__ import annotations

import os

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


class EnvError(ValueError):
    """An environment variable is set to a value that does not parse; the message names it."""


def env_str(name: str, default: str = "") -> str:
    return os.environ.get(name, default)


def env_bool(name: str, default: bool) -> bool:
    raw = os.environ.get(name)
    if raw is None:
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise EnvError(f"{name} must be a boolean (1/0, true/false), got {raw!r}")


def env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return int(raw.strip().replace("_", ""))
    except ValueError:
        raise EnvError(f"{name} must be an integer, got {raw!r}") from None


def env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise EnvError(f"{name} must be a number, got {raw!r}") from None


def env_list(name: str, default: list[str]) -> list[str]:
    raw = os.environ.get(name)
    if raw is None:
        return default
    return [item.strip() for item in raw.split(",") if item.strip()]


def env_dict(name: str, default: dict[str, str]) -> dict[str, str]:
    """`key=value,key2=value2` from the environment; a pair without `=` is a configuration error."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return dict(default)
    result: dict[str, str] = {}
    for item in raw.split(","):
        if not item.strip():
            continue
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not value.strip():
            raise EnvError(f"{name} must look like 'key=value,key2=value2', got {raw!r}")
        result[key.strip()] = value.strip()
    return result
