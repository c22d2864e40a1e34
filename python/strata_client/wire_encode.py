"""Messages to bytes: protobuf-wire bodies and whole frames, field for field as
the Go package ``node/wire`` writes them."""

from __future__ import annotations

import struct
from typing import List, Optional

from .wire_messages import (
    _BYTES,
    _FIXED64,
    _HEADER,
    _U64,
    _VARINT,
    ACK,
    BATCH_REPLY,
    ERROR,
    EXISTS,
    EXISTS_REPLY,
    GET,
    HELLO,
    HELLO_REPLY,
    MAGIC,
    MAX_BODY,
    PING,
    PONG,
    PUT,
    REGISTER_SEGMENT,
    REGISTER_SEGMENT_REPLY,
    REMOVE,
    REMOVE_REPLY,
    STATS,
    STATS_REPLY,
    TYPE_NAMES,
    UNREGISTER_SEGMENT,
    VERSION,
    Item,
    Malformed,
    Range,
    Run,
)
from .wire_validate import _valid_window, validate


def _varint(v: int) -> bytes:
    out = bytearray()
    while v > 0x7F:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


# Small varints are most of an item's bytes (tags, lengths, segment ids): cache them.
_SMALL = [_varint(i) for i in range(1 << 14)]


def varint(v: int) -> bytes:
    """Return the protobuf varint encoding of 0 <= v < 2**64."""
    if v < 16384:
        return _SMALL[v]
    return _varint(v)


def _tag(num: int, wt: int) -> bytes:
    return varint(num << 3 | wt)


def _f_varint(num: int, v: int) -> bytes:
    return _tag(num, _VARINT) + varint(v) if v else b""


def _f_fixed64(num: int, v: int) -> bytes:
    return _tag(num, _FIXED64) + struct.pack("<Q", v) if v else b""


def _f_bytes(num: int, b: bytes) -> bytes:
    return _tag(num, _BYTES) + varint(len(b)) + b if b else b""


def _f_str(num: int, s: str) -> bytes:
    return _f_bytes(num, s.encode("utf-8"))


def _int32(v: int) -> int:
    return v & _U64  # proto int32: sign-extended to 64 bits


def encode_range(r: Range) -> bytes:
    """The body of a Range message."""
    return _f_varint(1, r.segment) + _f_varint(2, r.offset) + _f_varint(3, r.length)


def encode_run(r: Run) -> bytes:
    """The body of a Run message (revision 2)."""
    return (
        _f_varint(1, r.segment)
        + _f_varint(2, r.offset)
        + _f_varint(3, r.length)
        + _f_varint(4, r.stride)
        + _f_varint(5, r.count)
    )


def encode_item(it: Item) -> bytes:
    """The body of an Item message: key, format, ranges (field 3), runs (field 4)."""
    parts = [_f_str(1, it.key), _f_fixed64(2, it.format)]
    for tag, enc, subs in ((b"\x1a", encode_range, it.ranges), (b"\x22", encode_run, it.runs)):
        for r in subs:
            body = enc(r)
            parts.append(tag + varint(len(body)) + body)
    return b"".join(parts)


def encode_window(deadline_ns: int, fence_slot: int) -> bytes:
    """A Put's or Get's deadline and fence slot fields, which go before its
    items (as the Go codec writes them, and where its fast decoder takes them)."""
    return _f_varint(2, deadline_ns) + _f_varint(3, fence_slot)


def _items(items: List[Item]) -> bytes:
    out = []
    for it in items:
        body = encode_item(it)
        out.append(b"\x0a" + varint(len(body)) + body)
    return b"".join(out)


def encode_body(msg) -> bytes:
    """Return msg's protobuf encoding (zero fields left out, as proto3 does)."""
    t = msg.TYPE
    if t == HELLO:
        return (
            _f_varint(1, msg.version)
            + _f_str(2, msg.client_name)
            + _f_varint(3, _int32(msg.pid))
            + _f_varint(4, msg.revision)
        )
    if t == HELLO_REPLY:
        return (
            _f_varint(1, msg.client_id)
            + _f_str(2, msg.server_version)
            + _f_varint(3, msg.max_batch)
            + _f_varint(4, msg.clock_ns)
            + _f_fixed64(5, msg.instance_id)
            + _f_fixed64(6, msg.content_id)
            + _f_varint(7, int(bool(msg.starting)))
            + _f_varint(8, msg.ready_percent)
            + _f_varint(9, int(bool(msg.warm)))
            + _f_varint(10, msg.revision)
        )
    if t == REGISTER_SEGMENT:
        return _f_varint(1, msg.size) + _f_str(2, msg.name) + _f_varint(3, int(bool(msg.fence)))
    if t in (REGISTER_SEGMENT_REPLY, UNREGISTER_SEGMENT):
        return _f_varint(1, msg.segment_id)
    if t == EXISTS:
        return b"".join(_tag(1, _BYTES) + _len_str(k) for k in msg.keys) + _f_fixed64(2, msg.format)
    if t == EXISTS_REPLY:
        return _f_varint(1, msg.present)
    if t in (PUT, GET):
        return encode_window(msg.deadline_ns, msg.fence_slot) + _items(msg.items)
    if t == BATCH_REPLY:
        out = []
        for r in msg.results:
            body = _f_varint(1, r.status) + _f_str(2, r.message)
            out.append(b"\x0a" + varint(len(body)) + body)
        return b"".join(out)
    if t == REMOVE:
        return b"".join(_tag(1, _BYTES) + _len_str(k) for k in msg.keys)
    if t == REMOVE_REPLY:
        return _f_varint(1, msg.removed)
    if t in (STATS, ACK):
        return b""
    if t == STATS_REPLY:
        return _f_bytes(1, msg.json)
    if t in (PING, PONG):
        return _f_fixed64(1, msg.nonce)
    if t == ERROR:
        return _f_varint(1, msg.code) + _f_str(2, msg.message)
    raise Malformed(f"encode: unknown message type {t}")


def _len_str(s: str) -> bytes:
    b = s.encode("utf-8")
    return varint(len(b)) + b


def encode_frame(req_id: int, msg, body: Optional[bytes] = None) -> bytes:
    """Validate msg and return its whole frame (header and body).

    body, when given, is msg's encoding already made (a hot path builds it
    itself); it is not validated again. For a Put or Get it is the items only:
    msg's deadline and fence slot (validated) go before them.
    """
    head = b""
    if body is None:
        validate(msg)
        body = encode_body(msg)
    elif msg.TYPE in (PUT, GET) and (msg.deadline_ns or msg.fence_slot):
        _valid_window(msg)
        head = encode_window(msg.deadline_ns, msg.fence_slot)
    n = len(head) + len(body)
    if n > MAX_BODY:
        raise Malformed(
            f"encode {TYPE_NAMES[msg.TYPE]}: body of {n} bytes, at most {MAX_BODY}; split the batch"
        )
    return b"".join((_HEADER.pack(MAGIC, VERSION, msg.TYPE, req_id & _U64, n), head, body))
