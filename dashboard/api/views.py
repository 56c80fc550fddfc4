"""Read API: conversations, LLM calls, tool and model statistics, compressions and artifacts (session or
read-scope key)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.db.models import Count, Exists, OuterRef, Prefetch, Q, QuerySet, Sum
from django.http import FileResponse, Http404
from django.utils import timezone
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, serializers, viewsets
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import action
from rest_framework.exceptions import NotFound
from rest_framework.pagination import LimitOffsetPagination
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dashboard.api import serializers as s
from dashboard.paging import CappedLimitOffsetPagination
from pipeline.artifacts.store import ArtifactError, open_artifact
from pipeline.drf_auth import BearerKeyAuthentication, ReadAccess
from pipeline.insight.calls import call_diff
from pipeline.insight.findings import conversation_findings
from pipeline.insight.usage import llm_calls_in, model_usage, window_model_usage
from pipeline.models import Artifact, CompressionEvent, Conversation, LLMCall, ToolCall
from pipeline.stats import tool_calls_in, tool_stats, window_tool_stats

MAX_ID = 2**63 - 1  # past a 64-bit integer no column holds an id (and SQLite refuses to compare it)
ERROR = OpenApiResponse(description="JSON `{\"detail\": ...}`")
READ_ERRORS = {401: ERROR, 403: ERROR}


class ApiPagination(LimitOffsetPagination):
    default_limit = 50
    max_limit = 500


class ConversationPagination(CappedLimitOffsetPagination):
    """The conversations list, counted only some pages ahead (dashboard.paging): a store of a
    million conversations is not counted on every request."""

    default_limit = ApiPagination.default_limit
    max_limit = ApiPagination.max_limit


class RoundPagination(LimitOffsetPagination):
    """The rounds of one conversation's detail, oldest first (RoundPageQuery validates the values).
    Ten unless asked for more: each round carries its calls' messages."""

    default_limit = 10
    max_limit = 500
    limit_query_param = "rounds_limit"
    offset_query_param = "rounds_offset"


class ReadApi:
    authentication_classes = [BearerKeyAuthentication, SessionAuthentication]
    permission_classes = [ReadAccess]


def query_params(request: Request, serializer_class: type[serializers.Serializer]) -> dict[str, Any]:
    """Validated query parameters; a 400 with DRF's field errors when they are bad."""
    serializer = serializer_class(data=request.query_params)
    serializer.is_valid(raise_exception=True)
    return serializer.validated_data


def window_start(params: dict[str, Any]) -> datetime | None:
    """`since`, or now minus `window` when the query gives one (statistics queries)."""
    if params.get("window") is not None:
        return timezone.now() - params["window"]
    return params.get("since")


def in_range(qs: QuerySet, field: str, since: datetime | None, until: datetime | None) -> QuerySet:
    if since is not None:
        qs = qs.filter(**{f"{field}__gte": since})
    if until is not None:
        qs = qs.filter(**{f"{field}__lt": until})
    return qs


