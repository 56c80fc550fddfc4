from __future__ import annotations

import json
import re
from datetime import timedelta

import pytest
from django.contrib import admin
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils.text import capfirst

from pipeline.ingest.records import LogRecord, SpanRecord
from pipeline.ingest.write.store import store_spans
from pipeline import semconv as sc
from pipeline.models import (
    ApiKey, Artifact, CompressionEvent, Conversation, LLMCall, Rollup, Round, SkillActivation, Span, SpanLog, ToolCall,
    ToolRequest,
)
from pipeline.models.apikeys import Scope
from tests.factories import make_artifact

pytestmark = pytest.mark.django_db

PIPELINE_MODELS = [m for m in admin.site._registry if m._meta.app_label == "pipeline"]


def test_every_pipeline_model_has_an_admin():
    from django.apps import apps

    assert set(apps.get_app_config("pipeline").get_models()) == set(PIPELINE_MODELS)


@pytest.mark.parametrize("model", PIPELINE_MODELS, ids=lambda m: m.__name__)
def test_a_superuser_sees_each_changelist(client, alice, model):
    client.force_login(alice)
    url = reverse(f"admin:pipeline_{model._meta.model_name}_changelist")
    assert client.get(url).status_code == 200


@pytest.mark.parametrize("model", PIPELINE_MODELS, ids=lambda m: m.__name__)
def test_an_anonymous_user_is_sent_to_the_admin_login(client, model):
    url = reverse(f"admin:pipeline_{model._meta.model_name}_changelist")
    response = client.get(url)
    assert response.status_code == 302
    assert response["Location"].startswith(reverse("admin:login"))


def test_a_plain_user_cannot_open_the_admin(client, bob):
    client.force_login(bob)
    response = client.get(reverse("admin:pipeline_artifact_changelist"))
    assert response.status_code == 302


def test_the_artifact_page_shows_an_escaped_preview_and_no_path(client, alice, artifact_dir):
    artifact = make_artifact(artifact_dir, b"<script>alert(1)</script> result rows")
    client.force_login(alice)
    html = client.get(reverse("admin:pipeline_artifact_change", args=[artifact.pk])).content.decode()
    assert "&lt;script&gt;alert(1)&lt;/script&gt; result rows" in html
    assert "<script>alert(1)" not in html
    assert str(artifact_dir) not in html


def test_the_artifact_list_shows_its_columns_and_searches(client, alice, artifact_dir):
    artifact = make_artifact(artifact_dir, b"quarterly sales table")
    make_artifact(artifact_dir, b"something else")
    client.force_login(alice)
    html = client.get(reverse("admin:pipeline_artifact_changelist"), {"q": artifact.sha256[:10]}).content.decode()
    assert artifact.artifact_id in html and artifact.sha256[:12] in html
    assert "1 result" in html


def test_the_download_link_returns_the_content(client, alice, artifact_dir):
    artifact = make_artifact(artifact_dir, b"col_a,col_b\n1,2\n", mime="text/csv")
    client.force_login(alice)
    response = client.get(reverse("admin:pipeline_artifact_download", args=[artifact.pk]))
    assert response.status_code == 200
    assert b"".join(response.streaming_content) == b"col_a,col_b\n1,2\n"
    assert artifact.artifact_id in response["Content-Disposition"]


def test_the_download_sends_the_same_untrusted_content_headers_as_the_api(client, alice, artifact_dir):
    artifact = make_artifact(artifact_dir, b"<html><script>alert(document.cookie)</script></html>", mime="text/html")
    client.force_login(alice)
    admin_reply = client.get(reverse("admin:pipeline_artifact_download", args=[artifact.pk]))
    api_reply = client.get(f"/api/artifacts/{artifact.artifact_id}/content")
    assert admin_reply.status_code == api_reply.status_code == 200
    for header in ("X-Content-Type-Options", "Content-Security-Policy", "Content-Disposition"):
        assert admin_reply[header] == api_reply[header], header
    assert admin_reply["X-Content-Type-Options"] == "nosniff"
    assert admin_reply["Content-Security-Policy"].startswith("sandbox")
    assert admin_reply["Content-Disposition"].startswith("attachment")


