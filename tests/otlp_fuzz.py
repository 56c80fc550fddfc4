"""Hypothesis strategies and properties for fuzzing OTLP decoding, normalising and storing.

Used by tests/test_hostile_input.py (short runs) and bench/fuzz_otlp.py (`make fuzz`, long runs).
The properties: the decoders either decode or raise OtlpDecodeError (→ 400); the normaliser
never raises; store_spans stores or rejects span by span and never fails the whole batch.

Besides st.text() (which never yields a lone surrogate), text includes lone surrogates and NUL
(`texts`); values nest far past the decoders' limit (`deep_values`, `_deep_any`); and some
fields repeat hundreds of times (many attributes, events, spans) or hold long repeated text.
"""

from __future__ import annotations

import json
from typing import Any

from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from pipeline import semconv as sc
from pipeline.ingest.decode.otlp import OtlpDecodeError, decode_traces_json, decode_traces_protobuf
from pipeline.ingest.records import SpanEvent, SpanRecord

# Attribute keys the normaliser reads, so generated spans reach its branches.
KNOWN_KEYS = [
    "gen_ai.operation.name", "gen_ai.request.model", "gen_ai.response.model", "gen_ai.provider.name", "gen_ai.system",
    "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens", "gen_ai.usage.cache_read.input_tokens",
    "gen_ai.usage.prompt_tokens", "gen_ai.usage.completion_tokens", "gen_ai.response.finish_reasons",
    "gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.system_instructions", "gen_ai.conversation.id",
    "gen_ai.agent.name", "gen_ai.tool.name", "gen_ai.tool.call.id", "gen_ai.tool.call.arguments",
    "gen_ai.tool.call.result", "error.type", "session.id", "user.id",
    "openinference.span.kind", "llm.model_name", "llm.token_count.prompt", "llm.token_count.completion",
    "llm.input_messages.0.message.role", "llm.input_messages.0.message.content",
    "llm.output_messages.0.message.tool_calls.0.tool_call.function.name", "input.value", "output.value",
    "input.mime_type", "tool.name", "tool_call.id", "llm.invocation_parameters", "metadata",
    "traceloop.span.kind", "traceloop.entity.input", "traceloop.entity.output", "gen_ai.prompt.0.content",
    "gen_ai.prompt.0.role", "gen_ai.completion.0.content", "traceloop.association.properties.session_id",
    sc.SPAN_KIND, sc.ROUND_ID, sc.ROUND_USER_MESSAGE, sc.ROUND_FINAL_ANSWER, sc.CONTEXT_WINDOW, sc.CONTEXT_TOKENS,
    sc.CONTEXT_COMPOSITION, sc.TOOL_OUTPUT_LEVEL, sc.TOOL_ARTIFACT_ID, sc.TOOL_RETRY_COUNT, sc.TOOL_ERROR_TYPE,
    sc.TOOL_ERROR_CODE, sc.COMPRESSION_STRATEGY, sc.COMPRESSION_TOKENS_BEFORE, sc.COMPRESSION_TOKENS_AFTER,
    sc.COMPRESSION_BEFORE_MESSAGES, sc.COMPRESSION_DROPPED, sc.COMPRESSION_SUMMARY, sc.SKILL_NAME, sc.SKILL_LEVEL,
    sc.SKILL_CHAIN, sc.SKILL_DEPTH, sc.SKILL_CONTEXT_MODIFIER, sc.SKILL_TOKENS,
]
KIND_VALUES = ["chat", "execute_tool", "invoke_agent", "LLM", "TOOL", "AGENT", "CHAIN", "compression",
               "skill_activation", "workflow", "task", "embeddings", ""]

def texts(max_size: int) -> st.SearchStrategy[str]:
    """Text as exporters send it: any characters, sometimes with lone surrogates and NUL mixed in."""
    hostile = st.lists(st.one_of(st.characters(), st.characters(categories=["Cs"]), st.just("\x00")),
                       max_size=max_size).map("".join)
    return st.one_of(st.text(max_size=max_size), hostile)


# Long repeated text: far bigger than any column, cheap to generate.
huge_texts = st.tuples(st.sampled_from(["x", "\ud800", "ab\x00", "é"]), st.integers(1_000, 50_000)).map(
    lambda pair: pair[0] * pair[1])


def _nest(value, depth: int, kind: str):
    for _ in range(depth):
        value = [value] if kind == "list" else {"k": value}
    return value


