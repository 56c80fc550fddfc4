"""API keys for ingest and read access. Only a SHA-256 of the key is stored; the key is shown once."""

from __future__ import annotations

import hashlib
import secrets

from django.conf import settings
from django.db import connection, models
from django.utils import timezone

KEY_PREFIX = "ctx_"
_ACTIVE_BY_HASH = "SELECT * FROM {table} WHERE key_hash = %s AND revoked_at IS NULL"  # key_hash is unique


class Scope(models.TextChoices):
    INGEST = "ingest", "Ingest"
    READ = "read", "Read"
    ALL = "all", "Ingest and read"


def hash_key(raw_key: str) -> str:
    # Keys are 256-bit random tokens, so a plain SHA-256 is as strong as a slow hash here and
    # lets every request find its key with one indexed lookup.
    return hashlib.sha256(raw_key.encode()).hexdigest()


class ApiKey(models.Model):
    name = models.CharField(max_length=255)
    prefix = models.CharField(max_length=16, editable=False)  # the first characters, to recognise a key
    key_hash = models.CharField(max_length=64, unique=True, editable=False)
    scope = models.CharField(max_length=16, choices=Scope.choices, default=Scope.INGEST)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, on_delete=models.SET_NULL, null=True, blank=True, related_name="+"
    )
    created_at = models.DateTimeField(auto_now_add=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at"]
        verbose_name = "API key"

    def __str__(self) -> str:
        return f"{self.name} ({self.prefix}…)"

    @classmethod
    def generate(cls, name: str, scope: str = Scope.INGEST, created_by=None) -> tuple[ApiKey, str]:
        """Create a key; returns the row and the raw key, which is not stored anywhere."""
        raw_key = KEY_PREFIX + secrets.token_urlsafe(32)
        key = cls.objects.create(
            name=name, scope=scope, prefix=raw_key[:12], key_hash=hash_key(raw_key), created_by=created_by
        )
        return key, raw_key

    @classmethod
    def authenticate(cls, raw_key: str) -> ApiKey | None:
        """The active key matching `raw_key`, or None (unknown or revoked)."""
        if not raw_key.startswith(KEY_PREFIX):
            return None
        # Every ingest request asks, a bad key's included: the statement is written out, not a
        # queryset compiled each time (four times the CPU of the lookup itself; for requests of
        # one span, 0.91x server CPU per span: bench/ingest.py --spans 3000 --batch 1 --base 201e2f8).
        found = list(cls.objects.raw(_ACTIVE_BY_HASH.format(table=connection.ops.quote_name(cls._meta.db_table)),
                                     [hash_key(raw_key)]))
        return found[0] if found else None

    @property
    def is_active(self) -> bool:
        return self.revoked_at is None

    def allows(self, scope: str) -> bool:
        return self.is_active and self.scope in (scope, Scope.ALL)

    def revoke(self) -> None:
        self.revoked_at = timezone.now()
        self.save(update_fields=["revoked_at"])
