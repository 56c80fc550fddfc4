"""The synchronous tool executor: deadlines, retries, cache, limits, permissions and artifacts."""

from __future__ import annotations

import contextvars
import threading
import uuid

import pytest
import time_machine
from django.core.cache import caches
from langchain_core.tools import StructuredTool, tool

from pipeline.artifacts.store import ServerArtifactStore
from pipeline.models import Artifact
from pipeline.runtime.protocol import (
    CachePolicy,
    ContextModifier,
    ExecutionContext,
    MissingToolCallId,
    OutputLevel,
    ToolError,
    ToolErrorType,
)
from pipeline.tokens.counting import count_tokens
from pipeline.runtime.executor import NO_RETRY, RetryPolicy, ToolExecutor, run_with_deadline


@pytest.fixture(autouse=True)
def own_cache_namespace(settings):
    """A fresh key prefix per test: no cross-test hits, and no flush of a shared Redis."""
    default = {**settings.CACHES["default"], "KEY_PREFIX": f"test-tools-{uuid.uuid4().hex}"}
    settings.CACHES = {**settings.CACHES, "default": default}


class Sleeps(list):
    """Records the backoff waits instead of sleeping."""

    def __call__(self, seconds: float) -> None:
        self.append(seconds)


class Flaky:
    """A tool body that fails with the given exceptions first, then answers."""

    def __init__(self, *failures: BaseException, answer: object = "ok") -> None:
        self.failures = list(failures)
        self.answer = answer
        self.calls = 0

    def __call__(self, **kwargs: object) -> object:
        self.calls += 1
        if self.failures:
            raise self.failures.pop(0)
        return self.answer


def structured(name: str, func, **metadata) -> StructuredTool:
    def run(query: str = "") -> object:
        return func(query=query)

    return StructuredTool.from_function(run, name=name, description=f"{name} tool", metadata=metadata or None)


def call(name: str, call_id: str = "call_1", **args) -> dict:
    return {"id": call_id, "name": name, "args": args, "type": "tool_call"}


@tool
def calculator(expression: str) -> str:
    """Evaluate a sum like 2+2."""
    left, right = expression.split("+")
    return str(int(left) + int(right))


def test_it_runs_a_langchain_tool_and_answers_the_models_call_id():
    result = ToolExecutor([calculator]).execute_tool_call(call("calculator", "call_xyz", expression="2+40"))
    assert result.success
    assert result.observation == "42"
    message = result.to_tool_message()
    assert message.tool_call_id == "call_xyz"
    assert message.status == "success"


def test_it_runs_plain_callables_with_keyword_arguments():
    def add(a: int, b: int) -> int:
        return a + b

    result = ToolExecutor([add]).execute_tool_call(call("add", a=2, b=3))
    assert (result.success, result.observation) == (True, "5")


def test_a_tool_call_without_id_is_refused():
    with pytest.raises(MissingToolCallId):
        ToolExecutor([calculator]).execute_tool_call({"name": "calculator", "args": {"expression": "1+1"}})


def test_a_slow_tool_returns_a_timeout_result_instead_of_raising():
    release = threading.Event()
    slow = structured("slow", lambda query: release.wait(5) and "late")
    try:
        result = ToolExecutor([slow], retry_policy=NO_RETRY).execute_tool_call(call("slow"), timeout_ms=50)
    finally:
        release.set()
    assert not result.success
    assert result.error_type is ToolErrorType.TIMEOUT
    assert "timed out after 50 ms" in result.error_message
    assert result.to_tool_message().status == "error"


