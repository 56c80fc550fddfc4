"""The read API: conversations, tool statistics, compressions and artifacts, with scopes and JSON errors."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import count

import pytest
import time_machine
from rest_framework.test import APIClient

from pipeline.models import (
    ApiKey,
    CompressionEvent,
    Conversation,
    LLMCall,
    Round,
    SkillActivation,
    Status,
    ToolCall,
)
from pipeline.models.apikeys import Scope
from pipeline.rollups.compact import rebuild_rollups
from tests.api_client import client_with
from tests.factories import make_artifact

T0 = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
_ids = count(1)


def span_ids() -> dict[str, str]:
    n = next(_ids)
    return {"trace_id": f"{n:032x}", "span_id": f"{n:016x}"}


def conversation(external_id: str, *, at: datetime = T0, **fields) -> Conversation:
    fields.setdefault("last_activity_at", at + timedelta(minutes=5))
    return Conversation.objects.create(external_id=external_id, started_at=at, **fields)


def add_round(conv: Conversation, key: str, *, at: datetime = T0, llm_calls: int = 1, tool_calls: int = 1) -> Round:
    round_ = Round.objects.create(conversation=conv, key=key, started_at=at, status=Status.OK,
                                  user_message=f"question {key}", final_answer=f"answer {key}")
    for i in range(llm_calls):
        LLMCall.objects.create(conversation=conv, round=round_, model="gpt-4o", started_at=at + timedelta(seconds=i),
                               input_tokens=100, output_tokens=10, step=i, **span_ids())
    for i in range(tool_calls):
        tool_call(conv, round_, "search", 10.0 + i, at=at + timedelta(seconds=i))
    return round_


def tool_call(conv: Conversation, round_: Round | None, name: str, duration: float | None, *, at: datetime = T0,
              success: bool = True, retries: int = 0, tokens: int = 0) -> ToolCall:
    return ToolCall.objects.create(
        conversation=conv, round=round_, tool_name=name, duration_ms=duration, started_at=at, success=success,
        status="ok" if success else "error", retry_count=retries, observation_tokens=tokens,
        observation="result", **span_ids(),
    )



@pytest.fixture
def api(db) -> APIClient:
    return client_with(ApiKey.generate("reader", scope=Scope.READ)[1])


# --- who may read ----------------------------------------------------------------------------


def test_reading_without_credentials_is_a_json_401(db):
    reply = client_with().get("/api/conversations/")

    assert reply.status_code == 401
    assert reply.json() == {"detail": "Authentication credentials were not provided."}


def test_an_ingest_key_cannot_read(db):
    raw = ApiKey.generate("agent", scope=Scope.INGEST)[1]

    reply = client_with(raw).get("/api/tools/stats/")

    assert reply.status_code == 403
    assert "read scope" in reply.json()["detail"]


def test_a_revoked_read_key_is_refused(db):
    key, raw = ApiKey.generate("reader", scope=Scope.READ)
    assert client_with(raw).get("/api/conversations/").status_code == 200
    key.revoke()

    reply = client_with(raw).get("/api/conversations/")

    assert reply.status_code == 401
    assert reply.json()["detail"] == "Invalid or revoked API key."


def test_a_logged_in_user_may_read(bob):
    client = APIClient()
    client.force_login(bob)

    assert client.get("/api/conversations/").status_code == 200


def test_an_unknown_api_path_is_a_json_404(api):
    reply = api.get("/api/no-such-thing/")

    assert reply.status_code == 404
    assert "No such API endpoint" in reply.json()["detail"]


def test_a_missing_trailing_slash_is_pointed_out(api):
    reply = api.get("/api/conversations")

    assert reply.status_code == 404
    assert "/api/conversations/ (with the trailing slash)" in reply.json()["detail"]


# --- conversations ---------------------------------------------------------------------------


def test_conversations_are_paged_newest_activity_first(api):
    for i in range(7):
        conversation(f"c{i}", at=T0 + timedelta(hours=i))

    first = api.get("/api/conversations/?limit=3").json()
    second = api.get("/api/conversations/?limit=3&offset=3").json()

    assert first["count"] == 7
    assert [c["external_id"] for c in first["results"]] == ["c6", "c5", "c4"]
    assert [c["external_id"] for c in second["results"]] == ["c3", "c2", "c1"]
    assert "offset=6" in first["next"] or "offset=6" in second["next"]


def test_the_page_size_is_capped(api):
    Conversation.objects.bulk_create(
        [Conversation(external_id=f"c{i}", started_at=T0, last_activity_at=T0) for i in range(510)]
    )

    reply = api.get("/api/conversations/?limit=100000").json()

    assert reply["count"] == 510
    assert len(reply["results"]) == 500


def test_conversations_filter_by_time_model_status_and_search(api):
    old = conversation("old", at=T0 - timedelta(days=3), agent_name="archiver", status=Status.OK)
    new = conversation("support-7", at=T0, title="Refund for order 9", agent_name="helper", status=Status.RUNNING)
    LLMCall.objects.create(conversation=new, model="claude-sonnet-4", started_at=T0, **span_ids())
    LLMCall.objects.create(conversation=old, model="gpt-4o", started_at=T0, **span_ids())

    def ids(query: str) -> list[str]:
        reply = api.get(f"/api/conversations/?{query}")
        assert reply.status_code == 200, reply.json()
        return [c["external_id"] for c in reply.json()["results"]]

    assert ids("since=2026-05-01T00:00:00Z") == ["support-7"]
    assert ids("until=2026-04-30T00:00:00Z") == ["old"]
    assert ids("model=gpt-4o") == ["old"]
    assert ids("status=running") == ["support-7"]
    assert ids("search=REFUND") == ["support-7"]
    assert ids("search=archiv") == ["old"]
    assert ids("search=port-7") == ["support-7"]
    assert ids("search=nothing-like-it") == []


@pytest.mark.parametrize(
    ("query", "field"),
    [("since=last-tuesday", "since"), ("status=sleeping", "status"),
     ("since=2026-05-02T00:00Z&until=2026-05-01T00:00Z", "until")],
)
def test_bad_conversation_filters_are_field_errors(api, query, field):
    reply = api.get(f"/api/conversations/?{query}")

    assert reply.status_code == 400
    assert field in reply.json()


def test_a_conversation_shows_its_rounds_calls_and_totals(api):
    conv = conversation("c1")
    first = add_round(conv, "r1", at=T0, llm_calls=2, tool_calls=1)
    second = add_round(conv, "r2", at=T0 + timedelta(minutes=1), llm_calls=1, tool_calls=2)
    failed = tool_call(conv, second, "fetch", 5.0, at=T0 + timedelta(minutes=1, seconds=9), success=False)
    LLMCall.objects.create(conversation=conv, round=second, model="gpt-4o", status="error", input_tokens=7,
                           started_at=T0 + timedelta(minutes=2), **span_ids())
    CompressionEvent.objects.create(conversation=conv, round=first, strategy="truncate", occurred_at=T0,
                                    tokens_before=900, tokens_after=300, **span_ids())
    SkillActivation.objects.create(conversation=conv, round=second, skill_name="pdf", activated_at=T0, **span_ids())

    reply = api.get(f"/api/conversations/{conv.id}/")

    assert reply.status_code == 200
    body = reply.json()
    # rows written by hand here carry no cost: every call counts as unpriced
    assert body["totals"] == {"input_tokens": 307, "output_tokens": 30, "llm_calls": 4, "tool_calls": 4, "errors": 2,
                              "cost_usd": None, "unpriced_llm_calls": 4}
    assert [r["key"] for r in body["rounds"]] == ["r1", "r2"]
    r1, r2 = body["rounds"]
    assert [c["model"] for c in r1["llm_calls"]] == ["gpt-4o", "gpt-4o"]
    assert r1["user_message"] == "question r1" and r1["final_answer"] == "answer r1"
    assert r1["compressions"][0]["tokens_saved"] == 600
    assert [t["tool_name"] for t in r2["tool_calls"]] == ["search", "search", "fetch"]
    assert r2["tool_calls"][2]["id"] == failed.id and r2["tool_calls"][2]["success"] is False
    assert r2["skill_activations"][0]["skill_name"] == "pdf"


def test_the_conversation_detail_query_count_does_not_grow_with_its_size(api, django_assert_max_num_queries):
    small = conversation("small")
    add_round(small, "r1")
    big = conversation("big")
    for i in range(30):
        add_round(big, f"r{i}", at=T0 + timedelta(minutes=i), llm_calls=3, tool_calls=4)

    assert api.get(f"/api/conversations/{small.id}/").status_code == 200  # the key's last_used_at is written once
    with django_assert_max_num_queries(12) as small_queries:
        assert api.get(f"/api/conversations/{small.id}/").status_code == 200
    with django_assert_max_num_queries(12) as big_queries:
        reply = api.get(f"/api/conversations/{big.id}/?rounds_limit=30")

    assert len(reply.json()["rounds"]) == 30
    assert len(big_queries.captured_queries) == len(small_queries.captured_queries)


def test_a_long_conversation_gives_its_rounds_a_page_at_a_time(api):
    conv = conversation("long")
    Round.objects.bulk_create([Round(conversation=conv, key=f"r{i:03}", started_at=T0 + timedelta(seconds=i))
                               for i in range(230)])

    first = api.get(f"/api/conversations/{conv.id}/").json()
    seen = [r["key"] for r in first["rounds"]]
    reply = first
    while reply["rounds_next"]:
        reply = api.get(reply["rounds_next"]).json()
        seen += [r["key"] for r in reply["rounds"]]
    widest = api.get(f"/api/conversations/{conv.id}/?rounds_limit=500").json()
    past_the_end = api.get(f"/api/conversations/{conv.id}/?rounds_offset={2**31 - 1}").json()

    assert first["rounds_total"] == 230 and len(first["rounds"]) == 10
    assert "rounds_offset=10" in first["rounds_next"]
    assert seen == [f"r{i:03}" for i in range(230)]
    assert reply["rounds_next"] is None
    assert len(widest["rounds"]) == 230 and widest["rounds_next"] is None
    assert past_the_end["rounds"] == [] and past_the_end["rounds_total"] == 230


@pytest.mark.parametrize("query", ["rounds_limit=501", "rounds_limit=0", "rounds_offset=-1", "rounds_limit=many",
                                   f"rounds_offset={2**63}"])
def test_a_round_page_out_of_bounds_is_a_field_error(api, query):
    conv = conversation("c1")

    reply = api.get(f"/api/conversations/{conv.id}/?{query}")

    assert reply.status_code == 400
    assert query.split("=")[0] in reply.json()


def test_a_missing_conversation_is_a_json_404(api):
    reply = api.get("/api/conversations/999999/")

    assert reply.status_code == 404
    assert "detail" in reply.json()


# --- tool statistics -------------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/tools/stats/", "/api/models/stats/"])
def test_a_window_edge_at_the_end_of_time_is_read_as_open_or_empty(api, path):
    conv = conversation("c1")
    tool_call(conv, None, "search", 40, tokens=100)
    LLMCall.objects.create(conversation=conv, model="gpt-4o", started_at=T0, input_tokens=10, **span_ids())
    everything = api.get(path).json()
    assert everything

    until = api.get(path, {"until": "9999-12-31T23:59:59Z"})
    between = api.get(path, {"since": "2026-01-01T00:00:00Z", "until": "9999-12-31T23:59:00Z"})
    after = api.get(path, {"since": "9999-12-31T00:00:01Z"})

    assert (until.status_code, between.status_code, after.status_code) == (200, 200, 200)
    assert until.json() == between.json() == everything
    assert after.json() == []


def test_tool_stats_match_figures_computed_by_hand(api):
    conv = conversation("c1")
    # search: durations 10, 20, 30, 40, 100 (and one without a duration)
    for duration, ok, retries, tokens in [(40, True, 0, 100), (10, True, 1, 200), (100, False, 2, 0),
                                          (30, True, 0, 300), (20, True, 0, 400), (None, False, 0, 0)]:
        tool_call(conv, None, "search", duration, success=ok, retries=retries, tokens=tokens)
    # calc: 1, 2, 3, 4 — an even count
    for duration in (4, 1, 3, 2):
        tool_call(conv, None, "calc", duration, tokens=10)
    tool_call(conv, None, "fetch", 5)

    # Over a window the percentiles come from the rollups' sketch: within 2 % of the exact ones.
    window = {s["tool_name"]: s for s in api.get("/api/tools/stats/").json()}
    stats = {s["tool_name"]: s for s in api.get(f"/api/tools/stats/?conversation={conv.pk}").json()}
    for name, exact in stats.items():
        for key in ("p50_duration_ms", "p95_duration_ms", "p99_duration_ms"):
            assert window[name][key] == pytest.approx(exact[key], rel=0.02)
        assert {k: v for k, v in window[name].items() if not k.startswith("p")} == pytest.approx(
            {k: v for k, v in exact.items() if not k.startswith("p")})

    search = stats["search"]
    assert (search["calls"], search["successes"], search["failures"], search["retries"]) == (6, 4, 2, 3)
    assert search["success_rate"] == pytest.approx(4 / 6)
    assert search["avg_duration_ms"] == pytest.approx(40.0)  # (10+20+30+40+100) / 5
    assert search["p50_duration_ms"] == pytest.approx(30.0)
    assert search["p95_duration_ms"] == pytest.approx(88.0)  # rank 0.95*4 = 3.8: 40 + 0.8 * (100-40)
    assert search["avg_observation_tokens"] == pytest.approx(1000 / 6)
    assert search["total_observation_tokens"] == 1000
    calc = stats["calc"]
    assert calc["p50_duration_ms"] == pytest.approx(2.5)
    assert calc["p95_duration_ms"] == pytest.approx(3.85)  # rank 2.85: 3 + 0.85 * 1
    assert calc["success_rate"] == 1.0
    assert stats["fetch"]["p50_duration_ms"] == stats["fetch"]["p95_duration_ms"] == pytest.approx(5.0)
    assert list(stats) == ["search", "calc", "fetch"]  # most called first


def test_tool_stats_on_many_calls_match_a_sorted_list(api):
    conv = conversation("c1")
    durations = [((i * 7919) % 1000) / 10 for i in range(1, 402)]  # 401 distinct-ish values, shuffled
    ToolCall.objects.bulk_create([
        ToolCall(conversation=conv, tool_name="grep", duration_ms=d, started_at=T0, **span_ids()) for d in durations
    ])
    rebuild_rollups()  # bulk_create bypasses the ORM signals that keep them
    ordered = sorted(durations)

    (grep,) = api.get(f"/api/tools/stats/?conversation={conv.pk}").json()  # exact: from the calls
    (window,) = api.get("/api/tools/stats/").json()  # from the rollups: within 2 %

    for figures, rel in ((grep, 1e-9), (window, 0.02)):
        assert figures["p50_duration_ms"] == pytest.approx(ordered[200], rel=rel)  # rank 0.5 * 400 = 200 exactly
        rank = 0.95 * 400  # 380
        assert figures["p95_duration_ms"] == pytest.approx(ordered[int(rank)], rel=rel)


def test_tool_stats_filter_by_conversation_and_time_window(api):
    one, two = conversation("one"), conversation("two")
    with time_machine.travel(T0 + timedelta(hours=2), tick=False):
        tool_call(one, None, "search", 10, at=T0 + timedelta(hours=1, minutes=30))  # inside the last hour
        tool_call(one, None, "search", 20, at=T0)  # two hours ago
        tool_call(two, None, "fetch", 30, at=T0 + timedelta(hours=1, minutes=45))

        def names(query: str) -> dict[str, int]:
            reply = api.get(f"/api/tools/stats/?{query}")
            assert reply.status_code == 200, reply.json()
            return {s["tool_name"]: s["calls"] for s in reply.json()}

        assert names("") == {"search": 2, "fetch": 1}
        assert names("window=1h") == {"search": 1, "fetch": 1}
        assert names(f"conversation={one.id}") == {"search": 2}
        assert names(f"conversation={one.id}&window=1h") == {"search": 1}
        assert names("since=2026-05-01T12:00:00Z&until=2026-05-01T13:00:00Z") == {"search": 1}
        assert names("tool=fetch") == {"fetch": 1}
        assert names(f"conversation={two.id}&tool=search") == {}


@pytest.mark.parametrize("query", ["window=soon", "window=0h", "window=1h&since=2026-05-01T00:00Z", "conversation=x",
                                   "window=999999w", "window=36501d"])
def test_bad_tool_stats_filters_are_field_errors(api, query):
    reply = api.get(f"/api/tools/stats/?{query}")

    assert reply.status_code == 400
    assert reply.json()


def test_a_window_of_a_hundred_years_is_the_longest(api):
    assert api.get("/api/tools/stats/?window=5200w").status_code == 200
    reply = api.get("/api/tools/stats/?window=999999w")
    assert reply.status_code == 400
    assert "100 years" in reply.json()["window"][0]


# --- compressions ----------------------------------------------------------------------------


def test_compressions_list_and_detail(api):
    conv = conversation("c1")
    other = conversation("c2")
    compression = CompressionEvent.objects.create(
        conversation=conv, strategy="summarize", occurred_at=T0, tokens_before=9000, tokens_after=2500,
        messages_before=3, messages_after=2, tokens_before_by_category={"tool_observations": 8000},
        tokens_after_by_category={"compressed_summaries": 1500},
        before_messages=[{"role": "user", "parts": [{"type": "text", "content": "a"}]}] * 3,
        after_messages=[{"role": "user", "parts": [{"type": "text", "content": "b"}]}] * 2,
        dropped=[1], summarised=[0, 2], summary="short", **span_ids(),
    )
    CompressionEvent.objects.create(conversation=other, strategy="truncate", occurred_at=T0 - timedelta(days=1),
                                    **span_ids())

    listing = api.get(f"/api/compressions/?conversation={conv.id}").json()
    detail = api.get(f"/api/compressions/{compression.id}/").json()

    assert listing["count"] == 1
    assert listing["results"][0]["tokens_saved"] == 6500
    assert "before_messages" not in listing["results"][0]
    assert detail["before_messages"][0]["parts"][0]["content"] == "a"
    assert len(detail["after_messages"]) == 2
    assert (detail["dropped"], detail["summarised"], detail["summary"]) == ([1], [0, 2], "short")
    assert detail["tokens_before_by_category"] == {"tool_observations": 8000}
    assert api.get("/api/compressions/?strategy=truncate").json()["count"] == 1
    assert api.get("/api/compressions/?since=2026-05-01T00:00Z").json()["count"] == 1
    assert api.get("/api/compressions/424242/").status_code == 404


# --- artifacts ------------------------------------------------------------------------------


def test_artifacts_are_listed_and_their_content_streams(api, artifact_dir):
    artifact = make_artifact(artifact_dir, b"line one\nline two\n", mime="text/plain")

    listing = api.get("/api/artifacts/").json()
    reply = api.get(f"/api/artifacts/{artifact.artifact_id}/content")

    assert listing["results"][0]["artifact_id"] == artifact.artifact_id
    assert listing["results"][0]["content_url"] == f"/api/artifacts/{artifact.artifact_id}/content"
    assert str(artifact_dir) not in str(listing)
    assert reply.status_code == 200
    assert b"".join(reply.streaming_content) == b"line one\nline two\n"
    assert reply["Content-Disposition"].startswith("attachment")
    assert reply["X-Content-Type-Options"] == "nosniff"
    assert str(artifact_dir) not in str(reply.headers)


@pytest.mark.parametrize("bad_id", ["artifact_XYZ", "artifact_0123", "secret_key", "artifact_..%2F..%2Fsecret_key"])
def test_an_invalid_artifact_id_is_a_json_404(api, artifact_dir, bad_id):
    (artifact_dir.parent / "secret_key").write_text("do not serve")

    reply = api.get(f"/api/artifacts/{bad_id}/content")

    assert reply.status_code == 404
    assert "detail" in reply.json()
    assert b"do not serve" not in reply.content


def test_an_artifact_whose_file_is_gone_is_a_json_404(api, artifact_dir):
    artifact = make_artifact(artifact_dir, b"data")
    (artifact_dir / artifact.artifact_id).unlink()

    reply = api.get(f"/api/artifacts/{artifact.artifact_id}/content")

    assert reply.status_code == 404
    assert reply.json() == {"detail": "The artifact's content is gone."}
    assert str(artifact_dir) not in reply.content.decode()


def test_an_expired_artifact_is_not_served(api, artifact_dir):
    artifact = make_artifact(artifact_dir, b"old", expires_in=timedelta(hours=-1))

    reply = api.get(f"/api/artifacts/{artifact.artifact_id}/content")

    assert reply.status_code == 404
    assert api.get("/api/artifacts/?expired=true").json()["count"] == 1
    assert api.get("/api/artifacts/?expired=false").json()["count"] == 0


def test_artifact_content_needs_the_read_scope(db, artifact_dir):
    artifact = make_artifact(artifact_dir, b"data")
    raw = ApiKey.generate("agent", scope=Scope.INGEST)[1]

    assert client_with().get(f"/api/artifacts/{artifact.artifact_id}/content").status_code == 401
    assert client_with(raw).get(f"/api/artifacts/{artifact.artifact_id}/content").status_code == 403
