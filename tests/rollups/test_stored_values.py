"""The rollups read stored rows with a raw SELECT and the ORM's own converters: the values must be
what `.values()` gives, types included (a boolean stored as 0/1 on SQLite, a decimal cost, an
aware datetime, a JSON dict), or an update or delete would take out other figures than it put in."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pipeline.models import CompressionEvent, Conversation, LLMCall, ToolCall
from pipeline.rollups.figures import COLUMNS, KIND_OF
from pipeline.rollups.track import _stored_values_by_id
from tests.dashboard_fixtures import make_conversation

pytestmark = pytest.mark.django_db


def test_stored_values_are_what_the_orm_reads():
    demo = make_conversation(rounds=3)
    tools = list(ToolCall.objects.filter(conversation=demo.conversation).order_by("pk"))
    ToolCall.objects.filter(pk=tools[0].pk).update(success=False, cache_hit=True, error_type="TimeoutError",
                                                   context_cost_usd=Decimal("0.000125"),
                                                   tokens_at_level={"brief": 10, "full": 300})
    ToolCall.objects.filter(pk=tools[1].pk).update(duration_ms=None, context_cost_usd=None, tokens_at_level=None)
    LLMCall.objects.filter(conversation=demo.conversation).update(cost_usd=Decimal("0.0042"))
    checked, compared = 0, set()
    for model in KIND_OF:
        ids = list(model.objects.order_by("pk").values_list("pk", flat=True))
        assert ids, model
        read = model.objects.filter(pk__in=ids).values("pk", *COLUMNS[KIND_OF[model]])
        expected = {row.pop("pk"): row for row in read}
        stored = _stored_values_by_id(model, ids + [max(ids) + 1000])  # an id no longer stored is left out
        assert stored == expected
        for pk, row in stored.items():
            for name, value in row.items():
                assert type(value) is type(expected[pk][name]), (model.__name__, name, value)
                checked += 1
        compared.add(model)
    assert {True, False} <= {row["success"] for row in _stored_values_by_id(ToolCall, [t.pk for t in tools]).values()}
    assert compared >= {CompressionEvent, Conversation, LLMCall, ToolCall} and checked > 50
