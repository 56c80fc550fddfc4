"""Hostile input: generated API requests, fuzzed OTLP bodies, XSS, CSRF, traversal and key scopes.

Short runs here; `make fuzz` (bench/fuzz_otlp.py) runs the OTLP fuzzing for longer. Inputs the
fuzzers found are kept below as explicit tests (`test_found_*`).

The classes of hostile input covered, each answered with its 4xx, or 200 with partial_success
(a refused request leaves the stored data exactly as it was):

 1. generated requests to every read and ingest API operation (schemathesis): never a 5xx
 2. fuzzed OTLP/JSON documents, with lone surrogates, deep nesting, repeated fields: 400 or decoded
 3. fuzzed protobuf bytes: 400 or decoded
 4. corrupted bytes of a real export: 400 or decoded
 5. fuzzed span records through the normaliser and the store: stored or rejected span by span
 6. JSON values of the wrong type (doubleValue "abc", bytesValue 5, Infinity times): 400
 7. integers past a column's range (2**40, 2**70, negative counts): clamped and stored
 8. NUL characters, NaN and infinities in attributes: stored, readable
 9. a list where the span kind goes: read as no kind
10. times past 2262 (2**64 - 1): the span refused alone
11. span kind and status past their enums: stored as unspecified
12. XSS payloads in every field a page shows: escaped everywhere
13. POST forms without a CSRF token: 403
14. artifact paths that try to leave the sandbox: 400/404
15. keys used outside their scope, or revoked: 401/403
16. page sizes past the cap: 500 items at most
17. token counts at the limit in one turn: sums do not overflow
18. two gzip members, the first past one chunk, at /v1/traces: inflated, never hung
19. lone surrogates in OTLP/JSON traces: stored as U+FFFD; pages and read API answer 200
20. a lone surrogate in an OTLP/JSON log body: stored, and its LLM span with it, every re-send
21. OTLP/JSON nested thousands of levels, at /v1/traces and /v1/logs: 400, google.rpc.Status why
22. AnyValues past the nesting limit (MAX_DEPTH), JSON and gRPC: cut there, the span kept
23. token counts of Infinity, "+Inf", "1e400": ignored, the span stored
24. an end before the start, or at -2**64: clamped to the start
25. a start or end in the far future (2255): the span refused with a reason in partial_success
26. conversation ids past 255 characters that differ only at the end: kept distinct
27. a log time of 2**64 - 1 (protobuf): kept within the column
28. lone surrogates in REST JSON values (arguments, observation): stored as U+FFFD
29. lone surrogates in REST text fields: 400 field error
30. REST duration_ms 1e308, times in 2255 or 9999: 400 with the reason
31. invalid UTF-8 (an encoded surrogate) in a gRPC string: INVALID_ARGUMENT
32. token counts of Infinity and far-future spans over gRPC: ignored / refused with a reason
33. read API filters given ids past 2**63 - 1: 400 field errors; detail pages: 404
"""

from __future__ import annotations

import http.client
import json
import re
import time
from html.parser import HTMLParser
from urllib.parse import urljoin

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from django.db import transaction
from django.test import Client
from hypothesis import strategies as st

from pipeline.ingest.decode.otlp import OtlpDecodeError, decode_traces_json
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline.models import ApiKey, Span
from tests import otlp_fuzz
from tests.agent_traces import record_turns
from tests.conftest import LiveServer
from tests.otlp_support import JSON, PROTOBUF, auth, make_key, wait_for_deferred_tokens
from tests.snapshot import snapshot

REAL_EXPORT = otlp_fuzz.sample_request(record_turns("fuzz", turns=1))
XSS = ['<script>alert("xss")</script>', '"><img src=x onerror=alert(1)>', "<svg/onload=alert(1)>"]

pytestmark = pytest.mark.django_db(transaction=True)


def seed_traces(server) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    key = ApiKey.generate("seed", scope="ingest")[1]
    exporter = OTLPSpanExporter(endpoint=f"{server.url}/v1/traces", headers={"Authorization": f"Bearer {key}"})
    assert exporter.export(record_turns("seeded", turns=2, payload=XSS[0])) == SpanExportResult.SUCCESS


# ---- schemathesis against the live API -------------------------------------------------------

@pytest.fixture
def api_key(transactional_db) -> str:
    return ApiKey.generate("schemathesis", scope="all")[1]


def test_no_generated_api_request_gets_a_server_error(live_uvicorn, api_key):
    """Every operation of /api/schema/, with requests schemathesis generates from it (valid and not)."""
    seed_traces(live_uvicorn)  # something to list, page and look up
    schema = schemathesis.openapi.from_url(f"{live_uvicorn.url}/api/schema/",
                                           headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 8  # ingest, tool stats, conversations, compressions, artifacts, ...
    failures: list[str] = []

    for operation in operations:
        @given(case=operation.as_strategy())
        @settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True,
                  database=None)
        def call(case) -> None:
            response = case.call(headers={"Authorization": f"Bearer {api_key}"}, timeout=30)
            if response.status_code >= 500:
                failures.append(f"{response.status_code} for {case.as_curl_command()}: {response.text[:300]}")

        call()

    # The server's log holds the traceback behind any 500.
    assert failures == [], "\n".join(re.findall(r"^\S+ \S+ ERROR .*?(?=^\d{4}-\d\d-\d\d |\Z)", live_uvicorn.log(),
                                               re.S | re.M))[-8000:]


# ---- fuzzing the OTLP decoders, the normaliser and the store ---------------------------------

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck), database=None)


@FUZZ
@given(document=otlp_fuzz.json_documents)
def test_fuzzed_otlp_json_decodes_or_is_refused_as_bad_input(document):
    otlp_fuzz.check_json(document)


@FUZZ
@given(body=st.binary(max_size=300))
def test_fuzzed_protobuf_bytes_decode_or_are_refused_as_bad_input(body):
    otlp_fuzz.check_protobuf(body)


@FUZZ
@given(edits=otlp_fuzz.byte_edits)
def test_a_corrupted_real_export_decodes_or_is_refused_as_bad_input(edits):
    otlp_fuzz.check_protobuf(otlp_fuzz.mutate(REAL_EXPORT, edits))