def test_timeouts_are_retried_with_growing_deadlines_and_backoff():
    calls = []

    def body(query: str) -> str:
        calls.append(query)
        if len(calls) == 1:
            raise TimeoutError("upstream did not answer")  # the tool's own I/O timeout
        if len(calls) == 2:
            raise ToolError(ToolErrorType.TIMEOUT, "upstream did not answer again")
        return "done"

    sleeps = Sleeps()
    result = ToolExecutor([structured("slow", body)], sleep=sleeps).execute_tool_call(call("slow"), timeout_ms=40)
    assert result.success
    assert result.retry_count == 2
    assert [a["timeout_ms"] for a in result.attempts] == [40, 80, 160]
    assert [a["error_type"] for a in result.attempts] == ["timeout", "timeout", None]
    assert sleeps == [1.0, 1.5]
    assert "did not answer" in result.last_error


def test_timeouts_are_not_retried_when_the_request_says_so():
    release = threading.Event()
    slow = structured("slow", lambda query: release.wait(5))
    sleeps = Sleeps()
    try:
        result = ToolExecutor([slow], sleep=sleeps).execute_tool_call(call("slow"), timeout_ms=30, retry_on_timeout=False)
    finally:
        release.set()
    assert (result.error_type, result.retry_count, sleeps) == (ToolErrorType.TIMEOUT, 0, [])


def test_retryable_errors_are_retried_three_times_then_reported():
    flaky = Flaky(*[ToolError(ToolErrorType.RATE_LIMITED, "429 from the API")] * 5)
    sleeps = Sleeps()
    result = ToolExecutor([structured("search", flaky)], sleep=sleeps).execute_tool_call(call("search"))
    assert flaky.calls == 4
    assert result.retry_count == 3
    assert sleeps == [1.0, 1.5, 2.25]
    assert (result.error_type, result.error_code) == (ToolErrorType.RATE_LIMIT, "RATE_LIMIT")
    assert "Error Message: 429 from the API" in result.content


def test_a_transient_failure_then_success_counts_one_retry():
    flaky = Flaky(ConnectionResetError("reset by peer"), answer=[1, 2, 3])
    result = ToolExecutor([structured("search", flaky)], sleep=Sleeps()).execute_tool_call(call("search"))
    assert result.success
    assert result.retry_count == 1
    assert result.last_error == "reset by peer"
    assert result.observation.startswith("Found 3 items")


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (ValueError("bad date"), ToolErrorType.INVALID_INPUT),
        (ToolError(ToolErrorType.NOT_FOUND, "no table"), ToolErrorType.NOT_FOUND),
        (RuntimeError("boom"), ToolErrorType.EXECUTION_ERROR),
    ],
)
def test_permanent_errors_are_not_retried(exc, expected):
    flaky = Flaky(exc)
    sleeps = Sleeps()
    result = ToolExecutor([structured("search", flaky)], sleep=sleeps).execute_tool_call(call("search"))
    assert (flaky.calls, sleeps, result.retry_count) == (1, [], 0)
    assert result.error_type is expected


def test_retry_policy_backoff_and_timeouts_are_capped():
    policy = RetryPolicy(max_retries=10)
    assert [policy.delay_s(n) for n in range(3)] == [1.0, 1.5, 2.25]
    assert policy.delay_s(9) == 10.0
    assert [policy.timeout_ms(120_000, n) for n in range(3)] == [120_000, 240_000, 300_000]


def test_argument_validation_errors_are_invalid_input():
    result = ToolExecutor([calculator]).execute_tool_call(call("calculator", expression=None))
    assert result.error_type is ToolErrorType.INVALID_INPUT


def test_an_unknown_tool_is_not_found():
    result = ToolExecutor([calculator]).execute_tool_call(call("delete_everything"))
    assert result.error_type is ToolErrorType.NOT_FOUND
    assert "Available: calculator" in result.error_message


def test_a_tool_outside_the_active_skill_is_refused_without_running():
    flaky = Flaky()
    executor = ToolExecutor([structured("web_search", flaky), calculator])
    skill = ExecutionContext(modifier=ContextModifier(allowed_tools=frozenset({"calculator"})))
    refused = executor.execute_tool_call(call("web_search", query="x"), context=skill)
    assert refused.error_type is ToolErrorType.PERMISSION_DENIED
    assert refused.to_tool_message().status == "error"
    assert flaky.calls == 0
    assert executor.execute_tool_call(call("calculator", expression="1+1"), context=skill).success


