"""Who may call the API: a Bearer API key with the right scope, or a logged-in session for reads."""

from __future__ import annotations

from django.contrib.auth.models import AnonymousUser
from django.utils import timezone
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework import authentication, exceptions, permissions
from rest_framework.request import Request

from pipeline.ingest.auth import LAST_USED_RESOLUTION
from pipeline.models import ApiKey
from pipeline.models.apikeys import Scope


class BearerKeyAuthentication(authentication.BaseAuthentication):
    """`Authorization: Bearer <api key>`. No header: let the next authenticator try."""

    keyword = "Bearer"

    def authenticate(self, request: Request) -> tuple[AnonymousUser, ApiKey] | None:
        header = authentication.get_authorization_header(request).split()
        if not header or header[0].lower() != self.keyword.lower().encode():
            return None
        if len(header) != 2:
            raise exceptions.AuthenticationFailed("Malformed Authorization header: use 'Bearer <api key>'.")
        try:
            raw_key = header[1].decode()
        except UnicodeDecodeError:
            raise exceptions.AuthenticationFailed("Invalid API key.") from None
        key = ApiKey.authenticate(raw_key)
        if key is None:
            raise exceptions.AuthenticationFailed("Invalid or revoked API key.")
        # last_used_at is a hint for the operator: written at most once per LAST_USED_RESOLUTION,
        # like the OTLP endpoints do (pipeline.ingest.auth), so reads do not all become writes.
        now = timezone.now()
        if key.last_used_at is None or now - key.last_used_at > LAST_USED_RESOLUTION:
            ApiKey.objects.filter(pk=key.pk).update(last_used_at=now)
        # The key, not a user, is the principal: request.user stays anonymous so nothing
        # grants a key the privileges of the person who created it.
        return AnonymousUser(), key

    def authenticate_header(self, request: Request) -> str:
        # Makes DRF answer 401 (not 403) when credentials are missing.
        return f'{self.keyword} realm="ctxlens"'


class IngestKeyAuthentication(BearerKeyAuthentication):
    """The ingest endpoint's key check: `pipeline.ingest.service.authenticate`, so a missing,
    unknown or read-only key is refused with the same words as over OTLP/HTTP and gRPC."""

    def authenticate(self, request: Request) -> tuple[AnonymousUser, ApiKey]:
        from pipeline.ingest.service import Failed, Kind, authenticate

        checked = authenticate(request.META.get("HTTP_AUTHORIZATION"))
        if isinstance(checked, Failed):
            if checked.kind is Kind.PERMISSION_DENIED:
                raise exceptions.PermissionDenied(checked.message)
            raise exceptions.AuthenticationFailed(checked.message)  # 401 with WWW-Authenticate
        return AnonymousUser(), checked


class BearerKeyScheme(OpenApiAuthenticationExtension):
    """Names the Bearer key in the OpenAPI schema (registered by being defined)."""

    target_class = BearerKeyAuthentication
    match_subclasses = True
    name = "apiKey"

    def get_security_definition(self, auto_schema: object) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "An API key from `manage.py create_api_key` or the admin: scope `read` for GET, "
                           "`ingest` for POST /api/ingest/, `all` for both.",
        }


def key_of(request: Request) -> ApiKey | None:
    return request.auth if isinstance(request.auth, ApiKey) else None


class ReadAccess(permissions.BasePermission):
    """A key with the read scope, or a logged-in user."""

    message = "This API key does not have the read scope."

    def has_permission(self, request: Request, view: object) -> bool:
        key = key_of(request)
        if key is not None:
            return key.allows(Scope.READ)
        return bool(request.user and request.user.is_authenticated)


class IngestAccess(permissions.BasePermission):
    """A key with the ingest scope; a browser session cannot ingest."""

    message = "This API key does not have the ingest scope."

    def has_permission(self, request: Request, view: object) -> bool:
        key = key_of(request)
        return key is not None and key.allows(Scope.INGEST)


class AnyAccess(permissions.BasePermission):
    """Any active key, whatever its scope, or a logged-in user (for the schema)."""

    def has_permission(self, request: Request, view: object) -> bool:
        return key_of(request) is not None or bool(request.user and request.user.is_authenticated)
