"""`manage.py export_otlp`: stored traces out to any OTLP endpoint, with their original ids.

The round trip: an agent's spans go into this ctxlens through the real OTel exporter and a
live uvicorn, `export_otlp` sends them to a second ctxlens (its own uvicorn or gRPC server on
its own migrated SQLite database), and every record the second one stores is compared field
by field with the first.
"""

from __future__ import annotations

import json
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import SpanExportResult

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import ApiKey, Span
from tests.agent_traces import record_turns, span_count
from tests.otlp_servers import migrated_template, second_ctxlens
from tests.otlp_support import wait_for_deferred_tokens
from tests.snapshot import snapshot

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(scope="module")
def template_db(tmp_path_factory) -> Path:
    return migrated_template(tmp_path_factory.mktemp("second-ctxlens"))


@pytest.fixture
def second(template_db, tmp_path, transactional_db):
    """A second ctxlens installation; its servers are stopped after the test."""
    other = second_ctxlens(tmp_path, template_db)
    servers = []
    other.started = servers

    def uvicorn(port: int | None = None, **env: str):
        server = other.uvicorn(env, port=port)
        servers.append(server)
        return server

    def grpc(**env: str):
        server = other.grpc(env)
        servers.append(server)
        return server

    other.start_uvicorn, other.start_grpc = uvicorn, grpc
    yield other
    for server in servers:
        server.stop()


@pytest.fixture(autouse=True)
def checkpoint_dir(settings, tmp_path) -> Path:
    settings.DATA_DIR = tmp_path / "data"
    return settings.DATA_DIR / "export-checkpoints"


