"""pipeline.insight.pricing: the same sums as genai-prices, faster, and the prices file."""

from __future__ import annotations

from datetime import UTC, datetime
from decimal import Decimal

import pytest
from django.core.management import call_command
from django.core.management.base import SystemCheckError
from genai_prices import Usage, calc_price, data_snapshot
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline.insight.pricing import PricesFileError, Tokens, call_cost, load_overrides, parse_overrides

AT = datetime(2026, 11, 1, tzinfo=UTC)
MODELS = sorted((provider.id, model.id) for provider in data_snapshot.get_snapshot().providers
                for model in provider.models)


def _database_price(provider: str, model: str, tokens: Tokens) -> Decimal | None:
    usage = Usage(input_tokens=tokens.input, output_tokens=tokens.output,
                  cache_read_tokens=tokens.cache_read, cache_write_tokens=tokens.cache_write)
    # As ctxlens asks: with the call's provider, then by the model name alone (some listed ids
    # match only under another provider's rules).
    for provider_id in (provider, None):
        try:
            price = calc_price(usage, model, provider_id=provider_id, genai_request_timestamp=AT)
        except (LookupError, ValueError):
            continue
        if price.model_price.input_mtok is None and price.model_price.output_mtok is None:
            return None  # priced per minute or per image: a token count gives no price, not $0
        return price.total_price
    return None


@settings(max_examples=300, deadline=None)
@given(
    st.sampled_from(MODELS),
    st.integers(0, 400_000), st.integers(0, 100_000), st.integers(0, 100_000), st.integers(0, 20_000),
)
def test_every_listed_model_costs_what_genai_prices_says(model, uncached, cache_read, cache_write, output):
    provider_id, model_id = model
    tokens = Tokens(input=uncached + cache_read + cache_write, output=output, cache_read=cache_read,
                    cache_write=cache_write)
    assert call_cost(model_id, provider_id, tokens, AT) == _database_price(provider_id, model_id, tokens)


def test_a_gpt4o_call_costs_its_list_price():
    # $2.50 per million input tokens, $1.25 cached, $10 output (genai-prices' data for gpt-4o).
    cost = call_cost("gpt-4o", "openai", Tokens(input=10_000, output=1_000, cache_read=4_000), AT)
    assert cost == Decimal("0.0150") + Decimal("0.0050") + Decimal("0.0100")


def test_separately_reported_cache_tokens_are_added_to_the_input():
    # Anthropic reports input tokens without the cache reads: 100 uncached + 5,000 read.
    separate = call_cost("claude-3-5-sonnet-20241022", "anthropic", Tokens(input=100, output=10, cache_read=5_000), AT)
    included = call_cost("claude-3-5-sonnet-20241022", "anthropic", Tokens(input=5_100, output=10, cache_read=5_000), AT)
    assert separate == included == _database_price(
        "anthropic", "claude-3-5-sonnet-20241022", Tokens(input=5_100, output=10, cache_read=5_000))


def test_reasoning_tokens_beyond_the_output_count_are_billed():
    assert call_cost("o3", "openai", Tokens(input=0, output=10, reasoning=500), AT) == call_cost(
        "o3", "openai", Tokens(input=0, output=500), AT)


def test_a_model_not_priced_by_tokens_has_no_price():
    # whisper-1 is priced per minute of audio: genai-prices gives $0 for tokens, ctxlens "no price".
    assert calc_price(Usage(input_tokens=5_000, output_tokens=100), "whisper-1", provider_id="openai",
                      genai_request_timestamp=AT).total_price == 0
    assert call_cost("whisper-1", "openai", Tokens(input=5_000, output=100), AT) is None


def test_an_unknown_model_has_no_price():
    assert call_cost("acme-large-7", "acme", Tokens(input=1_000, output=1_000), AT) is None
    assert call_cost("", "openai", Tokens(input=1_000), AT) is None


def test_overrides_add_a_model_and_win_over_the_database():
    overrides = parse_overrides({"models": [
        {"match": "acme-*", "input_mtok": 1, "output_mtok": 2, "cache_read_mtok": "0.5"},
        {"match": "gpt-4o", "provider": "openai", "input_mtok": 100, "output_mtok": 100},
    ]})
    assert call_cost("acme-large-7", "", Tokens(input=2_000_000, output=1_000_000, cache_read=1_000_000), AT,
                     overrides) == Decimal("1") + Decimal("0.5") + Decimal("2")
    assert call_cost("gpt-4o", "openai", Tokens(input=10_000), AT, overrides) == Decimal("1")
    assert call_cost("gpt-4o", "azure", Tokens(input=10_000), AT, overrides) == Decimal("0.025")  # other provider


@pytest.mark.parametrize(("document", "message"), [
    ([1, 2], "a mapping with a `models` list"),
    ({"models": [{"input_mtok": 1, "output_mtok": 1}]}, "models[0]: needs a `match`"),
    ({"models": [{"match": "x", "output_mtok": 1}]}, "models[0]: input_mtok is required"),
    ({"models": [{"match": "x", "input_mtok": -1, "output_mtok": 1}]}, "must be a non-negative number"),
    ({"models": [{"match": "x", "input_mtok": "lots", "output_mtok": 1}]}, "must be a number"),
    ({"models": [{"match": "x", "input_mtok": True, "output_mtok": 1}]}, "must be a number"),
])
def test_a_malformed_prices_file_says_what_is_wrong(document, message):
    with pytest.raises(PricesFileError, match=message.replace("[", r"\[").replace("]", r"\]")):
        parse_overrides(document)


def test_a_bad_prices_file_stops_the_server_without_naming_its_path(tmp_path, settings):
    path = tmp_path / "secret-dir" / "prices.yaml"
    path.parent.mkdir()
    path.write_text("models: [{match: x}]\n")
    settings.CTXLENS_PRICES_FILE = str(path)
    with pytest.raises(SystemCheckError) as raised:
        call_command("check")
    assert "pipeline.E072" in str(raised.value) and "input_mtok is required" in str(raised.value)
    assert "secret-dir" not in str(raised.value)
    load_overrides.cache_clear()
