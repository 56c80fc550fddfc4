"""Number and time formatting for the dashboard templates (all output is autoescaped text)."""

from __future__ import annotations

import json

from django import template

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