def test_a_download_whose_file_is_gone_is_a_404(client, alice, artifact_dir):
    artifact = make_artifact(artifact_dir, b"soon gone")
    (artifact_dir / artifact.artifact_id).unlink()
    client.force_login(alice)
    assert client.get(reverse("admin:pipeline_artifact_download", args=[artifact.pk])).status_code == 404


@pytest.mark.django_db(transaction=True)
def test_the_expired_action_deletes_expired_artifacts_and_their_files(client, alice, artifact_dir):
    expired = make_artifact(artifact_dir, b"old", expires_in=timedelta(hours=-1))
    fresh = make_artifact(artifact_dir, b"new", expires_in=timedelta(hours=1))
    client.force_login(alice)
    response = client.post(
        reverse("admin:pipeline_artifact_changelist"),
        {"action": "delete_expired", "_selected_action": [fresh.pk]},
        follow=True,
    )
    assert "Deleted 1 expired artifact" in response.content.decode()
    assert list(Artifact.objects.values_list("pk", flat=True)) == [fresh.pk]
    assert not (artifact_dir / expired.artifact_id).exists()
    assert (artifact_dir / fresh.artifact_id).exists()


def test_a_key_added_in_the_admin_is_shown_once_and_stored_hashed(client, alice):
    client.force_login(alice)
    response = client.post(
        reverse("admin:pipeline_apikey_add"), {"name": "collector", "scope": Scope.INGEST}, follow=True
    )
    message = next(str(m) for m in response.context["messages"] if "New API key" in str(m))
    raw = message.split(": ", 1)[1].split(" ")[0]
    key = ApiKey.objects.get(name="collector")
    assert ApiKey.authenticate(raw) == key
    assert key.created_by == alice
    # Shown once: the key's own page does not show it again.
    page = client.get(reverse("admin:pipeline_apikey_change", args=[key.pk])).content.decode()
    assert raw not in page


def test_the_revoke_action_revokes_keys(client, alice):
    key, raw = ApiKey.generate("old-agent", Scope.ALL)
    client.force_login(alice)
    client.post(reverse("admin:pipeline_apikey_changelist"), {"action": "revoke", "_selected_action": [key.pk]})
    assert ApiKey.authenticate(raw) is None


def test_an_llm_calls_output_and_round_are_read_only_in_the_admin(client, alice):
    """The tool calls a call asks for are indexed from its output (pipeline.models.ToolRequest) by
    round: an admin edit of either would leave that index describing another call."""
    asks = [{"role": "assistant", "parts": [{"type": "tool_call", "id": "call_1", "name": "lookup", "arguments": {}}]}]
    store_spans([SpanRecord("5cf92f3577b34da6a3ce929d0e0e4799", "0000000000000001", "chat gpt-4o",
                            1_763_900_000_000_000_000, 1_763_900_001_000_000_000, attributes={
                                "gen_ai.operation.name": "chat", "gen_ai.conversation.id": "conv-admin",
                                "gen_ai.output.messages": json.dumps(asks)})])
    call = LLMCall.objects.get()
    client.force_login(alice)
    response = client.get(reverse("admin:pipeline_llmcall_change", args=[call.pk]))
    assert response.status_code == 200
    editable = set(response.context["adminform"].form.fields)
    assert {"output_messages", "round"}.isdisjoint(editable)
    assert "call_1" in response.content.decode()  # still shown


# What each list leaves out: "table"."column" of the columns holding a row's bulk, written out here
# rather than read from the admins' list_defer, so a column dropped from one is noticed.
BULK_COLUMNS = {
    Round: ["user_message", "final_answer"],
    LLMCall: ["input_messages", "output_messages", "input_digest", "output_digest", "context_composition"],
    ToolCall: ["arguments", "observation"],
    CompressionEvent: ["before_messages", "after_messages", "summary"],
    SkillActivation: ["messages", "resources"],
    Span: ["attributes", "events", "resource"],
    SpanLog: ["body", "attributes"],
    ToolRequest: [],  # its LLM call's, through the join
}


def bulk_columns(model) -> set[str]:
    columns = {f'"{model._meta.db_table}"."{name}"' for name in BULK_COLUMNS[model]}
    if model is ToolRequest:
        columns |= bulk_columns(LLMCall) | bulk_columns(Round)
    return columns


