"""`manage.py export_otlp`: stored traces out to any OTLP endpoint, with their original ids.

The round trip: an agent's spans (and the GenAI event logs that carry some LLM calls'
messages) go into this ctxlens through the real OTel exporters and a live uvicorn,
`export_otlp` sends them to a second ctxlens (its own uvicorn or gRPC server on its own
migrated SQLite database), and every record the second one stores is compared field by field
with the first.
"""

from __future__ import annotations

import json
import time
from io import StringIO
from pathlib import Path

import pytest
from django.core.management import CommandError, call_command
from opentelemetry.exporter.otlp.proto.http._log_exporter import OTLPLogExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult

from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.export.job import Checkpoint
from pipeline.models import ApiKey, Span, SpanLog
from pipeline.runtime.telemetry.otlp_client import logs_url
from tests.agent_traces import record_turns, span_count
from tests.genai_spans import MS, ROOT, T0, chat
from tests.otlp_servers import migrated_template, second_ctxlens, span_logs
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

    assert f"exported {span_count(turns=2)} spans and 0 log records in 3 requests" in out
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

    with pytest.raises(CommandError, match="HTTP 429.*4 spans and 0 log records delivered.*"
                                           "run the same command again to resume"):
        export(*args, "--retries", "0")
    [checkpoint] = checkpoint_dir.glob("*.json")
    saved = json.loads(checkpoint.read_text())
    assert saved["exported"] == 4 and "Bearer" not in checkpoint.read_text()

    throttled.stop()
    second.start_uvicorn(port=throttled.port)  # the same endpoint, now without a limit
    out = export(*args)

    assert f"exported {total - 4} spans" in out and "resumed from checkpoint" in out
    assert f"{total} spans and 0 log records exported in total" in out
    assert len(second.snapshot()["Span"]) == total
    assert "exported 0 spans" in export(*args)  # nothing new since


USER_QUESTION, SECOND_QUESTION = "Is the sky blue?\nBriefly.", "And 6 x 7?"
CHAT = {"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.provider.name": "openai",
        "gen_ai.usage.input_tokens": 12, "gen_ai.usage.output_tokens": 3}


def ingest_events_here(live_uvicorn, conversation: str) -> None:
    """Two turns whose chat spans carry no messages: they come as GenAI event logs, sent with the
    OTel SDK's log exporter to /v1/logs. The first turn has the current details event on its chat
    span; the second OpenLLMetry's per-message events (with a kvlist body) on its root span."""
    headers = {"Authorization": f"Bearer {ApiKey.generate('agent', scope='ingest')[1]}"}
    resource = Resource.create({"service.name": "events-agent"})
    tracer_provider = TracerProvider(resource=resource)
    tracer_provider.add_span_processor(SimpleSpanProcessor(
        OTLPSpanExporter(endpoint=f"{live_uvicorn.url}/v1/traces", headers=headers)))
    logger_provider = LoggerProvider(resource=resource)
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(
        OTLPLogExporter(endpoint=f"{live_uvicorn.url}/v1/logs", headers=headers)))
    tracer, logger = tracer_provider.get_tracer("events"), logger_provider.get_logger("events")
    agent = {"gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": conversation}

    with tracer.start_as_current_span("invoke_agent", attributes=agent):
        with tracer.start_as_current_span("chat gpt-4o", attributes=CHAT):
            logger.emit(event_name="gen_ai.client.inference.operation.details", attributes={
                "gen_ai.input.messages": json.dumps([{"role": "user",
                                                      "parts": [{"type": "text", "content": USER_QUESTION}]}]),
                "gen_ai.output.messages": json.dumps([{"role": "assistant", "finish_reason": "stop",
                                                       "parts": [{"type": "text", "content": "Yes."}]}]),
                "gen_ai.request.temperature": 0.5, "gen_ai.request.seed": 7,
            })
    with tracer.start_as_current_span("invoke_agent", attributes=agent):
        logger.emit(event_name="gen_ai.system.message", body={"content": "You are terse."},
                    attributes={"gen_ai.system": "openai"})
        logger.emit(event_name="gen_ai.user.message", body={"content": SECOND_QUESTION})
        with tracer.start_as_current_span("chat gpt-4o", attributes=CHAT):
            pass
        logger.emit(event_name="gen_ai.choice", body={
            "index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": "42"}})
    logger_provider.shutdown()
    tracer_provider.shutdown()


@pytest.mark.parametrize("protocol", ["http/protobuf", "http/json", "grpc"])
def test_genai_event_logs_go_too_and_the_second_ctxlens_shows_the_same_messages(live_uvicorn, second, protocol):
    ingest_events_here(live_uvicorn, "events")
    here, logs = settled(snapshot), span_logs()
    assert [c["title"] for c in here["Conversation"]] == ["Is the sky blue?"] and len(logs) == 4
    target = second.start_grpc() if protocol == "grpc" else second.start_uvicorn()

    out = export("--endpoint", target.url, "--protocol", protocol, "--batch", "3",
                 "--header", f"Authorization=Bearer {second.key()}")

    assert "exported 4 spans and 4 log records in 4 requests" in out
    there = wait_until_equal(second, here)
    assert_same_records(here, there)
    assert second.span_logs() == logs  # each record whole, down to the digest of its content
    assert [c["title"] for c in there["Conversation"]] == ["Is the sky blue?"]
    assert sorted(r["user_message"] for r in there["Round"]) == [SECOND_QUESTION, USER_QUESTION]
    assert sorted(m["parts"][0]["content"] for call in there["LLMCall"] for m in call["input_messages"]
                  if m["role"] == "user") == [SECOND_QUESTION, USER_QUESTION]


