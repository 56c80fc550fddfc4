"""Read settings from the environment, failing loudly on values that do not parse.

The parsers are the runtime's (pipeline.runtime.env, which an agent uses without a server);
here a bad value becomes ImproperlyConfigured, as Django expects of a settings module.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import wraps
from typing import TypeVar

from django.core.exceptions import ImproperlyConfigured

from pipeline.runtime import env

T = TypeVar("T")


def _improperly_configured(parse: Callable[..., T]) -> Callable[..., T]:
    @wraps(parse)
    def wrapper(*args, **kwargs) -> T:
        try:
            return parse(*args, **kwargs)
        except env.EnvError as exc:
            raise ImproperlyConfigured(str(exc)) from None

    return wrapper


env_str = env.env_str
env_bool = _improperly_configured(env.env_bool)
env_int = _improperly_configured(env.env_int)
env_float = _improperly_configured(env.env_float)
env_list = env.env_list
env_dict = _improperly_configured(env.env_dict)
