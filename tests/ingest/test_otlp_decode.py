"""decode_traces_protobuf / decode_logs_protobuf: every AnyValue kind, and every span field, decode
to the same plain Python values whatever path the decoder takes for them (strings take a short one)."""

from __future__ import annotations

from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue

from pipeline.ingest.decode.otlp import MAX_DEPTH, TOO_DEEP, decode_logs_protobuf, decode_traces_protobuf
from pipeline.ingest.records import SpanEvent

TRACE, SPAN, PARENT, OTHER = b"\xab" * 16, b"\xcd" * 8, b"\x01" * 8, b"\xef" * 8


def typed(value: Any) -> Any:
    """The value with each leaf's type beside it, so that True, 1 and 1.0 (or "" and b"") differ."""
    if isinstance(value, dict):
        return {key: typed(inner) for key, inner in value.items()}
    if isinstance(value, list):
        return [typed(inner) for inner in value]
    return (type(value).__name__, value)


def array(*values: AnyValue) -> AnyValue:
    value = AnyValue()
    value.array_value.values.extend(values)
    return value


def kvlist(**values: AnyValue) -> AnyValue:
    value = AnyValue()
    value.kvlist_value.values.extend(KeyValue(key=key, value=inner) for key, inner in values.items())
    return value


def in_arrays(levels: int, leaf: AnyValue) -> AnyValue:
    for _ in range(levels):
        leaf = array(leaf)
    return leaf


def in_lists(levels: int, leaf: Any) -> Any:
    for _ in range(levels):
        leaf = [leaf]
    return leaf


# (attribute value as sent, value decoded): every kind, its empty/zero value, and unset.
CASES = {
    "string": (AnyValue(string_value="gpt-4o"), "gpt-4o"),
    "string.empty": (AnyValue(string_value=""), ""),
    "string.nul": (AnyValue(string_value="a\x00b"), "a\x00b"),
    "bool.true": (AnyValue(bool_value=True), True),
    "bool.false": (AnyValue(bool_value=False), False),
    "int": (AnyValue(int_value=42), 42),
    "int.zero": (AnyValue(int_value=0), 0),
    "int.negative": (AnyValue(int_value=-(2**63)), -(2**63)),
    "double": (AnyValue(double_value=0.5), 0.5),
    "double.zero": (AnyValue(double_value=0.0), 0.0),
    "double.integral": (AnyValue(double_value=3.0), 3.0),
    "bytes": (AnyValue(bytes_value=b"\x00\xff"), b"\x00\xff"),
    "bytes.empty": (AnyValue(bytes_value=b""), b""),
    "unset": (AnyValue(), None),
    "strindex": (AnyValue(string_value_strindex=3), None),  # a profiles dictionary index: no value here
    "array": (array(AnyValue(string_value="a"), AnyValue(int_value=1), AnyValue(bool_value=False),
                    AnyValue(double_value=1.0), AnyValue(bytes_value=b"b"), AnyValue(string_value=""),
                    AnyValue()), ["a", 1, False, 1.0, b"b", "", None]),
    "array.empty": (array(), []),
    "kvlist": (kvlist(s=AnyValue(string_value="x"), i=AnyValue(int_value=7), e=AnyValue(string_value=""),
                      u=AnyValue(), b=AnyValue(bool_value=True)), {"s": "x", "i": 7, "e": "", "u": None, "b": True}),
    "kvlist.empty": (kvlist(), {}),
    "nested": (kvlist(messages=array(kvlist(role=AnyValue(string_value="user"),
                                             parts=array(kvlist(content=AnyValue(string_value="hi")))))),
               {"messages": [{"role": "user", "parts": [{"content": "hi"}]}]}),
    "kvlist.nested": (kvlist(a=kvlist(b=kvlist(c=array(kvlist(d=AnyValue(int_value=1)))))),
                      {"a": {"b": {"c": [{"d": 1}]}}}),
    # MAX_DEPTH arrays or maps around a value are kept, one more is cut, whatever the leaf. (Maps are
    # nested inside arrays here: 33 maps deep is past protobuf's own limit of 100 messages.)
    "array.at_limit": (in_arrays(MAX_DEPTH, AnyValue(string_value="x")), in_lists(MAX_DEPTH, "x")),
    "array.past_limit": (in_arrays(MAX_DEPTH + 1, AnyValue(string_value="x")), in_lists(MAX_DEPTH, TOO_DEEP)),
    "kvlist.at_limit": (in_arrays(MAX_DEPTH - 1, kvlist(k=AnyValue(int_value=1))),
                        in_lists(MAX_DEPTH - 1, {"k": 1})),
    "kvlist.past_limit": (in_arrays(MAX_DEPTH, kvlist(k=AnyValue(string_value="x"))),
                          in_lists(MAX_DEPTH, TOO_DEEP)),
    "mixed.past_limit": (in_arrays(MAX_DEPTH - 1, kvlist(deep=array(AnyValue(string_value="x")))),
                         in_lists(MAX_DEPTH - 1, {"deep": TOO_DEEP})),
}


