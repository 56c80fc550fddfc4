"""An image in a call's input, in its context composition: where the span reported its input
tokens, the text takes its tokens at the usual rate and the image what the count leaves; where it
did not, the runtime's rule counts the image as MEDIA_TOKENS. (The split of a reported count
weighed only text: a four-word system prompt took 40 % of a vision call's context.)"""

from __future__ import annotations

import base64
import json
import os

import pytest

from pipeline.ingest.write import deferred
from pipeline.ingest.write.store import store_spans
from pipeline.models import LLMCall
from pipeline.tokens.counting import MEDIA_TOKENS
from tests.genai_spans import chat

pytestmark = pytest.mark.django_db

MESSAGES = [
    {"role": "system", "parts": [{"type": "text", "content": "You see images."}]},
    {"role": "user", "parts": [
        {"type": "text", "content": "What is in this image?"},
        {"type": "uri", "modality": "image", "uri": "data:image/png;base64," + base64.b64encode(os.urandom(3000)).decode()},
    ]},
]


def used(call: LLMCall) -> dict[str, int]:
    return {k: v for k, v in call.context_composition.items() if v and k != "free"}


def test_an_image_takes_what_a_reported_count_leaves_over_the_text():
    reported, counted = chat("0d" * 16, "00000000000000d1", 1, "gpt-4o"), chat("0e" * 16, "00000000000000e1", 1, "gpt-4o")
    for span in (reported, counted):
        span.attributes["gen_ai.input.messages"] = json.dumps(MESSAGES)
    del counted.attributes["gen_ai.usage.input_tokens"]
    reported.attributes["gen_ai.usage.input_tokens"] = 900

    assert store_spans([reported, counted]).accepted == 2
    deferred.complete_pending()

    by_trace = {c.trace_id: c for c in LLMCall.objects.all()}
    # 15 bytes of system text of 3,600 bytes' worth (900 tokens at 4 bytes each): 4 tokens
    assert used(by_trace[reported.trace_id]) == {"system": 4, "user": 896}
    counted_call = by_trace[counted.trace_id]
    assert counted_call.input_tokens > MEDIA_TOKENS and not counted_call.tokens_pending
    assert used(counted_call)["system"] < 0.01 * counted_call.input_tokens


def test_an_image_a_tool_returned_weighs_in_the_tool_results_share():
    """A screenshot tool's image, inside the tool result: counted as a media part there too."""
    call = chat("0f" * 16, "00000000000000f1", 1, "gpt-4o")
    call.attributes["gen_ai.input.messages"] = json.dumps([
        {"role": "user", "parts": [{"type": "text", "content": "Take a screenshot of the page, please."}]},
        {"role": "tool", "parts": [{"type": "tool_call_response", "id": "call_1", "response": [
            {"type": "uri", "modality": "image", "uri": "https://example.com/shot.png"}]}]},
    ])
    call.attributes["gen_ai.usage.input_tokens"] = 1000

    store_spans([call])

    composition = used(LLMCall.objects.get())
    assert composition["tool_observations"] > 900 and composition["user"] < 100


def test_messages_without_text_split_nothing_and_store_whole_counts():
    call = chat("1a" * 16, "000000000000001a", 1, "gpt-4o")
    call.attributes["gen_ai.input.messages"] = json.dumps([{"role": "user", "parts": [{"type": "text", "content": ""}]}])

    store_spans([call])

    composition = LLMCall.objects.get().context_composition
    assert all(type(n) is int for n in composition.values()), composition
