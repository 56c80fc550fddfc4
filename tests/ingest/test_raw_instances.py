"""Rows read with hand-written SELECTs (pipeline.ingest.write.sql.instances) are the instances the
ORM reads: the same values (datetimes, JSON, booleans converted), the same deferred fields."""

from __future__ import annotations

import pytest

from pipeline.ingest.write import linking, sql
from pipeline.ingest.write.store import store_spans
from pipeline.models import Conversation, LLMCall, Round, ToolCall
from tests.ingest.test_otlp_store import agent_trace

pytestmark = pytest.mark.django_db


def _values(rows) -> list[tuple[dict, set[str], bool, str | None]]:
    """Each row's attributes with their types (0 == False: an int where the ORM gives a bool must show)."""
    return [({k: (type(v).__name__, v) for k, v in vars(r).items() if k != "_state"}, r.get_deferred_fields(),
             r._state.adding, r._state.db) for r in rows]


@pytest.mark.parametrize(("model", "names"), [(LLMCall, linking.LLM_FIELDS), (ToolCall, linking.TOOL_FIELDS)])
def test_a_rounds_rows_read_by_hand_are_the_orms(model, names):
    store_spans(agent_trace())
    round_ids = list(Round.objects.values_list("id", flat=True))
    by_hand = linking._in_rounds(model, names, round_ids)
    by_orm = list(model.objects.only(*names).filter(round_id__in=round_ids))
    assert len(by_hand) == model.objects.count() > 0
    assert sorted(_values(by_hand), key=lambda v: v[0]["id"][1]) == sorted(_values(by_orm), key=lambda v: v[0]["id"][1])


def test_a_conversation_read_by_hand_is_the_orms():
    store_spans(agent_trace())
    names = ("id", "external_id", "started_at", "title", "title_explicit")
    rows = sql.fetch(f"SELECT {sql.columns(names)} FROM {sql.table(Conversation)}")
    assert _values(sql.instances(Conversation, names, rows)) == _values(Conversation.objects.only(*names))
