"""Background LLM summaries for context compression, kept in a cache, with an hourly cost cap.

Any LangChain chat model can summarise. `request()` never blocks the agent: it marks the work as
pending so two rounds or processes do not pay for the same summary, reserves the estimated
cost against the hour's budget (a counter in the cache, shared by every process on the same
cache: pass a shared one, e.g. the server's, as `cache=`; the default is this process's
InMemoryCache), and runs the model on this Summariser's own worker thread. The summary lands in the cache under
its key; the compressor uses it from the next round on.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from datetime import UTC, datetime

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage, SystemMessage

from pipeline.runtime.cache import Cache, InMemoryCache
from pipeline.tokens.counting import count_tokens

logger = logging.getLogger(__name__)

PREFIX = "ctxlens:summary"
MESSAGE_CHARS = 2_000
TRANSCRIPT_CHARS = 60_000
INSTRUCTIONS = (
    "You compress the earlier part of an AI agent's conversation so the agent can continue it. "
    "Keep the user's requests, every tool call with its key results (numbers, ids, artifact ids), "
    "errors, decisions and open questions. Drop pleasantries and repetition. Plain text, at most "
    "{words} words."
)


def transcript(messages: Sequence[BaseMessage]) -> str:
    lines: list[str] = []
    for message in messages:
        text = str(message.text)
        calls = [f"{c['name']}({c.get('args')})" for c in getattr(message, "tool_calls", None) or []]
        if calls:
            text = f"{text} [calls: {', '.join(calls)}]".strip()
        if len(text) > MESSAGE_CHARS:
            text = text[:MESSAGE_CHARS] + " …"
        lines.append(f"{message.type}: {text}")
    joined = "\n".join(lines)
    return joined if len(joined) <= TRANSCRIPT_CHARS else joined[-TRANSCRIPT_CHARS:]


class Summariser:
    """Summaries by `chat_model`, at most `max_cost_per_hour` (USD, estimated) per clock hour."""

    def __init__(
        self,
        chat_model: BaseChatModel,
        *,
        model: str = "",
        max_cost_per_hour: float = 0.10,
        cost_per_1k_tokens: float = 0.003,
        max_words: int = 200,
        ttl_seconds: int = 24 * 3600,
        cache: Cache | None = None,
    ) -> None:
        self.cache: Cache = InMemoryCache() if cache is None else cache
        self.chat_model = chat_model
        self.model = model
        self.max_cost_per_hour = max_cost_per_hour
        self.cost_per_1k_tokens = cost_per_1k_tokens
        self.max_words = max_words
        self.ttl_seconds = ttl_seconds
        self._pool: ThreadPoolExecutor | None = None
        self._futures: list[Future] = []

    def cached(self, key: str) -> str | None:
        return self.cache.get(f"{PREFIX}:{key}")

    def request(self, key: str, messages: Sequence[BaseMessage]) -> str:
        """Ask for a summary of `messages` under `key`: cached | pending | cost_cap | scheduled."""
        if self.cached(key):
            return "cached"
        if not self.cache.add(f"{PREFIX}:pending:{key}", 1, timeout=600):
            return "pending"  # another round or process is paying for it already
        prompt = self._prompt(messages)
        if not self._reserve(self._cost(prompt)):
            self.cache.delete(f"{PREFIX}:pending:{key}")
            logger.info("Summary skipped: the hourly compression budget is spent")
            return "cost_cap"
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ctxlens-summariser")
        self._futures.append(self._pool.submit(self._run, key, prompt))
        return "scheduled"

    def _prompt(self, messages: Sequence[BaseMessage]) -> list[BaseMessage]:
        return [SystemMessage(INSTRUCTIONS.format(words=self.max_words)), HumanMessage(transcript(messages))]

    def _cost(self, prompt: list[BaseMessage]) -> float:
        tokens = sum(count_tokens(str(m.content), self.model) for m in prompt) + self.max_words * 2
        return tokens / 1000 * self.cost_per_1k_tokens

    def estimate_cost(self, messages: Sequence[BaseMessage]) -> float:
        """Estimated USD for summarising `messages`: prompt tokens plus a full-length answer."""
        return self._cost(self._prompt(messages))

    def _run(self, key: str, prompt: list[BaseMessage]) -> None:
        try:
            reply = self.chat_model.invoke(prompt)
            text = str(reply.text).strip()
            if text:
                self.cache.set(f"{PREFIX}:{key}", text, timeout=self.ttl_seconds)
        except Exception:  # the agent goes on with extracts; a failed summary only costs quality
            logger.warning("Background summary failed", exc_info=True)
        finally:
            self.cache.delete(f"{PREFIX}:pending:{key}")

    @staticmethod
    def _bucket() -> str:
        return f"{PREFIX}:cost:{datetime.now(UTC):%Y%m%d%H}"

    def _reserve(self, cost: float) -> bool:
        micros = max(int(cost * 1_000_000), 1)
        limit = int(self.max_cost_per_hour * 1_000_000)
        bucket = self._bucket()
        self.cache.add(bucket, 0, timeout=3700)
        try:
            spent = self.cache.incr(bucket, micros)
        except ValueError:  # the bucket expired between add and incr
            self.cache.add(bucket, 0, timeout=3700)
            spent = self.cache.incr(bucket, micros)
        if spent > limit:
            self.cache.decr(bucket, micros)
            return False
        return True

    def spent_this_hour(self) -> float:
        return (self.cache.get(self._bucket()) or 0) / 1_000_000

    def wait(self, timeout: float | None = None) -> bool:
        """Block until the summaries asked for so far are done (tests, the demo, shutdown)."""
        done, pending = wait(self._futures, timeout=timeout)
        self._futures = list(pending)
        return not pending

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True)
            self._pool = None