@FUZZ
@given(record=otlp_fuzz.span_records)
def test_the_normaliser_reads_any_span(record):
    otlp_fuzz.check_records([record])


@settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(records=st.lists(otlp_fuzz.span_records, min_size=1, max_size=4))
def test_store_spans_stores_or_rejects_each_fuzzed_span_and_never_fails_the_batch(records):
    with transaction.atomic():  # each example starts from the same empty tables
        result = store_spans(records)
        transaction.set_rollback(True)
    assert result.accepted + result.rejected + result.duplicates == len(records)


# Inputs the fuzzers found. Each made a whole request fail (500, or a database error answered
# 503 that exporters retry until they give up); each is now stored or refused on its own.

def _json_span(**fields) -> bytes:
    span = {"traceId": "ab" * 16, "spanId": "cd" * 8, "name": "found", "startTimeUnixNano": "1700000000000000000",
            **fields}
    return json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [span]}]}]}, allow_nan=True).encode()


@pytest.mark.parametrize("body", [
    _json_span(attributes=[{"key": "a", "value": {"doubleValue": "abc"}}]),
    _json_span(attributes=[{"key": "a", "value": {"doubleValue": ""}}]),
    _json_span(attributes=[{"key": "a", "value": {"bytesValue": 5}}]),
    _json_span(startTimeUnixNano=float("inf")),
    _json_span(events=[{"name": "x", "timeUnixNano": float("-inf")}]),
], ids=["double-text", "double-empty", "bytes-int", "start-infinity", "event-time-minus-infinity"])
def test_found_json_values_that_crashed_the_decoder_are_a_400(body):
    with pytest.raises(OtlpDecodeError):
        decode_traces_json(body)


def _record(span_id: str, **attributes) -> SpanRecord:
    start = 1_700_000_000_000_000_000
    return SpanRecord(trace_id="ef" * 16, span_id=span_id, name="found", start_time_unix_nano=start,
                      end_time_unix_nano=start + 10**6, attributes=attributes)


