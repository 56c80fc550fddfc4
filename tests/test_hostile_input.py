"""Hostile input: generated API requests, fuzzed OTLP bodies, XSS, CSRF, traversal and key scopes.

Short runs here; `make fuzz` (bench/fuzz_otlp.py) runs the OTLP fuzzing for longer. Inputs the
fuzzers found are kept below as explicit tests (`test_found_*`).
"""

from __future__ import annotations

import http.client
import json
import re
from html.parser import HTMLParser
from urllib.parse import urljoin

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from django.db import transaction
from django.test import Client
from hypothesis import strategies as st

from pipeline.ingest.otlp import OtlpDecodeError, decode_traces_json
from pipeline.ingest.records import SpanRecord
from pipeline.ingest.store import store_spans
from pipeline.models import ApiKey, Span
from tests import otlp_fuzz
from tests.agent_traces import record_turns

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


def test_no_generated_api_request_gets_a_server_error(live_daphne, api_key):
    """Every operation of /api/schema/, with requests schemathesis generates from it (valid and not)."""
    seed_traces(live_daphne)  # something to list, page and look up
    schema = schemathesis.openapi.from_url(f"{live_daphne.url}/api/schema/",
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

    assert failures == []


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
    from pipeline.ingest.normalise import normalise

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
    from pipeline.artifacts import store_artifact
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


def test_artifact_traversal_forms_never_leave_the_sandbox(live_daphne, artifact_dir, session_headers):
    from pipeline.artifacts import store_artifact
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
        status, body = raw_get(live_daphne, path, headers)
        if (path, headers) in downloads or link_id not in path:
            assert status in (400, 404), f"{path}: {status}"
        else:  # the linked row's metadata and page exist; its content must not come through them either
            assert status == 200, f"{path}: {status}"
        assert SECRET not in body and str(artifact_dir) not in body.decode(errors="replace"), path

    # The real artifact is served, so the refusals above are not a broken endpoint.
    status, body = raw_get(live_daphne, f"/api/artifacts/{real.artifact_id}/content", read_key)
    assert (status, body) == (200, b"the real content")
    assert str(artifact_dir) not in live_daphne.log()


# ---- key scopes: a key does what its scope allows and nothing else ----------------------------

def test_a_key_of_one_scope_cannot_do_what_another_scope_does(live_daphne, artifact_dir):
    import httpx
    from websockets.sync.client import connect

    from pipeline.artifacts import store_artifact

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
            httpx.post(f"{live_daphne.url}/api/ingest/", json=rest_body, headers=as_key(key)).status_code,
            httpx.post(f"{live_daphne.url}/v1/traces", content=otlp_body,
                       headers={**as_key(key), "Content-Type": "application/x-protobuf"}).status_code,
        ]

    def read(key: str, path: str) -> int:
        return httpx.get(f"{live_daphne.url}{path}", headers=as_key(key)).status_code

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
            reply = httpx.get(f"{live_daphne.url}{path}", headers=as_key(key))
            assert reply.status_code == 302 and "login" in reply.headers["Location"], path
        assert httpx.get(f"{live_daphne.url}/fragments/overview/", headers=as_key(key)).status_code == 401
        with connect(f"{live_daphne.ws_url}/ws/live/", open_timeout=10,
                     additional_headers={**as_key(key), "Origin": live_daphne.url}) as ws:
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