# Arrays and maps nested further than the decoders keep (pipeline.ingest.decode.otlp.MAX_DEPTH).
deep_values = st.tuples(st.integers(20, 200), st.sampled_from(["list", "dict"])).map(
    lambda pair: _nest("bottom", *pair))

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.integers(min_value=-(2**80), max_value=2**80), st.floats(allow_nan=True, allow_infinity=True),
    texts(40), st.sampled_from(KIND_VALUES), st.binary(max_size=16), huge_texts,
)
json_text = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(allow_nan=False), texts(20)),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts(10), inner, max_size=4)),
    max_leaves=12,
).map(lambda value: json.dumps(value))
values = st.recursive(
    st.one_of(scalars, json_text, deep_values),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(texts(12), inner, max_size=4)),
    max_leaves=16,
)
_many_attributes = st.integers(200, 1_000).map(lambda n: {f"repeated.{i}": i for i in range(n)})
attributes = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(KNOWN_KEYS), texts(30)), values, max_size=12),
    st.tuples(st.dictionaries(st.sampled_from(KNOWN_KEYS), values, max_size=6), _many_attributes).map(
        lambda pair: {**pair[1], **pair[0]}),
)
hex_ids = st.one_of(st.binary(min_size=16, max_size=16).map(bytes.hex), texts(40))
span_ids = st.one_of(st.binary(min_size=8, max_size=8).map(bytes.hex), texts(20))
nanos = st.one_of(st.integers(min_value=-(2**64), max_value=2**64),
                  st.integers(min_value=1_500_000_000 * 10**9, max_value=2_000_000_000 * 10**9))

span_records = st.builds(
    SpanRecord,
    trace_id=hex_ids, span_id=span_ids, name=st.one_of(st.sampled_from(KIND_VALUES), texts(50), huge_texts),
    start_time_unix_nano=nanos, end_time_unix_nano=nanos, parent_span_id=st.one_of(st.just(""), span_ids),
    kind=st.integers(min_value=0, max_value=6), status_code=st.integers(min_value=0, max_value=3),
    status_message=texts(30), attributes=attributes,
    events=st.one_of(
        st.lists(st.builds(SpanEvent, name=st.sampled_from(["exception", "gen_ai.content.prompt", "x"]),
                           time_unix_nano=nanos, attributes=attributes), max_size=3),
        st.integers(100, 1_000).map(lambda n: [SpanEvent("x", 1_700_000_000 * 10**9, {"i": i}) for i in range(n)]),
    ),
    resource=st.dictionaries(st.sampled_from(["service.name", "x"]), values, max_size=2),
    scope_name=texts(20),
)

# OTLP/JSON-shaped documents: the right keys with values of any type, at any depth.
_json_scalar = st.one_of(st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
                         st.floats(allow_nan=True, allow_infinity=True), texts(34))
# An arrayValue or kvlistValue nested past MAX_DEPTH (json.dumps itself recurses: at most 100 here).
_deep_any = st.tuples(st.integers(20, 100), st.booleans()).map(lambda pair: _nest_any(*pair))


def _nest_any(depth: int, as_map: bool) -> dict:
    value: dict = {"stringValue": "bottom"}
    for _ in range(depth):
        value = ({"kvlistValue": {"values": [{"key": "k", "value": value}]}} if as_map
                 else {"arrayValue": {"values": [value]}})
    return value


_any_value = st.recursive(
    st.one_of(_json_scalar, _deep_any, st.fixed_dictionaries({}, optional={
        "stringValue": _json_scalar, "intValue": _json_scalar, "doubleValue": _json_scalar,
        "boolValue": _json_scalar, "bytesValue": _json_scalar})),
    lambda inner: st.one_of(st.fixed_dictionaries({"arrayValue": st.fixed_dictionaries({"values": st.lists(inner, max_size=3)})}),
                            st.fixed_dictionaries({"kvlistValue": st.fixed_dictionaries({"values": st.lists(
                                st.fixed_dictionaries({"key": texts(8), "value": inner}), max_size=3)})})),
    max_leaves=8,
)
_key_value = st.fixed_dictionaries({"key": st.one_of(st.sampled_from(KNOWN_KEYS), _json_scalar), "value": _any_value})
_json_attrs = st.integers(0, 9).flatmap(lambda n: (
    _json_scalar if n == 0 else st.lists(st.one_of(_json_scalar, _key_value), max_size=5) if n == 1
    else st.integers(200, 1_000).map(lambda count: [{"key": f"repeated.{i}", "value": {"intValue": str(i)}}
                                                    for i in range(count)]) if n == 2
    else st.lists(_key_value, min_size=1, max_size=5)))
_trace_id = st.binary(min_size=16, max_size=16).map(bytes.hex)
_span_id = st.binary(min_size=8, max_size=8).map(bytes.hex)
_time = st.integers(min_value=1_500_000_000 * 10**9, max_value=2_000_000_000 * 10**9)


