"""sql.row_maker builds the unsaved rows ingest inserts exactly as the model's constructor does."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from django.db import models
from django.db.models.signals import post_init

from pipeline.ingest.write import sql
from pipeline.models import Conversation, LLMCall, ToolCall

AT = datetime(2025, 11, 22, 8, 30, tzinfo=UTC)
VALUES = {
    LLMCall: {"trace_id": "a" * 32, "span_id": "b" * 16, "conversation_id": 3, "round_id": 7, "started_at": AT,
              "ended_at": AT, "duration_ms": 12.5, "status": "ok", "model": "gpt-4o", "input_tokens": 10,
              "input_messages": [{"role": "user", "parts": []}], "context_composition": {"user": 10}},
    ToolCall: {"trace_id": "a" * 32, "span_id": "c" * 16, "conversation_id": 3, "round_id": 7, "started_at": AT,
               "tool_name": "search", "arguments": {"q": "x"}, "observation": "3 hits", "success": True,
               "tokens_pending": True},
}


def _state(row) -> tuple[dict, bool, str | None]:
    attributes = {k: v for k, v in vars(row).items() if k != "_state"}
    return attributes, row._state.adding, row._state.db


@pytest.mark.parametrize("model", VALUES)
def test_a_made_row_is_the_row_the_constructor_makes(model):
    make = sql.row_maker(model)
    assert make is not model  # the fast path is taken for the ingest's models
    made, built = make(**VALUES[model]), model(**VALUES[model])
    assert _state(made) == _state(built)
    assert list(vars(made)) == list(vars(built))  # the fields in the constructor's order too
    assert made.conversation_id == 3 and made.pk is None
    other = make(**VALUES[model])
    for name, value in vars(made).items():  # mutable defaults are fresh per row, as the constructor's
        if isinstance(value, dict | list) and name not in VALUES[model]:
            assert value is not getattr(other, name)


def test_a_related_instance_goes_through_the_constructor():
    conversation = Conversation(id=5)
    values = {k: v for k, v in VALUES[ToolCall].items() if k != "conversation_id"}
    made = sql.row_maker(ToolCall)(**values, conversation=conversation)
    assert made.conversation is conversation and made.conversation_id == 5


def test_a_model_with_an_init_receiver_is_built_by_its_constructor():
    def receiver(**kwargs):
        pass

    post_init.connect(receiver, sender=ToolCall)
    try:
        assert sql.row_maker(ToolCall) is ToolCall
    finally:
        post_init.disconnect(receiver, sender=ToolCall)


@pytest.mark.parametrize(("field", "constant"), [
    (models.CharField(max_length=5), True),  # "" for every row
    (models.IntegerField(null=True), True),  # None
    (models.CharField(max_length=5, default="x"), True),  # the same object, as the constructor sets it
    (models.JSONField(default=dict), False),  # a fresh dict per row
    (models.IntegerField(db_default=1), False),  # a fresh DatabaseDefault per row
])
def test_a_default_that_is_one_value_for_every_row_is_told_from_one_made_per_row(field, constant):
    assert sql._constant_default(field) is constant
