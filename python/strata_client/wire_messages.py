"""The node service's protocol as data: its limits, message types, statuses and
one dataclass per message of ``node/wire/strata.proto``.

The codec (wire_encode, wire_decode, wire_validate) works on these; wire.py
is the module the rest of the plugin imports them from.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, field
from typing import List

MAGIC = b"ST"
VERSION = 1
# The highest revision of the protocol this codec speaks (Hello.revision,
# HelloReply.revision); the framing (VERSION) is the same in every revision.
# Revision 2 adds Item.runs. A peer that sends no revision (0) speaks revision 1.
REVISION = 2
HEADER_SIZE = 16
MAX_BODY = 16 << 20
MAX_ITEMS = 4096
MAX_RANGES = 256
# Revision 2: the most runs one item's bytes may be named by, the most ranges
# one run (and all of one item's runs) stands for, and the most ranges the items
# of one batch name, runs expanded (what MAX_ITEMS items of MAX_RANGES could).
MAX_RUNS = 256
MAX_RUN_COUNT = 4096
MAX_BATCH_RANGES = MAX_ITEMS * MAX_RANGES
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
    # The highest revision the client speaks; 0 (absent) is 1.
    revision: int = 0
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
    # The connection's revision: the lower of the client's and the server's;
    # 0, from a server before revisions, is 1 (revision_of).
    revision: int = 0
    TYPE = HELLO_REPLY


def revision_of(rev: int) -> int:
    """The revision a Hello's or HelloReply's revision field stands for: 0 is 1."""
    return max(rev, 1)


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
class Run:
    """count ranges of one segment at a fixed stride (revision 2): the ranges
    (segment, offset + i*stride, length) for i in 0..count-1."""

    segment: int = 0
    offset: int = 0
    length: int = 0  # each range's; not 0
    stride: int = 0  # at least length when count > 1: the ranges never overlap
    count: int = 0  # 1 to MAX_RUN_COUNT

    def ranges(self) -> List[Range]:
        return [
            Range(self.segment, self.offset + i * self.stride, self.length)
            for i in range(self.count)
        ]


@dataclass
class Item:
    """An object: the concatenation of its ranges, or of its runs' ranges
    (revision 2), in order; never both, never neither."""

    key: str = ""
    format: int = 0
    ranges: List[Range] = field(default_factory=list)
    runs: List[Run] = field(default_factory=list)

    def spans(self) -> int:
        """How many ranges the item names, its runs expanded."""
        return len(self.ranges) + sum(r.count for r in self.runs)


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
    # same status and no message (see wire_decode._fast_batch_reply).
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