def test_oversized_arguments_are_refused_before_the_tool_runs(settings):
    settings.CTXLENS_MAX_TOOL_INPUT_BYTES = 100
    flaky = Flaky()
    result = ToolExecutor([structured("search", flaky)]).execute_tool_call(call("search", query="x" * 200))
    assert result.error_type is ToolErrorType.INPUT_TOO_LARGE
    assert flaky.calls == 0


def test_cacheable_results_are_reused_across_rounds_under_the_new_call_id():
    flaky = Flaky(answer="sunny")
    executor = ToolExecutor([structured("weather", flaky)])
    first = executor.execute_tool_call(call("weather", "call_1", query="Oslo"), cache_policy=CachePolicy.SHORT)
    second = executor.execute_tool_call(call("weather", "call_2", query="Oslo"), cache_policy=CachePolicy.SHORT)
    assert flaky.calls == 1
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert second.to_tool_message().tool_call_id == "call_2"
    assert second.observation == "sunny"


def test_no_cache_is_the_default():
    flaky = Flaky(answer="sunny")
    executor = ToolExecutor([structured("weather", flaky)])
    executor.execute_tool_call(call("weather", "call_1", query="Oslo"))
    executor.execute_tool_call(call("weather", "call_2", query="Oslo"))
    assert flaky.calls == 2


@pytest.mark.parametrize(
    ("policy", "ttl"),
    [(CachePolicy.SHORT, 300), (CachePolicy.CACHEABLE, 3600), (CachePolicy.MEDIUM, 3600), (CachePolicy.LONG, 86400)],
    ids=lambda value: getattr(value, "value", value),
)
@pytest.mark.parametrize("server_cache", [False, True], ids=["runtime in-memory cache", "server locmem cache"])
def test_the_cache_ttl_of_the_policy_is_honoured(settings, server_cache, policy, ttl):
    # Frozen time cannot move a Redis server's clock: check the TTL on local-memory caches.
    settings.CACHES = {"default": {"BACKEND": "django.core.cache.backends.locmem.LocMemCache", "LOCATION": f"ttl-{uuid.uuid4().hex}"}}
    flaky = Flaky(answer="sunny")
    executor = ToolExecutor([structured("weather", flaky)], cache=caches["default"] if server_cache else None)
    with time_machine.travel("2030-01-01 12:00:00", tick=False) as traveller:
        executor.execute_tool_call(call("weather", "call_1", query="Oslo"), cache_policy=policy)
        traveller.shift(ttl - 1)
        assert executor.execute_tool_call(call("weather", "call_2", query="Oslo"), cache_policy=policy).cache_hit
        assert flaky.calls == 1
        traveller.shift(2)
        assert not executor.execute_tool_call(call("weather", "call_3", query="Oslo"), cache_policy=policy).cache_hit
    assert flaky.calls == 2


def test_the_seeds_policy_names_are_accepted_in_tool_metadata():
    flaky = Flaky(answer="rows")
    executor = ToolExecutor([structured("vector_search", flaky, ctxlens_cache_policy="cacheable")])
    assert executor.request_for(call("vector_search")).cache_policy is CachePolicy.CACHEABLE
    assert CachePolicy.TTL_SHORT is CachePolicy.SHORT and CachePolicy("ttl_long") is CachePolicy.TTL_LONG
    executor.execute_tool_call(call("vector_search", "c1"))
    assert executor.execute_tool_call(call("vector_search", "c2")).cache_hit and flaky.calls == 1


