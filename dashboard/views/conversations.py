"""The conversations list: search and filters, newest activity first, rows updated live."""

from __future__ import annotations

from django import forms
from django.db.models import Q, QuerySet
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.shortcuts import render
from django.utils import timezone

from dashboard import queries
from dashboard.paging import CappedPaginator
from dashboard.views.common import WINDOW_LABELS, WINDOWS, fragments, fragments_response, page
from pipeline.insight import finding_counts
from pipeline.insight.findings import CODES
from pipeline.models import Conversation, Status

PAGE_SIZE = 50


class ConversationFilter(forms.Form):
    q = forms.CharField(required=False, max_length=200, label="Search")
    model = forms.CharField(required=False, max_length=255)
    status = forms.ChoiceField(required=False, choices=[("", "Any status"), *Status.choices])
    finding = forms.ChoiceField(required=False, choices=[("", "Any findings"), *[(code, code) for code in CODES]])
    window = forms.ChoiceField(required=False, choices=[("all", "Any time"), *[
        (key, label) for key, label in WINDOW_LABELS.items() if key != "all"]])

    def queryset(self) -> QuerySet[Conversation]:
        qs = Conversation.objects.order_by("-last_activity_at", "-pk")
        if not self.is_valid():
            return qs
        data = self.cleaned_data
        if data["q"]:
            q = data["q"]
            qs = qs.filter(
                Q(title__icontains=q) | Q(external_id__icontains=q) | Q(agent_name__icontains=q)
                | Q(user_id__icontains=q) | Q(model__icontains=q)
            )
        if data["model"]:
            qs = qs.filter(model=data["model"])
        if data["status"]:
            qs = qs.filter(status=data["status"])
        if data["finding"]:  # by the stored counts, like the column
            qs = qs.filter(finding_counts__has_key=data["finding"])
        span = WINDOWS.get(data["window"] or "all")
        if span is not None:
            qs = qs.filter(last_activity_at__gte=timezone.now() - span)
        return qs


def _context(request: HttpRequest) -> dict:
    finding_counts.resume()  # once per process: counts an earlier process left stale
    form = ConversationFilter(request.GET or None)
    paginator = CappedPaginator(form.queryset(), PAGE_SIZE, request.GET.get("page"))
    page_obj = paginator.get_page(request.GET.get("page"))
    query = request.GET.copy()
    query.pop("page", None)
    return {"form": form, "page_obj": page_obj, "conversations": page_obj.object_list, "query": query.urlencode()}


@page
def conversation_list(request: HttpRequest) -> HttpResponse:
    context = _context(request)
    context.update(nav="conversations", models=queries.conversation_models(200))
    return render(request, "dashboard/conversations.html", context)


@fragments
def conversation_list_fragments(request: HttpRequest) -> JsonResponse:
    context = _context(request)
    return fragments_response(request, {"conversation-results": ("dashboard/partials/conversation_rows.html", context)})
