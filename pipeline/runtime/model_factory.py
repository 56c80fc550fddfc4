"""Chat models by name, for a skill whose ContextModifier switches the model.

Where the model comes from, first that applies:
1. the agent's `model_for` argument (a callable: model name -> LangChain chat model);
2. the configured factory, `CTXLENS_MODEL_FACTORY="package.module:callable"` (same signature), so a
   deployment names its provider set-up once instead of every caller passing `model_for`;
3. the agent's own chat model with its model field changed (`model_name` / `model`: ChatOpenAI,
   ChatAnthropic, ChatOllama … all have one), i.e. the same provider, credentials and settings.
The models made are kept per name, so a switched model is built once per agent.
"""

from __future__ import annotations

import logging
import pkgutil
from collections.abc import Callable

from langchain_core.language_models import BaseChatModel

from pipeline.runtime.settings import runtime_settings

logger = logging.getLogger(__name__)

ModelFactory = Callable[[str], BaseChatModel]
NAME_FIELDS = ("model_name", "model", "model_id")


class ModelFactoryError(ValueError):
    """CTXLENS_MODEL_FACTORY does not name a callable."""


def configured_factory() -> ModelFactory | None:
    """The callable CTXLENS_MODEL_FACTORY names, or None when it is not set."""
    path = runtime_settings().model_factory.strip()
    if not path:
        return None
    try:
        factory = pkgutil.resolve_name(path)
    except (ImportError, AttributeError, ValueError) as exc:
        raise ModelFactoryError(f"CTXLENS_MODEL_FACTORY={path!r} cannot be imported: {exc}") from None
    if not callable(factory):
        raise ModelFactoryError(f"CTXLENS_MODEL_FACTORY={path!r} is not callable")
    return factory


def same_provider(chat_model: BaseChatModel) -> ModelFactory | None:
    """Copies of `chat_model` with another model name; None if its class has no model field."""
    fields = type(chat_model).model_fields
    field = next((name for name in NAME_FIELDS if name in fields), None)
    if field is None:
        return None
    return lambda name: chat_model.model_copy(update={field: name})


class ModelSwitch:
    """The chat model for a model name: the agent's own, or one made (once) by the first factory that applies."""

    def __init__(self, chat_model: BaseChatModel, model: str, model_for: ModelFactory | None = None) -> None:
        self.chat_model = chat_model
        self.model = model
        self.factory = model_for or configured_factory() or same_provider(chat_model)
        self._made: dict[str, BaseChatModel] = {}

    def get(self, name: str | None) -> tuple[BaseChatModel, str]:
        if not name or name == self.model:
            return self.chat_model, self.model
        if name not in self._made:
            if self.factory is None:
                logger.warning("A skill asks for model %s, but no model factory is configured; keeping %s",
                               name, self.model)
                return self.chat_model, self.model
            self._made[name] = self.factory(name)
        return self._made[name], name
