"""What an LLM call cost in USD, from its token counts: genai-prices' offline data, plus overrides.

genai-prices (pydantic's maintained price database) ships its data in the package; ctxlens only
ever reads that snapshot — it never starts the package's price updater, so nothing is fetched.
A YAML file (CTXLENS_PRICES_FILE) adds models the database does not know or overrides its
prices; its entries win:

    models:
      - match: "acme-large*"        # the model name, or a glob over it (fnmatch)
        provider: acme               # optional: only for calls of this provider
        input_mtok: 3.0              # USD per million tokens
        output_mtok: 15.0
        cache_read_mtok: 0.3         # optional; default: input_mtok
        cache_write_mtok: 3.75       # optional; default: input_mtok

Token conventions, as genai-prices takes them: input tokens include the cache reads and writes,
output tokens include the reasoning tokens. A span that reports cache tokens beyond its input
count (Anthropic's way: cache tokens separate from input) gets them added to the input; a span
that reports more reasoning tokens than output tokens is billed for the reasoning tokens.
A model no price is known for costs `None` ("no price"), never 0.
"""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass
from datetime import UTC, datetime
from decimal import Decimal
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

MILLION = Decimal(1_000_000)
# $1 a token: far above any real price, and low enough that no sum of calls outgrows the cost columns.
MAX_RATE = Decimal(1_000_000)


@dataclass(frozen=True)
class Tokens:
    """An LLM call's token counts, as stored."""

    input: int = 0
    output: int = 0
    cache_read: int = 0
    cache_write: int = 0
    reasoning: int = 0

    def billed(self) -> Tokens:
        """The counts in genai-prices' convention (see the module docstring)."""
        cached = self.cache_read + self.cache_write
        return Tokens(
            input=self.input + cached if cached > self.input else self.input,
            output=max(self.output, self.reasoning),
            cache_read=self.cache_read,
            cache_write=self.cache_write,
        )


@dataclass(frozen=True)
class PriceOverride:
    """One entry of the prices file: USD per million tokens for the models it matches."""

    match: str
    provider: str
    input_mtok: Decimal
    output_mtok: Decimal
    cache_read_mtok: Decimal
    cache_write_mtok: Decimal
    per_request: Decimal = Decimal(0)  # a fixed fee per call (some search models charge one)

    def matches(self, model: str, provider: str) -> bool:
        if self.provider and self.provider.lower() != provider.lower():
            return False
        return fnmatch.fnmatchcase(model.lower(), self.match.lower())

    def cost(self, tokens: Tokens) -> Decimal:
        uncached = max(tokens.input - tokens.cache_read - tokens.cache_write, 0)
        return self.per_request + (
            uncached * self.input_mtok + tokens.cache_read * self.cache_read_mtok
            + tokens.cache_write * self.cache_write_mtok + tokens.output * self.output_mtok
        ) / MILLION


class PricesFileError(ValueError):
    """The prices file is unreadable or malformed; the message says where (never the path)."""


def _rate(entry: dict[str, Any], key: str, default: Decimal | None, where: str) -> Decimal:
    value = entry.get(key)
    if value is None:
        if default is None:
            raise PricesFileError(f"{where}: {key} is required")
        return default
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise PricesFileError(f"{where}: {key} must be a number of USD per million tokens")
    try:
        rate = Decimal(str(value))
    except ArithmeticError as exc:
        raise PricesFileError(f"{where}: {key} must be a number of USD per million tokens") from exc
    if not rate.is_finite() or rate < 0:
        raise PricesFileError(f"{where}: {key} must be a non-negative number")
    if rate > MAX_RATE:
        raise PricesFileError(f"{where}: {key} must be at most {MAX_RATE} USD per million tokens")
    return rate


def parse_overrides(document: object) -> tuple[PriceOverride, ...]:
    """The entries of a parsed prices file (see the module docstring)."""
    if document is None:
        return ()
    if not isinstance(document, dict) or not isinstance(document.get("models", []), list):
        raise PricesFileError("the prices file must be a mapping with a `models` list")
    overrides = []
    for i, entry in enumerate(document.get("models") or []):
        where = f"models[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("match"), str) or not entry["match"].strip():
            raise PricesFileError(f"{where}: needs a `match` (a model name or glob)")
        provider = entry.get("provider") or ""
        if not isinstance(provider, str):
            raise PricesFileError(f"{where}: provider must be a string")
        input_rate = _rate(entry, "input_mtok", None, where)
        overrides.append(PriceOverride(
            match=entry["match"].strip(), provider=provider.strip(), input_mtok=input_rate,
            output_mtok=_rate(entry, "output_mtok", None, where),
            cache_read_mtok=_rate(entry, "cache_read_mtok", input_rate, where),
            cache_write_mtok=_rate(entry, "cache_write_mtok", input_rate, where),
        ))
    return tuple(overrides)


@lru_cache(maxsize=8)
def load_overrides(path: str) -> tuple[PriceOverride, ...]:
    """The overrides in the YAML file at `path` ("" for none), read once per path."""
    if not path:
        return ()
    try:
        document = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise PricesFileError(f"the prices file cannot be read ({exc.strerror})") from exc
    except yaml.YAMLError as exc:
        raise PricesFileError("the prices file is not valid YAML") from exc
    return parse_overrides(document)


def load_price_database() -> None:
    """Read genai-prices' shipped data now (about a second of CPU, once per process): the server
    does it while starting, not in the first ingest request that prices a call."""
    from genai_prices import data_snapshot

    data_snapshot.get_snapshot()


