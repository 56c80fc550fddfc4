"""What every dashboard page shares: login, a strict CSP, time windows and live fragments."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from functools import wraps

from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.template.loader import render_to_string
from django.utils import timezone

# Scripts only from our own static files: even if trace content escaped a template, no
# inline script or event handler attribute would run. Styles may be inline (bar widths).
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:; "
    "connect-src 'self'; object-src 'none'; base-uri 'none'; frame-ancestors 'none'; form-action 'self'"
)

WINDOWS: dict[str, timedelta | None] = {
    "1h": timedelta(hours=1),
    "24h": timedelta(hours=24),
    "7d": timedelta(days=7),
    "30d": timedelta(days=30),
    "all": None,
}
WINDOW_LABELS = {"1h": "Last hour", "24h": "Last 24 hours", "7d": "Last 7 days", "30d": "Last 30 days", "all": "All time"}

View = Callable[..., HttpResponse]


def csp(view: View) -> View:
    """Send the dashboard's Content-Security-Policy with the view's responses."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        response = view(request, *args, **kwargs)
        response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
        return response

    return wrapped


def page(view: View) -> View:
    """A dashboard page: login required (anonymous users go to the login page), CSP set."""
    return login_required(csp(view))


def fragments(view: View) -> View:
    """A JSON endpoint the page's script calls for live updates: 401 JSON when logged out."""

    @wraps(view)
    def wrapped(request: HttpRequest, *args: object, **kwargs: object) -> HttpResponse:
        if not request.user.is_authenticated:
            return JsonResponse({"error": "login required"}, status=401)
        response = view(request, *args, **kwargs)
        response.headers["Cache-Control"] = "no-store"
        return response

    return wrapped


def fragments_response(
    request: HttpRequest, parts: Mapping[str, tuple[str, dict]], data: dict | None = None
) -> JsonResponse:
    """Render partials (the same templates the page includes) into {"fragments": {id: html}}.

    Each partial's root element carries the id; the page swaps that element for the new one.
    """
    rendered = {key: render_to_string(template, context, request) for key, (template, context) in parts.items()}
    return JsonResponse({"fragments": rendered, "data": data or {}})


def window_param(request: HttpRequest, default: str = "24h") -> tuple[str, datetime | None]:
    """The `window` query parameter (1h, 24h, 7d, 30d, all) and the time it starts at."""
    key = request.GET.get("window", default)
    if key not in WINDOWS:
        key = default
    span = WINDOWS[key]
    return key, (timezone.now() - span if span is not None else None)


def window_context(key: str) -> dict:
    return {"window": key, "windows": list(WINDOW_LABELS.items()), "window_label": WINDOW_LABELS[key]}
