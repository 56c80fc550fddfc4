"""/api/: the REST API. A DRF router for the read resources, plus ingest, tool statistics and the schema."""

from __future__ import annotations

from django.urls import Resolver404, include, path, re_path, resolve
from drf_spectacular.utils import extend_schema
from drf_spectacular.views import SpectacularAPIView
from rest_framework.authentication import SessionAuthentication
from rest_framework.decorators import api_view, authentication_classes, permission_classes
from rest_framework.exceptions import NotFound
from rest_framework.renderers import JSONRenderer
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.routers import SimpleRouter

from pipeline.drf_auth import AnyAccess, BearerKeyAuthentication
from pipeline.receivers.rest import IngestView
from dashboard.api.spans import RoundSpansView
from dashboard.api.views import (
    ArtifactViewSet,
    CompressionViewSet,
    ConversationViewSet,
    LLMCallViewSet,
    ModelStatsView,
    ToolStatsView,
)

app_name = "api"

router = SimpleRouter()
router.register("conversations", ConversationViewSet, basename="conversation")
router.register("llm-calls", LLMCallViewSet, basename="llm-call")
router.register("compressions", CompressionViewSet, basename="compression")
router.register("artifacts", ArtifactViewSet, basename="artifact")


class SchemaView(SpectacularAPIView):
    """OpenAPI 3 of this API, for any API key or logged-in user."""

    authentication_classes = [BearerKeyAuthentication, SessionAuthentication]
    permission_classes = [AnyAccess]

    def finalize_response(self, request: Request, response: Response, *args: object, **kwargs: object) -> Response:
        # Errors are JSON like the rest of the API, not an OpenAPI (YAML) rendering of {"detail": ...}.
        if response.status_code >= 400:
            request.accepted_renderer, request.accepted_media_type = JSONRenderer(), "application/json"
        return super().finalize_response(request, response, *args, **kwargs)


@extend_schema(exclude=True)
@api_view(["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"])
@authentication_classes([])
@permission_classes([])
def not_found(request: Request, rest: str = "") -> None:
    """Unknown /api/ paths answer JSON like the rest of the API, not an HTML page."""
    if not request.path.endswith("/"):
        try:
            match = resolve(request.path + "/")
        except Resolver404:
            match = None
        if match is not None and match.url_name != "not-found":
            raise NotFound(f"No such API endpoint; did you mean {request.path}/ (with the trailing slash)?")
    raise NotFound("No such API endpoint; see /api/schema/.")


urlpatterns = [
    path("ingest/", IngestView.as_view(), name="ingest"),
    path("tools/stats/", ToolStatsView.as_view(), name="tool-stats"),
    path("models/stats/", ModelStatsView.as_view(), name="model-stats"),
    path("schema/", SchemaView.as_view(), name="schema"),
    path("rounds/<int:pk>/spans/", RoundSpansView.as_view(), name="round-spans"),
    path("artifacts/<str:artifact_id>/content", ArtifactViewSet.as_view({"get": "content"}), name="artifact-content"),
    path("", include(router.urls)),
    re_path(r"^(?P<rest>.*)$", not_found, name="not-found"),
]
