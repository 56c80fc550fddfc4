"""No exception on an ingest path becomes an HTML error page or a traceback (issue #10, defect 2).

The fault here is the server's own, as an operator could cause it: the artifact sandbox path is
a file, so storing a large tool result fails with an error no receiver expects. Each transport
answers 500 in its own error format, with one line that names no path, and stores nothing.
"""

from __future__ import annotations

import json

import grpc
import httpx
import pytest

from pipeline.models import ApiKey, Span
from tests.otlp_servers import start_grpc
from tests.receivers.test_grpc_ingest import raw_export

MESSAGE = "the server failed to store this request (nothing was stored)"


def tool_span_json(padding: int) -> bytes:
    attributes = [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
        {"key": "gen_ai.tool.name", "value": {"stringValue": "export"}},
        {"key": "gen_ai.tool.call.result", "value": {"stringValue": "x" * padding}},
    ]
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "execute_tool export",
            "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000100000000",
            "attributes": attributes}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}).encode()


@pytest.fixture
def broken_sandbox(tmp_path) -> dict[str, str]:
    not_a_directory = tmp_path / "artifacts-is-a-file"
    not_a_directory.write_text("")
    return {"CTXLENS_ARTIFACT_DIR": str(not_a_directory), "CTXLENS_ARTIFACT_THRESHOLD_BYTES": "100"}


def test_otlp_http_and_rest_answer_a_server_fault_with_a_plain_500(uvicorn_factory, broken_sandbox, tmp_path):
    server = uvicorn_factory(broken_sandbox)
    key = ApiKey.generate("agent", scope="ingest")[1]
    headers = {"Authorization": f"Bearer {key}"}

    otlp = httpx.post(f"{server.url}/v1/traces", content=tool_span_json(5_000), timeout=30,
                      headers={**headers, "Content-Type": "application/json"})
    rest = httpx.post(f"{server.url}/api/ingest/", timeout=30, headers=headers, json={
        "schema_version": "1.0", "events": [{
            "type": "tool_call", "conversation_id": "c1", "round_id": "r1", "call_id": "t1",
            "tool_name": "export", "observation": "x" * 5_000, "started_at": "2026-05-01T12:00:00Z",
            "duration_ms": 5}]})

    assert otlp.status_code == 500 and otlp.headers["content-type"] == "application/json"
    assert MESSAGE in otlp.json()["message"]
    assert rest.status_code == 500 and rest.headers["content-type"] == "application/json"
    assert MESSAGE in rest.json()["detail"]
    for reply in (otlp, rest):
        assert str(tmp_path) not in reply.text and "Traceback" not in reply.text
    assert Span.objects.count() == 0


@pytest.mark.django_db(transaction=True)
def test_otlp_grpc_answers_a_server_fault_with_internal(broken_sandbox, tmp_path):
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
    from google.protobuf import json_format

    server = start_grpc(tmp_path, extra_env=broken_sandbox)
    try:
        key = ApiKey.generate("agent", scope="ingest")[1]
        body = json.loads(tool_span_json(5_000))
        for span in body["resourceSpans"][0]["scopeSpans"][0]["spans"]:  # protobuf JSON ids are base64
            span["traceId"], span["spanId"] = "q" * 21 + "w==", "zc3Nzc3Nzc0="
        request = json_format.ParseDict(body, ExportTraceServiceRequest())
        with pytest.raises(grpc.RpcError) as failed:
            raw_export(server, request.SerializeToString(), key)
        assert failed.value.code() == grpc.StatusCode.INTERNAL
        assert MESSAGE in failed.value.details() and str(tmp_path) not in failed.value.details()
        assert Span.objects.count() == 0
    finally:
        server.stop()