def attributes() -> list[KeyValue]:
    return [KeyValue(key=key, value=sent) for key, (sent, _) in CASES.items()]


EXPECTED = {key: decoded for key, (_, decoded) in CASES.items()}


def test_every_attribute_value_kind_decodes_to_its_plain_python_value():
    request = ExportTraceServiceRequest()
    resource_spans = request.resource_spans.add()
    resource_spans.resource.attributes.extend(attributes())
    scope_spans = resource_spans.scope_spans.add()
    scope_spans.scope.name, scope_spans.scope.version = "lib", "1.2"
    span = scope_spans.spans.add(trace_id=TRACE, span_id=SPAN, parent_span_id=PARENT, name="chat",
                                 start_time_unix_nano=2**63 + 5, end_time_unix_nano=2**63 + 9, kind=3)
    span.status.code, span.status.message = 2, "boom"
    span.attributes.extend(attributes())
    span.events.add(name="exception", time_unix_nano=7).attributes.extend(attributes())
    span.events.add(name="bare")
    span.links.add(trace_id=TRACE, span_id=OTHER).attributes.extend(attributes())

    (record,) = decode_traces_protobuf(request.SerializeToString()).spans

    assert typed(record.attributes) == typed(EXPECTED)
    assert list(record.attributes) == list(CASES)  # in the order sent
    assert typed(record.resource) == typed(EXPECTED)
    assert record.events == [SpanEvent("exception", 7, EXPECTED), SpanEvent("bare", 0, {})]
    assert typed(record.events[0].attributes) == typed(EXPECTED)
    assert record.links == [{"trace_id": "ab" * 16, "span_id": "ef" * 8, "attributes": EXPECTED}]
    assert typed(record.links[0]["attributes"]) == typed(EXPECTED)
    assert (record.trace_id, record.span_id, record.parent_span_id) == ("ab" * 16, "cd" * 8, "01" * 8)
    assert (record.name, record.kind, record.start_time_unix_nano, record.end_time_unix_nano) == (
        "chat", 3, 2**63 + 5, 2**63 + 9)
    assert (record.status_code, record.status_message) == (2, "boom")
    assert (record.scope_name, record.scope_version) == ("lib", "1.2")


def test_a_span_with_only_ids_decodes_to_empty_fields():
    request = ExportTraceServiceRequest()
    request.resource_spans.add().scope_spans.add().spans.add(trace_id=TRACE, span_id=SPAN)

    (record,) = decode_traces_protobuf(request.SerializeToString()).spans

    assert (record.parent_span_id, record.name, record.kind, record.start_time_unix_nano) == ("", "", 0, 0)
    assert (record.status_code, record.status_message, record.attributes, record.resource) == (0, "", {}, {})
    assert (record.events, record.links, record.scope_name, record.scope_version) == ([], [], "", "")


def test_every_log_body_kind_decodes_like_an_attribute_value():
    request = ExportLogsServiceRequest()
    records = request.resource_logs.add().scope_logs.add().log_records
    for sent, _ in CASES.values():
        records.add(time_unix_nano=1, body=sent)
    records.add(time_unix_nano=1)  # no body at all

    logs = decode_logs_protobuf(request.SerializeToString()).logs

    assert [typed(log.body) for log in logs] == [typed(decoded) for decoded in EXPECTED.values()] + [typed(None)]
