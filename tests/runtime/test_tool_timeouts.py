"""A timed-out tool never runs twice at once, and a generator tool's items survive its timeout."""

from __future__ import annotations

import logging
import threading

import pytest
from langchain_core.tools import StructuredTool, tool

from pipeline.runtime.executor import NO_RETRY, RetryPolicy, ToolExecutor
from pipeline.runtime.protocol import ToolErrorType

FAST = RetryPolicy(max_retries=3)


class Sleeps(list):
    """Records the backoff waits instead of sleeping; `then` runs at the first one."""

    def __init__(self, then=lambda: None) -> None:
        super().__init__()
        self.then = then

    def __call__(self, seconds: float) -> None:
        self.append(seconds)
        if len(self) == 1:
            self.then()


class Occupancy:
    """A real tool body that records how many runs of it are inside at once, and holds them until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.lock = threading.Lock()
        self.entries: list[str] = []
        self.inside = 0
        self.most_inside = 0

    def __call__(self, query: str = "") -> str:
        with self.lock:
            self.entries.append(query)
            self.inside += 1
            self.most_inside = max(self.most_inside, self.inside)
        try:
            self.release.wait(10)
            return f"report for {query}"
        finally:
            with self.lock:
                self.inside -= 1


def slow_tool(body: Occupancy) -> StructuredTool:
    def build_report(query: str = "") -> str:
        return body(query)

    return StructuredTool.from_function(build_report, description="Builds a report slowly.")


def call(call_id: str, **args) -> dict:
    return {"id": call_id, "name": "build_report", "args": args, "type": "tool_call"}


def test_a_retry_after_a_timeout_waits_for_the_first_run_instead_of_starting_another(caplog):
    caplog.set_level(logging.INFO, logger="pipeline.runtime.executor")
    body = Occupancy()
    sleeps = Sleeps(then=body.release.set)  # the first run finishes while the retry waits for it
    executor = ToolExecutor([slow_tool(body)], retry_policy=FAST, sleep=sleeps)
    try:
        result = executor.execute_tool_call(call("call_1", query="q3"), timeout_ms=40)
    finally:
        body.release.set()
    assert (body.entries, body.most_inside) == (["q3"], 1)
    assert result.success and result.observation == "report for q3"
    assert result.retry_count == 1
    assert [(a["error_type"], a.get("adopted", False)) for a in result.attempts] == [("timeout", False), (None, True)]
    assert "tool build_report call call_1 waits for its earlier run, still going" in caplog.messages


def test_a_tool_that_never_finishes_runs_once_through_all_retries_and_later_identical_calls():
    body = Occupancy()
    executor = ToolExecutor([slow_tool(body)], retry_policy=FAST, sleep=Sleeps())
    try:
        first = executor.execute_tool_call(call("call_1", query="q3"), timeout_ms=20)
        again = executor.execute_tool_call(call("call_2", query="q3"), timeout_ms=20)
        other = ToolExecutor([slow_tool(body)], retry_policy=NO_RETRY)  # other executors share nothing
        assert body.entries == ["q3"] and body.most_inside == 1
        different = executor.execute_tool_call(call("call_3", query="q4"), timeout_ms=20)
        other.execute_tool_call(call("call_4", query="q3"), timeout_ms=20)
    finally:
        body.release.set()
    assert (first.error_type, first.retry_count, len(first.attempts)) == (ToolErrorType.TIMEOUT, 3, 4)
    assert [a.get("adopted", False) for a in first.attempts] == [False, True, True, True]
    assert [a.get("adopted", False) for a in again.attempts] == [True] * 4
    assert again.error_type is ToolErrorType.TIMEOUT and "call_2" in again.content
    assert different.error_type is ToolErrorType.TIMEOUT
    # Different arguments, or another executor, are other calls: those may overlap.
    assert body.entries == ["q3", "q4", "q3"] and body.most_inside == 3


def test_a_timed_out_generator_tool_returns_the_items_it_yielded():
    release = threading.Event()

    @tool
    def scan_orders(region: str) -> list:
        """Scan orders page by page."""
        for page in range(3):
            yield {"region": region, "page": page, "orders": 10 * page}
        release.wait(10)
        yield {"region": region, "page": 3, "orders": 30}

    try:
        result = ToolExecutor([scan_orders], retry_policy=NO_RETRY).execute_tool_call(
            {"id": "call_scan", "name": "scan_orders", "args": {"region": "north"}}, timeout_ms=500
        )
    finally:
        release.set()
    assert not result.success and result.partial
    assert (result.error_type, result.error_code) == (ToolErrorType.TIMEOUT, "TIMEOUT_PARTIAL")
    message = result.to_tool_message()
    assert message.status == "error" and message.tool_call_id == "call_scan"
    assert message.content.startswith("Operation failed.\n\nError Type: timeout\nError Code: TIMEOUT_PARTIAL")
    assert "Partial result (3 items before the deadline):\nFound 3 items:" in message.content
    assert '"page": 2' in message.content and '"page": 3' not in message.content


@pytest.mark.parametrize("timeout_ms", [1000, None], ids=["in a worker", "inline"])
def test_a_generator_tool_that_finishes_returns_all_items_or_its_streamed_text(timeout_ms):
    @tool
    def pages(n: int) -> list:
        """Yield n pages."""
        yield from ({"page": i} for i in range(n))

    @tool
    def stream(text: str) -> str:
        """Stream text in pieces."""
        yield from text.split(" ")

    executor = ToolExecutor([pages, stream])
    listed = executor.execute_tool_call({"id": "c1", "name": "pages", "args": {"n": 5}}, timeout_ms=timeout_ms)
    streamed = executor.execute_tool_call({"id": "c2", "name": "stream", "args": {"text": "a b c"}}, timeout_ms=timeout_ms)
    assert listed.success and not listed.partial and listed.observation.startswith("Found 5 items:")
    assert (streamed.success, streamed.observation) == (True, "abc")