def ingest_here(live_uvicorn, conversation: str, turns: int = 2) -> None:
    """Spans into this ctxlens the way an agent sends them: the OTel HTTP exporter to /v1/traces."""
    key = ApiKey.generate("agent", scope="ingest")[1]
    exporter = OTLPSpanExporter(endpoint=f"{live_uvicorn.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})
    assert exporter.export(record_turns(conversation, turns=turns)) == SpanExportResult.SUCCESS


def settled(read) -> dict:
    """Token counts that ingest does not need for its reply are filled in after it; wait for them."""
    wait_for_deferred_tokens()
    return read()


def export(*args: str, progress: bool = False) -> str:
    out = StringIO()
    call_command("export_otlp", *args, *([] if progress else ["--no-progress"]), stdout=out)
    return out.getvalue()


def assert_same_records(here: dict, there: dict) -> None:
    for model, rows in here.items():
        assert len(there[model]) == len(rows), model
        for mine, theirs in zip(rows, there[model], strict=True):
            for field, value in mine.items():
                assert theirs[field] == value, f"{model}.{field}: {value!r} here, {theirs[field]!r} there"


def wait_until_equal(second, here: dict, seconds: float = 30) -> dict:
    deadline = time.monotonic() + seconds
    there = second.snapshot()
    while there != here and time.monotonic() < deadline:
        time.sleep(0.5)
        there = second.snapshot()
    return there


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json", "grpc"])
def test_a_round_trip_to_a_second_ctxlens_keeps_every_record(live_uvicorn, second, protocol):
    ingest_here(live_uvicorn, "round-trip", turns=2)
    here = settled(snapshot)
    assert len(here["Span"]) == span_count(turns=2) and len(here["ToolCall"]) == 4
    target = second.start_grpc() if protocol == "grpc" else second.start_uvicorn()

    out = export("--endpoint", target.url, "--protocol", protocol, "--batch", "5",
                 "--header", f"Authorization=Bearer {second.key()}")

    assert f"exported {span_count(turns=2)} spans in 3 requests" in out
    there = wait_until_equal(second, here)
    assert_same_records(here, there)
    # The original ids went out, not new ones.
    assert {(s["trace_id"], s["span_id"]) for s in there["Span"]} == set(Span.objects.values_list("trace_id", "span_id"))


def test_it_resumes_after_the_last_span_the_endpoint_accepted(live_uvicorn, second, checkpoint_dir):
    ingest_here(live_uvicorn, "resumable", turns=2)
    total = span_count(turns=2)
    key = second.key()
    # A bucket of 3.6 spans an hour: the second endpoint takes two batches of 2, then answers 429.
    throttled = second.start_uvicorn(CTXLENS_INGEST_RATE_LIMIT="0.001", CTXLENS_INGEST_RATE_WINDOW="3600")
    args = ("--endpoint", throttled.url, "--batch", "2", "--header", f"Authorization=Bearer {key}")

    with pytest.raises(CommandError, match="HTTP 429.*4 spans delivered.*run the same command again to resume"):
        export(*args, "--retries", "0")
    [checkpoint] = checkpoint_dir.glob("*.json")
    saved = json.loads(checkpoint.read_text())
    assert saved["exported"] == 4 and "Bearer" not in checkpoint.read_text()

    throttled.stop()
    second.start_uvicorn(port=throttled.port)  # the same endpoint, now without a limit
    out = export(*args)

    assert f"exported {total - 4} spans" in out and "resumed from checkpoint" in out
    assert f"{total} spans exported in total" in out
    assert len(second.snapshot()["Span"]) == total
    assert "exported 0 spans" in export(*args)  # nothing new since


def test_conversation_and_since_select_what_goes(live_uvicorn, second, capsys):
    ingest_here(live_uvicorn, "wanted", turns=1)
    ingest_here(live_uvicorn, "unwanted", turns=1)
    store_spans([SpanRecord(trace_id="0a" * 16, span_id="0b" * 8, name="old span",
                            start_time_unix_nano=1_600_000_000_000_000_000,
                            end_time_unix_nano=1_600_000_000_500_000_000)])
    target = second.start_uvicorn()
    auth = f"Authorization=Bearer {second.key()}"

    export("--endpoint", target.url, "--conversation", "wanted", "--header", auth, progress=True)
    assert "100%" in capsys.readouterr().err  # the progress bar, on stderr
    first = second.snapshot()
    assert [c["external_id"] for c in first["Conversation"]] == ["wanted"]
    assert len(first["Span"]) == span_count()

    encoded = f"Authorization=Bearer%20{second.key()}"  # percent-encoded as in OTEL_EXPORTER_OTLP_HEADERS
    out = export("--endpoint", target.url, "--since", "2021-01-01", "--header", encoded)
    assert f"exported {2 * span_count()} spans" in out  # the span from 2020 stays behind
    assert "old span" not in {s["name"] for s in second.snapshot()["Span"]}


def test_a_refused_export_says_why_and_keeps_no_checkpoint(live_uvicorn, second, checkpoint_dir):
    ingest_here(live_uvicorn, "refused", turns=1)
    target = second.start_uvicorn()

    with pytest.raises(CommandError, match="HTTP 401"):
        export("--endpoint", target.url, "--header", "Authorization=Bearer ctx_wrong")

    assert not list(checkpoint_dir.glob("*.json"))
    assert second.snapshot()["Span"] == []


@pytest.mark.parametrize("bad, message", [
    (["--since", "yesterday"], "--since takes"),
    (["--conversation", "no-such"], "no conversation"),
    (["--header", "no-equals-sign"], "KEY=VALUE"),
    (["--batch", "0"], "--batch"),
])
def test_it_rejects_bad_arguments_with_a_clear_message(bad, message):
    with pytest.raises(CommandError, match=message):
        export("--endpoint", "http://127.0.0.1:9", *bad)


def test_it_rejects_an_endpoint_that_is_not_a_url():
    with pytest.raises(CommandError, match="http:// or https://"):
        export("--endpoint", "collector:4318")


def run_pipeline(telemetry) -> None:
    """Two turns of ctxlens's own agent loop: a scripted model, a tool that works and one that fails."""
    from langchain_core.tools import tool

    from pipeline.runtime.agent import Agent
    from pipeline.runtime.demo.fake_model import ScriptedChatModel, calls, tool_call
    from pipeline.runtime.protocol import ToolError, ToolErrorType

    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return f"value of {key} <b>bold</b>"

    @tool
    def broken(x: int) -> str:
        """Always fails."""
        raise ToolError(ToolErrorType.INVALID_INPUT, "x must be positive", code="BAD_X")

    model = ScriptedChatModel.from_script([
        calls(tool_call("lookup", {"key": "a"}), tool_call("broken", {"x": -1})), "a is known; x was refused.",
        calls(tool_call("lookup", {"key": "b"})), "b too.",
    ], model_name="gpt-4o")
    agent = Agent(model, [lookup, broken], conversation_id="pipeline-to-otlp", telemetry=telemetry)
    agent.turn("What are a and x?")
    agent.turn("And b?")


def without_artifact_links(records: dict) -> dict:
    """Artifacts stay in the agent's own sandbox; another backend gets only their ids in attributes."""
    records.pop("Artifact")
    for row in records["ToolCall"]:
        row.pop("artifact")
    return records


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json", "grpc"])
def test_the_pipeline_sends_its_spans_to_ctxlens_and_to_another_otlp_endpoint(second, artifact_dir, protocol):
    from pipeline.adapters import in_process_telemetry
    from pipeline.runtime.telemetry.config import ObservabilityConfig

    target = second.start_grpc() if protocol == "grpc" else second.start_uvicorn()
    config = ObservabilityConfig(otlp_endpoint=target.url, otlp_protocol=protocol,
                                 otlp_headers={"Authorization": f"Bearer {second.key()}"})
    telemetry = in_process_telemetry(config)
    run_pipeline(telemetry)
    telemetry.shutdown()

    here = settled(snapshot)
    assert len(here["ToolCall"]) == 3 and len(here["Round"]) == 2
    assert_same_records(here, wait_until_equal(second, here))


def test_the_demo_agent_reaches_another_otlp_endpoint_record_for_record(second, artifact_dir):
    """The whole demo (compressions, skills, artifacts, retries), over OTLP/HTTP JSON."""
    from pipeline.adapters import in_process_telemetry, tool_adapters
    from pipeline.runtime.demo.scenario import run_demo
    from pipeline.runtime.telemetry.config import ObservabilityConfig

    target = second.start_uvicorn()
    config = ObservabilityConfig(otlp_endpoint=target.url, otlp_protocol="http/json",
                                 otlp_headers={"Authorization": f"Bearer {second.key()}"})
    telemetry = in_process_telemetry(config)
    run_demo(telemetry, **tool_adapters())
    telemetry.shutdown()

    here = without_artifact_links(settled(snapshot))
    assert here["CompressionEvent"] and here["SkillActivation"] and len(here["Span"]) > 20
    there = without_artifact_links(wait_until_equal(second, here))
    assert_same_records(here, there)