@extend_schema_view(
    list=extend_schema(parameters=[s.ConversationQuery], responses={200: s.ConversationSerializer, **READ_ERRORS},
                       summary="Conversations, newest activity first"),
    retrieve=extend_schema(parameters=[s.RoundPageQuery],
                           responses={200: s.ConversationDetailSerializer, 400: ERROR, 404: ERROR, **READ_ERRORS},
                           summary="One conversation: a page of its rounds with LLM calls and tool calls, and totals"),
)
class ConversationViewSet(ReadApi, viewsets.ReadOnlyModelViewSet):
    pagination_class = ConversationPagination

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return s.ConversationDetailSerializer if self.action == "retrieve" else s.ConversationSerializer

    def get_queryset(self) -> QuerySet[Conversation]:
        qs = Conversation.objects.order_by("-last_activity_at", "-id")
        if self.action in ("retrieve", "findings"):
            return qs
        params = query_params(self.request, s.ConversationQuery)
        # A conversation is in [since, until) when it was active at some point inside it.
        if params.get("since"):
            qs = qs.filter(last_activity_at__gte=params["since"])
        if params.get("until"):
            qs = qs.filter(started_at__lt=params["until"])
        if params.get("status"):
            qs = qs.filter(status=params["status"])
        if params.get("model"):
            model = params["model"]
            qs = qs.filter(Q(model=model) | Exists(LLMCall.objects.filter(conversation=OuterRef("pk"), model=model)))
        if params.get("search"):
            term = params["search"]
            qs = qs.filter(
                Q(external_id__icontains=term) | Q(title__icontains=term) | Q(agent_name__icontains=term)
            )
        return qs

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        query_params(request, s.RoundPageQuery)  # out-of-range values are a 400, not clamped
        conversation = self.get_object()
        page = RoundPagination()
        rounds = page.paginate_queryset(
            conversation.rounds.order_by("started_at", "id").prefetch_related(
                Prefetch("llm_calls", queryset=LLMCall.objects.order_by("started_at", "id")),
                Prefetch("tool_calls", queryset=ToolCall.objects.select_related("artifact").order_by("started_at", "id")),
                Prefetch("compressions", queryset=CompressionEvent.objects.order_by("occurred_at", "id")),
                "skill_activations",
            ),
            request, view=self,
        )
        # Every column in llm_conv_totals_idx (conversation_id counts the rows as id would): an
        # index-only read on PostgreSQL too, whose indexes, unlike SQLite's, do not carry the id.
        llm = LLMCall.objects.filter(conversation=conversation).aggregate(
            input_tokens=Sum("input_tokens"), output_tokens=Sum("output_tokens"), calls=Count("conversation"),
            errors=Count("conversation", filter=Q(status="error")), cost=Sum("cost_usd"),
            unpriced=Count("conversation", filter=Q(cost_usd__isnull=True)),
        )
        tools = ToolCall.objects.filter(conversation=conversation).aggregate(
            calls=Count("id"), errors=Count("id", filter=Q(success=False))
        )
        totals = {
            "input_tokens": llm["input_tokens"] or 0,
            "output_tokens": llm["output_tokens"] or 0,
            "llm_calls": llm["calls"],
            "tool_calls": tools["calls"],
            "errors": llm["errors"] + tools["errors"],
            "cost_usd": llm["cost"],
            "unpriced_llm_calls": llm["unpriced"],
        }
        context = {**self.get_serializer_context(), "totals": totals, "rounds": rounds,
                   "rounds_total": page.count, "rounds_next": page.get_next_link()}
        serializer = self.get_serializer(conversation, context=context)
        return Response(serializer.data)

    @extend_schema(responses={200: s.FindingListSerializer, 404: ERROR, **READ_ERRORS},
                   summary="What is wrong with the conversation's context, computed now from its stored calls")
    @action(detail=True, methods=["get"])
    def findings(self, request: Request, pk: str | None = None) -> Response:
        try:
            conversation = self.get_object()
        except Http404:
            raise NotFound("No such conversation.") from None
        return Response({"results": [finding.as_dict() for finding in conversation_findings(conversation)]})


@extend_schema_view(
    retrieve=extend_schema(responses={200: s.LLMCallDetailSerializer, 404: ERROR, **READ_ERRORS},
                           summary="One LLM call: its messages, tokens, context composition, and the diff of its "
                                   "input against the previous LLM call of the conversation"),
)
class LLMCallViewSet(ReadApi, mixins.RetrieveModelMixin, viewsets.GenericViewSet):
    serializer_class = s.LLMCallDetailSerializer
    queryset = LLMCall.objects.all()

    def get_object(self) -> LLMCall:
        raw = self.kwargs["pk"]
        # Any id no row can have (not a number, past a 64-bit integer) is just as unknown.
        call = (self.get_queryset().filter(pk=int(raw)).first()
                if raw.isascii() and raw.isdigit() and int(raw) <= MAX_ID else None)
        if call is None:
            raise Http404(f"No LLM call with id {raw[:40]!r}.")
        self.check_object_permissions(self.request, call)
        return call

    def retrieve(self, request: Request, *args: Any, **kwargs: Any) -> Response:
        call = self.get_object()
        return Response(self.get_serializer(call, context={**self.get_serializer_context(),
                                                           "diff": call_diff(call)}).data)


class ToolStatsView(ReadApi, APIView):
    @extend_schema(
        parameters=[s.ToolStatsQuery],
        responses={200: s.ToolStatsSerializer(many=True), 400: ERROR, **READ_ERRORS},
        summary="Per-tool statistics: calls, success rate, retries, cache hit rate, latency percentiles, observation "
                "tokens, what the results cost the context, and what another output level would have saved",
        description="Over a time window (no `conversation`) the figures come from rollups kept at ingest: counts, "
                    "sums and averages are exact; p50/p95/p99 are within 2 % of the exact percentiles (a "
                    "DDSketch-style histogram with log-spaced buckets). With `conversation` they are computed "
                    "from that conversation's calls, percentiles exact.",
    )
    def get(self, request: Request) -> Response:
        params = query_params(request, s.ToolStatsQuery)
        since = window_start(params)
        if params.get("conversation") is None:  # a time window: from the rollups
            found = window_tool_stats(since=since, until=params.get("until"), tool_name=params.get("tool"))
        else:
            found = tool_stats(tool_calls_in(since=since, until=params.get("until"),
                                             conversation_id=params["conversation"], tool_name=params.get("tool")))
        stats = [entry.as_dict() for entry in found]
        return Response(s.ToolStatsSerializer(stats, many=True).data)


