"""Bytes to messages: frame headers and bodies from the socket, decoded and
checked (limits, enum values, integer ranges, UTF-8), :class:`Malformed` for
anything else: a reply from the socket is input, not trust."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from .wire_messages import (
    _BYTES,
    _FIXED32,
    _FIXED64,
    _HEADER,
    _U32,
    _VARINT,
    ACK,
    BATCH_REPLY,
    ERROR,
    EXISTS,
    EXISTS_REPLY,
    GET,
    HEADER_SIZE,
    HELLO,
    HELLO_REPLY,
    MAGIC,
    MAX_BODY,
    MAX_ITEMS,
    MAX_KEY,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_RANGES,
    MAX_RUNS,
    MAX_STATUS,
    OK,
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
    Ack,
    BatchReply,
    Error,
    Exists,
    ExistsReply,
    Get,
    Hello,
    HelloReply,
    Item,
    Malformed,
    Ping,
    Pong,
    Put,
    Range,
    RegisterSegment,
    RegisterSegmentReply,
    Remove,
    RemoveReply,
    Result,
    Run,
    Stats,
    StatsReply,
    UnregisterSegment,
)
from .wire_validate import validate


@dataclass
class Header:
    type: int
    id: int
    length: int


def parse_header(b: bytes) -> Header:
    """Decode a frame header; a bad magic, version or length is Malformed."""
    if len(b) != HEADER_SIZE:
        raise Malformed(f"frame header of {len(b)} bytes, want {HEADER_SIZE}")
    magic, version, typ, rid, n = _HEADER.unpack(b)
    if magic != MAGIC:
        raise Malformed(f"bad frame magic {magic!r}, want {MAGIC!r}")
    if version != VERSION:
        raise Malformed(
            f"protocol version {version}; this plugin speaks version {VERSION}: "
            "run the plugin and strata serve from matching releases"
        )
    if n > MAX_BODY:
        raise Malformed(f"frame declares a body of {n} bytes, at most {MAX_BODY}")
    return Header(typ, rid, n)


def _read_varint(b, i: int):
    v = 0
    shift = 0
    n = len(b)
    while True:
        if i >= n:
            raise Malformed("truncated varint")
        c = b[i]
        i += 1
        if shift == 63 and c > 1:
            raise Malformed("varint overflows 64 bits")
        v |= (c & 0x7F) << shift
        if c < 0x80:
            return v, i
        shift += 7
        if shift > 63:
            raise Malformed("varint longer than 10 bytes")


def _fields(b):
    """Yield (number, wire type, value) for each field of message body b.

    value is an int for varint and fixed fields, a memoryview for bytes.
    """
    b = memoryview(b)
    i, n = 0, len(b)
    while i < n:
        key, i = _read_varint(b, i)
        num, wt = key >> 3, key & 7
        if num == 0 or num > (1 << 29) - 1:
            raise Malformed(f"bad field number {num}")
        if wt == _VARINT:
            v, i = _read_varint(b, i)
        elif wt == _FIXED64:
            if i + 8 > n:
                raise Malformed(f"field {num}: truncated fixed64")
            v = int.from_bytes(b[i : i + 8], "little")
            i += 8
        elif wt == _FIXED32:
            if i + 4 > n:
                raise Malformed(f"field {num}: truncated fixed32")
            v = int.from_bytes(b[i : i + 4], "little")
            i += 4
        elif wt == _BYTES:
            ln, i = _read_varint(b, i)
            if ln > n - i:
                raise Malformed(f"field {num}: length {ln} past the end")
            v = b[i : i + ln]
            i += ln
        else:
            raise Malformed(
                f"field {num} has wire type {wt}; groups and reserved wire types are not used"
            )
        yield num, wt, v


def _want(name: str, wt: int, want: int):
    if wt != want:
        raise Malformed(f"{name} has wire type {wt}, want {want}")


def _u32(name, wt, v):
    _want(name, wt, _VARINT)
    if v > _U32:
        raise Malformed(f"{name} {v} out of range (uint32)")
    return v


def _i32(name, wt, v):
    _want(name, wt, _VARINT)
    if v >= 1 << 63:
        v -= 1 << 64
    if not -(1 << 31) <= v < 1 << 31:
        raise Malformed(f"{name} {v} out of range (int32)")
    return v


def _status(name, wt, v):
    _want(name, wt, _VARINT)
    if v > MAX_STATUS:
        raise Malformed(f"{name} {v} is not a known status (0 to {MAX_STATUS})")
    return v


def _text(name, wt, v, limit):
    _want(name, wt, _BYTES)
    if len(v) > limit:
        raise Malformed(f"{name} is {len(v)} bytes, at most {limit}")
    try:
        return bytes(v).decode("utf-8")
    except UnicodeDecodeError:
        raise Malformed(f"{name} is not valid UTF-8") from None


# The varint fields of a Range and a Run: number -> (attribute, whether uint32).
_RANGE_FIELDS = {1: ("segment", True), 2: ("offset", False), 3: ("length", False)}
_RUN_FIELDS = {**_RANGE_FIELDS, 4: ("stride", False), 5: ("count", True)}


def _varint_message(b, m, fields):
    """Decode b, a message of varint fields (fields), into m; return m."""
    for num, wt, v in _fields(b):
        f = fields.get(num)
        if f is None:
            continue
        name, u32 = f
        if u32:
            v = _u32(name, wt, v)
        else:
            _want(name, wt, _VARINT)
        setattr(m, name, v)
    return m


def _decode_range(b) -> Range:
    return _varint_message(b, Range(), _RANGE_FIELDS)


def _decode_run(b) -> Run:
    return _varint_message(b, Run(), _RUN_FIELDS)


def _decode_item(b) -> Item:
    it = Item()
    for num, wt, v in _fields(b):
        if num == 1:
            it.key = _text("key", wt, v, MAX_KEY)
        elif num == 2:
            _want("format", wt, _FIXED64)
            it.format = v
        elif num == 3:
            _want("ranges", wt, _BYTES)
            if len(it.ranges) >= MAX_RANGES:
                raise Malformed(f"more than {MAX_RANGES} ranges")
            it.ranges.append(_decode_range(v))
        elif num == 4:
            _want("runs", wt, _BYTES)
            if len(it.runs) >= MAX_RUNS:
                raise Malformed(f"more than {MAX_RUNS} runs")
            it.runs.append(_decode_run(v))
    return it


def _keys(b, num_keys: int, other=None) -> List[str]:
    keys = []
    for num, wt, v in _fields(b):
        if num == num_keys:
            if len(keys) >= MAX_ITEMS:
                raise Malformed(f"more than {MAX_ITEMS} keys")
            keys.append(_text("key", wt, v, MAX_KEY))
        elif other is not None:
            other(num, wt, v)
    return keys


# The results the Go codec writes for an item without a message: an empty
# Result ("\x0a\x00", OK) or one with only its status ("\x0a\x02\x08" status).
_RESULT_OK = b"\x0a\x00"
_SHARED_RESULTS = [Result(s) for s in range(MAX_STATUS + 1)]
# The Result every OK item of a fast-decoded reply is: list.count(RESULT_OK)
# counts them by identity, without a dataclass __eq__ per result.
RESULT_OK = _SHARED_RESULTS[OK]


def _fast_batch_reply(body) -> Optional[BatchReply]:
    """A BatchReply whose results are all of the two common forms above,
    decoded without the generic field walk; None for anything else (the
    generic decoder then decides, errors included)."""
    b = bytes(body)
    n = len(b)
    if n % 2 == 0 and b == _RESULT_OK * (n // 2):
        if n // 2 > MAX_ITEMS:
            return None
        return BatchReply([_SHARED_RESULTS[OK]] * (n // 2))
    results = []
    i = 0
    while i < n:
        if b[i] != 0x0A or i + 1 >= n:
            return None
        if b[i + 1] == 0:
            results.append(_SHARED_RESULTS[OK])
            i += 2
        elif b[i + 1] == 2 and i + 3 < n and b[i + 2] == 0x08 and 0 < b[i + 3] <= MAX_STATUS:
            results.append(_SHARED_RESULTS[b[i + 3]])
            i += 4
        else:
            return None
    if len(results) > MAX_ITEMS:
        return None
    return BatchReply(results)


def decode(typ: int, body) -> object:
    """Decode and validate the body of a frame of type typ; Malformed if bad."""
    if typ not in TYPE_NAMES:
        raise Malformed(f"unknown message type {typ} (known: 1 to {ERROR})")
    if len(body) > MAX_BODY:
        raise Malformed(f"body of {len(body)} bytes, at most {MAX_BODY}")
    if typ == BATCH_REPLY:
        m = _fast_batch_reply(body)
        if m is not None:
            return m  # valid by construction: known statuses, no messages
    try:
        m = _decode(typ, body)
        validate(m)
    except Malformed as e:
        raise Malformed(f"{TYPE_NAMES[typ]}: {e}") from None
    return m


def _decode(typ: int, body):
    if typ == HELLO:
        m = Hello(version=0, revision=0)
        for num, wt, v in _fields(body):
            if num == 1:
                m.version = _u32("version", wt, v)
            elif num == 2:
                m.client_name = _text("client name", wt, v, MAX_NAME)
            elif num == 3:
                m.pid = _i32("pid", wt, v)
            elif num == 4:
                m.revision = _u32("revision", wt, v)
        return m
    if typ == HELLO_REPLY:
        m = HelloReply()
        for num, wt, v in _fields(body):
            if num == 1:
                _want("client id", wt, _VARINT)
                m.client_id = v
            elif num == 2:
                m.server_version = _text("server version", wt, v, MAX_NAME)
            elif num == 3:
                m.max_batch = _u32("max batch", wt, v)
            elif num == 4:
                _want("clock", wt, _VARINT)
                m.clock_ns = v
            elif num == 5:
                _want("instance id", wt, _FIXED64)
                m.instance_id = v
            elif num == 6:
                _want("content id", wt, _FIXED64)
                m.content_id = v
            elif num in (7, 9):
                what = "starting" if num == 7 else "warm"
                _want(what, wt, _VARINT)
                if v > 1:
                    raise Malformed(f"{what} {v}, want 0 or 1")
                setattr(m, what, v == 1)
            elif num == 8:
                m.ready_percent = _u32("ready percent", wt, v)
                if m.ready_percent > 100:
                    raise Malformed(f"ready percent {m.ready_percent} over 100")
            elif num == 10:
                m.revision = _u32("revision", wt, v)
        return m
    if typ == REGISTER_SEGMENT:
        m = RegisterSegment()
        for num, wt, v in _fields(body):
            if num == 1:
                _want("size", wt, _VARINT)
                m.size = v
            elif num == 2:
                m.name = _text("name", wt, v, MAX_NAME)
            elif num == 3:
                _want("fence", wt, _VARINT)
                if v > 1:
                    raise Malformed(f"fence {v}, want 0 or 1")
                m.fence = v == 1
        return m
    if typ in (REGISTER_SEGMENT_REPLY, UNREGISTER_SEGMENT):
        seg = 0
        for num, wt, v in _fields(body):
            if num == 1:
                seg = _u32("segment id", wt, v)
        if typ == REGISTER_SEGMENT_REPLY:
            return RegisterSegmentReply(seg)
        return UnregisterSegment(seg)
    if typ == EXISTS:
        m = Exists()

        def other(num, wt, v):
            if num == 2:
                _want("format", wt, _FIXED64)
                m.format = v

        m.keys = _keys(body, 1, other)
        return m
    if typ in (EXISTS_REPLY, REMOVE_REPLY):
        n = 0
        for num, wt, v in _fields(body):
            if num == 1:
                n = _u32("present" if typ == EXISTS_REPLY else "removed", wt, v)
        return ExistsReply(n) if typ == EXISTS_REPLY else RemoveReply(n)
    if typ in (PUT, GET):
        m = Put() if typ == PUT else Get()
        for num, wt, v in _fields(body):
            if num == 1:
                _want("items", wt, _BYTES)
                if len(m.items) >= MAX_ITEMS:
                    raise Malformed(f"more than {MAX_ITEMS} items")
                m.items.append(_decode_item(v))
            elif num == 2:
                _want("deadline", wt, _VARINT)
                m.deadline_ns = v
            elif num == 3:
                m.fence_slot = _u32("fence slot", wt, v)
        return m
    if typ == BATCH_REPLY:
        results = []
        for num, wt, v in _fields(body):
            if num != 1:
                continue
            _want("results", wt, _BYTES)
            if len(results) >= MAX_ITEMS:
                raise Malformed(f"more than {MAX_ITEMS} results")
            status, message = OK, ""
            for rn, rwt, rv in _fields(v):
                if rn == 1:
                    status = _status("status", rwt, rv)
                elif rn == 2:
                    message = _text("message", rwt, rv, MAX_MESSAGE)
            results.append(Result(status, message))
        return BatchReply(results)
    if typ == REMOVE:
        return Remove(_keys(body, 1))
    if typ in (STATS, ACK):
        for _ in _fields(body):
            pass
        return Stats() if typ == STATS else Ack()
    if typ == STATS_REPLY:
        m = StatsReply()
        for num, wt, v in _fields(body):
            if num == 1:
                _want("json", wt, _BYTES)
                m.json = bytes(v)
        return m
    if typ in (PING, PONG):
        nonce = 0
        for num, wt, v in _fields(body):
            if num == 1:
                _want("nonce", wt, _FIXED64)
                nonce = v
        return Ping(nonce) if typ == PING else Pong(nonce)
    if typ == ERROR:
        m = Error(code=OK)
        for num, wt, v in _fields(body):
            if num == 1:
                m.code = _status("code", wt, v)
            elif num == 2:
                m.message = _text("message", wt, v, MAX_MESSAGE)
        return m
    raise Malformed(f"unknown message type {typ}")


def parse_frame(buf: bytes):
    """Decode one whole frame held in buf; return (Header, message).

    Anything but exactly one well-formed frame is Malformed.
    """
    if len(buf) < HEADER_SIZE:
        raise Malformed(f"frame of {len(buf)} bytes is shorter than its header")
    h = parse_header(bytes(buf[:HEADER_SIZE]))
    if len(buf) != HEADER_SIZE + h.length:
        raise Malformed(
            f"frame declares a body of {h.length} bytes and holds {len(buf) - HEADER_SIZE}"
        )
    return h, decode(h.type, memoryview(buf)[HEADER_SIZE:])
