"""Number and time formatting, and links into a conversation, for the dashboard templates (all
output is autoescaped text)."""

from __future__ import annotations

import json
from decimal import ROUND_HALF_UP, Decimal, InvalidOperation

from django import template
from django.urls import reverse

register = template.Library()


@register.filter
def tokens(value: object) -> str:
    """12345 -> "12.3k", 2500000 -> "2.5M"."""
    if not isinstance(value, (int, float)):
        return "–"
    n = float(value)
    for limit, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if abs(n) >= limit:
            return f"{n / limit:.1f}".rstrip("0").rstrip(".") + suffix
    return f"{int(n)}"


@register.filter
def duration(ms: object) -> str:
    """Milliseconds as "850 ms", "1.24 s", "2 min 5 s"."""
    if not isinstance(ms, (int, float)):
        return "–"
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 60_000:
        return f"{ms / 1000:.2f} s"
    minutes, seconds = divmod(int(ms // 1000), 60)
    return f"{minutes} min {seconds} s"


@register.filter
def percent(value: object, digits: int = 0) -> str:
    """0.953 -> "95%" (a ratio) for success rates."""
    if not isinstance(value, (int, float)):
        return "–"
    return f"{100 * value:.{int(digits)}f}%"


@register.filter
def pretty_json(value: object) -> str:
    """Arguments and other JSON values, indented, for a <pre> block (escaped by the template)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except ValueError:
            return value
    return json.dumps(value, indent=2, ensure_ascii=False, sort_keys=False, default=str)


@register.filter
def clip(text: object, limit: int = 20000) -> str:
    """At most `limit` characters of a long text (the page says how long the whole is)."""
    text = "" if text is None else str(text)
    return text if len(text) <= int(limit) else text[: int(limit)]


NO_PRICE = "no price"


@register.filter
def usd(value: object) -> str:
    """A cost in USD, short: "$12.35", "$0.0255", "$0.00255" (three significant digits under a
    dollar, never an exponent); None → "no price" (unknown is not free)."""
    if value is None or isinstance(value, bool):
        return NO_PRICE
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return NO_PRICE
    if not amount.is_finite():
        return NO_PRICE
    if amount == 0:
        return "$0.00"
    places = 2 if abs(amount) >= 1 else max(2, 2 - amount.adjusted())  # under $1: three significant digits
    amount = amount.quantize(Decimal(1).scaleb(-places), rounding=ROUND_HALF_UP)
    if abs(amount) >= 1:
        return f"${amount:,.2f}"
    whole, _, fraction = f"{amount:f}".partition(".")
    return f"${whole}.{fraction.rstrip('0').ljust(2, '0')}"


@register.filter
def usd_exact(value: object) -> str:
    """The whole amount, for a title attribute: "0.00255 USD"; "" for no price."""
    if value is None or isinstance(value, bool):
        return ""
    try:
        amount = Decimal(str(value))
    except (InvalidOperation, ValueError):
        return ""
    text = f"{amount:f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return f"{text} USD"


@register.simple_tag
def turn_url(conversation_id: int, round_id: int | None = None, kind: str = "", pk: int | None = None) -> str:
    """The conversation page at the element `kind`-`pk` (e.g. "tool", 12: #tool-12; `kind` alone: that
    id): with the round it is in, `?round=`, which the page redirects to the page of turns holding it."""
    url = reverse("conversation", args=[conversation_id])
    if round_id:
        url += f"?round={int(round_id)}"
    anchor = f"{kind}-{int(pk)}" if kind and pk is not None else kind
    return f"{url}#{anchor}" if anchor else url