def test_a_different_caller_or_arguments_miss_the_cache():
    flaky = Flaky(answer="sunny")
    executor = ToolExecutor([structured("weather", flaky)])
    executor.execute_tool_call(call("weather", "c1", query="Oslo"), cache_policy=CachePolicy.LONG)
    executor.execute_tool_call(call("weather", "c2", query="Oslo"), cache_policy=CachePolicy.LONG, caller_id="skill:x")
    executor.execute_tool_call(call("weather", "c3", query="Bergen"), cache_policy=CachePolicy.LONG)
    assert flaky.calls == 3


def test_a_result_cached_at_one_output_level_is_not_served_at_another():
    flaky = Flaky(answer=[1, 2, 3, 4, 5])
    executor = ToolExecutor([structured("query_sales", flaky)])
    brief = executor.execute_tool_call(call("query_sales", "c1"), cache_policy=CachePolicy.SHORT, output_level="brief")
    standard = executor.execute_tool_call(call("query_sales", "c2"), cache_policy=CachePolicy.SHORT, output_level="standard")
    assert flaky.calls == 2 and not standard.cache_hit
    assert (brief.observation, standard.observation.splitlines()[0]) == ("Found 5 items", "Found 5 items:")


@pytest.mark.django_db
def test_a_cached_result_whose_artifact_is_gone_runs_the_tool_again(artifact_dir):
    flaky = Flaky(answer="x" * 100)
    executor = ToolExecutor([structured("export", flaky)], artifact_store=ServerArtifactStore())
    first = executor.execute_tool_call(call("export", "c1"), cache_policy=CachePolicy.LONG, output_level="full")
    Artifact.objects.filter(artifact_id=first.artifact_id).delete()
    again = executor.execute_tool_call(call("export", "c2"), cache_policy=CachePolicy.LONG, output_level="full")
    assert flaky.calls == 2 and not again.cache_hit
    assert Artifact.objects.filter(artifact_id=again.artifact_id).exists()


def test_failures_are_not_cached():
    flaky = Flaky(ValueError("bad"), answer="fine")
    executor = ToolExecutor([structured("weather", flaky)])
    assert not executor.execute_tool_call(call("weather", "c1"), cache_policy=CachePolicy.SHORT).success
    assert executor.execute_tool_call(call("weather", "c2"), cache_policy=CachePolicy.SHORT).success


def test_tool_metadata_sets_the_default_cache_policy():
    flaky = Flaky(answer="rows")
    executor = ToolExecutor([structured("query_sales", flaky, ctxlens_cache_policy="ttl_medium")])
    assert executor.request_for(call("query_sales")).cache_policy is CachePolicy.MEDIUM
    executor.execute_tool_call(call("query_sales", "c1"))
    assert executor.execute_tool_call(call("query_sales", "c2")).cache_hit


@pytest.mark.django_db
def test_a_result_over_the_threshold_becomes_an_artifact(settings, artifact_dir):
    settings.CTXLENS_ARTIFACT_THRESHOLD_BYTES = 1000
    rows = [{"id": i, "region": "north", "revenue": i * 10} for i in range(200)]
    executor = ToolExecutor([structured("query_sales", lambda query: rows)], artifact_store=ServerArtifactStore())
    result = executor.execute_tool_call(call("query_sales"))
    assert result.success
    assert result.artifact_id and Artifact.is_valid_id(result.artifact_id)
    assert f"Data stored as artifact: {result.artifact_id}" in result.observation
    assert "List with 200 items" in result.observation
    assert str(artifact_dir) not in result.observation
    row = Artifact.objects.get(artifact_id=result.artifact_id)
    assert row.mime == "application/json"
    assert (artifact_dir / result.artifact_id).stat().st_size == row.size == result.data_size_bytes
    assert row.token_count > 0


@pytest.mark.django_db
def test_full_level_stores_even_a_small_result(artifact_dir):
    executor = ToolExecutor([calculator], artifact_store=ServerArtifactStore())
    result = executor.execute_tool_call(call("calculator", expression="1+1"), output_level="full")
    assert result.output_level is OutputLevel.FULL
    assert (artifact_dir / result.artifact_id).read_text() == "2"


