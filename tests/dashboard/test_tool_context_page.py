"""The tools page's ranking by context cost, as the page and its live fragment render it."""

from __future__ import annotations

import re

import pytest

from pipeline.ingest.write import deferred
from pipeline.models import ToolCall
from pipeline.models.apikeys import ApiKey, Scope
from tests.api_client import client_with
from tests.ingest.test_tool_levels import run, turn

pytestmark = pytest.mark.django_db


@pytest.fixture
def api():
    return client_with(ApiKey.generate("agent", scope=Scope.INGEST)[1])


def post(api, events: list[dict]) -> None:
    assert api.post("/api/ingest/", {"schema_version": "1.0", "events": events}, format="json").status_code == 200


def sentences(html: str) -> list[str]:
    found = re.findall(r'data-stat="context-sentence">(.*?)</p>', html, re.S)
    return [re.sub(r"<[^>]+>", "", s) for s in found]


def test_the_costliest_tool_comes_first_and_an_unpriced_one_says_no_price(api, client, alice):
    post(api, turn("web_search", run("web_search", store_artifacts=False), carriers=2))
    cheap = turn("lookup", run("lookup", store_artifacts=False), carriers=3, round_id="r2")
    for event in cheap:
        event.update(model="acme-unknown-model") if event["type"] == "llm_call" else None
    post(api, cheap)
    deferred.complete_pending()
    client.force_login(alice)

    page = client.get("/tools/?window=all").content.decode()
    fragment = client.get("/fragments/tools/?window=all").json()["fragments"]["tools-context"]

    search = ToolCall.objects.get(tool_name="web_search")
    assert search.context_cost_usd is not None and ToolCall.objects.get(tool_name="lookup").context_cost_usd is None
    assert float(search.context_cost_usd) == pytest.approx(0.0099, abs=0.00005)  # shown to two significant digits
    expected = ["web_search: results re-sent 2× on average, 4k input tokens, $0.0099",
                "lookup: results re-sent 3× on average, 6.1k input tokens, no price"]
    assert sentences(page) == sentences(fragment) == expected
    assert "would have saved" in fragment and "lookup to brief would have saved" in fragment


def test_a_tool_name_with_markup_is_shown_as_text(api, client, alice):
    name = '<img src=x onerror="alert(1)">'
    events = turn(name, run("web_search", store_artifacts=False), carriers=1)
    post(api, events)
    deferred.complete_pending()
    client.force_login(alice)

    fragment = client.get("/fragments/tools/?window=all").json()["fragments"]["tools-context"]

    assert "<img" not in fragment and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in fragment


def test_costs_below_a_cent_keep_two_significant_digits_and_no_price_is_never_zero():
    from dashboard.views.tools import usd

    assert [usd(v) for v in (None, 0.0, 0.46, 1234.5, 0.0099, 0.00005912, -0.00037, 0.00999)] == [
        "no price", "$0.00", "$0.46", "$1,234.50", "$0.0099", "$0.000059", "-$0.00037", "$0.01"]
