"""Items that differ only in their name and offset, encoded as filled templates.

The pages of one pool in one batch are alike: for SGLang's MHA ``page_first``
every item is one range of one segment and one length, for MLA
``layer_first`` one run of one segment, length, stride and count, for vLLM's
CPU tier one row. Only the name (a matrix row: strata_sglang's
``batch.name_rows``) and the offset differ, and an offset's varint has one of a
few widths. So the items are cut into groups by that width, and each group is
one template row (the bytes of its first item) repeated, with the names' and
the offsets' columns written over it: no per-field masks and no boolean
selection, the general encoder's (strata_sglang's ``batch.encode``, or
``wire.encode_item`` an item) largest costs. The bytes are
what the general encoder writes, item for item; only their order differs (by
width group, in order within each), which is why ``encode`` returns it.

Reordering is safe because a request's items are independent: each has its own
result, and the callers map results to pages through that order. Two items of
one name in one batch (never made by SGLang or vLLM, whose keys are content hashes)
may land in the other order; either is the same content.
"""

from __future__ import annotations

from typing import Optional, Tuple

import numpy as np

from strata_client.wire_encode import varint

_U8 = np.uint8
_I64 = np.int64
_STEPS = np.array([1 << (7 * i) for i in range(1, 10)], dtype=np.uint64)
# Protobuf tags of an item's fields: Put/Get.items and Item.key (1, bytes),
# Item.format (2, fixed64, written by the callers), Item.ranges (3) and, from
# revision 2, Item.runs (4, bytes); a Range's or Run's segment (1), offset (2)
# and length (3), a Run's stride (4) and count (5), all varints.
TAG_ITEM = TAG_KEY = 0x0A
TAG_RANGE, TAG_RUN = 0x1A, 0x22
TAG_SEGMENT, TAG_OFFSET, TAG_LENGTH, TAG_STRIDE, TAG_COUNT = 0x08, 0x10, 0x18, 0x20, 0x28


def _field(tag: int, v: int) -> bytes:
    """A varint field, left out when 0 (proto3)."""
    return bytes([tag]) + varint(v) if v else b""


def ranges(names: np.ndarray, fmt_field: bytes, seg: int, off: np.ndarray, length: int):
    """N items of one Range each, (seg, off[i], length): see encode."""
    tail = bytes([TAG_LENGTH]) + varint(length)  # a range's length is never 0
    return encode(names, fmt_field, TAG_RANGE, seg, off, tail)


def runs(
    names: np.ndarray,
    fmt_field: bytes,
    seg: int,
    off: np.ndarray,
    length: int,
    stride: int,
    count: int,
):
    """N items of one Run each, (seg, off[i], length, stride, count): see encode."""
    tail = bytes([TAG_LENGTH]) + varint(length) + _field(TAG_STRIDE, stride)
    tail += bytes([TAG_COUNT]) + varint(count)
    return encode(names, fmt_field, TAG_RUN, seg, off, tail)


def encode(
    names: np.ndarray, fmt_field: bytes, sub_tag: int, seg: int, off: np.ndarray, tail: bytes
) -> Optional[Tuple[bytes, np.ndarray, np.ndarray]]:
    """N items, names[i] (a uint8 matrix of one width) with one sub-message
    (a Range or a Run, sub_tag) of the segment seg, the offset off[i] and the
    encoded fields tail after them, the same for all. Returns (body, each
    item's encoded size, the order of the items in body), or None when a
    sub-message would need a length of more than one byte."""
    n, nw = names.shape
    off = np.asarray(off, dtype=_I64)
    if n == 0 or int(off.min()) < 0:
        return None
    # An offset's varint width: 0 for an offset of 0 (left out, as proto3 does).
    width = np.searchsorted(_STEPS, off.astype(np.uint64), side="right") + 1
    width[off == 0] = 0
    order = np.argsort(width, kind="stable")
    widths = width[order]
    cuts = np.flatnonzero(np.diff(widths)) + 1
    bounds = [0] + cuts.tolist() + [n]
    seg_f = _field(TAG_SEGMENT, seg)
    name_head = bytes([TAG_KEY]) + varint(nw)
    parts, sizes = [], np.empty(n, dtype=_I64)
    for a, z in zip(bounds[:-1], bounds[1:]):
        w = int(widths[a])
        sub_len = len(seg_f) + (1 + w if w else 0) + len(tail)
        if sub_len > 0x7F:
            return None
        item_len = len(name_head) + nw + len(fmt_field) + 2 + sub_len
        head = bytes([TAG_ITEM]) + varint(item_len) + name_head
        # The template: the name and the offset's bytes are placeholders.
        lead = head + bytes(nw) + fmt_field + bytes([sub_tag, sub_len]) + seg_f
        tmpl = lead + (bytes([TAG_OFFSET]) + bytes(w) if w else b"") + tail
        rows = np.empty((z - a, len(tmpl)), dtype=_U8)
        rows[:] = np.frombuffer(tmpl, dtype=_U8)
        idx = order[a:z]
        rows[:, len(head) : len(head) + nw] = names[idx]
        if w:
            x = off[idx]
            at = len(lead) + 1
            for k in range(w):
                b = (x >> (7 * k)) & 0x7F
                rows[:, at + k] = b | 0x80 if k < w - 1 else b
        parts.append(rows.tobytes())
        sizes[a:z] = len(tmpl)
    return b"".join(parts), sizes, order