class ModelStatsView(ReadApi, APIView):
    @extend_schema(
        parameters=[s.ModelStatsQuery],
        responses={200: s.ModelStatsSerializer(many=True), 400: ERROR, **READ_ERRORS},
        summary="Per-model usage: LLM calls, tokens and cost in USD, the costliest model first",
        description="Over a time window (no `conversation`) read from rollups kept at ingest; exact.",
    )
    def get(self, request: Request) -> Response:
        params = query_params(request, s.ModelStatsQuery)
        since = window_start(params)
        if params.get("conversation") is None:  # a time window: from the rollups
            usage = window_model_usage(since=since, until=params.get("until"), model=params.get("model"))
        else:
            usage = model_usage(llm_calls_in(since=since, until=params.get("until"),
                                             conversation_id=params["conversation"], model=params.get("model")))
        return Response(s.ModelStatsSerializer([u.as_dict() for u in usage], many=True).data)


@extend_schema_view(
    list=extend_schema(parameters=[s.CompressionQuery], responses={200: s.CompressionSummarySerializer, **READ_ERRORS},
                       summary="Context compressions, newest first"),
    retrieve=extend_schema(responses={200: s.CompressionDetailSerializer, 404: ERROR, **READ_ERRORS},
                           summary="One compression: messages before and after, tokens by category"),
)
class CompressionViewSet(ReadApi, viewsets.ReadOnlyModelViewSet):
    pagination_class = ApiPagination

    def get_serializer_class(self) -> type[serializers.Serializer]:
        return s.CompressionDetailSerializer if self.action == "retrieve" else s.CompressionSummarySerializer

    def get_queryset(self) -> QuerySet[CompressionEvent]:
        qs = CompressionEvent.objects.order_by("-occurred_at", "-id")
        if self.action == "retrieve":
            return qs
        # The list leaves out the (possibly large) message lists.
        qs = qs.defer("before_messages", "after_messages", "tokens_before_by_category",
                      "tokens_after_by_category", "dropped", "summarised", "summary")
        params = query_params(self.request, s.CompressionQuery)
        qs = in_range(qs, "occurred_at", params.get("since"), params.get("until"))
        if params.get("conversation"):
            qs = qs.filter(conversation_id=params["conversation"])
        if params.get("strategy"):
            qs = qs.filter(strategy=params["strategy"])
        return qs


@extend_schema_view(
    list=extend_schema(parameters=[s.ArtifactQuery], responses={200: s.ArtifactSerializer, **READ_ERRORS},
                       summary="Stored artifacts (large tool outputs), newest first"),
    retrieve=extend_schema(responses={200: s.ArtifactSerializer, 404: ERROR, **READ_ERRORS}),
)
class ArtifactViewSet(ReadApi, viewsets.ReadOnlyModelViewSet):
    serializer_class = s.ArtifactSerializer
    pagination_class = ApiPagination
    lookup_field = "artifact_id"
    lookup_value_regex = r"[^/]+"

    def get_queryset(self) -> QuerySet[Artifact]:
        qs = Artifact.objects.order_by("-created_at", "-id")
        if self.action != "list":
            return qs
        params = query_params(self.request, s.ArtifactQuery)
        if params.get("conversation"):
            qs = qs.filter(conversation_id=params["conversation"])
        if params.get("expired") is True:
            qs = qs.expired()
        elif params.get("expired") is False:
            qs = qs.exclude(expires_at__lte=timezone.now())
        return qs

    def get_object(self) -> Artifact:
        artifact_id = self.kwargs["artifact_id"]
        # Validate before any lookup: the id names a file, and nothing else may reach the disk.
        if not Artifact.is_valid_id(artifact_id):
            raise Http404("No such artifact.")
        artifact = self.get_queryset().filter(artifact_id=artifact_id).first()
        if artifact is None:
            raise Http404("No such artifact.")
        self.check_object_permissions(self.request, artifact)
        return artifact

    @extend_schema(
        responses={(200, "application/octet-stream"): OpenApiTypes.BINARY, 404: ERROR, **READ_ERRORS},
        summary="The artifact's content, as a download",
    )
    def content(self, request: Request, artifact_id: str) -> FileResponse:
        artifact = self.get_object()
        if artifact.is_expired:
            raise Http404("The artifact has expired.")
        try:
            handle = open_artifact(artifact)  # never follows a link out of the sandbox; the row's content
        except ArtifactError:
            raise Http404("The artifact's content is gone.") from None
        Artifact.objects.filter(pk=artifact.pk).update(last_accessed_at=timezone.now())
        response = FileResponse(handle, as_attachment=True, filename=artifact.artifact_id,
                                content_type=artifact.mime or "application/octet-stream")
        # Tool output is untrusted: never let a browser render it as a page of this origin.
        response["X-Content-Type-Options"] = "nosniff"
        response["Content-Security-Policy"] = "sandbox; default-src 'none'"
        return response
