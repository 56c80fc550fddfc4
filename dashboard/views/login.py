"""Login throttling (django-axes): what a locked-out login looks like, and whose address counts.

Failed logins are counted per user name and per client address in Django's cache (Redis on the
scale path) for CTXLENS_LOGIN_LOCKOUT_MINUTES; at CTXLENS_LOGIN_FAILURE_LIMIT failures that
user name, and that address, cannot log in until the window has passed. Other users from other
addresses log in as usual.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.contrib.auth.forms import AuthenticationForm
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from dashboard.views.common import CONTENT_SECURITY_POLICY

TOO_MANY_REQUESTS = 429


def client_address(request: HttpRequest) -> str | None:
    """The peer's address as the ASGI server reports it. Behind the proxy, uvicorn takes it from
    X-Forwarded-For of trusted proxies only (--forwarded-allow-ips); a client's own header is
    never believed, or it could spread its failures over made-up addresses."""
    return request.META.get("REMOTE_ADDR")


def lockout_response(request: HttpRequest, *args: Any, **kwargs: Any) -> HttpResponse:
    """The login page again, with the reason, as 429 (axes calls this in place of the view's
    response; its sync and async middleware pass different arguments, none of which is needed)."""
    form = AuthenticationForm(request, data=request.POST or None)
    context = {
        "form": form,
        "locked_out": True,
        "lockout_minutes": settings.CTXLENS_LOGIN_LOCKOUT_MINUTES,
        "next": request.POST.get("next", "") or request.GET.get("next", ""),
    }
    response = render(request, "registration/login.html", context, status=TOO_MANY_REQUESTS)
    response.headers.setdefault("Content-Security-Policy", CONTENT_SECURITY_POLICY)
    return response
