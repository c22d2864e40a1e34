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
    MAX_BATCH_RANGES,
    MAX_ITEMS,
    MAX_KEY,
    MAX_MESSAGE,
    MAX_NAME,
    MAX_RANGES,
    MAX_RUN_COUNT,
    MAX_RUNS,
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
    Run,
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
    """Raise Malformed unless it has a valid key and its bytes named by ranges
    or by runs, never both: 1 to MAX_RANGES sane ranges, or 1 to MAX_RUNS valid
    runs standing for at most MAX_RUN_COUNT ranges in all (the Go codec's
    Item.Validate)."""
    valid_key(it.key)
    if not 0 <= it.format <= _U64:
        raise Malformed(f"item {it.key!r}: format out of range")
    if it.ranges and it.runs:
        raise Malformed(
            f"item {it.key!r} has both ranges and runs; name its bytes by one or the other"
        )
    if it.runs:
        _valid_runs(it)
        return
    if not it.ranges:
        raise Malformed(f"item {it.key!r} has no ranges and no runs")
    if len(it.ranges) > MAX_RANGES:
        raise Malformed(f"item {it.key!r} has {len(it.ranges)} ranges, at most {MAX_RANGES}")
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


def _valid_runs(it: Item) -> None:
    if len(it.runs) > MAX_RUNS:
        raise Malformed(f"item {it.key!r} has {len(it.runs)} runs, at most {MAX_RUNS}")
    total = spans = 0
    for i, r in enumerate(it.runs):
        try:
            valid_run(r)
        except Malformed as e:
            raise Malformed(f"item {it.key!r}: runs[{i}]: {e}") from None
        spans += r.count
        if spans > MAX_RUN_COUNT:
            raise Malformed(f"item {it.key!r}: its runs stand for more than {MAX_RUN_COUNT} ranges")
        total += r.count * r.length
        if total > _U64:
            raise Malformed(f"item {it.key!r}: total length overflows")


def valid_run(r: Run) -> None:
    """Raise Malformed unless r is a run on its own: a non-zero length, a count
    of 1 to MAX_RUN_COUNT, a stride of at least the length when the count is
    over 1 (its ranges ascend and never overlap), an end that fits uint64."""
    if not 0 <= r.segment <= _U32 or min(r.offset, r.length, r.stride) < 0:
        raise Malformed("out of range")
    if max(r.offset, r.length, r.stride) > _U64:
        raise Malformed("out of range (uint64)")
    if r.length == 0:
        raise Malformed("length 0")
    if not 1 <= r.count <= MAX_RUN_COUNT:
        raise Malformed(f"count {r.count}, want 1 to {MAX_RUN_COUNT}")
    if r.count > 1 and r.stride < r.length:
        raise Malformed(
            f"stride {r.stride} under length {r.length}: a run's ranges must not overlap"
        )
    if r.offset + (r.count - 1) * r.stride + r.length > _U64:
        raise Malformed(
            f"offset {r.offset:#x} + {r.count - 1} strides of {r.stride} + length {r.length} overflows"
        )


def valid_items(items) -> None:
    """Raise Malformed unless items are at most MAX_ITEMS valid items naming at
    most MAX_BATCH_RANGES ranges, runs expanded."""
    if len(items) > MAX_ITEMS:
        raise Malformed(f"{len(items)} items, at most {MAX_ITEMS}")
    spans = 0
    for i, it in enumerate(items):
        try:
            valid_item(it)
        except Malformed as e:
            raise Malformed(f"items[{i}]: {e}") from None
        spans += it.spans()
        if spans > MAX_BATCH_RANGES:
            raise Malformed(
                f"items[{i}]: the batch's items name more than {MAX_BATCH_RANGES} ranges, "
                "runs expanded"
            )


def _valid_u32(what: str, v: int) -> None:
    if not 0 <= v <= _U32:
        raise Malformed(f"{what} {v} out of range (uint32)")


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
        _valid_u32("revision", m.revision)
    elif t == HELLO_REPLY:
        _valid_text("server version", m.server_version, MAX_NAME)
        _valid_u32("revision", m.revision)
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
        valid_items(m.items)
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