@lru_cache(maxsize=4096)
def _database_model(model: str, provider: str) -> tuple[Any, Any] | None:
    """genai-prices' (provider, model) for a call's model and provider name, or None. The
    provider name is a hint: the database is asked with it, then by the model name alone."""
    from genai_prices import data_snapshot

    snapshot = data_snapshot.get_snapshot()
    for provider_id in ([_provider_id(provider)] if provider else []) + [None]:
        try:
            return snapshot.find_provider_model(model, None, provider_id, None)
        except LookupError:
            continue
    return None


def _provider_id(provider: str) -> str:
    """genai-prices' provider id for an OTel `gen_ai.provider.name` ("aws.bedrock" → "aws",
    "gcp.vertex_ai" → "google", "azure.ai.openai" → "azure")."""
    name = provider.lower()
    for prefix, provider_id in (("aws", "aws"), ("gcp", "google"), ("google", "google"), ("azure", "azure"),
                                ("xai", "x-ai"), ("x_ai", "x-ai"), ("mistral", "mistral")):
        if name.startswith(prefix):
            return provider_id
    return name


def call_cost(model: str, provider: str, tokens: Tokens, at: datetime | None,
              overrides: tuple[PriceOverride, ...] = ()) -> Decimal | None:
    """The USD cost of one call, or None when no price is known for its model."""
    if not model:
        return None
    billed = tokens.billed()
    for override in overrides:
        if override.matches(model, provider):
            return override.cost(billed)
    found = _database_model(model, provider)
    if found is None:
        return None
    db_provider, db_model = found
    try:
        model_price = db_model.get_prices(at or datetime.now(UTC))
        if not _prices_tokens(model_price):
            return None  # priced per minute, per character or per image: not from token counts
        rates = _linear_rates(model_price)
        if rates is not None:
            return rates.cost(billed)
        return db_model.calc_price(_usage(billed), db_provider, genai_request_timestamp=at).total_price
    except (LookupError, ValueError):
        return None  # a model known only for other kinds of usage (images, audio)


def cost_parts(model: str, provider: str, tokens: Tokens, at: datetime | None,
               overrides: tuple[PriceOverride, ...] = ()) -> dict[str, Decimal] | None:
    """`call_cost` split by kind of token: {"input" (uncached), "cache_read", "cache_write",
    "output", "request" (a fixed fee)}, which add up to it; None when no price is known or the
    price is tiered (not a rate per token, so not split)."""
    if not model:
        return None
    rates = next((o for o in overrides if o.matches(model, provider)), None)
    if rates is None:
        found = _database_model(model, provider)
        if found is None:
            return None
        try:
            model_price = found[1].get_prices(at or datetime.now(UTC))
            rates = _linear_rates(model_price) if _prices_tokens(model_price) else None
        except (LookupError, ValueError):
            return None
        if rates is None:
            return None
    billed = tokens.billed()
    uncached = max(billed.input - billed.cache_read - billed.cache_write, 0)
    return {
        "input": uncached * rates.input_mtok / MILLION,
        "cache_read": billed.cache_read * rates.cache_read_mtok / MILLION,
        "cache_write": billed.cache_write * rates.cache_write_mtok / MILLION,
        "output": billed.output * rates.output_mtok / MILLION,
        "request": rates.per_request,
    }


def _prices_tokens(model_price: Any) -> bool:
    """Whether a genai-prices price charges for text tokens at all (speech-to-text models are
    priced per minute, moderation models not at all: a token count gives them no cost, which is
    "no price", not $0)."""
    return getattr(model_price, "input_mtok", None) is not None or getattr(model_price, "output_mtok", None) is not None


def _usage(tokens: Tokens) -> Any:
    from genai_prices import Usage

    return Usage(input_tokens=tokens.input, output_tokens=tokens.output,
                 cache_read_tokens=tokens.cache_read, cache_write_tokens=tokens.cache_write)


_RATES: dict[int, tuple[Any, PriceOverride | None]] = {}


def _linear_rates(model_price: Any) -> PriceOverride | None:
    """`_read_rates` once per price object (they live as long as the snapshot; ModelPrice is
    not hashable, so the cache holds it by identity and keeps it alive)."""
    cached = _RATES.get(id(model_price))
    if cached is None or cached[0] is not model_price:
        cached = _RATES[id(model_price)] = (model_price, _read_rates(model_price))
    return cached[1]


def _read_rates(model_price: Any) -> PriceOverride | None:
    """The per-token rates genai-prices charges under `model_price`, read off its own
    calculation of a million tokens of each kind; None for tiered prices, which are not linear
    (those calls go through genai-prices whole). Its full calculation costs ~0.25 ms, too much
    to pay on every ingested call; the rates make the same sum."""
    from genai_prices.types import TieredPrices

    if any(isinstance(value, TieredPrices) for value in vars(model_price).values()):
        return None
    n = 1_000_000

    def price(**usage: int) -> Decimal:
        return model_price.calc_price(_usage(Tokens(**usage)))["total_price"]

    fee = price()

    def per_mtok(**usage: int) -> Decimal:
        return price(**usage) - fee

    return PriceOverride(
        match="", provider="", input_mtok=per_mtok(input=n), output_mtok=per_mtok(output=n),
        cache_read_mtok=per_mtok(input=n, cache_read=n), cache_write_mtok=per_mtok(input=n, cache_write=n),
        per_request=fee,
    )


def input_token_cost(model: str, provider: str, tokens: int, at: datetime | None,
                     overrides: tuple[PriceOverride, ...] = ()) -> Decimal | None:
    """What `tokens` more uncached input tokens cost on this model: how a tool result re-sent
    with a call is priced (without the model's fee per request, which the call pays anyway)."""
    cost = call_cost(model, provider, Tokens(input=tokens), at, overrides)
    fee = call_cost(model, provider, Tokens(), at, overrides)
    return cost - fee if cost is not None and fee is not None else cost
