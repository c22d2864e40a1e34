"""How a batch of pages becomes the items of Put and Get requests, vectorised.

A 128-page batch is 256 items of one range each for an MHA pool in page_first,
and 128 items of 61 ranges each for a 61-layer MLA model in layer_first: doing
that page by page, range by range in Python costs milliseconds, as much as the
service's copy of the bytes. Here every step is a handful of torch operations
over the whole batch:

- where each page's bytes are: SGLang's ``get_page_buffer_meta`` is a Python
  loop over pages and layers, and its pointers are an affine function of the
  page's first token index for every host pool SGLang has. :class:`PageModel`
  learns that function from ``get_page_buffer_meta`` itself on three pages of
  the pool and checks it against ``get_page_buffer_meta`` on the first page of
  every batch; a pool whose pointers are not affine (or any mismatch) goes back
  to calling ``get_page_buffer_meta`` for the whole batch.
- which registered segment and offset each pointer falls in (``searchsorted``),
  adjacent runs of an object part merged into one range;
- the protobuf encoding of every item, varints included, as one byte matrix
  with a mask of the bytes that exist, flattened into the request body; on a
  connection of revision 2, an item whose ranges are one strided run (a
  layer_first part: a range per layer) as one Run (``encode_runs``).

The result is byte for byte what ``wire.encode_item`` makes of the same items
(tests/test_batch.py checks it). It is a request's items only: the connection
that sends it writes the call's deadline and fence slot before them
(``wire.encode_frame``), as the Go codec does, so a request is cut to leave
room for them (``split``).
"""

from __future__ import annotations

import bisect
from typing import List, Optional, Tuple

import torch

from strata_client import wire

_I64 = torch.int64
_U8 = torch.uint8
# Protobuf tags of the fields an item holds: Put/Get.items (1, bytes), Item.key
# (1, bytes), Item.format (2, fixed64), Item.ranges (3, bytes), Range.segment (1,
# varint), Range.offset (2, varint), Range.length (3, varint).
_TAG_ITEM = 0x0A
_TAG_KEY = 0x0A
_TAG_RANGE = 0x1A
_TAG_SEGMENT = 0x08
_TAG_OFFSET = 0x10
_TAG_LENGTH = 0x18
# Revision 2: Item.runs (4, bytes), Run.stride (4), Run.count (5); a Run's
# segment, offset and length have a Range's tags.
_TAG_RUN = 0x22
_TAG_STRIDE = 0x20
_TAG_COUNT = 0x28

# Varints are written in fixed-width slots, one per field, as wide as the
# field's largest value needs (at most _W 7-bit groups: segments are uint32;
# offsets and lengths are below 2**56, far past any segment; an item is at most a
# frame; a key at most MAX_KEY bytes), and a mask keeps the bytes each varint
# really has.
_W = 8
_SHIFTS = torch.arange(0, 7 * _W, 7, dtype=_I64)
_POS = torch.arange(_W, dtype=_I64)
# A varint of x has 1 + (number of these that are <= x) bytes.
_STEPS = torch.tensor([1 << (7 * i) for i in range(1, _W)], dtype=_I64)
# An item's head: its own tag and length slot, the key's tag and length slot.
_HEAD_TAGS = torch.tensor([[_TAG_ITEM], [_TAG_KEY]], dtype=_U8)


