"""GET /api/rounds/<id>/spans/: one turn's spans as a tree on a time axis (dashboard.waterfall).

The serializers here document the response in /api/schema/; the view returns the waterfall's
plain dicts as they are, because DRF serializer fields cost tens of microseconds each and a turn
may have 2,000 spans of twenty fields (tests check that the two agree).
"""

from __future__ import annotations

from drf_spectacular.utils import extend_schema
from rest_framework import serializers
from rest_framework.exceptions import NotFound
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dashboard.api.views import ERROR, READ_ERRORS, ReadApi
from dashboard.waterfall import MAX_SPANS, SHOWN_ATTRIBUTES, round_waterfall
from pipeline.models import Round, SpanKind

MAX_ID = 2**63 - 1  # past a 64-bit integer no row has the id (and the database driver overflows)


class TimelineEntrySerializer(serializers.Serializer):
    type = serializers.ChoiceField(choices=["llm", "tool", "compression"])
    id = serializers.IntegerField(help_text="The LLM call's, tool call's or compression's id.")
    anchor = serializers.CharField(help_text="The id of its element on the conversation page, e.g. `llm-12`.")
    url = serializers.CharField(help_text="The conversation page, scrolled to the entry.")


class WaterfallSpanSerializer(serializers.Serializer):
    span_id = serializers.CharField()
    parent_span_id = serializers.CharField(help_text="As the span states it; empty for a root.")
    depth = serializers.IntegerField(help_text="0 for the spans at the root level.")
    orphan = serializers.BooleanField(
        help_text="Names a parent that is not in the turn (never sent, or past the cap): shown at the root level.")
    name = serializers.CharField()
    kind = serializers.ChoiceField(choices=SpanKind.choices)
    status = serializers.ChoiceField(choices=["unset", "ok", "error"])
    status_message = serializers.CharField(help_text="At most 500 characters.")
    start_offset_ms = serializers.FloatField(help_text="From the turn's first span.")
    duration_ms = serializers.FloatField(allow_null=True, help_text="null while the span is running.")
    running = serializers.BooleanField()
    model = serializers.CharField(help_text="The LLM call's model; empty for other spans.")
    tool_name = serializers.CharField(help_text="The tool call's tool; empty for other spans.")
    input_tokens = serializers.IntegerField(allow_null=True)
    output_tokens = serializers.IntegerField(allow_null=True)
    langgraph_node = serializers.CharField(help_text="The LangGraph node the span ran in, when the span says.")
    attributes = serializers.DictField(
        child=serializers.JSONField(),
        help_text="Those of these attributes the span has, texts cut at 200 characters: " + ", ".join(SHOWN_ATTRIBUTES))
    timeline = TimelineEntrySerializer(allow_null=True, help_text="For LLM calls, tool calls and compressions.")


class WaterfallSerializer(serializers.Serializer):
    round_id = serializers.IntegerField()
    conversation_id = serializers.IntegerField()
    trace_id = serializers.CharField()
    started_at = serializers.DateTimeField(help_text="When the turn's first span started.")
    duration_ms = serializers.FloatField(help_text="From the first span's start to the last span's end: the time axis.")
    span_count = serializers.IntegerField(help_text="Spans in the turn.")
    spans_omitted = serializers.IntegerField(help_text=f"Spans past the first {MAX_SPANS} by start time, left out.")
    max_spans = serializers.IntegerField()
    spans = WaterfallSpanSerializer(many=True, help_text="Depth first, siblings by start time.")


class RoundSpansView(ReadApi, APIView):
    @extend_schema(
        responses={200: WaterfallSerializer, 404: ERROR, **READ_ERRORS},
        summary="One turn's spans as a tree with a time axis: LLM and tool calls, and every other span "
                "(agent, chains, LangGraph nodes, retrievers)",
    )
    def get(self, request: Request, pk: int) -> Response:
        round_ = Round.objects.filter(pk=pk).first() if 0 < pk <= MAX_ID else None
        if round_ is None:
            raise NotFound("No such round.")
        waterfall = round_waterfall(round_)
        # Dates as the other serializers write them (DRF's JSON encoder would cut them to milliseconds).
        started_at = serializers.DateTimeField().to_representation(waterfall["started_at"])
        return Response({**waterfall, "started_at": started_at})
