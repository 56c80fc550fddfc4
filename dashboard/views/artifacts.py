"""Artifacts: the list (size, tokens, conversation, expiry) and one artifact with an escaped preview.

Downloads go through the read API (`/api/artifacts/<artifact_id>/content`), which validates
the id and serves the file as an attachment that a browser never renders as a page.
"""

from __future__ import annotations

from django.core.paginator import Paginator
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render

from dashboard.views.common import fragments, fragments_response, page
from pipeline.artifacts.store import ArtifactError, read_artifact
from pipeline.models import Artifact

PAGE_SIZE = 50
PREVIEW_BYTES = 64 * 1024
TEXT_MIMES = ("application/json", "application/xml", "application/yaml", "application/x-ndjson",
              "application/javascript")


def is_text(mime: str) -> bool:
    mime = mime.split(";")[0].strip().lower()
    return mime.startswith("text/") or mime in TEXT_MIMES or mime.endswith(("+json", "+xml"))


def _list_context(request: HttpRequest) -> dict:
    artifacts = Artifact.objects.select_related("conversation").order_by("-created_at", "-pk")
    page_obj = Paginator(artifacts, PAGE_SIZE).get_page(request.GET.get("page"))
    return {"page_obj": page_obj}


@page
def artifact_list(request: HttpRequest) -> HttpResponse:
    return render(request, "dashboard/artifacts.html", {**_list_context(request), "nav": "artifacts"})


@fragments
def artifact_list_fragments(request: HttpRequest) -> JsonResponse:
    return fragments_response(request, {"artifact-results": ("dashboard/partials/artifact_rows.html",
                                                             _list_context(request))})


@page
def artifact_detail(request: HttpRequest, artifact_id: str) -> HttpResponse:
    # Validate before any lookup: the id names a file, and nothing else may reach the disk.
    if not Artifact.is_valid_id(artifact_id):
        raise Http404("No such artifact.")
    artifact = Artifact.objects.select_related("conversation").filter(artifact_id=artifact_id).first()
    if artifact is None:
        raise Http404("No such artifact.")
    preview, problem = "", ""
    if artifact.is_expired:
        problem = "This artifact has expired; its content is no longer kept."
    elif not is_text(artifact.mime):
        problem = f"No preview for {artifact.mime} content; download it instead."
    else:
        try:
            preview = read_artifact(artifact.artifact_id, max_bytes=PREVIEW_BYTES).text
        except ArtifactError as exc:  # messages of ArtifactError never hold a path
            problem = str(exc)
    context = {
        "nav": "artifacts",
        "artifact": artifact,
        "preview": preview,
        "preview_clipped": bool(preview) and artifact.size > PREVIEW_BYTES,
        "preview_bytes": PREVIEW_BYTES,
        "problem": problem,
        "tool_calls": artifact.tool_calls.select_related("conversation").order_by("started_at")[:20],
    }
    return render(request, "dashboard/artifact.html", context)
