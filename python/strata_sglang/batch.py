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

import numpy as np
import torch

from strata_client import uniform, wire

# The arithmetic is numpy's: a numpy operation on a few thousand elements costs
# about 1 us of dispatch where torch 1.13's costs 5-10 (a batch takes some
# hundred of them); torch is only what SGLang hands in (host indices) and what
# get_page_buffer_meta is asked with. Every function takes torch tensors or
# numpy arrays (a CPU tensor's .numpy() is a view, no copy).
_I64 = np.int64
_U8 = np.uint8
# Protobuf tags of the fields an item holds (strata_client.uniform names them).
_TAG_ITEM, _TAG_KEY = uniform.TAG_ITEM, uniform.TAG_KEY
_TAG_RANGE, _TAG_RUN = uniform.TAG_RANGE, uniform.TAG_RUN
_TAG_SEGMENT, _TAG_OFFSET, _TAG_LENGTH = uniform.TAG_SEGMENT, uniform.TAG_OFFSET, uniform.TAG_LENGTH
_TAG_STRIDE, _TAG_COUNT = uniform.TAG_STRIDE, uniform.TAG_COUNT

# Varints are written in fixed-width slots, one per field, as wide as the
# field's largest value needs (at most _W 7-bit groups: segments are uint32;
# offsets and lengths are below 2**56, far past any segment; an item is at most a
# frame; a key at most MAX_KEY bytes), and a mask keeps the bytes each varint
# really has.
_W = 8
_SHIFTS = np.arange(0, 7 * _W, 7, dtype=_I64)
_POS = np.arange(_W, dtype=_I64)
# A varint of x has 1 + (number of these that are <= x) bytes.
_STEPS = np.array([1 << (7 * i) for i in range(1, _W)], dtype=_I64)
# An item's head: its own tag and length slot, the key's tag and length slot.
_HEAD_TAGS = np.array([[_TAG_ITEM], [_TAG_KEY]], dtype=_U8)


def arr(x, dtype=None) -> np.ndarray:
    """x (a CPU torch tensor, a numpy array or a list) as a numpy array: a
    tensor's is a view of its memory."""
    if isinstance(x, torch.Tensor):
        x = x.detach()
        if x.device.type != "cpu":
            x = x.cpu()
        x = x.numpy()
    x = np.asarray(x)
    return x if dtype is None or x.dtype == dtype else x.astype(dtype)


