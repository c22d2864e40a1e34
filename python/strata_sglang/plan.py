"""A batch's pages planned: per page and run when it must be, per page when it can.

``batch.plan_pages`` places every element of every page (61 a one-token MLA
page in ``layer_first``, a pool's layer apart) in the segments and merges the
adjacent ones: tens of thousands of elements a batch, half a millisecond of
numpy. For a pool whose pointers are affine in the page number
(``batch.PageModel``) with one page step within each part, none of that depends
on the page: the segment of every element, which runs merge and their lengths,
whether a part is one strided run. :class:`Template` works it out once, from
the model's first and last pages (every page between lies between them, in the
same segment), and :class:`Affine` is then a batch's page numbers and nothing
else; its items are encoded from one offset each (``encode``).

A pool the template does not fit (pointers not affine, a part whose layers
step by different amounts, an element that crosses from one segment to
another across the pool) is planned element by element as before: :class:`Full`.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

from strata_client import uniform

from . import batch

_I64 = np.int64


class Full:
    """A plan of every run of every page: plan_pages's (seg, off, length, keep,
    good), each (m, parts, runs) but good (m,)."""

    def __init__(self, seg, off, length, keep, good):
        self.seg, self.off, self.length, self.keep, self.good = seg, off, length, keep, good

    def rows(self, idx: np.ndarray) -> "Full":
        """The plan of the pages idx only."""
        s = self
        return Full(s.seg[idx], s.off[idx], s.length[idx], s.keep[idx], s.good[idx])

    def full(self):
        """(seg, off, length, keep), each (m, parts, runs)."""
        return self.seg, self.off, self.length, self.keep


class Template:
    """What every page of an affine pool has in common, for parts parts: a
    page's plan is seg, off0 + page * step (per part), length and keep."""

    __slots__ = ("seg", "off0", "step", "length", "keep", "parts")

    @staticmethod
    def make(model, parts: int, bases, ends) -> Optional["Template"]:
        """The template of the model's pool, or None when it does not fit."""
        if not model.ok or model.pages < 1:
            return None
        a, b, s = (batch.arr(x, _I64) for x in (model.a, model.b, model.sizes))
        per = a.shape[0]
        if per % parts:
            return None
        runs = per // parts
        step = b.reshape(runs, parts).T  # (parts, runs)
        if not bool((step == step[:, :1]).all()):
            return None  # merges and strides would depend on the page
        last = a + (model.pages - 1) * b
        p0 = batch.plan_pages(a[None], s[None], parts, bases, ends)
        p1 = batch.plan_pages(last[None], s[None], parts, bases, ends)
        if p0 is None or p1 is None or not (bool(p0[4][0]) and bool(p1[4][0])):
            return None
        if not (
            np.array_equal(p0[0], p1[0])
            and np.array_equal(p0[2], p1[2])
            and np.array_equal(p0[3], p1[3])
        ):
            return None  # an element in another segment at the far end of the pool
        t = Template()
        t.seg, t.off0, t.length, t.keep = p0[0][0], p0[1][0], p0[2][0], p0[3][0]
        t.step, t.parts = step[:, 0].copy(), parts
        return t


class Affine:
    """The plan of a batch of an affine pool: its pages' numbers."""

    def __init__(self, t: Template, page: np.ndarray):
        self.t, self.page = t, page
        self.good = np.ones(page.shape[0], dtype=bool)

    def rows(self, idx: np.ndarray) -> "Affine":
        return Affine(self.t, self.page[idx])

    def full(self):
        t, m = self.t, self.page.shape[0]
        shape = (m,) + t.seg.shape
        off = t.off0[None] + self.page[:, None, None] * t.step[None, :, None]
        return (
            np.broadcast_to(t.seg, shape),
            off,
            np.broadcast_to(t.length, shape),
            np.broadcast_to(t.keep, shape),
        )


def encode(names, pages, fmt_field: bytes, seg_ids, plan, runs: bool) -> Optional[batch.Encoded]:
    """The items of a plan (see batch.encode_pages): from one offset an item
    when the plan is Affine and its parts are alike (one range, or one run, of
    one segment and shape each), else through encode_pages."""
    if isinstance(plan, Affine) and isinstance(names, np.ndarray) and plan.page.size:
        got = _affine(names, pages, fmt_field, batch.arr(seg_ids, _I64), plan, runs)
        if got is not None:
            return got
    return batch.encode_pages(names, pages, fmt_field, seg_ids, *plan.full(), runs)


def _affine(names, pages, fmt_field, seg_ids, plan: Affine, runs: bool):
    t = plan.t
    sid = seg_ids[t.seg]  # (parts, runs)
    nr = t.keep.shape[1]
    off = (t.off0[None, :, 0] + plan.page[:, None] * t.step[None]).reshape(-1)
    if bool((t.keep.sum(1) == 1).all()):
        # One range a part (page_first, or layer_first in a pool of one page).
        cols = (sid[:, 0], t.length[:, 0])
        if not all(bool((c == c[0]).all()) for c in cols):
            return None
        got = uniform.ranges(names, fmt_field, int(sid[0, 0]), off, int(cols[1][0]))
        nruns = 0
    elif runs:
        ok, stride = batch.as_runs(sid, t.off0, t.length, t.keep)
        cols = (sid[:, 0], t.length[:, 0], stride)
        if not bool(ok.all()) or not all(bool((c == c[0]).all()) for c in cols):
            return None
        got = uniform.runs(
            names, fmt_field, int(sid[0, 0]), off, int(cols[1][0]), int(stride[0]), nr
        )
        nruns = plan.page.size * t.parts
    else:
        return None
    if got is None:
        return None
    body, sizes, order = got
    page_of = np.repeat(np.asarray(pages, dtype=_I64), t.parts)[order]
    totals = np.tile(t.length.sum(1), plan.page.size)[order]
    return batch.Encoded(body, sizes.tolist(), page_of.tolist(), totals.tolist(), nruns)
