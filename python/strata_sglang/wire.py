"""The node service's protocol (node/wire/strata.proto), encoded by hand.

SGLang does not depend on protobuf, so this module carries its own codec for the
frames and messages of ``node/wire/strata.proto``, field for field as the Go
package ``node/wire`` encodes them (checked against frames the Go codec writes:
``node/wire/testdata/golden``). Decoders check what a reply may hold (the
protocol's limits, enum values, integer ranges, UTF-8) and raise
:class:`Malformed` for anything else: a reply from the socket is input, not trust.

A frame is a 16-byte header (magic ``ST``, version 1, message type, request id
uint64 LE, body length uint32 LE) and a protobuf-wire body.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import List, Optional

MAGIC = b"ST"
VERSION = 1
HEADER_SIZE = 16
MAX_BODY = 16 << 20
MAX_ITEMS = 4096
MAX_RANGES = 256
MAX_KEY = 512
MAX_NAME = 256
MAX_MESSAGE = 2048
# The fence page (RegisterSegment.fence): FENCE_SLOTS little-endian uint32
# counters; Put/Get.fence_slot s (1 to FENCE_SLOTS) is the one at 4*(s-1).
FENCE_BYTES = 4096
FENCE_SLOTS = FENCE_BYTES // 4
# The most bytes a Put's or Get's deadline and fence slot add before its items.
MAX_WINDOW = 1 + 10 + 1 + 2

_HEADER = struct.Struct("<2sBBQI")
_U64 = (1 << 64) - 1
_U32 = (1 << 32) - 1


class Malformed(ValueError):
    """A frame or message breaks the protocol (the Go codec's ErrMalformed)."""


# Message types (enum MessageType).
HELLO = 1
HELLO_REPLY = 2
REGISTER_SEGMENT = 3
REGISTER_SEGMENT_REPLY = 4
UNREGISTER_SEGMENT = 5
EXISTS = 6
EXISTS_REPLY = 7
PUT = 8
GET = 9
BATCH_REPLY = 10
REMOVE = 11
REMOVE_REPLY = 12
STATS = 13
STATS_REPLY = 14
PING = 15
PONG = 16
ACK = 17
ERROR = 18

TYPE_NAMES = {
    HELLO: "Hello",
    HELLO_REPLY: "HelloReply",
    REGISTER_SEGMENT: "RegisterSegment",
    REGISTER_SEGMENT_REPLY: "RegisterSegmentReply",
    UNREGISTER_SEGMENT: "UnregisterSegment",
    EXISTS: "Exists",
    EXISTS_REPLY: "ExistsReply",
    PUT: "Put",
    GET: "Get",
    BATCH_REPLY: "BatchReply",
    REMOVE: "Remove",
    REMOVE_REPLY: "RemoveReply",
    STATS: "Stats",
    STATS_REPLY: "StatsReply",
    PING: "Ping",
    PONG: "Pong",
    ACK: "Ack",
    ERROR: "Error",
}

# Statuses (enum Status).
OK = 0
NOT_FOUND = 1
CORRUPT = 2
NO_SPACE = 3
BAD_RANGE = 4
FORMAT_MISMATCH = 5
BUSY = 6
QUOTA = 7
INTERNAL = 8
UNAVAILABLE = 9
MAX_STATUS = UNAVAILABLE

STATUS_NAMES = [
    "ok",
    "not_found",
    "corrupt",
    "no_space",
    "bad_range",
    "format_mismatch",
    "busy",
    "quota",
    "internal",
    "unavailable",
]

_VARINT, _FIXED64, _BYTES, _FIXED32 = 0, 1, 2, 5


# ---------------------------------------------------------------- messages


@dataclass
class Hello:
    version: int = VERSION
    client_name: str = ""
    pid: int = 0
    TYPE = HELLO


@dataclass
class HelloReply:
    client_id: int = 0
    server_version: str = ""
    max_batch: int = 0
    # The service's CLOCK_MONOTONIC (ns) when it answered: the clock of
    # deadline_ns. 0 from a service that keeps no client deadlines.
    clock_ns: int = 0
    # Random per start of the service; content_id stays the same across a
    # restart that kept the service's contents (warm), and changes when it
    # started empty. 0 from an older service.
    instance_id: int = 0
    content_id: int = 0
    # The service serves already while starting, from ready_percent of its
    # arena; warm says this start kept the contents of the one before.
    starting: bool = False
    ready_percent: int = 0
    warm: bool = False
    TYPE = HELLO_REPLY


@dataclass
class RegisterSegment:
    size: int = 0
    name: str = ""
    # The memfd is the connection's fence page (FENCE_BYTES), not a host pool.
    fence: bool = False
    TYPE = REGISTER_SEGMENT


@dataclass
class RegisterSegmentReply:
    segment_id: int = 0
    TYPE = REGISTER_SEGMENT_REPLY


@dataclass
class UnregisterSegment:
    segment_id: int = 0
    TYPE = UNREGISTER_SEGMENT


@dataclass
class Exists:
    keys: List[str] = field(default_factory=list)
    format: int = 0
    TYPE = EXISTS


@dataclass
class ExistsReply:
    present: int = 0
    TYPE = EXISTS_REPLY


@dataclass
class Range:
    segment: int = 0
    offset: int = 0
    length: int = 0


@dataclass
class Item:
    key: str = ""
    format: int = 0
    ranges: List[Range] = field(default_factory=list)


@dataclass
class Put:
    items: List[Item] = field(default_factory=list)
    # When the client gives up, in the service's clock (HelloReply.clock_ns);
    # 0: none. The service copies nothing for the request after it.
    deadline_ns: int = 0
    # The fence page's counter for the request (a Get's), 1 to FENCE_SLOTS; 0: none.
    fence_slot: int = 0
    TYPE = PUT


@dataclass
class Get:
    items: List[Item] = field(default_factory=list)
    deadline_ns: int = 0
    fence_slot: int = 0
    TYPE = GET


@dataclass(frozen=True)
class Result:
    # Frozen: a decoded reply shares one instance among all the items with the
    # same status and no message (see _fast_batch_reply).
    status: int = OK
    message: str = ""


@dataclass
class BatchReply:
    results: List[Result] = field(default_factory=list)
    TYPE = BATCH_REPLY


@dataclass
class Remove:
    keys: List[str] = field(default_factory=list)
    TYPE = REMOVE


@dataclass
class RemoveReply:
    removed: int = 0
    TYPE = REMOVE_REPLY


@dataclass
class Stats:
    TYPE = STATS


@dataclass
class StatsReply:
    json: bytes = b""
    TYPE = STATS_REPLY


@dataclass
class Ping:
    nonce: int = 0
    TYPE = PING


@dataclass
class Pong:
    nonce: int = 0
    TYPE = PONG


@dataclass
class Ack:
    TYPE = ACK


@dataclass
class Error:
    code: int = INTERNAL
    message: str = ""
    TYPE = ERROR


# ---------------------------------------------------------------- encoding


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


def encode_item(it: Item) -> bytes:
    """The body of an Item message."""
    parts = [_f_str(1, it.key), _f_fixed64(2, it.format)]
    for r in it.ranges:
        body = encode_range(r)
        parts.append(b"\x1a" + varint(len(body)) + body)
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
            _f_varint(1, msg.version) + _f_str(2, msg.client_name) + _f_varint(3, _int32(msg.pid))
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


# ---------------------------------------------------------------- decoding


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


def _decode_range(b) -> Range:
    r = Range()
    for num, wt, v in _fields(b):
        if num == 1:
            r.segment = _u32("segment", wt, v)
        elif num == 2:
            _want("offset", wt, _VARINT)
            r.offset = v
        elif num == 3:
            _want("length", wt, _VARINT)
            r.length = v
    return r


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
        m = Hello(version=0)
        for num, wt, v in _fields(body):
            if num == 1:
                m.version = _u32("version", wt, v)
            elif num == 2:
                m.client_name = _text("client name", wt, v, MAX_NAME)
            elif num == 3:
                m.pid = _i32("pid", wt, v)
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


# ---------------------------------------------------------------- validation


def valid_key(k: str) -> None:
    """Raise Malformed unless k is 1 to MAX_KEY bytes of printable ASCII."""
    if not k:
        raise Malformed("key is empty")
    if len(k) > MAX_KEY:
        raise Malformed(f"key {k[:40]!r}... is {len(k)} bytes, at most {MAX_KEY}")
    for i, c in enumerate(k):
        if not " " <= c <= "~":
            raise Malformed(f"key {k[:40]!r} has {c!r} at {i}; keys are printable ASCII")


def _valid_text(what: str, s: str, limit: int) -> None:
    if len(s.encode("utf-8", "surrogatepass")) > limit:
        raise Malformed(f"{what} is longer than {limit} bytes")


def _valid_keys(keys) -> None:
    if len(keys) > MAX_ITEMS:
        raise Malformed(f"{len(keys)} keys, at most {MAX_ITEMS}")
    for i, k in enumerate(keys):
        try:
            valid_key(k)
        except Malformed as e:
            raise Malformed(f"keys[{i}]: {e}") from None


def valid_item(it: Item) -> None:
    """Raise Malformed unless it has a valid key and 1 to MAX_RANGES sane ranges."""
    valid_key(it.key)
    if not it.ranges:
        raise Malformed(f"item {it.key!r} has no ranges")
    if len(it.ranges) > MAX_RANGES:
        raise Malformed(f"item {it.key!r} has {len(it.ranges)} ranges, at most {MAX_RANGES}")
    if not 0 <= it.format <= _U64:
        raise Malformed(f"item {it.key!r}: format out of range")
    total = 0
    for i, r in enumerate(it.ranges):
        if r.length <= 0:
            raise Malformed(f"item {it.key!r}: ranges[{i}] has length 0")
        if not 0 <= r.segment <= _U32 or r.offset < 0:
            raise Malformed(f"item {it.key!r}: ranges[{i}] out of range")
        if r.offset + r.length > _U64:
            raise Malformed(f"item {it.key!r}: ranges[{i}] offset + length overflows")
        total += r.length
        if total > _U64:
            raise Malformed(f"item {it.key!r}: total length overflows")


def _valid_window(m) -> None:
    if not 0 <= m.deadline_ns <= _U64:
        raise Malformed(f"deadline {m.deadline_ns} out of range (uint64)")
    if not 0 <= m.fence_slot <= FENCE_SLOTS:
        raise Malformed(f"fence slot {m.fence_slot}, at most {FENCE_SLOTS}")


def validate(m) -> None:
    """Check m against the protocol's limits, as the Go codec's Validate does."""
    t = m.TYPE
    if t == HELLO:
        _valid_text("client name", m.client_name, MAX_NAME)
    elif t == HELLO_REPLY:
        _valid_text("server version", m.server_version, MAX_NAME)
        if not 0 <= m.clock_ns <= _U64:
            raise Malformed(f"clock {m.clock_ns} out of range (uint64)")
    elif t == REGISTER_SEGMENT:
        if m.size <= 0:
            raise Malformed("segment size is 0")
        _valid_text("segment name", m.name, MAX_NAME)
    elif t in (EXISTS, REMOVE):
        _valid_keys(m.keys)
    elif t == EXISTS_REPLY:
        if m.present > MAX_ITEMS:
            raise Malformed(f"{m.present} keys present, a batch has at most {MAX_ITEMS}")
    elif t == REMOVE_REPLY:
        if m.removed > MAX_ITEMS:
            raise Malformed(f"{m.removed} keys removed, a batch has at most {MAX_ITEMS}")
    elif t in (PUT, GET):
        _valid_window(m)
        if len(m.items) > MAX_ITEMS:
            raise Malformed(f"{len(m.items)} items, at most {MAX_ITEMS}")
        for i, it in enumerate(m.items):
            try:
                valid_item(it)
            except Malformed as e:
                raise Malformed(f"items[{i}]: {e}") from None
    elif t == BATCH_REPLY:
        if len(m.results) > MAX_ITEMS:
            raise Malformed(f"{len(m.results)} results, at most {MAX_ITEMS}")
        for r in m.results:
            if not 0 <= r.status <= MAX_STATUS:
                raise Malformed(f"status {r.status} is not a known status")
            _valid_text("message", r.message, MAX_MESSAGE)
    elif t == ERROR:
        if m.code == OK:
            raise Malformed("error code is ok; an Error must carry a failure status")
        if not 0 < m.code <= MAX_STATUS:
            raise Malformed(f"error code {m.code} is not a known status")
        _valid_text("message", m.message, MAX_MESSAGE)


# Replies each request type expects (any request may get ERROR instead).
REPLY_OF = {
    HELLO: HELLO_REPLY,
    REGISTER_SEGMENT: REGISTER_SEGMENT_REPLY,
    UNREGISTER_SEGMENT: ACK,
    EXISTS: EXISTS_REPLY,
    PUT: BATCH_REPLY,
    GET: BATCH_REPLY,
    REMOVE: REMOVE_REPLY,
    STATS: STATS_REPLY,
    PING: PONG,
}

MESSAGE_CLASSES = {
    cls.TYPE: cls
    for cls in (
        Hello,
        HelloReply,
        RegisterSegment,
        RegisterSegmentReply,
        UnregisterSegment,
        Exists,
        ExistsReply,
        Put,
        Get,
        BatchReply,
        Remove,
        RemoveReply,
        Stats,
        StatsReply,
        Ping,
        Pong,
        Ack,
        Error,
    )
}


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