def width(x) -> int:
    """The varint slot width, in bytes, of the largest of the values x."""
    x = arr(x)
    top = int(x.max()) if x.size else 0
    if top >= 1 << (7 * _W):
        raise wire.Malformed(f"value {top} is too large for a range or an item")
    return max(1, (top.bit_length() + 6) // 7)


def varints(x, w: int = 0) -> Tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Protobuf varints of the non-negative int64 values x, in w-byte slots
    (w=0: as wide as the largest needs).

    Returns (bytes, mask, count): bytes and mask have x's shape plus a last
    dimension of w; mask marks the count bytes each varint really has.
    """
    x = arr(x, _I64)
    w = w or width(x)
    if x.ndim and x.size > 64:
        first = x.reshape(-1)[:1]
        if bool((x == first[0]).all()):
            # One value throughout (a batch's segment, or its range length):
            # one varint, broadcast, instead of shifting every element.
            b, m, c = varints(first, w)
            shape = x.shape + (w,)
            return np.broadcast_to(b, shape), np.broadcast_to(m, shape), np.broadcast_to(c, x.shape)
    if w == 1:
        return x.astype(_U8)[..., None], np.ones(x.shape + (1,), dtype=bool), np.ones_like(x)
    count = np.searchsorted(_STEPS[: w - 1], x, side="right") + 1
    mask = _POS[:w] < count[..., None]
    groups = ((x[..., None] >> _SHIFTS[:w]) & 0x7F).astype(_U8)
    # Every byte but a varint's last has the continuation bit: the next is in it.
    groups[..., :-1] |= mask[..., 1:].astype(_U8) << 7
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
        self.a = np.array(a, dtype=_I64)
        self.b = np.array(b, dtype=_I64)
        self.sizes = np.array(sizes, dtype=_I64)
        self.ok = True

    def _meta(self, page: int):
        ptrs, sizes = self.host.get_page_buffer_meta(
            torch.arange(page * self.ps, (page + 1) * self.ps, dtype=torch.int64)
        )
        return [int(p) for p in ptrs], [int(s) for s in sizes]

    def page_numbers(self, host_indices, n: int) -> Optional[np.ndarray]:
        """The page numbers (n,) of the n pages of host_indices (a torch
        tensor, as SGLang gives them); None when the model does not apply (not
        whole pages, or SGLang disagrees)."""
        if not self.ok:
            return None
        first = arr(host_indices).reshape(n, self.ps)[:, 0].astype(_I64)
        page = first // self.ps
        if bool((first % self.ps).any()) or bool(((page < 0) | (page >= self.pages)).any()):
            return None
        # One page of SGLang's own answer per batch: a pool whose memory moved,
        # or a layout whose pointers this model gets wrong, is never trusted.
        a, b, sizes = arr(self.a, _I64), arr(self.b, _I64), arr(self.sizes, _I64)
        want, want_sizes = self.host.get_page_buffer_meta(host_indices[: self.ps])
        if [int(p) for p in want] != (a + int(page[0]) * b).tolist() or [
            int(s) for s in want_sizes
        ] != sizes.tolist():
            self.ok = False
            return None
        return page

    def pointers(self, host_indices, n: int):
        """(ptrs, sizes), each (n, per), of the n pages of host_indices; None when
        the model does not apply (see page_numbers)."""
        page = self.page_numbers(host_indices, n)
        return None if page is None else self.at(page)

    def at(self, page: np.ndarray):
        """(ptrs, sizes), each (n, per), of the pages numbered page."""
        a, b, sizes = arr(self.a, _I64), arr(self.b, _I64), arr(self.sizes, _I64)
        return a + page[:, None] * b, np.broadcast_to(sizes, (page.shape[0], sizes.shape[0]))


def meta_pointers(host, host_indices, n: int):
    """(ptrs, sizes), each (n, per), from SGLang's get_page_buffer_meta; None when
    its answer does not split into n pages."""
    ptrs, sizes = host.get_page_buffer_meta(host_indices)
    if len(ptrs) == 0 or len(ptrs) % n or len(sizes) != len(ptrs):
        return None
    p = np.array([int(x) for x in ptrs], dtype=_I64).reshape(n, -1)
    s = np.array([int(x) for x in sizes], dtype=_I64).reshape(n, -1)
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


def locate(ptrs, sizes, bases, ends):
    """(segment index, offset, inside) of each run [ptr, ptr+size): inside is
    False for a run not wholly inside one of the segments (sorted by base)."""
    ptrs, sizes, bases, ends = arr(ptrs, _I64), arr(sizes, _I64), arr(bases, _I64), arr(ends, _I64)
    si = np.searchsorted(bases, ptrs, side="right") - 1
    sic = np.maximum(si, 0)
    inside = (si >= 0) & (sizes > 0) & (ptrs + sizes <= ends[sic])
    return sic, ptrs - bases[sic], inside


def plan_pages(ptrs, sizes, parts: int, bases, ends):
    """Split each page's runs into its parts and place them in the segments.

    ptrs, sizes: (n, per), a page's elements in SGLang's order (part e % parts of
    run e // parts). Returns (seg, off, length, keep, good): the first four are
    (n, parts, runs) with keep False for a run merged into the one before it;
    good (n,) is False for a page that has a run outside the segments or a part
    with more than MAX_RANGES ranges. None when per is not a multiple of parts.
    """
    ptrs, sizes = arr(ptrs, _I64), arr(sizes, _I64)
    n, per = ptrs.shape
    if per % parts:
        return None
    runs = per // parts
    p = ptrs.reshape(n, runs, parts).transpose(0, 2, 1)
    s = sizes.reshape(n, runs, parts).transpose(0, 2, 1)
    seg, off, inside = locate(p, s, bases, ends)
    good = inside.reshape(n, -1).all(1)
    # A run that starts where the one before it (same part) ends, in the same
    # segment, extends it: one range, as SGLang's layer_first pages of a pool
    # of one page would be.
    keep = np.ones(inside.shape, dtype=bool)
    if runs > 1:
        keep[:, :, 1:] = (seg[:, :, 1:] != seg[:, :, :-1]) | (
            off[:, :, 1:] != off[:, :, :-1] + s[:, :, :-1]
        )
    length = np.ascontiguousarray(s)
    if not bool(keep.all()):
        # A kept run's range is it and the merged runs after it: the sums of
        # the runs from each kept one to the next (a part's first run is always
        # kept, so no range crosses a part).
        sums = np.add.reduceat(length.reshape(-1), np.flatnonzero(keep.reshape(-1)))
        length = np.zeros(s.shape, dtype=_I64)
        length[keep] = sums
    good &= (keep.sum(2) <= wire.MAX_RANGES).all(1)
    return seg, off, length, keep, good


def name_rows(prefix: bytes, keys: List[str], suffixes: List[bytes]) -> Optional[np.ndarray]:
    """The object names prefix + key + suffix, for each key and each suffix in
    turn, as the rows of a byte matrix (what encode takes instead of a list);
    None unless every key is ASCII of one length and every suffix of one length."""
    if not keys or len(set(map(len, suffixes))) != 1 or len(set(map(len, keys))) != 1:
        return None
    blob = "".join(keys)
    if not blob or not blob.isascii():
        return None
    m, parts, klen = len(keys), len(suffixes), len(keys[0])
    plen, slen = len(prefix), len(suffixes[0])
    rows = np.empty((m, parts, plen + klen + slen), dtype=_U8)
    rows[:, :, :plen] = np.frombuffer(prefix, dtype=_U8)
    rows[:, :, plen : plen + klen] = np.frombuffer(blob.encode("ascii"), dtype=_U8).reshape(
        m, 1, klen
    )
    rows[:, :, plen + klen :] = np.frombuffer(b"".join(suffixes), dtype=_U8).reshape(parts, slen)
    return rows.reshape(m * parts, -1)


def _name_matrix(names: List[bytes], n: int):
    """A list of n names as (bytes (n, width), mask of the bytes each has, lengths)."""
    widths = np.array([len(x) for x in names], dtype=_I64)
    w = int(widths.max())
    if int(widths.min()) == w:
        name_b = np.frombuffer(b"".join(names), dtype=_U8).reshape(n, w)
        return name_b, np.ones((n, w), dtype=bool), widths
    name_b = np.frombuffer(b"".join(x.ljust(w, b"\0") for x in names), dtype=_U8).reshape(n, w)
    return name_b, np.arange(w) < widths[:, None], widths


def _names(names, n: int):
    """names (a list of n bytes, or an (n, width) uint8 matrix from name_rows)
    as (bytes (n, width), mask of the bytes each has, lengths)."""
    if isinstance(names, (np.ndarray, torch.Tensor)):
        names = arr(names, _U8)
        if names.ndim != 2 or names.shape[0] != n or names.shape[1] == 0:
            raise ValueError(f"names of shape {tuple(names.shape)} for {n} items")
        w = names.shape[1]
        return names, np.ones((n, w), dtype=bool), np.full(n, w, dtype=_I64)
    return _name_matrix(names, n)


def _items(names, fmt_field: bytes, body_b, body_m, body_len) -> Tuple[bytes, np.ndarray]:
    """N items, each its head (tag and length, the key's tag, length and
    bytes, the format) then body_b[i] where body_m[i] (its ranges or its run,
    body_len[i] bytes): the request body and each item's encoded size."""
    n = body_b.shape[0]
    name_b, name_m, name_len = _names(names, n)
    kl_n = 1 + (name_len >= 0x80)
    item_len = 1 + kl_n + name_len + len(fmt_field) + body_len
    hb, hm, hn = varints(np.stack([item_len, name_len], 1))  # (n, 2, slot)
    sw, f = hb.shape[2], len(fmt_field)
    nw, bw = name_b.shape[1], body_b.shape[1]
    rows = np.empty((n, 2 * (1 + sw) + nw + f + bw), dtype=_U8)
    mask = np.ones(rows.shape, dtype=bool)
    head = rows[:, : 2 * (1 + sw)].reshape(n, 2, 1 + sw)
    head[:, :, :1] = _HEAD_TAGS
    head[:, :, 1:] = hb
    mask[:, : 2 * (1 + sw)].reshape(n, 2, 1 + sw)[:, :, 1:] = hm
    at = 2 * (1 + sw)
    rows[:, at : at + nw] = name_b
    mask[:, at : at + nw] = name_m
    at += nw
    rows[:, at : at + f] = np.frombuffer(fmt_field, dtype=_U8)
    at += f
    rows[:, at:] = body_b
    mask[:, at:] = body_m
    return select(rows, mask), 1 + hn[:, 0] + item_len


def _fields(values, tags, always):
    """Protobuf varint fields, each (n, r) values: their bytes and mask, each
    (n, r, bytes), and their encoded length (n, r). A field whose always is
    False is left out where its value is 0, as proto3 does."""
    parts_b, parts_m, total = [], [], 0
    for x, t, a in zip(values, tags, always):
        x = arr(x, _I64)
        b, m, c = varints(x)
        if a:
            parts_b += [np.full(x.shape + (1,), t, dtype=_U8), b]
            parts_m += [np.ones(x.shape + (1,), dtype=bool), m]
            total = total + 1 + c
            continue
        has = x > 0
        h = has[..., None]
        parts_b += [np.full(x.shape + (1,), t, dtype=_U8), b]
        parts_m += [h, m & h]
        total = total + has * (1 + c)
    return parts_b, parts_m, total


def _message(tag: int, values, tags, always, keep):
    """Sub-messages (ranges, runs) of varint fields, (n, r) of them, each its
    tag and one length byte: (bytes (n, r*w), mask, each item's bytes of them)
    with keep (n, r) False for the ones an item does not have."""
    keep = arr(keep, bool)
    n, r = keep.shape
    fb, fm, flen = _fields(values, tags, always)
    if bool((flen > 0x7F).any()):
        raise wire.Malformed("a range's or run's encoding is longer than one length byte")
    k = keep[:, :, None]
    b = np.concatenate([np.full((n, r, 1), tag, dtype=_U8), flen.astype(_U8)[:, :, None]] + fb, 2)
    m = np.concatenate([k, k] + [x & k for x in fm], 2)
    return b.reshape(n, -1), m.reshape(n, -1), (keep * (2 + flen)).sum(1)


def encode(names, fmt_field: bytes, sid, off, length, keep) -> Tuple[bytes, np.ndarray]:
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
    names, fmt_field: bytes, sid, off, length, stride, count
) -> Tuple[bytes, np.ndarray]:
    """Encode N items of one run each (revision 2): names[i] with the run
    (sid, off, length, stride, count)[i], each (N,). As encode, otherwise."""
    cols = [arr(x, _I64).reshape(-1, 1) for x in (sid, off, length, stride, count)]
    b, m, ln = _message(
        _TAG_RUN,
        cols,
        (_TAG_SEGMENT, _TAG_OFFSET, _TAG_LENGTH, _TAG_STRIDE, _TAG_COUNT),
        (False, False, True, False, True),
        np.ones((cols[0].shape[0], 1), dtype=bool),
    )
    return _items(names, fmt_field, b, m, ln)


def as_runs(sid, off, length, keep):
    """Which items (rows of (n, r) ranges) are one run: at least two ranges,
    every one kept, of one segment and one length, equally spaced upward by at
    least the length. Returns (regular (n,), stride (n,))."""
    sid, off, length, keep = arr(sid), arr(off), arr(length), arr(keep, bool)
    n, r = sid.shape
    if r < 2 or r > wire.MAX_RUN_COUNT:
        return np.zeros(n, dtype=bool), np.zeros(n, dtype=_I64)
    d = off[:, 1:] - off[:, :-1]
    stride = d[:, 0]
    ok = keep.all(1) & (sid == sid[:, :1]).all(1) & (length == length[:, :1]).all(1)
    ok &= (d == stride[:, None]).all(1) & (stride >= length[:, 0])
    return ok, stride


def select(rows: np.ndarray, mask: np.ndarray) -> bytes:
    """The bytes of rows where mask is set, row by row, as bytes: numpy's
    boolean indexing, and tobytes is the one copy into the body."""
    return rows[mask].tobytes()


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
    names, pages: List[int], fmt_field: bytes, seg_ids, seg, off, length, keep, runs: bool = False
) -> Optional[Encoded]:
    """The items of the planned pages (see plan_pages, rows already selected,
    pages[i] the page of row i): one item per page and part, names[i] naming
    item i. With runs (a connection of revision 2 or later), an item whose
    ranges are one run (as_runs: a layer_first part, one range per layer) is
    one Run instead; the others keep their ranges, and come after them."""
    seg, seg_ids = arr(seg), arr(seg_ids, _I64)
    m, parts, nr = seg.shape
    if m == 0:
        return None
    n = m * parts
    sid = seg_ids[seg].reshape(n, nr)
    off, lens = arr(off, _I64).reshape(n, nr), arr(length, _I64).reshape(n, nr)
    keep = arr(keep, bool).reshape(n, nr)
    totals = lens.sum(1)
    page_of = np.repeat(np.asarray(pages, dtype=_I64), parts)
    ok, stride = as_runs(sid, off, lens, keep) if runs else (None, None)
    if ok is None or not bool(ok.any()):
        if nr == 1 and _alike(names, sid, lens) and bool(keep.all()):
            got = uniform.ranges(arr(names), fmt_field, int(sid[0, 0]), off[:, 0], int(lens[0, 0]))
            if got is not None:
                body, sizes, order = got
                return Encoded(
                    body, sizes.tolist(), page_of[order].tolist(), totals[order].tolist()
                )
        body, sizes = encode(names, fmt_field, sid, off, lens, keep)
        return Encoded(body, sizes.tolist(), page_of.tolist(), totals.tolist())
    run = (sid[:, 0], off[:, 0], lens[:, 0], stride, np.full_like(stride, nr))
    if bool(ok.all()):
        if _alike(names, sid[:, 0], lens[:, 0], stride):
            head = (arr(names), fmt_field, int(sid[0, 0]), off[:, 0], int(lens[0, 0]))
            got = uniform.runs(*head, int(stride[0]), nr)
            if got is not None:
                body, sizes, order = got
                return Encoded(
                    body, sizes.tolist(), page_of[order].tolist(), totals[order].tolist(), n
                )
        body, sizes = encode_runs(names, fmt_field, *run)
        return Encoded(body, sizes.tolist(), page_of.tolist(), totals.tolist(), n)
    # Some of each: the runs' items first, then the others', each in order.
    a, z = np.flatnonzero(ok), np.flatnonzero(~ok)
    b1, s1 = encode_runs(_take(names, a), fmt_field, *(x[a] for x in run))
    b2, s2 = encode(_take(names, z), fmt_field, sid[z], off[z], lens[z], keep[z])
    order = np.concatenate([a, z])
    sizes = s1.tolist() + s2.tolist()
    return Encoded(b1 + b2, sizes, page_of[order].tolist(), totals[order].tolist(), len(a))


def _alike(names, *cols) -> bool:
    """Whether names is a matrix of one width (name_rows) and each of cols one
    value throughout: the items are filled templates (uniform.py)."""
    if not isinstance(names, (np.ndarray, torch.Tensor)):
        return False
    return all(bool((c == c.reshape(-1)[0]).all()) for c in cols)


def _take(names, idx: np.ndarray):
    """The names of the items idx (a list's, or a name_rows matrix's rows)."""
    if isinstance(names, (np.ndarray, torch.Tensor)):
        return arr(names)[idx]
    return [names[i] for i in idx.tolist()]