def test_it_resumes_after_the_last_log_record_the_endpoint_accepted(live_uvicorn, second, checkpoint_dir):
    ingest_events_here(live_uvicorn, "resumable-events")
    logs = span_logs()
    key = second.key()
    # A bucket of 5.5 items: one request each, the 4 spans and 2 of the 4 log records go, then 429.
    throttled = second.start_uvicorn(CTXLENS_INGEST_RATE_LIMIT="0.001", CTXLENS_INGEST_RATE_WINDOW="5500")
    args = ("--endpoint", throttled.url, "--batch", "1", "--header", f"Authorization=Bearer {key}")

    with pytest.raises(CommandError, match="HTTP 429.*4 spans and 2 log records delivered"):
        export(*args, "--retries", "0")
    saved = json.loads(next(checkpoint_dir.glob("*.json")).read_text())
    first_two = SpanLog.objects.order_by("pk")[:2]
    assert (saved["exported"], saved["logs_exported"], saved["last_log_id"]) == (4, 2, first_two[1].pk)
    assert {log["digest"] for log in second.span_logs()} == {log.digest for log in first_two}

    throttled.stop()
    second.start_uvicorn(port=throttled.port)
    out = export(*args)

    assert "exported 0 spans and 2 log records in 2 requests" in out and "resumed from checkpoint" in out
    assert "4 spans and 4 log records exported in total" in out
    assert second.span_logs() == logs
    assert "exported 0 spans and 0 log records in 0 requests" in export(*args)  # nothing new since


def test_a_checkpoint_from_before_logs_were_exported_sends_them_next(live_uvicorn, second):
    ingest_events_here(live_uvicorn, "old-checkpoint")
    target = second.start_uvicorn()
    args = ("--endpoint", target.url, "--header", f"Authorization=Bearer {second.key()}")
    last = Span.objects.order_by("received_at", "pk").last()
    old = Checkpoint.for_job(target.url, {})  # what export_otlp wrote when it sent only spans
    old.path.parent.mkdir(parents=True)
    old.path.write_text(json.dumps({"endpoint": target.url, "filters": {}, "received_at": last.received_at.isoformat(),
                                    "last_id": last.pk, "exported": 4, "updated_at": "2025-01-01T00:00:00+00:00"}))

    out = export(*args)

    assert "exported 0 spans and 4 log records" in out and "4 spans and 4 log records exported in total" in out
    assert second.span_logs() == span_logs()
    again = export(*args, "--restart")  # starts over for both
    assert "exported 4 spans and 4 log records" in again and "4 spans and 4 log records exported in total" in again


def test_only_the_log_records_of_the_chosen_conversation_go(live_uvicorn, second):
    ingest_events_here(live_uvicorn, "wanted")
    ingest_events_here(live_uvicorn, "unwanted")
    wanted = set(Span.objects.filter(conversation__external_id="wanted").values_list("trace_id", flat=True))
    target = second.start_uvicorn()

    # An endpoint naming the traces URL: the log records go beside it, to /v1/logs.
    out = export("--endpoint", f"{target.url}/v1/traces", "--conversation", "wanted",
                 "--header", f"Authorization=Bearer {second.key()}")

    assert "exported 4 spans and 4 log records" in out
    assert second.span_logs() == [log for log in span_logs() if log["trace_id"] in wanted]


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


def test_a_log_record_stored_before_its_traces_spans_goes_once_they_are_selected(live_uvicorn, second):
    """Ingest takes a trace's logs before its spans. Exported by conversation, such a record is not
    selected yet, later ones are sent past it, and once its spans arrive it must still go."""
    late = "0c" * 16
    store_spans([], logs=[LogRecord(late, "", 1_763_800_000_000_000_000, "gen_ai.user.message",
                                    body={"content": "asked before the spans came"})])
    ingest_events_here(live_uvicorn, "wanted")
    target = second.start_uvicorn()
    args = ("--endpoint", target.url, "--conversation", "wanted", "--header", f"Authorization=Bearer {second.key()}")
    assert "and 4 log records" in export(*args)

    root = SpanRecord(late, ROOT, "invoke_agent", T0, T0 + 9 * MS, attributes={
        "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "wanted"})
    store_spans([root, chat(late, "00000000000000c1", 1, "gpt-4o")])
    out = export(*args)

    assert "exported 2 spans and 1 log records" in out
    assert second.span_logs() == span_logs()
    assert "exported 0 spans and 0 log records" in export(*args)


def test_without_logs_or_with_their_own_url(live_uvicorn, second):
    ingest_events_here(live_uvicorn, "spans only")
    target = second.start_uvicorn()
    auth = ("--header", f"Authorization=Bearer {second.key()}")

    with pytest.raises(CommandError, match=r"no logs URL follows from .*/api/otlp/traces.*--logs-endpoint.*--no-logs"):
        export("--endpoint", f"{target.url}/api/otlp/traces", *auth)
    assert not second.span_logs()  # refused before anything went

    out = export("--endpoint", target.url, "--no-logs", *auth)
    assert "exported 4 spans and 0 log records" in out and not second.span_logs()

    out = export("--endpoint", f"{target.url}/v1/traces", "--logs-endpoint", f"{target.url}/v1/logs", *auth)
    assert "exported 4 spans and 4 log records" in out and second.span_logs() == span_logs()  # another checkpoint


@pytest.mark.parametrize(("endpoint", "logs"), [
    ("http://h:4318", "http://h:4318/v1/logs"), ("http://h:4318/", "http://h:4318/v1/logs"),
    ("http://h/otlp/v1/traces", "http://h/otlp/v1/logs"), ("http://h/otlp/v1/traces/", "http://h/otlp/v1/logs"),
    ("http://h/v1/logs", "http://h/v1/logs"),
])
def test_the_logs_url_beside_a_traces_endpoint(endpoint, logs):
    assert logs_url(endpoint) == logs