def test_tools_can_opt_out_of_artifacts():
    echo = structured("read_artifact", lambda query: "x" * 50, ctxlens_store_artifacts=False)
    result = ToolExecutor([echo]).execute_tool_call(call("read_artifact"), output_level=OutputLevel.FULL)
    assert (result.artifact_id, result.observation) == (None, "x" * 50)


def test_context_pressure_makes_observations_brief():
    rows = structured("query_sales", lambda query: [1, 2, 3, 4, 5])
    result = ToolExecutor([rows]).execute_tool_call(call("query_sales"), context=ExecutionContext(context_usage=0.9))
    assert (result.output_level, result.observation) == (OutputLevel.BRIEF, "Found 5 items")


def circular_list() -> list:
    loop: list = []
    loop.append(loop)
    return loop


@pytest.mark.parametrize("level", ["brief", "standard", "full"])
def test_a_result_json_cannot_hold_is_answered_as_text_not_raised(artifact_dir, level):
    by_key = structured("sales_by_region_quarter", lambda query: {("EMEA", "Q3"): 1200.5, ("APAC", "Q3"): 980.0})
    loop = structured("loop", lambda query: circular_list())
    executor = ToolExecutor([by_key, loop], retry_policy=NO_RETRY, output_levels={"sales_by_region_quarter": level, "loop": level})
    sales = executor.execute_tool_call(call("sales_by_region_quarter"))
    looped = executor.execute_tool_call(call("loop"))
    assert sales.success and looped.success
    if level == "standard":  # the tuple keys and the cycle are shown as text
        assert "('EMEA', 'Q3')" in sales.observation and "1200.5" in sales.observation
        assert "<circular reference>" in looped.observation
    if level == "full":
        assert sales.artifact_id and looped.artifact_id


class Unlistable(dict):
    def __iter__(self):
        raise RuntimeError("cannot list the keys")


def test_a_result_whose_rendering_fails_is_an_internal_failure_not_an_exception(artifact_dir):
    odd = structured("odd", lambda query: Unlistable(a=1))
    result = ToolExecutor([odd], retry_policy=NO_RETRY).execute_tool_call(call("odd", output_level="full"))
    assert not result.success and result.error_type is ToolErrorType.INTERNAL
    assert result.error_code == "UNRENDERABLE_RESULT" and "cannot list the keys" in result.error_message
    assert result.to_tool_message().tool_call_id == "call_1"


def test_observation_tokens_are_counted_with_the_skills_model():
    executor = ToolExecutor([calculator], model="gpt-4o")
    ctx = ExecutionContext(modifier=ContextModifier(model="claude-3-5-sonnet"))
    result = executor.execute_tool_call(call("calculator", expression="20+22"), context=ctx)
    assert result.observation_tokens == count_tokens("42", "claude-3-5-sonnet")
    failed = executor.execute_tool_call(call("nope"))
    assert failed.observation_tokens == count_tokens(failed.content, "gpt-4o")


def test_error_messages_never_show_the_sandbox_path(artifact_dir):
    def leaky(query: str) -> str:
        raise FileNotFoundError(f"No such file: {artifact_dir / 'secret.json'}")

    result = ToolExecutor([structured("leaky", leaky)]).execute_tool_call(call("leaky"))
    assert str(artifact_dir) not in result.content
    assert "<artifact sandbox>" in result.error_message


def test_the_worker_thread_sees_the_callers_context():
    current = contextvars.ContextVar("current", default="none")
    current.set("round-7")
    assert run_with_deadline(current.get, timeout_ms=1000) == "round-7"
    assert run_with_deadline(lambda: threading.current_thread().name, timeout_ms=1000) == "ctxlens-tool"
    assert run_with_deadline(lambda: threading.current_thread().name, timeout_ms=None) == threading.current_thread().name
