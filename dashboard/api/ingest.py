"""POST /api/ingest/: REST JSON events → SpanRecords → the same store as OTLP, in one transaction."""

from __future__ import annotations

import io
from typing import Any

from django.db import transaction
from drf_spectacular.utils import OpenApiExample, OpenApiResponse, extend_schema, inline_serializer
from rest_framework import exceptions, serializers, status
from rest_framework.parsers import JSONParser
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from dashboard.api.authentication import BearerKeyAuthentication, IngestAccess, key_of
from dashboard.api.ingest_schema import INGEST_EXAMPLE, IngestRequestDoc
from pipeline.artifacts import ArtifactStorageError
from pipeline.conf import ctxlens_config
from pipeline.ingest.open_spans import complete_open_spans
from pipeline.ingest.rest import IngestRequestSerializer
from pipeline.ingest.rest_records import events_to_records
from pipeline.ingest.store import store_spans
from pipeline.models import Conversation
from pipeline.ratelimit import check_ingest_rate


class PayloadTooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_detail = "The request body is too large."
    default_code = "payload_too_large"


class Overloaded(exceptions.APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "Too many spans for this API key; retry after the time in Retry-After."
    default_code = "rate_limited"

    def __init__(self, retry_after: int) -> None:
        super().__init__()
        self.wait = retry_after  # DRF's exception handler turns this into Retry-After


class StorageFull(exceptions.APIException):
    """A full artifact disk: nothing was stored; the same request succeeds once there is space."""

    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_code = "storage_full"
    wait = 30  # DRF's exception handler turns this into Retry-After


class LimitedJSONParser(JSONParser):
    """JSON, read only up to CTXLENS_MAX_INGEST_BYTES (a missing or lying Content-Length included)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: dict | None = None) -> Any:
        limit = ctxlens_config().max_ingest_bytes
        raw = stream.read(limit + 1)
        if len(raw) > limit:
            raise PayloadTooLarge(f"The request body is larger than {limit} bytes (CTXLENS_MAX_INGEST_BYTES).")
        return super().parse(io.BytesIO(raw), media_type, parser_context)


class StoreRejected(Exception):
    """The store refused spans the serializers accepted: roll the whole request back."""


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
    authentication_classes = [BearerKeyAuthentication]
    permission_classes = [IngestAccess]
    parser_classes = [LimitedJSONParser]

    def initial(self, request: Request, *args: Any, **kwargs: Any) -> None:
        super().initial(request, *args, **kwargs)  # authentication and scope first
        encoding = request.headers.get("Content-Encoding", "identity").strip().lower()
        if encoding not in ("", "identity"):
            raise exceptions.UnsupportedMediaType(
                encoding, detail=f"Content-Encoding {encoding!r} is not supported here; send plain JSON."
            )
        try:
            length = int(request.headers.get("Content-Length") or 0)
        except ValueError:
            length = 0
        limit = ctxlens_config().max_ingest_bytes
        if length > limit:
            raise PayloadTooLarge(f"The request body is larger than {limit} bytes (CTXLENS_MAX_INGEST_BYTES).")

    @extend_schema(
        request=IngestRequestDoc,
        responses={
            200: IngestResponse,
            400: OpenApiResponse(description="Unknown schema_version, malformed JSON, or field errors: "
                                             '`{"events": {"<index>": {"<field>": ["..."]}}}`. Nothing is stored.'),
            401: ERROR, 403: ERROR, 413: ERROR, 415: ERROR,
            503: OpenApiResponse(description="Over this key's ingest rate; retry after Retry-After seconds."),
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
        serializer = IngestRequestSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        events = serializer.validated_data["events"]
        records = events_to_records(events)
        key = key_of(request)
        decision = check_ingest_rate(key, len(records))
        if not decision.allowed:
            raise Overloaded(decision.retry_after)
        try:
            with transaction.atomic():
                complete_open_spans(records)
                result = store_spans(records, source="rest")
                if result.rejected:
                    raise StoreRejected(result.error_message)
        except StoreRejected as error:
            raise exceptions.ValidationError({"events": [str(error)]}) from None
        except ArtifactStorageError as error:
            raise StorageFull(str(error)) from None
        return Response(
            {
                "schema_version": serializer.validated_data["schema_version"],
                "events": len(events),
                "spans": len(records),
                "stored": result.accepted,
                "duplicates": result.duplicates,
                "conversation_ids": sorted(
                    Conversation.objects.filter(external_id__in={e["conversation_id"] for e in events})
                    .values_list("id", flat=True)
                ),
            }
        )
