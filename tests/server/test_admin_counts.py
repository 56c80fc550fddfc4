"""Token counts and costs follow an admin edit of an LLM call or a tool call (pipeline.admin.counts):
the counts the edit made stale are counted again by the deferred run, for the new model or text."""

from __future__ import annotations

from decimal import Decimal

import pytest

from pipeline.ingest.records import SpanRecord
from pipeline.ingest.write import deferred
from pipeline.ingest.write.precount import count_observation, counting_key
from pipeline.ingest.write.store import store_spans
from pipeline.insight.costs import llm_call_cost
from pipeline.insight.levels import result_data, tokens_at_levels
from pipeline.models import LLMCall, ToolCall
from pipeline.rollups.compact import rebuild_rollups
from tests import genai_spans
from tests.admin_forms import edit_in_the_admin
from tests.stored_rollups import rollup_rows

pytestmark = pytest.mark.django_db

TRACE = "5" * 32
CLAUDE = "claude-3-5-sonnet-20241022"
OBSERVATION = "3 hits: ctxlens, 上下文, {\"score\": 0.93}"


def chat(span_id: str, start: int, model: str, requested: tuple[str, ...] = ()) -> SpanRecord:
    return genai_spans.chat(TRACE, span_id, start, model, requested)


def tool(span_id: str, start: int, call_id: str, **attributes) -> SpanRecord:
    span = genai_spans.tool(TRACE, span_id, start, OBSERVATION, call_id)
    span.attributes.update(attributes)
    return span


def a_turn(model: str = "gpt-4o", **tool_attributes) -> ToolCall:
    """A gpt-4o call that asked for a tool, the tool (counted for gpt-4o), and a claude call."""
    store_spans([chat("00000000000000c1", 1, model, requested=("call_1",)),
                 tool("00000000000000d1", 3, "call_1", **tool_attributes),
                 chat("00000000000000c2", 5, CLAUDE)])
    deferred.complete_pending()
    stored = ToolCall.objects.get()
    assert stored.llm_call.model == model and not (stored.tokens_pending or stored.levels_pending)
    return stored


def counts(row: ToolCall) -> tuple[int, bool, bool]:
    return row.observation_tokens, row.tokens_estimated, row.tokens_approximate


def edited(client, row, callbacks, **changed):
    """`row` edited in the admin; the deferred run scheduled at commit (asserted), then completed here."""
    with callbacks() as scheduled:
        edit_in_the_admin(client, row, **changed)
    assert (deferred.schedule in scheduled) == bool(
        ToolCall.objects.filter(tokens_pending=True).exists() or ToolCall.objects.filter(levels_pending=True).exists())
    deferred.complete_pending()
    return type(row).objects.get(pk=row.pk)


@pytest.fixture
def admin_client(client, alice):
    client.force_login(alice)
    return client


def test_a_tool_linked_to_a_call_of_another_encoding_in_the_admin_is_counted_for_it(
        admin_client, django_capture_on_commit_callbacks):
    stored = a_turn(**{"ctxlens.tool.output_level": "full"})
    assert counts(stored) == count_observation(OBSERVATION, "gpt-4o") != count_observation(OBSERVATION, CLAUDE)
    assert stored.tokens_at_level == tokens_at_levels(result_data(OBSERVATION), "gpt-4o")
    claude_call = LLMCall.objects.get(model=CLAUDE)

    after = edited(admin_client, stored, django_capture_on_commit_callbacks, llm_call=claude_call.pk)

    assert after.llm_call_id == claude_call.pk
    assert counts(after) == count_observation(OBSERVATION, CLAUDE)
    assert after.tokens_at_level == tokens_at_levels(result_data(OBSERVATION), CLAUDE)


def test_a_tool_linked_to_a_call_that_counts_alike_keeps_its_counts(admin_client, django_capture_on_commit_callbacks):
    stored = a_turn()
    store_spans([chat("00000000000000c3", 7, "gpt-4o-mini")])
    assert counting_key("gpt-4o-mini") == counting_key("gpt-4o")
    mini = LLMCall.objects.get(model="gpt-4o-mini")

    with django_capture_on_commit_callbacks() as scheduled:
        edit_in_the_admin(admin_client, stored, llm_call=mini.pk)

    after = ToolCall.objects.get()
    assert after.llm_call_id == mini.pk and not (after.tokens_pending or after.levels_pending)
    assert deferred.schedule not in scheduled
    assert counts(after) == counts(stored)


@pytest.mark.parametrize("reported", [False, True], ids=["counted", "reported by its span"])
def test_a_call_given_another_model_in_the_admin_has_its_tools_counted_for_it(
        admin_client, django_capture_on_commit_callbacks, reported):
    stored = a_turn(**({"ctxlens.tool.observation_tokens": 999} if reported else {}),
                    **{"ctxlens.tool.output_level": "full"})
    call = stored.llm_call

    edited(admin_client, call, django_capture_on_commit_callbacks, model=CLAUDE)

    after = ToolCall.objects.get()
    assert after.observation_tokens == (999 if reported else count_observation(OBSERVATION, CLAUDE)[0])
    assert after.tokens_at_level == tokens_at_levels(result_data(OBSERVATION), CLAUDE)


