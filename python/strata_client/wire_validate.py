"""The protocol's limits, checked on a message before it is encoded and after
it is decoded, as the Go codec's Validate does."""

from __future__ import annotations

from .wire_messages import (
    BATCH_REPLY,
    ERROR,
    EXISTS,
    EXISTS_REPLY,
    FENCE_SLOTS,
    GET,
    HELLO,
    HELLO_REPLY,
    MAX_ITEMS,
    MAX_KEY,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_RANGES,
    MAX_STATUS,
    OK,
    PUT,
    REGISTER_SEGMENT,
    REMOVE,
    REMOVE_REPLY,
    _U32,
    _U64,
    Item,
    Malformed,
)


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