def width(x: torch.Tensor) -> int:
    """The varint slot width, in bytes, of the largest of the values x."""
    top = int(x.max()) if x.numel() else 0
    if top >= 1 << (7 * _W):
        raise wire.Malformed(f"value {top} is too large for a range or an item")
    return max(1, (top.bit_length() + 6) // 7)


def varints(x: torch.Tensor, w: int = 0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Protobuf varints of the non-negative int64 values x, in w-byte slots
    (w=0: as wide as the largest needs).

    Returns (bytes, mask, count): bytes and mask have x's shape plus a last
    dimension of w; mask marks the count bytes each varint really has.
    """
    w = w or width(x)
    if x.dim() and x.numel() > 64:
        first = x.reshape(-1)[:1]
        if bool((x == first).all()):
            # One value throughout (a batch's segment, or its range length):
            # one varint, broadcast, instead of shifting every element.
            b, m, c = varints(first, w)
            shape = x.shape + (w,)
            return b.expand(shape), m.expand(shape), c.expand(x.shape)
    if w == 1:
        ones = torch.ones(x.shape + (1,), dtype=torch.bool)
        return x.to(_U8).unsqueeze(-1), ones, torch.ones_like(x)
    count = torch.bucketize(x, _STEPS[: w - 1], right=True) + 1
    mask = _POS[:w] < count.unsqueeze(-1)
    groups = ((x.unsqueeze(-1) >> _SHIFTS[:w]) & 0x7F).to(_U8)
    # Every byte but a varint's last has the continuation bit: the next is in it.
    groups[..., :-1] |= mask[..., 1:].to(_U8) << 7
    return groups, mask, count


class PageModel:
    """A host pool's page pointers as an affine function of the page number.

    ptr[e] = a[e] + (first token index // page size) * b[e] for each element e
    of a page's ``get_page_buffer_meta``, learnt from pages 0, 1 and the last.
    """

    def __init__(self, host, page_size: int):
        self.host = host
        self.ps = page_size
        self.pages = int(getattr(host, "size", 0) or 0) // page_size
        self.a = self.b = self.sizes = None
        self.ok = False
        if self.pages < 1:
            return
        try:
            self._learn()
        except Exception:  # noqa: BLE001 - SGLang cannot describe one page: ask it per batch
            self.ok = False

    def _learn(self):
        probes = sorted({0, min(1, self.pages - 1), self.pages - 1})
        metas = [self._meta(p) for p in probes]
        a, sizes = metas[0]
        if (
            not a
            or len(sizes) != len(a)
            or any(len(m[0]) != len(a) or m[1] != sizes for m in metas)
        ):
            return
        b = [0] * len(a)
        if len(probes) > 1:
            b = [y - x for x, y in zip(a, metas[1][0])]
        for p, (ptrs, _) in zip(probes, metas):
            if any(x + p * s != y for x, s, y in zip(a, b, ptrs)):
                return  # not affine in the page number: call SGLang every time
        self.a = torch.tensor(a, dtype=_I64)
        self.b = torch.tensor(b, dtype=_I64)
        self.sizes = torch.tensor(sizes, dtype=_I64)
        self.ok = True

    def _meta(self, page: int):
        ptrs, sizes = self.host.get_page_buffer_meta(
            torch.arange(page * self.ps, (page + 1) * self.ps, dtype=_I64)
        )
        return [int(p) for p in ptrs], [int(s) for s in sizes]

    def pointers(self, host_indices: torch.Tensor, n: int):
        """(ptrs, sizes), each (n, per), of the n pages of host_indices; None when
        the model does not apply (not whole pages, or SGLang disagrees)."""
        if not self.ok:
            return None
        first = host_indices.reshape(n, self.ps)[:, 0].to(_I64)
        page = torch.div(first, self.ps, rounding_mode="floor")
        if bool(((first % self.ps) != 0).any()) or bool(((page < 0) | (page >= self.pages)).any()):
            return None
        ptrs = self.a + page.unsqueeze(1) * self.b
        # One page of SGLang's own answer per batch: a pool whose memory moved,
        # or a layout whose pointers this model gets wrong, is never trusted.
        want, want_sizes = self.host.get_page_buffer_meta(host_indices[: self.ps])
        if [int(p) for p in want] != ptrs[0].tolist() or [
            int(s) for s in want_sizes
        ] != self.sizes.tolist():
            self.ok = False
            return None
        return ptrs, self.sizes.expand(n, -1)


def meta_pointers(host, host_indices: torch.Tensor, n: int):
    """(ptrs, sizes), each (n, per), from SGLang's get_page_buffer_meta; None when
    its answer does not split into n pages."""
    ptrs, sizes = host.get_page_buffer_meta(host_indices)
    if len(ptrs) == 0 or len(ptrs) % n or len(sizes) != len(ptrs):
        return None
    p = torch.tensor([int(x) for x in ptrs], dtype=_I64).view(n, -1)
    s = torch.tensor([int(x) for x in sizes], dtype=_I64).view(n, -1)
    return p, s


class Encoded:
    """One pool's items of a batch: the encoded body and what each item is."""

    __slots__ = ("body", "sizes", "pages", "lengths", "runs")

    def __init__(
        self, body: bytes, sizes: List[int], pages: List[int], lengths: List[int], runs: int = 0
    ):
        self.body = body  # the items, each a whole Put/Get "items" field
        self.sizes = sizes  # encoded bytes of each item
        self.pages = pages  # the page (index into the job's keys) of each item
        self.lengths = lengths  # bytes each item moves
        self.runs = runs  # how many of the items are one Run (the first ones)


def locate(ptrs: torch.Tensor, sizes: torch.Tensor, bases: torch.Tensor, ends: torch.Tensor):
    """(segment index, offset, inside) of each run [ptr, ptr+size): inside is
    False for a run not wholly inside one of the segments (sorted by base)."""
    si = torch.searchsorted(bases, ptrs, right=True) - 1
    sic = si.clamp(min=0)
    inside = (si >= 0) & (sizes > 0) & (ptrs + sizes <= ends[sic])
    return sic, ptrs - bases[sic], inside


def plan_pages(
    ptrs: torch.Tensor,
    sizes: torch.Tensor,
    parts: int,
    bases: torch.Tensor,
    ends: torch.Tensor,
):
    """Split each page's runs into its parts and place them in the segments.

    ptrs, sizes: (n, per), a page's elements in SGLang's order (part e % parts of
    run e // parts). Returns (seg, off, length, keep, good): the first four are
    (n, parts, runs) with keep False for a run merged into the one before it;
    good (n,) is False for a page that has a run outside the segments or a part
    with more than MAX_RANGES ranges. None when per is not a multiple of parts.
    """
    n, per = ptrs.shape
    if per % parts:
        return None
    runs = per // parts
    p = ptrs.view(n, runs, parts).transpose(1, 2).contiguous()
    s = sizes.reshape(n, runs, parts).transpose(1, 2).contiguous()
    seg, off, inside = locate(p, s, bases, ends)
    good = inside.reshape(n, -1).all(1)
    # A run that starts where the one before it (same part) ends, in the same
    # segment, extends it: one range, as SGLang's layer_first pages of a pool
    # of one page would be.
    adj = torch.zeros_like(inside)
    if runs > 1:
        adj[:, :, 1:] = (seg[:, :, 1:] == seg[:, :, :-1]) & (
            off[:, :, 1:] == off[:, :, :-1] + s[:, :, :-1]
        )
    keep = ~adj
    length = s.clone()
    if bool(adj.any()):
        group = keep.to(_I64).cumsum(2) - 1  # index of the range each run joins
        merged = torch.zeros_like(s).scatter_add_(2, group, s)
        length = torch.where(keep, merged.gather(2, group), torch.zeros_like(s))
    good &= (keep.sum(2) <= wire.MAX_RANGES).all(1)
    return seg, off, length, keep, good


def name_rows(prefix: bytes, keys: List[str], suffixes: List[bytes]) -> Optional[torch.Tensor]:
    """The object names prefix + key + suffix, for each key and each suffix in
    turn, as the rows of a byte matrix (what encode takes instead of a list);
    None unless every key is ASCII of one length and every suffix of one length.

    For a batch of 512 one-token MHA pages (1024 names) this and the encoding
    that takes it cost 0.43 ms of CPU where the list and its join cost 0.52."""
    if not keys or len(set(map(len, suffixes))) != 1 or len(set(map(len, keys))) != 1:
        return None
    blob = "".join(keys)
    if not blob or not blob.isascii():
        return None
    m, parts, klen = len(keys), len(suffixes), len(keys[0])
    key_b = torch.frombuffer(bytearray(blob.encode("ascii")), dtype=_U8).view(m, 1, klen)
    pre = torch.tensor(list(prefix), dtype=_U8).view(1, 1, -1)
    sfx = torch.tensor([list(x) for x in suffixes], dtype=_U8).view(1, parts, -1)
    rows = torch.cat(
        [pre.expand(m, parts, -1), key_b.expand(m, parts, klen), sfx.expand(m, -1, -1)], 2
    )
    return rows.reshape(m * parts, -1)


def _name_matrix(names: List[bytes], n: int):
    """A list of n names as (bytes (n, width), mask of the bytes each has, lengths)."""
    widths = [len(x) for x in names]
    w = max(widths)
    if min(widths) == w:
        name_b = torch.frombuffer(bytearray(b"".join(names)), dtype=_U8).view(n, w)
        name_m = torch.ones(n, w, dtype=torch.bool)
    else:
        blob = bytearray(b"".join(x.ljust(w, b"\0") for x in names))
        name_b = torch.frombuffer(blob, dtype=_U8).view(n, w)
        name_m = torch.arange(w) < torch.tensor(widths, dtype=_I64).unsqueeze(1)
    return name_b, name_m, torch.tensor(widths, dtype=_I64)


def _names(names, n: int):
    """names (a list of n bytes, or an (n, width) uint8 matrix from name_rows)
    as (bytes (n, width), mask of the bytes each has, lengths)."""
    if isinstance(names, torch.Tensor):
        if names.dim() != 2 or names.shape[0] != n or names.shape[1] == 0:
            raise ValueError(f"names of shape {tuple(names.shape)} for {n} items")
        w = names.shape[1]
        return names, torch.ones(n, w, dtype=torch.bool), torch.full((n,), w, dtype=_I64)
    return _name_matrix(names, n)


def _items(names, fmt_field: bytes, body_b, body_m, body_len) -> Tuple[bytes, torch.Tensor]:
    """N items, each its head (tag and length, the key's tag, length and
    bytes, the format) then body_b[i] where body_m[i] (its ranges or its run,
    body_len[i] bytes): the request body and each item's encoded size."""
    n = body_b.shape[0]
    name_b, name_m, name_len = _names(names, n)
    kl_n = 1 + (name_len >= 0x80).to(_I64)
    item_len = 1 + kl_n + name_len + len(fmt_field) + body_len
    hb, hm, hn = varints(torch.stack([item_len, name_len], 1))  # (n, 2, slot)
    head_b = torch.cat([_HEAD_TAGS.expand(n, 2, 1), hb], 2).view(n, -1)
    head_m = torch.cat([torch.ones(n, 2, 1, dtype=torch.bool), hm], 2).view(n, -1)
    fmt_b = torch.tensor(list(fmt_field), dtype=_U8).expand(n, -1)
    rows = torch.cat([head_b, name_b, fmt_b, body_b], 1)
    mask = torch.cat([head_m, name_m, torch.ones(n, len(fmt_field), dtype=torch.bool), body_m], 1)
    return select(rows, mask), 1 + hn[:, 0] + item_len


def _fields(values, tags, always):
    """Protobuf varint fields, each (n, r) values: their bytes and mask, each
    (n, r, bytes), and their encoded length (n, r). A field whose always is
    False is left out where its value is 0, as proto3 does."""
    parts_b, parts_m, total = [], [], 0
    for x, t, a in zip(values, tags, always):
        b, m, c = varints(x)
        has = torch.ones_like(x, dtype=torch.bool) if a else x > 0
        h = has.unsqueeze(-1)
        parts_b += [torch.full(x.shape + (1,), t, dtype=_U8), b]
        parts_m += [h, m & h]
        total = total + has * (1 + c)
    return parts_b, parts_m, total


def _message(tag: int, values, tags, always, keep):
    """Sub-messages (ranges, runs) of varint fields, (n, r) of them, each its
    tag and one length byte: (bytes (n, r*w), mask, each item's bytes of them)
    with keep (n, r) False for the ones an item does not have."""
    n, r = keep.shape
    fb, fm, flen = _fields(values, tags, always)
    if bool((flen > 0x7F).any()):
        raise wire.Malformed("a range's or run's encoding is longer than one length byte")
    k = keep.unsqueeze(2)
    b = torch.cat([torch.full((n, r, 1), tag, dtype=_U8), flen.to(_U8).unsqueeze(2)] + fb, 2)
    m = torch.cat([k, k] + [x & k for x in fm], 2)
    return b.view(n, -1), m.view(n, -1), (keep * (2 + flen)).sum(1)


def encode(
    names,
    fmt_field: bytes,
    sid: torch.Tensor,
    off: torch.Tensor,
    length: torch.Tensor,
    keep: torch.Tensor,
) -> Tuple[bytes, torch.Tensor]:
    """Encode N items: names[i] with ranges (sid, off, length)[i, r] where
    keep[i, r]; fmt_field is the encoded format field, the same for all.
    Returns the body (the items, each a Put/Get "items" field) and each item's
    encoded size. Each item is a row of a byte matrix, each field a column
    slot; the mask drops the bytes a row does not have. names is a list of
    bytes, or the (N, width) uint8 matrix of N names of one width (name_rows)."""
    b, m, ln = _message(
        _TAG_RANGE,
        (sid, off, length),
        (_TAG_SEGMENT, _TAG_OFFSET, _TAG_LENGTH),
        (False, False, True),  # a range's length is never 0
        keep,
    )
    return _items(names, fmt_field, b, m, ln)


def encode_runs(
    names,
    fmt_field: bytes,
    sid: torch.Tensor,
    off: torch.Tensor,
    length: torch.Tensor,
    stride: torch.Tensor,
    count: torch.Tensor,
) -> Tuple[bytes, torch.Tensor]:
    """Encode N items of one run each (revision 2): names[i] with the run
    (sid, off, length, stride, count)[i], each (N,). As encode, otherwise."""
    n = sid.shape[0]
    b, m, ln = _message(
        _TAG_RUN,
        tuple(x.reshape(n, 1).contiguous() for x in (sid, off, length, stride, count)),
        (_TAG_SEGMENT, _TAG_OFFSET, _TAG_LENGTH, _TAG_STRIDE, _TAG_COUNT),
        (False, False, True, False, True),
        torch.ones(n, 1, dtype=torch.bool),
    )
    return _items(names, fmt_field, b, m, ln)


def as_runs(sid: torch.Tensor, off: torch.Tensor, length: torch.Tensor, keep: torch.Tensor):
    """Which items (rows of (n, r) ranges) are one run: at least two ranges,
    every one kept, of one segment and one length, equally spaced upward by at
    least the length. Returns (regular (n,), stride (n,))."""
    n, r = sid.shape
    if r < 2 or r > wire.MAX_RUN_COUNT:
        return torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=_I64)
    d = off[:, 1:] - off[:, :-1]
    stride = d[:, 0]
    ok = keep.all(1) & (sid == sid[:, :1]).all(1) & (length == length[:, :1]).all(1)
    ok &= (d == stride.unsqueeze(1)).all(1) & (stride >= length[:, 0])
    return ok, stride


def select(rows: torch.Tensor, mask: torch.Tensor) -> bytes:
    """The bytes of rows where mask is set, row by row, as bytes.

    numpy's boolean indexing is 3-4x torch 1.13's masked_select here (4 ms of
    an MLA batch's 5 ms of encoding was masked_select: 512 one-token pages of 61
    ranges are 0.5M candidate bytes), and tobytes is the one copy into the
    body. torch wheels may come without numpy: masked_select then."""
    try:
        return rows.numpy()[mask.numpy()].tobytes()
    except (ImportError, RuntimeError, TypeError):
        flat = torch.masked_select(rows, mask)
        out = bytearray(flat.numel())
        if out:
            torch.frombuffer(out, dtype=_U8).copy_(flat)
        return bytes(out)


def split(
    sizes: List[int],
    max_items: int = wire.MAX_ITEMS,
    max_body: int = wire.MAX_BODY - wire.MAX_WINDOW,
):
    """Cut items of the given encoded sizes into requests of at most max_items
    items and max_body bytes: [(first item, end item, first byte, end byte)].
    The default leaves room in a frame for the deadline and fence slot."""
    cum = [0]
    for s in sizes:
        cum.append(cum[-1] + s)
    out = []
    start = 0
    while start < len(sizes):
        end = min(start + max_items, len(sizes))
        if cum[end] - cum[start] > max_body:
            end = bisect.bisect_right(cum, cum[start] + max_body, start, end + 1) - 1
        if end == start:
            raise wire.Malformed("one object's description is larger than a frame")
        out.append((start, end, cum[start], cum[end]))
        start = end
    return out


def encode_pages(
    names,
    pages: List[int],
    fmt_field: bytes,
    seg_ids: torch.Tensor,
    seg: torch.Tensor,
    off: torch.Tensor,
    length: torch.Tensor,
    keep: torch.Tensor,
    runs: bool = False,
) -> Optional[Encoded]:
    """The items of the planned pages (see plan_pages, rows already selected,
    pages[i] the page of row i): one item per page and part, names[i] naming
    item i. With runs (a connection of revision 2 or later), an item whose
    ranges are one run (as_runs: a layer_first part, one range per layer) is
    one Run instead; the others keep their ranges, and come after them."""
    m, parts, nr = seg.shape
    if m == 0:
        return None
    n = m * parts
    sid = seg_ids[seg].reshape(n, nr)
    off, lens, keep = off.reshape(n, nr), length.reshape(n, nr), keep.reshape(n, nr)
    totals = lens.sum(1)
    page_of = torch.tensor(pages, dtype=_I64).repeat_interleave(parts)
    ok, stride = as_runs(sid, off, lens, keep) if runs else (None, None)
    if ok is None or not bool(ok.any()):
        body, sizes = encode(names, fmt_field, sid, off, lens, keep)
        return Encoded(body, sizes.tolist(), page_of.tolist(), totals.tolist())
    run = (sid[:, 0], off[:, 0], lens[:, 0], stride, torch.full_like(stride, nr))
    if bool(ok.all()):
        body, sizes = encode_runs(names, fmt_field, *run)
        return Encoded(body, sizes.tolist(), page_of.tolist(), totals.tolist(), n)
    # Some of each: the runs' items first, then the others', each in order.
    a, z = ok.nonzero().flatten(), (~ok).nonzero().flatten()
    b1, s1 = encode_runs(_take(names, a), fmt_field, *(x[a] for x in run))
    b2, s2 = encode(_take(names, z), fmt_field, sid[z], off[z], lens[z], keep[z])
    order = torch.cat([a, z])
    sizes = s1.tolist() + s2.tolist()
    return Encoded(b1 + b2, sizes, page_of[order].tolist(), totals[order].tolist(), len(a))


def _take(names, idx: torch.Tensor):
    """The names of the items idx (a list's, or a name_rows matrix's rows)."""
    return names[idx] if isinstance(names, torch.Tensor) else [names[i] for i in idx.tolist()]
