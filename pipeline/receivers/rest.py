"""POST /api/ingest/: REST JSON events → SpanRecords → the same store as OTLP, in one transaction.

The flow is `pipeline.ingest.service`; this view only translates: the key is checked by
`IngestKeyAuthentication` (the service's check) before anything reads the body, the rate and
the declared size are checked before the body is read (`service.admit`), and the outcome
becomes a DRF response: `{"detail": <the service's message>}` for failures, field errors for
invalid events, `{"events": [<why>]}` when the store refuses a span (nothing is stored then).
"""

from __future__ import annotations

from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from pipeline.conf import ctxlens_config
from pipeline.drf_auth import IngestAccess, IngestKeyAuthentication, key_of
from pipeline.ingest import service
from pipeline.ingest.service import Failed, IngestRequest, Kind, Rejected
from pipeline.models import Conversation
from pipeline.receivers.rest_schema import INGEST_EXAMPLE, IngestRequestDoc


class IngestRefused(exceptions.APIException):
    """A failure of the ingest service, with its status and message (and Retry-After when it has one)."""

    def __init__(self, failed: Failed) -> None:
        super().__init__(failed.message)
        self.status_code = failed.kind.value
        if failed.retry_after:
            self.wait = failed.retry_after  # DRF's exception handler turns this into Retry-After


def refuse(failed: Failed) -> exceptions.APIException:
    if failed.detail is not None:
        return exceptions.ValidationError(failed.detail)
    if failed.kind is Kind.UNAUTHENTICATED:
        return exceptions.AuthenticationFailed(failed.message)
    if failed.kind is Kind.PERMISSION_DENIED:
        return exceptions.PermissionDenied(failed.message)
    return IngestRefused(failed)


def read_body(request: Request, limit: int) -> bytes:
    """The body, read only up to one byte past `limit` (a missing or lying Content-Length included)."""
    stream = request.stream
    return stream.read(limit + 1) if stream is not None else b""


IngestResponse = inline_serializer(
    name="IngestResponse",
    fields={
        "schema_version": serializers.CharField(),
        "events": serializers.IntegerField(help_text="Events in the request."),
        "spans": serializers.IntegerField(help_text="Span records they became."),
        "stored": serializers.IntegerField(help_text="Spans stored now (new, or a running turn completed)."),
        "duplicates": serializers.IntegerField(help_text="Spans already stored: a re-send changes nothing."),
        "conversation_ids": serializers.ListField(child=serializers.IntegerField()),
    },
)
ERROR = OpenApiResponse(description='JSON `{"detail": ...}`')


class IngestView(APIView):
    authentication_classes = [IngestKeyAuthentication]
    permission_classes = [IngestAccess]
    parser_classes = [JSONParser]  # documents the body; the service parses it

    @extend_schema(
        request=IngestRequestDoc,
        responses={
            200: IngestResponse,
            400: OpenApiResponse(description="Unknown schema_version, malformed JSON, or field errors: "
                                             '`{"events": {"<index>": {"<field>": ["..."]}}}`. Nothing is stored.'),
            401: ERROR, 403: ERROR, 413: ERROR, 415: ERROR,
            503: OpenApiResponse(description="Over this key's ingest rate, or the database or artifact storage is "
                                             "busy or full; retry after Retry-After seconds."),
        },
        examples=[OpenApiExample("One turn with a tool call", value=INGEST_EXAMPLE, request_only=True)],
        summary="Ingest agent events (REST JSON)",
        description=(
            "Events from a service without OpenTelemetry. Each event becomes a span like the ones ctxlens's "
            "own pipeline emits, stored by the same normaliser as OTLP. Ids are yours (conversation_id, "
            "round_id, call_id, ...): re-sending an event changes nothing (first write wins), except that a "
            "round_end completes a turn a round_start left running. A request is stored whole or not at all."
        ),
    )
    def post(self, request: Request) -> Response:
        try:
            declared = int(request.headers.get("Content-Length") or 0)
        except ValueError:
            declared = None
        key = service.admit(None, declared_length=declared, key=key_of(request))  # DRF checked the key
        if isinstance(key, Failed):
            raise refuse(key)
        outcome = service.ingest(IngestRequest(
            source="rest", body=read_body(request, ctxlens_config().max_ingest_bytes),
            content_type=request.content_type or "", content_encoding=request.headers.get("Content-Encoding", ""),
        ), key=key)
        if isinstance(outcome, Failed):
            raise refuse(outcome)
        if isinstance(outcome, Rejected):
            raise exceptions.ValidationError({"events": [outcome.message]})
        meta = outcome.batch.meta
        return Response(
            {
                "schema_version": meta["schema_version"],
                "events": meta["events"],
                "spans": len(outcome.batch.spans),
                "stored": outcome.result.accepted,
                "duplicates": outcome.result.duplicates,
                "conversation_ids": sorted(
                    Conversation.objects.filter(external_id__in=meta["conversation_ids"]).values_list("id", flat=True)
                ),
            }
        )
