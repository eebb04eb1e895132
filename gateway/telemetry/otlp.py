"""OTLP traces as protobuf bytes, written by hand: the ``ExportTraceServiceRequest`` of
opentelemetry-proto (opentelemetry/proto/collector/trace/v1/trace_service.proto and trace/v1/trace.proto,
common/v1/common.proto for attributes), only the fields the gateway fills.

Why not the SDK's exporter: it builds a protobuf object tree per span (and pulls protobuf in) to write
the same bytes; this writes them straight from the gateway's spans (the commit that added it says what
each cost per request). Field numbers and wire types are the .proto files'; the Phoenix test
(tests/telemetry) reads every exported span back through a real OTLP receiver.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Final

from gateway.telemetry.spans import AttributeValue, Span

# Span.SpanKind and Status.StatusCode values.
KIND_INTERNAL, KIND_SERVER, KIND_CLIENT = 1, 2, 3
STATUS_UNSET, STATUS_OK, STATUS_ERROR = 0, 1, 2

_double: Final = struct.Struct("<d")
_fixed64: Final = struct.Struct("<Q")
_fixed32: Final = struct.Struct("<I")
_SMALL: Final = [bytes((n,)) for n in range(0x80)]


def varint(value: int) -> bytes:
    if 0 <= value < 0x80:
        return _SMALL[value]
    if value < 0:  # int64 as protobuf writes a negative one: its 64-bit two's complement
        value += 1 << 64
    out = bytearray()
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(field: int, wire_type: int) -> bytes:
    return varint(field << 3 | wire_type)


def len_field(field: int, payload: bytes) -> bytes:
    size = len(payload)
    if size < 0x80:
        return _LEN_TAGS[field] + _SMALL[size] + payload
    if size < 0x4000:  # a span, an event: two bytes
        return _LEN_TAGS[field] + bytes((size & 0x7F | 0x80, size >> 7)) + payload
    return _LEN_TAGS[field] + varint(size) + payload


_LEN_TAGS: Final = [_key(field, 2) for field in range(16)]


def text_field(field: int, text: str) -> bytes:
    return len_field(field, text.encode("utf-8", "replace"))


def _any_value(value: AttributeValue) -> bytes:
    # AnyValue: string_value 1, bool_value 2, int_value 3, double_value 4, array_value 5.
    if isinstance(value, bool):
        return _key(2, 0) + varint(int(value))
    if isinstance(value, int):
        return _key(3, 0) + varint(value)
    if isinstance(value, float):
        return _key(4, 1) + _double.pack(value)
    if isinstance(value, str):
        return text_field(1, value)
    return len_field(5, b"".join(len_field(1, _any_value(item)) for item in value))  # ArrayValue.values 1


def attributes(field: int, values: Mapping[str, AttributeValue]) -> bytes:
    # KeyValue: key 1, value 2. Names repeat in every span, and so do most text values (route, backend,
    # model, status): each such whole KeyValue is encoded once and kept (boundedly); numbers each time.
    pairs, names = _encoded_pairs, _encoded_names
    out = []
    for name, value in values.items():
        if isinstance(value, (str, bool)) and name not in UNIQUE_VALUES:
            pair = pairs.get((field, name, value))
            if pair is None:
                pair = len_field(field, text_field(1, name) + len_field(2, _any_value(value)))
                if len(pairs) < MAX_CACHED:
                    pairs[field, name, value] = pair
            out.append(pair)
            continue
        key = names.get(name)
        if key is None:
            key = text_field(1, name)
            if len(names) < MAX_CACHED:
                names[name] = key
        if isinstance(value, int):
            encoded = _INT_TAG + (_SMALL[value] if 0 <= value < 0x80 else varint(value))
        elif isinstance(value, float):
            encoded = _DOUBLE_TAG + _double.pack(value)
        else:
            encoded = _any_value(value)
        out.append(len_field(field, key + len_field(2, encoded)))
    return b"".join(out)


_INT_TAG: Final = _key(3, 0)
_DOUBLE_TAG: Final = _key(4, 1)
_KIND_TAG: Final = _key(6, 0)
_START_TAG: Final = _key(7, 1)
_END_TAG: Final = _key(8, 1)
_SAMPLED_FLAGS: Final = _key(16, 5) + _fixed32.pack(1)


# Bounded, whatever names and values a policy or its clients bring (a request id is never a repeat:
# the cache fills with them and then stops growing).
MAX_CACHED: Final = 8192
UNIQUE_VALUES: Final = frozenset(
    {"gateway.request_id", "gateway.resumes_span_id", "gen_ai.input.messages", "gen_ai.output.messages"}
)
_encoded_pairs: Final[dict[tuple[int, str, AttributeValue], bytes]] = {}
_encoded_names: Final[dict[str, bytes]] = {}


def span_bytes(span: Span) -> bytes:
    # Span: trace_id 1, span_id 2, trace_state 3, parent_span_id 4, name 5, kind 6,
    # start_time_unix_nano 7, end_time_unix_nano 8, attributes 9, events 11, links 13, status 15, flags 16.
    out = [len_field(1, span.trace_id), len_field(2, span.span_id)]
    if span.trace_state:
        out.append(text_field(3, span.trace_state))
    if span.parent_span_id:
        out.append(len_field(4, span.parent_span_id))
    out += [
        text_field(5, span.name),
        _KIND_TAG + _SMALL[span.kind],
        _START_TAG + _fixed64.pack(span.start_ns),
        _END_TAG + _fixed64.pack(max(span.end_ns, span.start_ns)),
        attributes(9, span.attributes),
    ]
    for event in span.events:  # Event: time_unix_nano 1, name 2, attributes 3
        body = (
            _key(1, 1)
            + _fixed64.pack(event.time_ns)
            + text_field(2, event.name)
            + attributes(3, event.attributes)
        )
        out.append(len_field(11, body))
    for link in span.links:  # Link: trace_id 1, span_id 2, attributes 4, flags 6
        body = len_field(1, link.trace_id) + len_field(2, link.span_id) + attributes(4, link.attributes)
        out.append(len_field(13, body + _key(6, 5) + _fixed32.pack(1)))
    if span.error is not None:  # Status: message 2, code 3
        out.append(len_field(15, text_field(2, span.error) + _key(3, 0) + varint(STATUS_ERROR)))
    out.append(_SAMPLED_FLAGS)  # only sampled spans are exported
    return b"".join(out)


def export_request(
    resource: Mapping[str, AttributeValue], scope: tuple[str, str], spans: Iterable[Span]
) -> bytes:
    """One ``ExportTraceServiceRequest``: resource_spans 1 > (resource 1 > attributes 1, scope_spans 2 >
    (scope 1 > name 1, version 2; spans 2))."""
    scope_bytes = len_field(1, text_field(1, scope[0]) + text_field(2, scope[1]))
    span_list: Sequence[bytes] = [len_field(2, span_bytes(span)) for span in spans]
    scope_spans = len_field(2, scope_bytes + b"".join(span_list))
    return len_field(1, len_field(1, attributes(1, resource)) + scope_spans)


# The pieces the request writer (encode.py) puts around its cached blocks.
SAMPLED_FLAGS: Final = _SAMPLED_FLAGS


def envelope(resource: Mapping[str, AttributeValue], scope: tuple[str, str]) -> tuple[bytes, bytes]:
    """The parts of every export that never change, written once: the resource and the scope."""
    return len_field(1, attributes(1, resource)), len_field(
        1, text_field(1, scope[0]) + text_field(2, scope[1])
    )


def export_body(parts: tuple[bytes, bytes], spans: Sequence[bytes]) -> bytes:
    """One ``ExportTraceServiceRequest``: resource_spans 1 > (resource 1, scope_spans 2 > (scope 1,
    spans 2)), around span messages already written. The lengths are summed first and every piece is
    joined once: nesting ``_len`` copied each span four times (a batch is ~1 MB; ~10% of the exporter's
    CPU went to those copies)."""
    resource, scope = parts
    pieces = [b"", resource, b"", scope]
    size = 0
    for span in spans:
        head = _length_head(2, len(span))
        pieces += (head, span)
        size += len(head) + len(span)
    size += len(scope)
    pieces[2] = _length_head(2, size)
    pieces[0] = _length_head(1, len(resource) + len(pieces[2]) + size)
    return b"".join(pieces)


def _length_head(field: int, size: int) -> bytes:
    """A length-delimited field's tag and length, without its payload."""
    return _LEN_TAGS[field] + (_SMALL[size] if size < 0x80 else varint(size))


def fixed64(value: int) -> bytes:
    return max(value, 0).to_bytes(8, "little")


def span_times(start_ns: int, end_ns: int) -> bytes:
    # start_time_unix_nano 7, end_time_unix_nano 8 (fixed64)
    return b"\x39" + fixed64(start_ns) + b"\x41" + fixed64(max(end_ns, start_ns))


def span_ids(trace_id: bytes, span_id: bytes, parent: bytes) -> bytes:
    # trace_id 1, span_id 2, parent_span_id 4
    out = b"\x0a\x10" + trace_id + b"\x12\x08" + span_id
    return out + b"\x22\x08" + parent if parent else out


def error_status(message: str) -> bytes:
    # Status 15 {message 2, code 3}
    return len_field(15, text_field(2, message) + b"\x18" + varint(STATUS_ERROR))
