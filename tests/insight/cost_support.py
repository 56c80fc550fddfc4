"""Conversations with known token counts, sent through the REST ingest API, and the prices
genai-prices itself gives for them: what the cost tests compare ctxlens's figures with."""

from __future__ import annotations

from datetime import datetime, timedelta
from decimal import Decimal
from html.parser import HTMLParser

from genai_prices import Usage, calc_price
from rest_framework.test import APIClient

from pipeline.models import ApiKey
from pipeline.models.apikeys import Scope
from tests.api_client import client_with


def genai_price(model: str, at: datetime, *, provider: str = "openai", input: int = 0, output: int = 0,
                cache_read: int = 0, cache_write: int = 0) -> Decimal:
    """What genai-prices charges for these counts (its own calculation, not ctxlens's)."""
    usage = Usage(input_tokens=input, output_tokens=output, cache_read_tokens=cache_read,
                  cache_write_tokens=cache_write)
    return calc_price(usage, model_ref=model, provider_id=provider, genai_request_timestamp=at).total_price


def ingest_client() -> APIClient:
    return client_with(ApiKey.generate("agent", scope=Scope.INGEST)[1])


def read_client() -> APIClient:
    return client_with(ApiKey.generate("reader", scope=Scope.READ)[1])


def iso(at: datetime) -> str:
    return at.isoformat().replace("+00:00", "Z")


def llm_call(conversation: str, round_id: str, call_id: str, at: datetime, model: str, **fields: object) -> dict:
    """An llm_call event of one second starting at `at`."""
    return {"type": "llm_call", "conversation_id": conversation, "round_id": round_id, "call_id": call_id,
            "started_at": iso(at), "ended_at": iso(at + timedelta(seconds=1)), "model": model, **fields}


def round_start(conversation: str, round_id: str, at: datetime, message: str = "How much was that?") -> dict:
    return {"type": "round_start", "conversation_id": conversation, "round_id": round_id, "timestamp": iso(at),
            "user_message": message}


def send(api: APIClient, *events: dict) -> dict:
    reply = api.post("/api/ingest/", {"schema_version": "1.0", "events": list(events)}, format="json")
    assert reply.status_code == 200, reply.content
    return reply.json()


class _StatText(HTMLParser):
    """The text of every element with data-stat="<stat>" (its descendants' text included)."""

    VOID = {"br", "img", "input", "meta", "link", "hr", "wbr"}

    def __init__(self, stat: str) -> None:
        super().__init__()
        self.stat = stat
        self.found: list[str] = []
        self.depth = 0  # open elements inside the current match (0: not in one)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in self.VOID:
            return
        if self.depth:
            self.depth += 1
        elif dict(attrs).get("data-stat") == self.stat:
            self.depth = 1
            self.found.append("")

    def handle_endtag(self, tag: str) -> None:
        if self.depth and tag not in self.VOID:
            self.depth -= 1

    def handle_data(self, data: str) -> None:
        if self.depth:
            self.found[-1] += data


def stat_texts(html: str, stat: str) -> list[str]:
    """What each element marked data-stat="<stat>" reads, whitespace collapsed."""
    parser = _StatText(stat)
    parser.feed(html)
    return [" ".join(text.split()) for text in parser.found]