def mostly(valid, wild=_json_scalar):
    """Nine times in ten `valid`, else anything: one bad field refuses the whole body, so most must be good.
    (one_of would not do: hypothesis merges repeated branches.)"""
    return st.integers(0, 9).flatmap(lambda n: wild if n == 0 else valid)


_event = st.fixed_dictionaries({"name": mostly(st.sampled_from(["exception", "gen_ai.choice", "x"])),
                                "timeUnixNano": mostly(_time.map(str)), "attributes": _json_attrs})
_link = st.fixed_dictionaries({"traceId": mostly(_trace_id), "spanId": mostly(_span_id), "attributes": _json_attrs})
_json_span = st.fixed_dictionaries({
    "traceId": mostly(_trace_id), "spanId": mostly(_span_id),
    "name": mostly(st.sampled_from(KIND_VALUES)), "kind": mostly(st.integers(min_value=0, max_value=5)),
    "startTimeUnixNano": mostly(_time.map(str)), "endTimeUnixNano": mostly(st.one_of(_time, _time.map(str))),
    "attributes": _json_attrs,
}, optional={
    "parentSpanId": mostly(_span_id),
    "status": mostly(st.fixed_dictionaries({"code": mostly(st.integers(0, 2)), "message": mostly(texts(9))})),
    "events": mostly(st.lists(_event, max_size=2)), "links": mostly(st.lists(_link, max_size=2)),
})
_well_formed = st.fixed_dictionaries({"resourceSpans": st.lists(st.fixed_dictionaries({
    "resource": st.fixed_dictionaries({"attributes": _json_attrs}),
    "scopeSpans": st.lists(st.fixed_dictionaries({
        "scope": st.fixed_dictionaries({}, optional={"name": _json_scalar, "version": _json_scalar}),
        "spans": st.one_of(st.lists(_json_span, min_size=1, max_size=3),
                           _json_span.map(lambda span: [span] * 300)),  # one span repeated: duplicates
    }), min_size=1, max_size=2),
}), min_size=1, max_size=2)})
_wild = st.fixed_dictionaries({}, optional={"resourceSpans": st.one_of(_json_scalar, st.lists(
    st.one_of(_json_scalar, st.fixed_dictionaries({}, optional={
        "resource": st.one_of(_json_scalar, st.fixed_dictionaries({"attributes": _json_attrs})),
        "scopeSpans": st.one_of(_json_scalar, st.lists(st.one_of(_json_scalar, st.fixed_dictionaries({}, optional={
            "scope": st.one_of(_json_scalar, st.fixed_dictionaries({}, optional={
                "name": _json_scalar, "version": _json_scalar})),
            "spans": st.one_of(_json_scalar, st.lists(st.one_of(_json_scalar, _json_span), max_size=3)),
        })), max_size=2)),
    })), max_size=2))})
# Mostly the right shape with wrong values inside, sometimes the wrong shape altogether.
json_documents = mostly(_well_formed, _wild)


def json_body(document: Any) -> bytes:
    """Python's json writes NaN and Infinity, which json.loads (and so the server) accepts."""
    return json.dumps(document, allow_nan=True).encode()


def mutate(body: bytes, edits: list[tuple[int, int]]) -> bytes:
    """Overwrite bytes of a valid body: (position, new byte) pairs, positions taken modulo the length."""
    data = bytearray(body)
    for position, byte in edits:
        if data:
            data[position % len(data)] = byte
    return bytes(data)


byte_edits = st.lists(st.tuples(st.integers(min_value=0), st.integers(min_value=0, max_value=255)),
                      min_size=1, max_size=8)


def decodes_or_refuses(decode, body: bytes):
    """The decoder's contract: a Decoded, or OtlpDecodeError; nothing else escapes."""
    try:
        return decode(body)
    except OtlpDecodeError:
        return None


def check_protobuf(body: bytes) -> None:
    decoded = decodes_or_refuses(decode_traces_protobuf, body)
    if decoded is not None:
        check_records(decoded.spans)


def check_json(document: Any) -> None:
    decoded = decodes_or_refuses(decode_traces_json, json_body(document))
    if decoded is not None:
        check_records(decoded.spans)


def check_records(records: list[SpanRecord]) -> None:
    from pipeline.ingest.normalise.span import normalise
    from pipeline.ingest.write.store import validation_error

    for record in records:
        if not validation_error(record):
            normalise(record)  # must not raise for anything that passed validation


def sample_request(spans: list) -> bytes:
    """A valid ExportTraceServiceRequest body built from SDK spans, to mutate."""
    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

    request: ExportTraceServiceRequest = encode_spans(spans)
    return request.SerializeToString()