def store_a_bulky_turn() -> None:
    """A turn whose every row holds bulk: messages, an observation, raw attributes, a log body."""
    trace, started = "7" * 32, 1_763_800_000_000_000_000
    big = "context " * 5_000
    messages = json.dumps([{"role": "user", "parts": [{"type": "text", "content": big}]}])
    store_spans([
        SpanRecord(trace, "1" * 16, "invoke_agent", started, started + 10**9, attributes={
            "gen_ai.operation.name": "invoke_agent", "gen_ai.conversation.id": "bulky", "ctxlens.round.user_message": big}),
        SpanRecord(trace, "2" * 16, "chat gpt-4o", started + 1, started + 10**8, parent_span_id="1" * 16, attributes={
            "gen_ai.operation.name": "chat", "gen_ai.request.model": "gpt-4o", "gen_ai.input.messages": messages,
            "gen_ai.output.messages": json.dumps([{"role": "assistant", "parts": [
                {"type": "tool_call", "id": "call_1", "name": "search", "arguments": {"q": big[:100]}}]}])}),
        SpanRecord(trace, "3" * 16, "execute_tool search", started + 2 * 10**8, started + 3 * 10**8,
                   parent_span_id="1" * 16, attributes={
                       "gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "search",
                       "gen_ai.tool.call.id": "call_1", "gen_ai.tool.call.result": big}),
        SpanRecord(trace, "4" * 16, "compress_context", started + 4 * 10**8, started + 5 * 10**8,
                   parent_span_id="1" * 16, attributes={
                       sc.SPAN_KIND: sc.SPAN_KIND_COMPRESSION, sc.COMPRESSION_STRATEGY: "summarize",
                       sc.COMPRESSION_BEFORE_MESSAGES: messages, sc.COMPRESSION_SUMMARY: big}),
        SpanRecord(trace, "5" * 16, "activate_skill pdf", started + 6 * 10**8, started + 7 * 10**8,
                   parent_span_id="1" * 16, attributes={
                       sc.SPAN_KIND: sc.SPAN_KIND_SKILL, sc.SKILL_NAME: "pdf", sc.SKILL_LEVEL: 3,
                       sc.SKILL_RESOURCES: json.dumps([big[:200]])}),
    ], logs=[LogRecord(trace, "2" * 16, started + 2, "gen_ai.user.message", {"content": big})])


@pytest.mark.parametrize("model", list(BULK_COLUMNS), ids=lambda m: m.__name__)
def test_a_changelist_reads_no_messages_observations_or_raw_attributes(client, alice, model):
    """Rows whose bulk no list column shows (an LLM call's messages can be megabytes) are listed
    without it: a page of 100 read and decoded all of it."""
    store_a_bulky_turn()
    client.force_login(alice)

    with CaptureQueriesContext(connection) as queries:
        response = client.get(reverse(f"admin:pipeline_{model._meta.model_name}_changelist"))

    assert response.status_code == 200 and response.context["cl"].result_count >= 1
    selects = [q["sql"] for q in queries if q["sql"].startswith("SELECT")]
    assert not [(column, sql) for sql in selects for column in bulk_columns(model) if column in sql]


DELETED_IN_THE_ADMIN = [Round, LLMCall, ToolCall, CompressionEvent, SkillActivation]


@pytest.mark.parametrize("model", DELETED_IN_THE_ADMIN, ids=lambda m: m.__name__)
def test_an_admin_delete_reads_no_messages_or_observations(rf, alice, model):
    """The admin's delete (its action and its delete page both end in `delete_queryset`) locks,
    recounts and deletes by ids, conversations and rounds: it read every selected row whole,
    messages and all, three times. Nothing it reads holds any row's bulk, cascaded rows' included,
    aliased columns too."""
    store_a_bulky_turn()
    request = rf.post("/")
    request.user = alice
    bulk = {f'"{name}"' for deleted in DELETED_IN_THE_ADMIN for name in BULK_COLUMNS[deleted]}

    with CaptureQueriesContext(connection) as queries:
        admin.site._registry[model].delete_queryset(request, model.objects.all())

    assert not model.objects.exists()
    selects = [q["sql"] for q in queries if q["sql"].startswith("SELECT")]
    assert any(f'FROM "{model._meta.db_table}"' in sql for sql in selects)  # the rows it deleted were read
    assert not [(column, sql) for sql in selects for column in bulk if column in sql]


