"""A DRF test client for the REST API, with or without an API key."""

from __future__ import annotations

from rest_framework.test import APIClient


def client_with(raw_key: str | None = None) -> APIClient:
    """An APIClient that sends `Authorization: Bearer <raw_key>`, or no credentials."""
    client = APIClient()
    if raw_key:
        client.credentials(HTTP_AUTHORIZATION=f"Bearer {raw_key}")
    return client