def test_an_observation_edited_in_the_admin_is_counted_even_where_its_span_reported_the_old_ones(
        admin_client, django_capture_on_commit_callbacks):
    stored = a_turn(**{"ctxlens.tool.observation_tokens": 999})
    new = "a shorter result"

    after = edited(admin_client, stored, django_capture_on_commit_callbacks, observation=new)

    assert after.observation == new
    assert counts(after) == count_observation(new, "gpt-4o")
    assert not after.tokens_reported


def test_a_count_typed_in_the_admin_with_the_observation_is_kept(admin_client, django_capture_on_commit_callbacks):
    stored = a_turn()

    after = edited(admin_client, stored, django_capture_on_commit_callbacks, observation="new text",
                   observation_tokens=42)

    assert (after.observation, after.observation_tokens, after.tokens_pending) == ("new text", 42, False)


def test_a_tool_taken_below_the_full_level_in_the_admin_has_no_tokens_at_each_level(
        admin_client, django_capture_on_commit_callbacks):
    stored = a_turn(**{"ctxlens.tool.output_level": "full"})
    assert stored.tokens_at_level

    after = edited(admin_client, stored, django_capture_on_commit_callbacks, output_level="brief")

    assert (after.output_level, after.tokens_at_level, after.levels_pending) == ("brief", None, False)


def test_a_call_given_another_model_in_the_admin_is_priced_at_it(admin_client, django_capture_on_commit_callbacks):
    call = a_turn().llm_call
    assert call.cost_usd is not None

    after = edited(admin_client, call, django_capture_on_commit_callbacks, model=CLAUDE)

    assert after.cost_usd == llm_call_cost(after) != call.cost_usd


def test_a_cost_typed_in_the_admin_is_kept(admin_client, django_capture_on_commit_callbacks):
    call = a_turn().llm_call

    after = edited(admin_client, call, django_capture_on_commit_callbacks, input_tokens=5000, cost_usd="1.5")

    assert (after.input_tokens, after.cost_usd) == (5000, Decimal("1.5"))


def test_a_call_given_a_model_that_counts_alike_leaves_its_tools_counts(admin_client, django_capture_on_commit_callbacks):
    stored = a_turn(**{"ctxlens.tool.output_level": "full"})

    with django_capture_on_commit_callbacks() as scheduled:
        edit_in_the_admin(admin_client, stored.llm_call, model="gpt-4o-mini")

    after = ToolCall.objects.get()
    assert after.llm_call.model == "gpt-4o-mini" and not (after.tokens_pending or after.levels_pending)
    assert deferred.schedule not in scheduled
    assert (counts(after), after.tokens_at_level) == (counts(stored), stored.tokens_at_level)


def test_the_rollups_follow_the_tokens_at_each_level_an_edit_clears(admin_client, django_capture_on_commit_callbacks):
    stored = a_turn(**{"ctxlens.tool.output_level": "full"})
    assert stored.tokens_at_level

    edited(admin_client, stored, django_capture_on_commit_callbacks, output_level="brief")

    def days() -> list[tuple]:  # the rebuild keeps minutes and hours of the recent past only
        return [row for row in rollup_rows() if row[1] == "d"]

    incremental = days()
    rebuild_rollups()
    assert days() == incremental


def test_a_count_typed_while_the_tool_is_still_pending_is_kept(admin_client, django_capture_on_commit_callbacks):
    stored = a_turn()
    ToolCall.objects.filter(pk=stored.pk).update(tokens_pending=True)  # as a tool whose call is not in yet

    after = edited(admin_client, ToolCall.objects.get(), django_capture_on_commit_callbacks, observation_tokens=42)

    assert (after.observation_tokens, after.tokens_pending, after.tokens_reported) == (42, False, True)


def test_a_tool_unlinked_from_its_call_in_the_admin_is_counted_for_no_model(
        admin_client, django_capture_on_commit_callbacks):
    stored = a_turn(model=CLAUDE)
    assert counts(stored) == count_observation(OBSERVATION, CLAUDE) != count_observation(OBSERVATION, None)

    after = edited(admin_client, stored, django_capture_on_commit_callbacks, llm_call="")

    assert after.llm_call_id is None
    assert counts(after) == count_observation(OBSERVATION, None)


def test_an_observation_emptied_in_the_admin_counts_nothing_at_once(admin_client, django_capture_on_commit_callbacks):
    stored = a_turn(**{"ctxlens.tool.output_level": "full"})

    with django_capture_on_commit_callbacks() as scheduled:
        edit_in_the_admin(admin_client, stored, observation="")

    after = ToolCall.objects.get()  # no deferred run: nothing is left for it
    assert (after.observation_tokens, after.tokens_pending, after.tokens_at_level, after.levels_pending) == (
        0, False, None, False)
    assert deferred.schedule not in scheduled


def test_a_typed_count_is_exact_unless_the_form_says_otherwise(admin_client, django_capture_on_commit_callbacks):
    stored = a_turn()
    ToolCall.objects.filter(pk=stored.pk).update(tokens_estimated=True, tokens_approximate=True)

    after = edited(admin_client, ToolCall.objects.get(), django_capture_on_commit_callbacks, observation_tokens=42)

    assert (after.observation_tokens, after.tokens_estimated, after.tokens_approximate) == (42, False, False)
