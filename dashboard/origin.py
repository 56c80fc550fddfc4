"""The websocket origin check: a browser's websocket must come from a page of this very site.

Browsers send cookies with a websocket handshake from any page, so without this check a page on
another site (or another port of the same host: `http://127.0.0.1:9999`) could open `/ws/live/`
with the user's session and read the live feed (cross-site websocket hijacking). Channels'
`AllowedHostsOriginValidator` compares only the Origin's host name with ALLOWED_HOSTS; here the
Origin's scheme, host and port must equal the request's own (its Host header, and https when the
connection or the trusted TLS proxy says so), or match CSRF_TRUSTED_ORIGINS, as Django's CSRF
check does for forms. A handshake without an Origin is refused.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import urlsplit

from channels.security.websocket import WebsocketDenier
from django.conf import settings
from django.http.request import split_domain_port, validate_host

DEFAULT_PORTS = {"http": 80, "https": 443}
Site = tuple[str, str, int]  # scheme, host, port


def parse_origin(value: str) -> Site | None:
    try:
        parts = urlsplit(value.strip())
        port = parts.port
    except ValueError:
        return None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        return None
    return parts.scheme, parts.hostname.lower(), port or DEFAULT_PORTS[parts.scheme]


def request_site(scope: dict, headers: dict[bytes, bytes]) -> Site | None:
    """The site the handshake was sent to, when its Host is one of ALLOWED_HOSTS."""
    domain, port = split_domain_port(headers.get(b"host", b"").decode("latin-1"))
    if not domain or not validate_host(domain, settings.ALLOWED_HOSTS):
        return None
    scheme = "https" if scope.get("scheme") in ("wss", "https") else "http"
    proxy_header = getattr(settings, "SECURE_PROXY_SSL_HEADER", None)
    if proxy_header:
        name, secure_value = proxy_header
        header = name.removeprefix("HTTP_").replace("_", "-").lower().encode("latin-1")
        forwarded = headers.get(header, b"").decode("latin-1").split(",")[0].strip()
        if forwarded:
            scheme = "https" if forwarded == secure_value else "http"
    return scheme, domain.strip("[]"), int(port) if port else DEFAULT_PORTS[scheme]


def trusted(origin: Site, pattern: str) -> bool:
    """Whether `origin` matches a CSRF_TRUSTED_ORIGINS entry (`https://*.example.com` allowed)."""
    wildcard = "://*." in pattern
    site = parse_origin(pattern.replace("://*.", "://", 1) if wildcard else pattern)
    if site is None:
        return False
    scheme, host, port = site
    if (origin[0], origin[2]) != (scheme, port):
        return False
    return origin[1] == host or (wildcard and origin[1].endswith(f".{host}"))


def origin_allowed(scope: dict) -> bool:
    headers = dict(scope.get("headers") or ())
    origin = parse_origin(headers.get(b"origin", b"").decode("latin-1"))
    if origin is None:
        return False
    if origin == request_site(scope, headers):
        return True
    return any(trusted(origin, pattern) for pattern in settings.CSRF_TRUSTED_ORIGINS)


class SameOriginValidator:
    """ASGI middleware: refuse a websocket whose Origin is not this site (see the module doc)."""

    def __init__(self, application: Any) -> None:
        self.application = application

    async def __call__(self, scope: dict, receive: Any, send: Any) -> Any:
        if scope["type"] == "websocket" and not origin_allowed(scope):
            return await WebsocketDenier()(scope, receive, send)
        return await self.application(scope, receive, send)