@pytest.mark.parametrize("attributes", [
    {"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 2**40},  # PostgreSQL: integer out of range
    {"gen_ai.operation.name": "chat", "gen_ai.usage.output_tokens": 2**70},  # SQLite: int too large
    {"gen_ai.operation.name": "chat", "ctxlens.context.window": -(2**40)},
    {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "t", "ctxlens.tool.retry_count": -5},
    {"ctxlens.span.kind": "skill_activation", "ctxlens.skill.level": 2**40, "ctxlens.skill.depth": 2**40},
    {"ctxlens.span.kind": "compression", "ctxlens.compression.messages_before": -1},
    {"gen_ai.operation.name": "chat", "gen_ai.request.model": "a\x00b", "x\x00": "\x00"},  # PostgreSQL: NUL
    {"gen_ai.operation.name": "chat", "x": float("nan"), "y": [float("inf")]},  # not JSON
], ids=["tokens-2^40", "tokens-2^70", "window-negative", "retries-negative", "skill-level-2^40",
        "messages-negative", "nul-characters", "nan-and-infinity"])
def test_found_span_content_that_failed_the_whole_batch_is_stored(attributes):
    neighbour = _record("01" * 8, **{"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o"})

    result = store_spans([neighbour, _record("02" * 8, **attributes)])

    assert (result.accepted, result.rejected) == (2, 0)
    stored = Span.objects.get(span_id="02" * 8)
    assert "\x00" not in json.dumps(stored.attributes)


@pytest.mark.parametrize("key", ["gen_ai.operation.name", "openinference.span.kind", "traceloop.span.kind"])
def test_found_a_list_where_the_span_kind_goes_is_read_as_no_kind(key):
    from pipeline.ingest.normalise.span import normalise

    assert normalise(_record("04" * 8, **{key: ["chat", "tool"]})).kind == "other"


def test_found_a_time_past_2262_is_refused_alone_not_with_its_batch():
    late = _record("05" * 8)
    late.end_time_unix_nano = 2**64 - 1  # fixed64 allows it; no database column does
    result = store_spans([late, _record("06" * 8)])
    assert (result.accepted, result.rejected) == (1, 1) and "2262" in result.error_message


def test_found_out_of_range_span_kind_and_status_are_stored_as_unspecified():
    record = _record("03" * 8)
    record.kind, record.status_code = 2**31, -7
    assert store_spans([record]).accepted == 1
    assert Span.objects.values_list("otel_kind", "status_code").get() == (0, 0)


# ---- XSS: trace content is shown escaped, wherever it is shown --------------------------------

def payload(field: str) -> str:
    return f'<script>alert("{field}")</script>"><img src=x onerror=alert("{field}")>'


def escaped(field: str) -> re.Pattern:
    """The payload as text on the page (in JSON-formatted values its quotes carry a backslash)."""
    return re.compile(rf"&lt;script&gt;alert\(\\?(&quot;|&#x27;|\\u0022){re.escape(field)}")


SHOWN_FIELDS = ["span-name", "compressed-message", "conversation", "agent", "user", "service", "user-message", "final-answer", "model", "tool",
                "arguments", "observation", "tool-error", "compression-summary", "skill", "input-message",
                "output-message", "artifact-summary"]


def hostile_trace() -> None:
    """One turn in which every text a page can show is an XSS payload naming its field."""
    from pipeline import semconv as sc
    from pipeline.artifacts.store import store_artifact
    from pipeline.models import Conversation

    start = 1_750_000_000_000_000_000
    trace = "5e" * 16

    def span(n: int, name: str, parent: int | None = None, **attributes) -> SpanRecord:
        return SpanRecord(trace_id=trace, span_id=f"{n:016x}", name=name, parent_span_id=f"{parent:016x}" if parent
                          else "", start_time_unix_nano=start + n * 10**6, end_time_unix_nano=start + n * 10**6 + 500,
                          attributes=attributes, resource={"service.name": payload("service")})

    messages = lambda field, role: json.dumps([{"role": role, "parts": [{"type": "text", "content": payload(field)}]}])
    records = [
        span(1, f"invoke_agent {payload('span-name')}", **{
            "gen_ai.operation.name": "invoke_agent", sc.CONVERSATION_ID: payload("conversation"),
            "gen_ai.agent.name": payload("agent"), "user.id": payload("user"),
            sc.ROUND_USER_MESSAGE: payload("user-message"), sc.ROUND_FINAL_ANSWER: payload("final-answer")}),
        span(2, "chat", 1, **{
            "gen_ai.operation.name": "chat", "gen_ai.request.model": payload("model"),
            "gen_ai.usage.input_tokens": 100, "gen_ai.usage.output_tokens": 10,
            "gen_ai.input.messages": messages("input-message", "user"),
            "gen_ai.output.messages": messages("output-message", "assistant")}),
        span(3, "execute_tool", 1, **{
            "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": payload("tool"),
            "gen_ai.tool.call.id": "call_x", "gen_ai.tool.call.arguments": json.dumps({"q": payload("arguments")}),
            "gen_ai.tool.call.result": payload("observation"), "error.type": payload("tool-error-type"),
            sc.TOOL_ERROR_TYPE: "timeout"}),
        span(4, "compress_context", 1, **{
            sc.SPAN_KIND: sc.SPAN_KIND_COMPRESSION, sc.COMPRESSION_STRATEGY: "summarize",
            sc.COMPRESSION_SUMMARY: payload("compression-summary"), sc.COMPRESSION_TOKENS_BEFORE: 900,
            sc.COMPRESSION_TOKENS_AFTER: 100,
            sc.COMPRESSION_BEFORE_MESSAGES: messages("compressed-message", "user")}),
        span(5, "activate_skill", 1, **{sc.SPAN_KIND: sc.SPAN_KIND_SKILL, sc.SKILL_NAME: payload("skill")}),
    ]
    records[2].status_code, records[2].status_message = 2, payload("tool-error")
    assert store_spans(records).accepted == 5
    conversation = Conversation.objects.get()
    store_artifact("content", summary=payload("artifact-summary"), conversation=conversation)


def dashboard_urls() -> list[str]:
    from django.urls import reverse

    from pipeline.models import Artifact, CompressionEvent, Conversation, LLMCall

    conversation, llm_call = Conversation.objects.get(), LLMCall.objects.get()
    compression, artifact = CompressionEvent.objects.get(), Artifact.objects.get()
    pages = [reverse(name) for name in ("overview", "conversations", "compressions", "tools", "tool-calls",
                                        "artifacts", "overview-fragments", "conversations-fragments",
                                        "tools-fragments", "artifacts-fragments")]
    pages += [reverse("conversation", args=[conversation.pk]), reverse("llm-call", args=[llm_call.pk]),
              reverse("compression", args=[compression.pk]), reverse("artifact", args=[artifact.artifact_id]),
              reverse("conversation-fragments", args=[conversation.pk])]
    for model in ("conversation", "round", "llmcall", "toolcall", "compressionevent", "skillactivation", "span",
                  "artifact"):
        pages.append(reverse(f"admin:pipeline_{model}_changelist"))
        instance = __import__("pipeline.models", fromlist=["x"]).__dict__[
            {"llmcall": "LLMCall", "toolcall": "ToolCall", "compressionevent": "CompressionEvent",
             "skillactivation": "SkillActivation"}.get(model, model.capitalize())].objects.first()
        pages.append(reverse(f"admin:pipeline_{model}_change", args=[instance.pk]))
    return pages


def texts_of(response) -> str:
    """The HTML a browser would parse: the page, or every string inside a JSON fragment response."""
    if response["Content-Type"].startswith("application/json"):
        strings: list[str] = []

        def walk(value) -> None:
            if isinstance(value, str):
                strings.append(value)
            elif isinstance(value, dict):
                for item in value.values():
                    walk(item)
            elif isinstance(value, list):
                for item in value:
                    walk(item)

        walk(json.loads(response.content))
        return "\n".join(strings)
    return response.content.decode()


def test_xss_payloads_in_every_shown_field_are_escaped_on_every_page(client, alice, artifact_dir):
    hostile_trace()
    client.force_login(alice)
    shown: set[str] = set()

    for url in dashboard_urls():
        response = client.get(url)
        assert response.status_code == 200, url
        html = texts_of(response)
        assert "<script>alert(" not in html, url
        assert "<img src=x onerror" not in html, url
        shown |= {field for field in SHOWN_FIELDS if escaped(field).search(html)}

    assert shown == set(SHOWN_FIELDS)  # each field was on some page, escaped


# ---- CSRF: every form that changes something refuses a POST without the token -----------------

class FormFinder(HTMLParser):
    """The POST forms of a page: their action and the fields they would send."""

    def __init__(self) -> None:
        super().__init__()
        self.forms: list[dict] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        attributes = dict(attrs)
        if tag == "form" and (attributes.get("method") or "get").lower() == "post":
            self.forms.append({"action": attributes.get("action") or "", "fields": {}})
        elif tag in ("input", "select", "textarea", "button") and self.forms and attributes.get("name"):
            self.forms[-1]["fields"][attributes["name"]] = attributes.get("value") or ""


def post_forms(client, url: str) -> list[tuple[str, dict]]:
    response = client.get(url)
    assert response.status_code == 200, url
    finder = FormFinder()
    finder.feed(response.content.decode())
    return [(urljoin(url, form["action"]) or url, form["fields"]) for form in finder.forms]


def form_pages() -> list[str]:
    from django.urls import reverse

    from pipeline.models import ApiKey as Key, Artifact, Conversation

    key = Key.objects.first()
    pages = dashboard_urls()
    pages = [url for url in pages if "fragments" not in url]
    pages += [reverse("admin:index"), reverse("admin:password_change"), reverse("admin:pipeline_apikey_add"),
              reverse("admin:pipeline_apikey_changelist"), reverse("admin:pipeline_apikey_change", args=[key.pk]),
              reverse("admin:pipeline_apikey_delete", args=[key.pk]), reverse("admin:auth_user_changelist"),
              reverse("admin:pipeline_conversation_delete", args=[Conversation.objects.get().pk]),
              reverse("admin:pipeline_artifact_delete", args=[Artifact.objects.get().pk])]
    return pages


def test_every_post_form_refuses_a_request_without_the_csrf_token(alice, artifact_dir):
    hostile_trace()
    ApiKey.generate("a key to edit", scope="read")
    client = Client(enforce_csrf_checks=True)
    client.force_login(alice)
    forms = [form for url in form_pages() for form in post_forms(client, url)]
    anonymous = Client(enforce_csrf_checks=True)
    forms += post_forms(anonymous, "/login/")
    assert len({action for action, _ in forms}) >= 10  # the admin's forms, logout, login ...

    for action, fields in forms:
        fields.pop("csrfmiddlewaretoken", None)
        poster = anonymous if action.startswith("/login/") else client
        response = poster.post(action, fields)
        assert response.status_code == 403, f"{action} answered {response.status_code} without a CSRF token"

    assert ApiKey.objects.filter(name="a key to edit", revoked_at__isnull=True).exists()  # nothing changed
    client.get("/")  # still logged in: the logout form did not log out


# ---- artifact traversal: no path leaves the sandbox, by the API, the dashboard or the admin ----

SECRET = b"TOP-SECRET-CONTENT"
TRAVERSALS = [
    "../../secret.txt", "..%2f..%2fsecret.txt", "%2e%2e%2f%2e%2e%2fsecret.txt", "..%252f..%252fsecret.txt",
    "artifact_..%2f..%2fsecret.txt", "%2Fetc%2Fpasswd", "artifact_0123456789abcdef%00", "artifact_0123456789ABCDEF",
    ".tmp-0123", "artifact_0123456789abcdef%2f..%2f..%2fsecret.txt", "artifact_%EF%BC%90123456789abcdef",
]


def raw_get(server, path: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """GET exactly `path`, unnormalised (HTTP clients would resolve the dots before sending)."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        connection.request("GET", path, headers=headers)
        reply = connection.getresponse()
        return reply.status, reply.read()
    finally:
        connection.close()


@pytest.fixture
def session_headers(alice) -> dict[str, str]:
    client = Client()
    client.force_login(alice)
    return {"Cookie": f"sessionid={client.cookies['sessionid'].value}"}


def test_artifact_traversal_forms_never_leave_the_sandbox(live_uvicorn, artifact_dir, session_headers):
    from pipeline.artifacts.store import store_artifact
    from pipeline.models import Artifact

    (artifact_dir.parent / "secret.txt").write_bytes(SECRET)
    real = store_artifact("the real content")
    # A row whose file was swapped for a link out of the sandbox, and a row with a forged id.
    link_id = "artifact_" + "ab" * 16
    (artifact_dir / link_id).symlink_to(artifact_dir.parent / "secret.txt")
    Artifact.objects.create(artifact_id=link_id, sha256="0" * 64, size=len(SECRET))
    forged = Artifact.objects.create(artifact_id="../secret.txt", sha256="1" * 64, size=len(SECRET))
    read_key = {"Authorization": f"Bearer {ApiKey.generate('reader', scope='read')[1]}"}

    downloads, pages = [], []
    for form in [*TRAVERSALS, link_id, "../secret.txt"]:
        downloads.append((f"/api/artifacts/{form}/content", read_key))
        pages += [(f"/api/artifacts/{form}/", read_key), (f"/artifacts/{form}/", session_headers)]
    downloads += [(f"/admin/pipeline/artifact/{forged.pk}/download/", session_headers),
                  (f"/admin/pipeline/artifact/{Artifact.objects.get(artifact_id=link_id).pk}/download/",
                   session_headers)]
    for path, headers in downloads + pages:
        status, body = raw_get(live_uvicorn, path, headers)
        if (path, headers) in downloads or link_id not in path:
            assert status in (400, 404), f"{path}: {status}"
        else:  # the linked row's metadata and page exist; its content must not come through them either
            assert status == 200, f"{path}: {status}"
        assert SECRET not in body and str(artifact_dir) not in body.decode(errors="replace"), path

    # The real artifact is served, so the refusals above are not a broken endpoint.
    status, body = raw_get(live_uvicorn, f"/api/artifacts/{real.artifact_id}/content", read_key)
    assert (status, body) == (200, b"the real content")
    assert str(artifact_dir) not in live_uvicorn.log()


# ---- key scopes: a key does what its scope allows and nothing else ----------------------------

def test_a_key_of_one_scope_cannot_do_what_another_scope_does(live_uvicorn, artifact_dir):
    import httpx
    from websockets.sync.client import connect

    from pipeline.artifacts.store import store_artifact

    artifact = store_artifact("stored output")
    keys = {scope: ApiKey.generate(scope, scope=scope)[1] for scope in ("ingest", "read", "all")}
    revoked_row, revoked = ApiKey.generate("revoked", scope="all")
    revoked_row.revoke()
    reads = ["/api/conversations/", "/api/compressions/", "/api/artifacts/", "/api/tools/stats/",
             f"/api/artifacts/{artifact.artifact_id}/content", "/api/schema/"]
    rest_body = {"schema_version": "1.0", "events": [
        {"type": "round_start", "conversation_id": "scoped", "round_id": "r1", "timestamp": "2026-05-01T12:00:00Z",
         "user_message": "hi"}]}
    otlp_body = otlp_fuzz.sample_request(record_turns("scoped-otlp", turns=1))

    def as_key(key: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {key}"}

    def ingest(key: str) -> list[int]:
        return [
            httpx.post(f"{live_uvicorn.url}/api/ingest/", json=rest_body, headers=as_key(key)).status_code,
            httpx.post(f"{live_uvicorn.url}/v1/traces", content=otlp_body,
                       headers={**as_key(key), "Content-Type": "application/x-protobuf"}).status_code,
        ]

    def read(key: str, path: str) -> int:
        return httpx.get(f"{live_uvicorn.url}{path}", headers=as_key(key)).status_code

    # Ingest keys do not read (the schema is open to any key: it describes, it does not disclose).
    assert [read(keys["ingest"], path) for path in reads] == [403] * 5 + [200]
    # Read keys do not ingest, by any way in.
    assert ingest(keys["read"]) == [403, 403]
    assert Span.objects.count() == 0
    # A key of both scopes does both; a revoked key does neither.
    assert [read(keys["all"], path) for path in reads] == [200] * 6
    assert ingest(keys["all"]) == [200, 200]
    assert [read(revoked, path) for path in reads] == [401] * 6 and ingest(revoked) == [401, 401]
    # No key opens the dashboard, its live fragments, the admin or the live websocket.
    for key in keys.values():
        for path in ("/", "/conversations/", "/admin/", "/admin/pipeline/apikey/"):
            reply = httpx.get(f"{live_uvicorn.url}{path}", headers=as_key(key))
            assert reply.status_code == 302 and "login" in reply.headers["Location"], path
        assert httpx.get(f"{live_uvicorn.url}/fragments/overview/", headers=as_key(key)).status_code == 401
        with connect(f"{live_uvicorn.ws_url}/ws/live/", open_timeout=10,
                     additional_headers={**as_key(key), "Origin": live_uvicorn.url}) as ws:
            with pytest.raises(Exception):  # closed with 4401 (unauthenticated) before any message
                ws.recv(timeout=10)
            assert ws.close_code == 4401


# ---- limits: a reader cannot ask for everything at once --------------------------------------

@pytest.mark.parametrize("path", ["/api/conversations/", "/api/artifacts/", "/api/compressions/"])
def test_read_api_pages_are_capped_at_500_items(client, path, artifact_dir):
    from django.utils import timezone

    from pipeline.models import Artifact, CompressionEvent, Conversation

    now = timezone.now()
    Conversation.objects.bulk_create(Conversation(external_id=f"c{n}", started_at=now, last_activity_at=now)
                                     for n in range(501))
    conversation = Conversation.objects.first()
    CompressionEvent.objects.bulk_create(
        CompressionEvent(conversation=conversation, trace_id="ab" * 16, span_id=f"{n + 1:016x}", strategy="truncate",
                         occurred_at=now) for n in range(501))
    Artifact.objects.bulk_create(Artifact(artifact_id=f"artifact_{n:032x}", sha256=f"{n:064x}", size=1)
                                 for n in range(501))
    key = ApiKey.generate("reader", scope="read")[1]

    page = client.get(f"{path}?limit=100000", HTTP_AUTHORIZATION=f"Bearer {key}").json()

    assert len(page["results"]) == 500 and page["count"] == 501 and page["next"]
    default = client.get(path, HTTP_AUTHORIZATION=f"Bearer {key}").json()
    assert len(default["results"]) == 50


def test_found_token_counts_at_the_limit_in_one_turn_do_not_overflow_its_sums():
    from pipeline.models import Conversation

    calls = [_record(f"{n:016x}", **{"gen_ai.operation.name": "chat", "gen_ai.usage.input_tokens": 2**63 - 1,
                                     "gen_ai.usage.output_tokens": 2**63 - 1}) for n in (7, 8, 9)]
    assert store_spans(calls).accepted == 3
    assert Conversation.objects.get().input_tokens == 3 * (2**31 - 1)  # each call clamped to its column


# ---- hostile requests at each way in (issue #10): a 4xx, or 200 with partial_success -----------
# Each is sent to a real server. A refused request leaves the stored data exactly as it was.

LONE = "\ud800"  # a lone UTF-16 surrogate: JSON can spell it ("\\ud800"), UTF-8 cannot encode it


def _now() -> int:
    return time.time_ns() - 10**9


def _span_json(span_id: str = "cd" * 8, trace_id: str = "ab" * 16, *, start: int | None = None,
               end: int | None = None, attributes: dict | None = None, **fields) -> dict:
    start = _now() if start is None else start
    attrs = [{"key": key, "value": value if isinstance(value, dict) else _any_json(value)}
             for key, value in (attributes or {}).items()]
    return {"traceId": trace_id, "spanId": span_id, "name": "chat", "startTimeUnixNano": str(start),
            "endTimeUnixNano": str(start + 10**6 if end is None else end), "attributes": attrs, **fields}


def _any_json(value) -> dict:
    if isinstance(value, bool):
        return {"boolValue": value}
    if isinstance(value, int):
        return {"intValue": str(value)}
    if isinstance(value, float):
        return {"doubleValue": value}
    return {"stringValue": value}


def _traces(*spans: dict, resource: dict | None = None) -> bytes:
    resource_attrs = [{"key": k, "value": _any_json(v)} for k, v in (resource or {}).items()]
    return otlp_fuzz.json_body({"resourceSpans": [{"resource": {"attributes": resource_attrs},
                                                   "scopeSpans": [{"spans": list(spans)}]}]})


def _post(server: LiveServer, path: str, body: bytes | str, content_type: str = JSON, **headers: str):
    import httpx

    return httpx.post(f"{server.url}{path}", content=body, timeout=120,
                      headers={**auth(make_key()), "Content-Type": content_type, **headers})


def _partial(reply) -> tuple[int, str]:
    """(rejected count, error message) of an OTLP/JSON export reply."""
    assert reply.status_code == 200, reply.text
    partial = reply.json().get("partialSuccess", {})
    return int(partial.get("rejectedSpans", partial.get("rejectedLogRecords", 0))), partial.get("errorMessage", "")


def _refused(server: LiveServer, path: str, body: bytes | str, status: int, reason: str, **headers: str) -> None:
    """The request is answered `status` with a reason naming `reason`, and nothing stored changes."""
    wait_for_deferred_tokens()  # what earlier requests left to count, counted before comparing
    before = snapshot()
    reply = _post(server, path, body, **headers)
    assert reply.status_code == status, reply.text
    assert reason in reply.text
    assert snapshot() == before


def _nested_json(depth: int) -> str:
    """An AnyValue `depth` arrayValues deep, as text (json.dumps itself cannot nest that far)."""
    return '{"arrayValue":{"values":[' * depth + '{"stringValue":"bottom"}' + "]}}" * depth


@pytest.mark.timeout(120)
def test_a_two_member_gzip_body_over_a_chunk_is_inflated_whole(otlp_server):
    """Two gzip members back to back, the first inflating past 1 MiB, sent the inflater into an
    endless loop: the request never got an answer and the process hung."""
    import gzip

    from tests.receivers.test_grpc_ingest import one_span_request

    first = otlp_fuzz.sample_request(record_turns("big member", turns=1, payload="x" * (2**20 + 1)))
    second = one_span_request("ef" * 16, "12" * 8)
    reply = _post(otlp_server, "/v1/traces", gzip.compress(first) + gzip.compress(second), PROTOBUF,
                  **{"Content-Encoding": "gzip"})
    assert reply.status_code == 200
    assert Span.objects.filter(span_id="12" * 8).exists() and Span.objects.count() > 1
    # The body of the report: two members of zeros inflate fine, and are not a protobuf request.
    _refused(otlp_server, "/v1/traces", gzip.compress(b"\0" * (2**20 + 1)) * 2, 400, "protobuf",
             **{"Content-Type": PROTOBUF, "Content-Encoding": "gzip"})


def test_lone_surrogates_in_otlp_json_traces_are_stored_as_replacement_characters(otlp_server, alice):
    from django.test import Client

    from pipeline.models import Conversation, LLMCall

    chat = _span_json(name=f"chat {LONE}", status={"code": 2, "message": f"boom {LONE}"},
                      events=[{"name": f"exception{LONE}", "timeUnixNano": str(_now()), "attributes": []}],
                      attributes={"gen_ai.operation.name": "chat", "gen_ai.conversation.id": f"conv {LONE}",
                                  "gen_ai.request.model": f"gpt{LONE}", f"key {LONE}": f"value {LONE}",
                                  "gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 1,
                                  "gen_ai.input.messages": json.dumps(  # an escape inside JSON inside a string
                                      [{"role": "user", "parts": [{"type": "text", "content": LONE}]}]),
                                  "gen_ai.output.messages": json.dumps(
                                      [{"role": "assistant", "parts": [{"type": "text", "content": "ok"}]}])})

    reply = _post(otlp_server, "/v1/traces", _traces(chat, resource={"service.name": f"svc {LONE}"}))

    assert _partial(reply) == (0, "")
    conversation = Conversation.objects.get()
    assert conversation.external_id == "conv \ufffd"
    call = LLMCall.objects.get()
    assert call.model == "gpt\ufffd" and call.input_messages[0]["parts"][0]["content"] == "\ufffd"
    assert Span.objects.get().attributes["key \ufffd"] == "value \ufffd"
    browser = Client()
    browser.force_login(alice)
    for url in (f"/conversations/{conversation.pk}/", f"/llm-calls/{call.pk}/", "/conversations/",
                f"/api/conversations/{conversation.pk}/", "/api/conversations/", "/api/tools/stats/"):
        assert browser.get(url).status_code == 200, url


def test_a_log_body_with_a_lone_surrogate_is_stored_and_never_fails_its_llm_span(otlp_server):
    from pipeline.models import LLMCall, SpanLog

    chat = _span_json(attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                                  "gen_ai.usage.input_tokens": 5, "gen_ai.usage.output_tokens": 1})
    logs = otlp_fuzz.json_body({"resourceLogs": [{"scopeLogs": [{"logRecords": [
        {"traceId": "ab" * 16, "spanId": "cd" * 8, "timeUnixNano": str(_now()), "eventName": "gen_ai.user.message",
         "body": {"kvlistValue": {"values": [{"key": "content", "value": {"stringValue": f"hi {LONE}"}}]}}},
    ]}]}]})

    for _ in range(2):  # the re-send too: the stored log once failed the span every time
        assert _partial(_post(otlp_server, "/v1/logs", logs)) == (0, "")
        assert _partial(_post(otlp_server, "/v1/traces", _traces(chat))) == (0, "")

    assert SpanLog.objects.get().body == {"content": "hi \ufffd"}
    assert LLMCall.objects.get().input_messages == [{"role": "user", "parts": [{"type": "text",
                                                                                "content": "hi \ufffd"}]}]


@pytest.mark.parametrize("path", ["/v1/traces", "/v1/logs"])
def test_otlp_json_nested_thousands_of_levels_deep_is_a_400_that_says_why(otlp_server, path):
    value = _nested_json(3000)
    if path == "/v1/traces":
        body = ('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"' + "ab" * 16 + '","spanId":"' + "cd" * 8
                + '","startTimeUnixNano":"1","attributes":[{"key":"deep","value":' + value + "}]}]}]}]}")
    else:
        body = '{"resourceLogs":[{"scopeLogs":[{"logRecords":[{"body":' + value + "}]}]}]}"
    _refused(otlp_server, path, body, 400, "nested too deeply")
    assert json.loads(_post(otlp_server, path, body).content)["code"] == 3  # google.rpc.Status INVALID_ARGUMENT


def test_otlp_json_values_past_the_nesting_limit_are_cut_and_the_span_kept(otlp_server):
    from pipeline.ingest.decode.otlp import MAX_DEPTH, TOO_DEEP

    body = ('{"resourceSpans":[{"scopeSpans":[{"spans":[{"traceId":"' + "ab" * 16 + '","spanId":"' + "cd" * 8
            + f'","startTimeUnixNano":"{_now()}","attributes":[{{"key":"deep","value":' + _nested_json(200)
            + "}]}]}]}]}")

    assert _partial(_post(otlp_server, "/v1/traces", body)) == (0, "")

    value, depth = Span.objects.get().attributes["deep"], 0
    while isinstance(value, list):
        value, depth = value[0], depth + 1
    assert (depth, value) == (MAX_DEPTH, TOO_DEEP)


@pytest.mark.parametrize("count", [float("inf"), "+Inf", "1e400", "Infinity"], ids=["double-inf", "text-inf",
                                                                                      "text-1e400", "text-infinity"])
def test_a_token_count_of_infinity_is_ignored_and_the_span_stored(otlp_server, count):
    from pipeline.models import LLMCall

    chat = _span_json(attributes={"gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o",
                                  "gen_ai.usage.input_tokens": count, "gen_ai.usage.output_tokens": 7})

    assert _partial(_post(otlp_server, "/v1/traces", _traces(chat))) == (0, "")

    assert LLMCall.objects.values_list("input_tokens", "output_tokens").get() == (0, 7)  # missing, not refused


def test_an_end_before_the_start_is_clamped_to_the_start(otlp_server):
    from pipeline.models import Round

    start = _now()
    spans = [_span_json("01" * 8, end=start - 5 * 10**9, start=start, attributes={"gen_ai.operation.name": "chat"}),
             _span_json("02" * 8, end=-(2**64), start=start, attributes={"gen_ai.operation.name": "chat"})]

    assert _partial(_post(otlp_server, "/v1/traces", _traces(*spans))) == (0, "")

    for span in Span.objects.all():
        assert span.end_time_unix_nano == span.start_time_unix_nano and span.duration_ms == 0
    assert Round.objects.get().ended_at >= Round.objects.get().started_at


@pytest.mark.parametrize("field", ["start", "end"])
def test_a_span_from_the_far_future_is_refused_with_a_reason(otlp_server, field):
    from pipeline.models import Conversation

    far = 9_000_000_000 * 10**9  # 2255: would sort its conversation first until then
    now = _now()
    times = {"start": far, "end": far + 1} if field == "start" else {"start": now, "end": far}
    late = _span_json("01" * 8, attributes={"gen_ai.conversation.id": "late"}, **times)
    fine = _span_json("02" * 8, "ef" * 16, attributes={"gen_ai.conversation.id": "fine"})

    rejected, message = _partial(_post(otlp_server, "/v1/traces", _traces(late, fine)))

    assert rejected == 1 and "ahead of the server's clock" in message
    assert list(Conversation.objects.values_list("external_id", flat=True)) == ["fine"]


def test_long_conversation_ids_that_differ_only_at_the_end_stay_two_conversations(otlp_server):
    from pipeline.models import Conversation

    ids = ["c" * 300 + "-one", "c" * 300 + "-two"]
    spans = [_span_json(f"{n + 1:016x}", f"{n + 1:032x}", attributes={"gen_ai.conversation.id": conversation})
             for n, conversation in enumerate(ids)]

    assert _partial(_post(otlp_server, "/v1/traces", _traces(*spans))) == (0, "")

    stored = sorted(Conversation.objects.values_list("external_id", flat=True))
    assert len(stored) == 2 and all(len(key) <= 255 and key.startswith("c" * 200) for key in stored)
    # The same long id again is the same conversation.
    again = _span_json("09" * 8, "09" * 16, attributes={"gen_ai.conversation.id": ids[0]})
    assert _partial(_post(otlp_server, "/v1/traces", _traces(again))) == (0, "")
    assert Conversation.objects.count() == 2


def test_a_log_time_past_2262_is_kept_within_the_column(otlp_server):
    from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest

    from pipeline.models import SpanLog

    request = ExportLogsServiceRequest()
    log = request.resource_logs.add().scope_logs.add().log_records.add()
    log.trace_id, log.span_id, log.time_unix_nano = b"\xab" * 16, b"\xcd" * 8, 2**64 - 1  # fixed64 allows it
    log.event_name, log.body.string_value = "gen_ai.user.message", "hi"

    reply = _post(otlp_server, "/v1/logs", request.SerializeToString(), PROTOBUF)

    assert reply.status_code == 200
    assert SpanLog.objects.get().time_unix_nano == 2**63 - 1


# ---- the same at /api/ingest/ ------------------------------------------------------------------

def _rest(*events: dict) -> str:
    return json.dumps({"schema_version": "1.0", "events": list(events)})


def _rest_call(**fields) -> dict:
    return {"type": "tool_call", "conversation_id": "rest-hostile", "round_id": "r1", "call_id": "t1",
            "tool_name": "search", "started_at": "2026-05-01T12:00:00Z", "duration_ms": 5, **fields}


def test_lone_surrogates_in_rest_json_values_are_stored_as_replacement_characters(otlp_server):
    """`arguments` and `observation` are any JSON: a surrogate there reached the database driver."""
    from pipeline.models import ToolCall

    body = _rest(_rest_call(arguments={f"q{LONE}": f"x {LONE}", "list": [LONE]}, observation={"seen": LONE}))

    reply = _post(otlp_server, "/api/ingest/", body)

    assert reply.status_code == 200, reply.text
    tool = ToolCall.objects.get()
    assert tool.arguments == {"q\ufffd": "x \ufffd", "list": ["\ufffd"]}
    assert json.loads(tool.observation) == {"seen": "\ufffd"}


def test_lone_surrogates_in_rest_text_fields_are_a_400_field_error(otlp_server):
    """Text fields (ids, messages) are DRF CharFields, which refuse surrogates by name."""
    event = {"type": "round_start", "conversation_id": f"rest {LONE}", "round_id": "r1",
             "timestamp": "2026-05-01T12:00:00Z", "user_message": f"hello {LONE}"}
    _refused(otlp_server, "/api/ingest/", _rest(event), 400, "Surrogate characters are not allowed")


@pytest.mark.parametrize("depth, reason", [(5_000, "nested too deeply"), (100, "more than 64 levels deep")],
                         ids=["past-the-parser", "past-the-limit"])
def test_rest_arguments_nested_too_deep_are_a_400_that_says_why(otlp_server, depth, reason):
    """A RecursionError in the JSON parser was a 500; a body the parser reads is still refused
    past 64 levels, before the serializers or the normaliser walk it recursively."""
    event = _rest(_rest_call(arguments={"q": "x"}))
    body = event.replace('{"q": "x"}', '{"q": ' + "[" * depth + "1" + "]" * depth + "}")
    _refused(otlp_server, "/api/ingest/", body, 400, reason)


@pytest.mark.parametrize("fields, field", [
    ({"duration_ms": 1e308}, "duration_ms"),
    ({"started_at": "2255-01-01T00:00:00Z"}, "ahead of the server"),
    ({"ended_at": "9999-12-31T23:59:59Z", "duration_ms": None}, "2262"),
], ids=["duration-1e308", "start-in-2255", "end-in-9999"])
def test_rest_times_no_column_can_hold_are_a_400_with_a_reason(otlp_server, fields, field):
    event = {key: value for key, value in _rest_call(**fields).items() if value is not None}
    _refused(otlp_server, "/api/ingest/", _rest(event), 400, field)


# ---- the same over gRPC -----------------------------------------------------------------------

@pytest.fixture(scope="module")
def grpc_ingest(django_db_setup, django_db_blocker, tmp_path_factory):
    from tests.otlp_servers import start_grpc

    with django_db_blocker.unblock():
        server = start_grpc(tmp_path_factory.mktemp("grpc-hostile"))
    yield server
    server.stop()


@pytest.fixture
def grpc_server(grpc_ingest, transactional_db):
    yield grpc_ingest
    wait_for_deferred_tokens()


def _grpc_export(server: LiveServer, body: bytes):
    from tests.receivers.test_grpc_ingest import raw_export

    return raw_export(server, body, make_key())


def _kv_bytes(key: str, any_value: bytes) -> bytes:
    """A KeyValue written by hand, so values protobuf's own builders refuse can be sent."""
    def field(number: int, payload: bytes) -> bytes:
        return _varint(number << 3 | 2) + _varint(len(payload)) + payload
    return field(1, key.encode()) + field(2, any_value)


def _varint(number: int) -> bytes:
    out = bytearray()
    while True:
        out.append(number & 0x7F | (0x80 if number > 0x7F else 0))
        number >>= 7
        if not number:
            return bytes(out)


def _grpc_request(*attributes: bytes, start: int | None = None) -> bytes:
    from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

    request = ExportTraceServiceRequest()
    span = request.resource_spans.add().scope_spans.add().spans.add()
    span.trace_id, span.span_id, span.name = b"\xab" * 16, b"\xcd" * 8, "chat"
    span.start_time_unix_nano = _now() if start is None else start
    span.end_time_unix_nano = span.start_time_unix_nano + 10**6
    body = request.SerializeToString()
    # Append the attributes to the span by hand: re-encode the nesting with the longer span.
    span_bytes = span.SerializeToString() + b"".join(_varint(9 << 3 | 2) + _varint(len(a)) + a for a in attributes)
    scope = _varint(2 << 3 | 2) + _varint(len(span_bytes)) + span_bytes  # ScopeSpans.spans = 2
    resource = _varint(2 << 3 | 2) + _varint(len(scope)) + scope  # ResourceSpans.scope_spans = 2
    assert body  # (the plain request, for comparison when debugging)
    return _varint(1 << 3 | 2) + _varint(len(resource)) + resource  # ExportTraceServiceRequest.resource_spans = 1


def _any_string_bytes(raw: bytes) -> bytes:
    return _varint(1 << 3 | 2) + _varint(len(raw)) + raw  # AnyValue.string_value = 1


def _any_nested_bytes(depth: int) -> bytes:
    value = _any_string_bytes(b"bottom")
    for _ in range(depth):
        array = _varint(1 << 3 | 2) + _varint(len(value)) + value  # ArrayValue.values = 1
        value = _varint(5 << 3 | 2) + _varint(len(array)) + array  # AnyValue.array_value = 5
    return value


def test_grpc_a_surrogate_encoded_into_a_string_is_invalid_argument(grpc_server):
    import grpc

    before = snapshot()
    body = _grpc_request(_kv_bytes("text", _any_string_bytes(b"a\xed\xa0\x80b")))  # "\ud800" as CESU-8
    with pytest.raises(grpc.RpcError) as refusal:
        _grpc_export(grpc_server, body)
    assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "protobuf" in refusal.value.details()
    assert snapshot() == before


def test_grpc_attributes_past_the_nesting_limit_are_cut_or_refused(grpc_server):
    import grpc

    from pipeline.ingest.decode.otlp import MAX_DEPTH, TOO_DEEP

    # 40 levels: each is two messages (AnyValue, ArrayValue), within protobuf's own limit of 100.
    reply = _grpc_export(grpc_server, _grpc_request(_kv_bytes("deep", _any_nested_bytes(40))))
    assert reply.partial_success.rejected_spans == 0
    value, depth = Span.objects.get().attributes["deep"], 0
    while isinstance(value, list):
        value, depth = value[0], depth + 1
    assert (depth, value) == (MAX_DEPTH, TOO_DEEP)

    before = snapshot()
    with pytest.raises(grpc.RpcError) as refusal:  # past protobuf's own limit
        _grpc_export(grpc_server, _grpc_request(_kv_bytes("deeper", _any_nested_bytes(500))))
    assert refusal.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert snapshot() == before


def test_grpc_a_token_count_of_infinity_is_ignored_and_a_future_span_refused(grpc_server):
    import struct

    from pipeline.models import LLMCall

    def double(value: float) -> bytes:
        return _varint(4 << 3 | 1) + struct.pack("<d", value)  # AnyValue.double_value = 4

    reply = _grpc_export(grpc_server, _grpc_request(
        _kv_bytes("gen_ai.operation.name", _any_string_bytes(b"chat")),
        _kv_bytes("gen_ai.usage.input_tokens", double(float("inf"))),
        _kv_bytes("gen_ai.usage.output_tokens", double(3.0))))
    assert reply.partial_success.rejected_spans == 0
    assert LLMCall.objects.values_list("input_tokens", "output_tokens").get() == (0, 3)

    before = snapshot()
    reply = _grpc_export(grpc_server, _grpc_request(start=9_000_000_000 * 10**9))
    assert reply.partial_success.rejected_spans == 1
    assert "ahead of the server's clock" in reply.partial_success.error_message
    assert snapshot() == before


# ---- the read API: ids no column can hold -----------------------------------------------------

@pytest.mark.parametrize("path", ["/api/artifacts/", "/api/tools/stats/", "/api/compressions/"])
@pytest.mark.parametrize("value", [2**63, 2**64, 10**30])
def test_read_api_filters_given_ids_past_64_bits_are_field_errors(client, path, value):
    key = ApiKey.generate("reader", scope="read")[1]

    reply = client.get(f"{path}?conversation={value}", HTTP_AUTHORIZATION=f"Bearer {key}")

    assert reply.status_code == 400 and "conversation" in reply.json()


@pytest.mark.parametrize("path", ["/api/conversations/{}/", "/api/compressions/{}/", "/conversations/{}/",
                                  "/llm-calls/{}/", "/compressions/{}/"])
def test_detail_pages_given_ids_past_64_bits_are_not_found(client, alice, path):
    key = ApiKey.generate("reader", scope="read")[1]
    client.force_login(alice)

    reply = client.get(path.format(2**64), HTTP_AUTHORIZATION=f"Bearer {key}")

    assert reply.status_code == 404
