"""Synchronous tool execution: permission, input limit, cache, deadline, retries, artifacts.

    executor = ToolExecutor([query_sales, web_search])          # or cache=, artifact_store=, on_worker_exit=
    for call in ai_message.tool_calls:
        result = executor.execute(executor.request_for(call), context=ExecutionContext(...))
        messages.append(result.to_tool_message())

`execute` never raises for a tool's failure: every outcome is a ToolExecutionResult (a
timeout, a refused call and a crash included). Tools are LangChain BaseTools (StructuredTool,
@tool) or plain callables taking keyword arguments. Per-tool defaults may sit in a BaseTool's
`metadata`: `ctxlens_cache_policy` ("cacheable", "ttl_short" …), `ctxlens_version`, `ctxlens_timeout_ms`,
`ctxlens_store_artifacts` (False for tools whose results must never become artifacts),
`ctxlens_output_level` (the tool's default level).

Output levels follow the seeds' chain (pipeline.runtime.observations.effective_level): the
level the model asks for in the call's arguments (`"output_level": "full"`, taken out of the
arguments unless the tool has such a parameter itself; an unknown level is answered as
invalid_input) → the tool configuration (`output_levels=` here, CTXLENS_TOOL_OUTPUT_LEVELS,
the tool's metadata) → BRIEF above 80 % context use → CTXLENS_DEFAULT_OUTPUT_LEVEL.

Deadlines: a tool with a timeout runs in a daemon worker thread that the caller waits on
(pipeline.runtime.tool_runs). A Python thread cannot be killed, so a tool that overruns keeps
running in the background until it returns on its own. Give tools their own I/O timeouts.
Pass `timeout_ms=None` to run a tool inline.

One call never runs twice at once: a retry after a timeout WAITS for the first attempt instead
of starting a second copy beside it. The retry's (longer) deadline is spent waiting on the run
that is still going, and that run's outcome is the retry's outcome; only once it has ended does
a further retry start the tool afresh. The same holds for a later identical call (same
idempotency key: tool, version, arguments, caller, permission) that arrives while a timed-out
run of it still goes: it adopts that run. A run's late result after the last attempt gave up
is discarded. Such attempts say `"adopted": True` in `result.attempts`.

Partial results: a tool that `yield`s its items (a generator) gives, when the last attempt
times out, the items produced so far. The result is then a TIMEOUT failure with error code
TIMEOUT_PARTIAL and `partial=True`, and the model reads the standard error text followed by
those items formatted at the call's output level. Partial results are never cached.

Caching: calls whose CachePolicy has a TTL (CACHEABLE and TTL_SHORT / MEDIUM / LONG) are kept
in `cache` under their idempotency key and output level; a hit answers the new call id with
`cache_hit=True`, runs nothing and counts no retries. Failures are never cached.

Adapters (plain Python by default; a server passes its own):
- `cache`: where results of cacheable calls are kept (pipeline.runtime.cache.Cache; default
  an InMemoryCache of this executor's own).
- `artifact_store`: where large results go (pipeline.runtime.artifacts.ArtifactStore; default
  a LocalArtifactStore in `runtime_settings().artifact_dir`).
- `on_worker_exit`: called in the deadline worker thread as it ends, whatever the tool did. A
  thread-bound resource the tool or an adapter opened in that thread (a database connection,
  say) is released there; the server passes the closing of its connections. The hook sits in
  the executor rather than in each adapter because the tool itself may open such resources too.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from langchain_core.tools import BaseTool

from pipeline.runtime.artifact_tool import may_store_artifacts
from pipeline.runtime.artifacts import ArtifactStorageError, ArtifactStore, LocalArtifactStore, redact_paths
from pipeline.runtime.cache import Cache, InMemoryCache
from pipeline.runtime.observations import (
    LEVEL_ARGUMENT,
    OutputLevel,
    effective_level,
    format_artifact_observation,
    format_observation,
    summarize,
    to_text,
)
from pipeline.runtime.protocol import (
    CachePolicy,
    ExecutionContext,
    ToolExecutionResult,
    ToolErrorType,
    ToolInvocationRequest,
    classify_exception,
)
from pipeline.runtime.settings import runtime_settings
from pipeline.runtime.tool_runs import DeadlineExceeded, RunningTools, ToolRun, collected, run_with_deadline
from pipeline.tokens.counting import count_tokens, is_approximate

logger = logging.getLogger(__name__)

CACHE_PREFIX = "ctxlens:tool-result"
MAX_COUNTED_ARTIFACT_BYTES = 4 * 1024 * 1024  # artifact token counts above this are left blank


@dataclass(frozen=True)
class RetryPolicy:
    """Retry retryable failures with exponential backoff and a growing deadline.

    Defaults: 3 retries; waits 1 s, 1.5 s, 2.25 s … capped at 10 s; each retry's timeout is
    twice the previous one, capped at 300 s.
    """

    max_retries: int = 3
    initial_delay_s: float = 1.0
    backoff_multiplier: float = 1.5
    max_delay_s: float = 10.0
    timeout_multiplier: float = 2.0
    max_timeout_ms: int = 300_000

    def should_retry(self, error_type: ToolErrorType, retries_done: int) -> bool:
        return error_type.is_retryable and retries_done < self.max_retries

    def delay_s(self, retries_done: int) -> float:
        """Seconds to wait before retry number `retries_done + 1`."""
        return min(self.initial_delay_s * self.backoff_multiplier**retries_done, self.max_delay_s)

    def timeout_ms(self, base_ms: int, retries_done: int) -> int:
        """The deadline of the attempt after `retries_done` retries."""
        return int(min(base_ms * self.timeout_multiplier**retries_done, max(base_ms, self.max_timeout_ms)))


NO_RETRY = RetryPolicy(max_retries=0)


def _tool_name(tool: BaseTool | Callable[..., Any]) -> str:
    return tool.name if isinstance(tool, BaseTool) else getattr(tool, "__name__", repr(tool))


def _takes(tool: BaseTool | Callable[..., Any], argument: str) -> bool:
    """Whether the tool has a parameter named `argument`."""
    if isinstance(tool, BaseTool):
        return argument in tool.args
    try:
        return argument in inspect.signature(tool).parameters
    except (TypeError, ValueError):
        return False


def _metadata(tool: BaseTool | Callable[..., Any]) -> Mapping[str, Any]:
    return (tool.metadata or {}) if isinstance(tool, BaseTool) else getattr(tool, "ctxlens_metadata", {})


class ToolExecutor:
    """Runs the tools of one agent; safe to share between threads.

    Its only state is the set of runs that overran their deadline and still go (RunningTools).
    """

    def __init__(
        self,
        tools: Iterable[BaseTool | Callable[..., Any]],
        *,
        retry_policy: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] = time.sleep,
        cache: Cache | None = None,
        artifact_store: ArtifactStore | None = None,
        on_worker_exit: Callable[[], None] | None = None,
        model: str | None = None,
        output_levels: Mapping[str, OutputLevel | str] | None = None,
    ) -> None:
        self._tools = {_tool_name(tool): tool for tool in tools}
        self.retry_policy = retry_policy
        self._sleep = sleep
        self.cache: Cache = InMemoryCache() if cache is None else cache
        self.artifact_store: ArtifactStore = LocalArtifactStore() if artifact_store is None else artifact_store
        self.on_worker_exit = on_worker_exit
        self.model = model
        self._running = RunningTools()
        self.output_levels = {tool: OutputLevel.parse(level) for tool, level in (output_levels or {}).items()}

    def add_tool(self, tool: BaseTool | Callable[..., Any]) -> None:
        """Make one more tool callable (the agent adds its artifact reader this way)."""
        self._tools[_tool_name(tool)] = tool

    @property
    def tool_names(self) -> list[str]:
        return sorted(self._tools)

    def request_for(self, tool_call: Mapping[str, Any], **options: Any) -> ToolInvocationRequest:
        """A request for `AIMessage.tool_calls[i]`, with the tool's metadata defaults under `options`."""
        meta = _metadata(self._tools.get(str(tool_call.get("name")), lambda: None))
        defaults: dict[str, Any] = {}
        if "ctxlens_cache_policy" in meta:
            defaults["cache_policy"] = CachePolicy(meta["ctxlens_cache_policy"])
        if "ctxlens_version" in meta:
            defaults["tool_version"] = str(meta["ctxlens_version"])
        if "ctxlens_timeout_ms" in meta:
            defaults["timeout_ms"] = meta["ctxlens_timeout_ms"]
        return ToolInvocationRequest.from_tool_call(tool_call, **{**defaults, **options})

    def execute_tool_call(
        self, tool_call: Mapping[str, Any], *, context: ExecutionContext | None = None, **options: Any
    ) -> ToolExecutionResult:
        """`execute(request_for(tool_call, **options))`; raises MissingToolCallId for a call without id."""
        return self.execute(self.request_for(tool_call, **options), context=context)

    def execute(self, request: ToolInvocationRequest, *, context: ExecutionContext | None = None) -> ToolExecutionResult:
        """Run one tool call to a result; never raises for the tool's own failures."""
        started = time.perf_counter()
        ctx = context or ExecutionContext()
        name = request.tool_name
        tool = self._tools.get(name)
        configured = self._configured_level(name, tool)
        level = effective_level(request.output_level, name, ctx.context_usage, tool_default=configured)

        def refuse(error_type: ToolErrorType, message: str) -> ToolExecutionResult:
            failed = ToolExecutionResult.failure(request.tool_call_id, name, error_type, message, output_level=level)
            return self._finish(failed, started, ctx)

        if ctx.modifier is not None and not ctx.modifier.allows(name):
            return refuse(ToolErrorType.PERMISSION_DENIED, f"Tool '{name}' is not allowed by the active skill.")
        if tool is None:
            return refuse(ToolErrorType.NOT_FOUND, f"Unknown tool '{name}'. Available: {', '.join(self.tool_names)}.")
        try:
            request = self._with_requested_level(tool, request)
        except ValueError as exc:
            return refuse(ToolErrorType.INVALID_INPUT, str(exc))
        level = effective_level(request.output_level, name, ctx.context_usage, tool_default=configured)
        limit = runtime_settings().max_tool_input_bytes
        if request.input_bytes > limit:
            return refuse(ToolErrorType.INPUT_TOO_LARGE, f"Arguments are {request.input_bytes} bytes; the limit is {limit}.")

        cache_key = self._cache_key(request, level)
        if cache_key and (hit := self._cached(cache_key)):
            return self._finish(hit.for_call(request.tool_call_id, cache_hit=True, retry_count=0), started, ctx)

        result = self._run_with_retries(tool, request, level, ctx)
        if cache_key and result.success:
            self._remember(cache_key, result, request.cache_policy)
        return self._finish(result, started, ctx)

    def _configured_level(self, name: str, tool: BaseTool | Callable[..., Any] | None) -> OutputLevel | None:
        """The tool configuration's level: this executor's `output_levels`, then CTXLENS_TOOL_OUTPUT_LEVELS,
        then the tool's own `ctxlens_output_level` metadata."""
        level = self.output_levels.get(name) or runtime_settings().tool_output_levels.get(name)
        if level is None and tool is not None:
            level = _metadata(tool).get("ctxlens_output_level")
        return OutputLevel.parse(level) if level else None

    @staticmethod
    def _with_requested_level(tool: BaseTool | Callable[..., Any], request: ToolInvocationRequest) -> ToolInvocationRequest:
        """The level the model asked for in the call's arguments (`output_level`) becomes the explicit
        request; the argument is taken out unless the tool itself has a parameter of that name.
        ValueError names the levels when the model asked for one that does not exist."""
        if LEVEL_ARGUMENT not in request.parameters:
            return request
        asked = request.parameters[LEVEL_ARGUMENT]
        parameters = request.parameters if _takes(tool, LEVEL_ARGUMENT) else {
            key: value for key, value in request.parameters.items() if key != LEVEL_ARGUMENT
        }
        if asked is None:
            return replace(request, parameters=parameters)
        return replace(request, parameters=parameters, output_level=OutputLevel.parse(asked))

    def _run_with_retries(
        self, tool: BaseTool | Callable[..., Any], request: ToolInvocationRequest, level: OutputLevel, ctx: ExecutionContext
    ) -> ToolExecutionResult:
        attempts: list[dict[str, Any]] = []
        retries = 0
        last_error: str | None = None
        run: ToolRun | None = None
        key = request.idempotency_key
        while True:
            timeout = None if request.timeout_ms is None else self.retry_policy.timeout_ms(request.timeout_ms, retries)
            began = time.perf_counter()
            attempt: dict[str, Any] = {"error_type": None, "timeout_ms": timeout}
            try:
                run = self._running.get(key)
                if run is not None:
                    attempt["adopted"] = True  # the earlier run still goes: wait for it, never start a twin
                    logger.info("tool %s call %s waits for its earlier run, still going", request.tool_name, request.tool_call_id)
                    raw = self._wait(key, run, timeout)
                elif timeout is None:
                    raw = run_with_deadline(lambda: self._invoke(tool, request.parameters), None)
                else:
                    run = ToolRun(
                        lambda: self._invoke(tool, request.parameters),
                        on_exit=self.on_worker_exit, on_done=self._running.finished,
                    ).start()
                    raw = self._wait(key, run, timeout)
            except Exception as exc:
                error_type = classify_exception(exc)
                message = self._redact(str(exc) or type(exc).__name__)
                last_error = message
                attempts.append({**attempt, "error_type": error_type.value, "ms": _ms(began)})
                retry = self.retry_policy.should_retry(error_type, retries) and (
                    error_type is not ToolErrorType.TIMEOUT or request.retry_on_timeout
                )
                logger.info("tool %s call %s failed (%s), retry=%s", request.tool_name, request.tool_call_id, error_type.value, retry)
                if retry:
                    self._sleep(self.retry_policy.delay_s(retries))
                    retries += 1
                    continue
                partial = run.partial_items() if run is not None and isinstance(exc, DeadlineExceeded) else []
                if partial:
                    return self._partial(tool, request, partial, message, level, ctx, retries, attempts)
                code = getattr(exc, "code", None) if isinstance(getattr(exc, "code", None), str) else None
                return ToolExecutionResult.failure(
                    request.tool_call_id, request.tool_name, error_type, message,
                    code=code, output_level=level, retry_count=retries, attempts=attempts,
                )
            attempts.append({**attempt, "ms": _ms(began)})
            result = self._success(tool, request, raw, level, ctx)
            result.retry_count, result.attempts = retries, attempts
            result.last_error = result.error_message or last_error
            return result

    def _wait(self, key: str, run: ToolRun, timeout_ms: int | None) -> Any:
        try:
            return run.wait(timeout_ms)
        except DeadlineExceeded:
            self._running.overran(key, run)
            raise

    def _partial(
        self, tool: BaseTool | Callable[..., Any], request: ToolInvocationRequest, items: list[Any], message: str,
        level: OutputLevel, ctx: ExecutionContext, retries: int, attempts: list[dict[str, Any]],
    ) -> ToolExecutionResult:
        """A timeout that still shows the model what the tool yielded before the deadline."""
        result = self._success(tool, request, collected(items), level, ctx)
        if result.success:
            result.observation = f"Partial result ({len(items)} items before the deadline):\n{result.observation}"
            result.success, result.partial = False, True
            result.error_type, result.error_code = ToolErrorType.TIMEOUT, "TIMEOUT_PARTIAL"
            result.error_message = f"{message}; it had produced {len(items)} items, shown below"
        result.retry_count, result.attempts, result.last_error = retries, attempts, message
        return result

    @staticmethod
    def _invoke(tool: BaseTool | Callable[..., Any], parameters: dict[str, Any]) -> Any:
        if isinstance(tool, BaseTool):
            return tool.invoke(dict(parameters))
        return tool(**parameters)

    def _success(
        self, tool: BaseTool | Callable[..., Any], request: ToolInvocationRequest, raw: Any, level: OutputLevel, ctx: ExecutionContext
    ) -> ToolExecutionResult:
        """The result of a tool that returned `raw`; a result that cannot be rendered (a failing
        __str__, say) is an INTERNAL failure, never an exception, so its call is still answered."""
        try:
            return self._observe(tool, request, raw, level, ctx)
        except Exception as exc:
            logger.warning("tool %s call %s: its result could not be rendered", request.tool_name,
                           request.tool_call_id, exc_info=True)
            return ToolExecutionResult.failure(
                request.tool_call_id, request.tool_name, ToolErrorType.INTERNAL,
                self._redact(f"The result could not be rendered as text: {type(exc).__name__}: {exc}"),
                code="UNRENDERABLE_RESULT", output_level=level,
            )

    def _observe(
        self, tool: BaseTool | Callable[..., Any], request: ToolInvocationRequest, raw: Any, level: OutputLevel, ctx: ExecutionContext
    ) -> ToolExecutionResult:
        text, mime = to_text(raw)
        data = text.encode("utf-8")
        result = ToolExecutionResult(
            tool_call_id=request.tool_call_id, tool_name=request.tool_name, observation="", success=True,
            output_level=level, data_size_bytes=len(data), data_hash=hashlib.sha256(data).hexdigest(),
        )
        storable = may_store_artifacts(tool)
        if storable and (level is OutputLevel.FULL or len(data) > runtime_settings().artifact_threshold_bytes):
            summary = summarize(raw)
            tokens = count_tokens(text, self._model(ctx)) if len(data) <= MAX_COUNTED_ARTIFACT_BYTES else None
            try:
                artifact_id = self.artifact_store.store(
                    data, summary=summary, mime=mime, token_count=tokens, conversation=ctx.conversation
                )
            except ArtifactStorageError as exc:
                return ToolExecutionResult.failure(
                    request.tool_call_id, request.tool_name, ToolErrorType.INTERNAL, f"The result could not be stored: {exc}",
                    code="ARTIFACT_STORAGE", output_level=level, data_size_bytes=len(data),
                )
            result.artifact_id, result.data_summary = artifact_id, summary
            result.observation = format_artifact_observation(artifact_id, summary)
        else:
            result.observation = format_observation(raw, level)
        return result

    def _model(self, ctx: ExecutionContext) -> str | None:
        return (ctx.modifier.model if ctx.modifier else None) or ctx.model or self.model

    def _finish(self, result: ToolExecutionResult, started: float, ctx: ExecutionContext) -> ToolExecutionResult:
        result.duration_ms = _ms(started)
        result.observation_tokens = count_tokens(result.content, self._model(ctx))
        result.observation_tokens_approximate = is_approximate(self._model(ctx))
        return result

    def _redact(self, message: str) -> str:
        """Error text may quote a path inside the sandbox; users only ever see artifact ids."""
        return redact_paths(message, (runtime_settings().artifact_dir, getattr(self.artifact_store, "directory", None)))

    def _cache_key(self, request: ToolInvocationRequest, level: OutputLevel) -> str | None:
        """Keyed by the idempotency key; the level is part of the key as it shapes the observation."""
        if request.cache_policy.ttl_seconds is None:
            return None
        return f"{CACHE_PREFIX}:{request.idempotency_key}:{level.value}"

    def _cached(self, key: str) -> ToolExecutionResult | None:
        try:
            data = self.cache.get(key)
        except Exception:  # a cache outage must not break the tool call
            logger.warning("tool result cache unavailable", exc_info=True)
            return None
        if not data:
            return None
        cached = ToolExecutionResult.from_dict(data)
        if cached.artifact_id and not self.artifact_store.exists(cached.artifact_id):
            return None  # its artifact is gone: run the tool again
        return cached

    def _remember(self, key: str, result: ToolExecutionResult, policy: CachePolicy) -> None:
        try:
            self.cache.set(key, result.to_dict(), timeout=policy.ttl_seconds)
        except Exception:
            logger.warning("tool result cache unavailable", exc_info=True)


def _ms(since: float) -> float:
    return round((time.perf_counter() - since) * 1000, 3)