@pytest.mark.parametrize("how", ["delete page", "delete action"])
def test_deleting_a_conversation_counts_the_rows_under_it_without_reading_them(client, alice, how):
    """Django's confirmation linked every row a delete cascades to, each read whole (a 2,000-turn
    conversation: seconds and megabytes of page); it now lists the conversation and counts the
    rest, by kind, from ids."""
    store_a_bulky_turn()
    conversation = Conversation.objects.get(external_id="bulky")
    client.force_login(alice)
    bulk = {f'"{name}"' for names in BULK_COLUMNS.values() for name in names}

    with CaptureQueriesContext(connection) as queries:
        if how == "delete page":
            response = client.get(reverse("admin:pipeline_conversation_delete", args=[conversation.pk]))
        else:
            response = client.post(reverse("admin:pipeline_conversation_changelist"),
                                   {"action": "delete_selected", "_selected_action": [conversation.pk]})

    assert response.status_code == 200
    page = response.content.decode()
    assert reverse("admin:pipeline_conversation_change", args=[conversation.pk]) in page
    for model in (Round, LLMCall, ToolCall, CompressionEvent, SkillActivation, Span):  # log records stay
        assert f"<li>{capfirst(model._meta.verbose_name_plural)}: {model.objects.count()}</li>" in page
        assert not [row for row in model.objects.all()  # counted, not linked
                    if reverse(f"admin:pipeline_{model._meta.model_name}_change", args=[row.pk]) in page]
    selects = [q["sql"] for q in queries if q["sql"].startswith("SELECT")]
    assert not [(column, sql) for sql in selects for column in bulk if column in sql]


def test_a_conversation_is_not_deleted_by_someone_who_may_not_delete_what_is_under_it(client, django_user_model):
    store_a_bulky_turn()
    conversation = Conversation.objects.get(external_id="bulky")
    carol = django_user_model.objects.create_user("carol", "carol@example.com", "carol-pass-123", is_staff=True)
    carol.user_permissions.set(Permission.objects.filter(codename__in=["view_conversation", "delete_conversation"]))
    client.force_login(carol)
    url = reverse("admin:pipeline_conversation_delete", args=[conversation.pk])

    page = client.get(url)
    refused = client.post(url, {"post": "yes"})

    assert page.status_code == 200 and "<h1>Cannot delete conversation</h1>" in page.content.decode()
    refused_kinds = set(re.findall(r"<li>([a-z ]+)</li>", page.content.decode()))
    assert refused_kinds == {model._meta.verbose_name for model in (
        Round, LLMCall, ToolCall, ToolRequest, CompressionEvent, SkillActivation, Span)}
    assert refused.status_code == 403 and Conversation.objects.filter(pk=conversation.pk).exists()


@pytest.mark.parametrize("model", [Conversation, *DELETED_IN_THE_ADMIN], ids=lambda m: m.__name__)
def test_the_delete_summary_counts_what_the_delete_removes(client, rf, alice, model):
    store_a_bulky_turn()
    chosen = model.objects.order_by("pk").first()
    request = rf.get("/")
    request.user = alice
    listed, summary, perms_needed, protected = admin.site._registry[model].get_deleted_objects([chosen], request)
    stored = [m for m in PIPELINE_MODELS if m is not Rollup]  # figures: rows emptied go, but no delete takes them
    before = {m: m.objects.count() for m in stored}
    client.force_login(alice)

    response = client.post(reverse(f"admin:pipeline_{model._meta.model_name}_delete", args=[chosen.pk]),
                           {"post": "yes"})

    assert response.status_code == 302 and not model.objects.filter(pk=chosen.pk).exists()
    removed = {m._meta.verbose_name_plural: before[m] - m.objects.count() for m in stored}
    assert summary == {name: count for name, count in removed.items() if count}
    assert len(listed) == 1 and not perms_needed and not protected
