"""API-key checks for ingest and read endpoints: `Authorization: Bearer <key>`.

A plain function so the OTLP views and a DRF authentication class share it:

    key = check_bearer_key(request.headers.get("Authorization"), "ingest")  # raises ApiKeyError

401 when the header is missing or malformed and when the key is unknown or revoked; 403 when
the key is valid but its scope does not allow `scope`. The raw key never appears in a message.
"""

from __future__ import annotations

from datetime import timedelta

from django.core.cache import cache
from django.utils import timezone

from pipeline.models import ApiKey

LAST_USED_RESOLUTION = timedelta(minutes=1)  # write last_used_at at most once a minute per key


class ApiKeyError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def bearer_token(authorization: str | None) -> str:
    """The token of an `Authorization: Bearer <token>` header, or "" when there is none."""
    if not authorization:
        return ""
    scheme, _, token = authorization.strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


def check_bearer_key(authorization: str | None, scope: str) -> ApiKey:
    token = bearer_token(authorization)
    if not token:
        raise ApiKeyError(401, "missing API key: send 'Authorization: Bearer <key>'")
    key = ApiKey.authenticate(token)
    if key is None:
        raise ApiKeyError(401, "invalid or revoked API key")
    if not key.allows(scope):
        raise ApiKeyError(403, f"this API key does not have the {scope!r} scope")
    _touch(key)
    return key


def _touch(key: ApiKey) -> None:
    if cache.add(f"ctxlens:apikey-used:{key.pk}", 1, timeout=int(LAST_USED_RESOLUTION.total_seconds())):
        ApiKey.objects.filter(pk=key.pk).update(last_used_at=timezone.now())
