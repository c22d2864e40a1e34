"""strata_sglang.plan: a batch of an affine pool planned from its page numbers
alone is the element-by-element plan, and encodes to the same items."""

import random

import numpy as np
import pytest
import torch

import harness
from strata_client import wire
from strata_sglang import batch, plan

LAYOUTS = harness.LAYOUTS


def _everything():
    """One segment holding any pointer: every page is inside it."""
    return np.array([0], dtype=np.int64), np.array([1 << 62], dtype=np.int64)


def _items(enc):
    """name: (ranges expanded, page, length) of each item of an Encoded."""
    out = {}
    for x, pg, ln in zip(wire.decode(wire.PUT, enc.body).items, enc.pages, enc.lengths):
        spans = [(r.segment, r.offset, r.length) for r in x.ranges]
        spans += [(y.segment, y.offset, y.length) for r in x.runs for y in r.ranges()]
        assert x.key not in out
        out[x.key] = (spans, pg, ln)
    assert sum(enc.sizes) == len(enc.body)
    return out


@pytest.mark.parametrize("kind,layout", LAYOUTS)
@pytest.mark.parametrize("runs", [False, True])
def test_an_affine_plan_is_the_element_by_element_plan(sglang, kind, layout, runs):
    pool = harness.host_pool(kind, layout)
    parts = 2 if kind == "mha" else 1
    model = batch.PageModel(pool, pool.page_size)
    bases, ends = _everything()
    t = plan.Template.make(model, parts, bases, ends)
    assert t is not None, f"{kind} {layout}: SGLang's own layout did not fit the template"
    rnd = random.Random(f"{kind}{layout}")
    pages = rnd.sample(range(model.pages), min(12, model.pages))
    idx = harness.indices(pool, pages)
    page = model.page_numbers(idx, len(pages))
    assert page.tolist() == pages
    affine = plan.Affine(t, page)
    ptrs, sizes = batch.meta_pointers(pool, idx, len(pages))
    full = plan.Full(*batch.plan_pages(ptrs, sizes, parts, bases, ends))
    assert full.good.all() and affine.good.all()
    for got, want in zip(affine.full(), full.full()):
        assert np.array_equal(got, want)
    # The items: the same names, ranges, pages and lengths (maybe in another
    # order), and from a subset of the pages too.
    keys = harness.keys(len(pages))
    names = batch.name_rows(b"m/", keys, [b"_k", b"_v"][:parts])
    seg_ids = np.array([3], dtype=np.int64)
    fmt = b"\x11" + (9).to_bytes(8, "little")
    order = list(range(len(pages)))
    a = plan.encode(names, order, fmt, seg_ids, affine, runs)
    b = batch.encode_pages(names, order, fmt, seg_ids, *full.full(), runs)
    assert _items(a) == _items(b) and a.runs == b.runs
    rows = np.array([1, 4, 5])
    sub = batch.name_rows(b"m/", [keys[i] for i in rows], [b"_k", b"_v"][:parts])
    a = plan.encode(sub, rows.tolist(), fmt, seg_ids, affine.rows(rows), runs)
    b = batch.encode_pages(sub, rows.tolist(), fmt, seg_ids, *full.rows(rows).full(), runs)
    assert _items(a) == _items(b)


class _Affine:
    """A host pool of pages of two elements whose pointers are affine in the
    page number: element e at base[e] + page * step[e]."""

    page_size, size = 4, 64

    def __init__(self, base, step, elem=64):
        self.base, self.step, self.elem = base, step, elem

    def get_page_buffer_meta(self, indices):
        ptrs = []
        for i in indices.tolist()[:: self.page_size]:
            ptrs += [b + (i // self.page_size) * s for b, s in zip(self.base, self.step)]
        return ptrs, [self.elem] * len(ptrs)


def test_the_template_refuses_what_depends_on_the_page():
    bases, ends = _everything()
    # One part whose two layers step by different amounts: whether they merge,
    # and the run's stride, would change page by page.
    bent = batch.PageModel(_Affine([4096, 4096 + 64], [128, 256]), 4)
    assert bent.ok and plan.Template.make(bent, 1, bases, ends) is None
    # The same steps in two parts (one layer each): one range a part, fits.
    assert plan.Template.make(bent, 2, bases, ends) is not None
    # A pool that crosses from one registered segment to another: its first
    # pages are in one and its last in the other.
    two = batch.PageModel(_Affine([4096, 8192], [64, 64]), 4)
    split_b = np.array([0, 4096 + 8 * 64], dtype=np.int64)
    split_e = np.array([4096 + 8 * 64, 1 << 40], dtype=np.int64)
    assert plan.Template.make(two, 2, split_b, split_e) is None
    assert plan.Template.make(two, 2, bases, ends) is not None
    # A pool past a segment's end: not planned from the template (the pages
    # outside are refused element by element).
    short = np.array([8192 + 8 * 64], dtype=np.int64)
    assert plan.Template.make(two, 2, np.array([0], dtype=np.int64), short) is None
    # Parts that do not divide the elements.
    assert plan.Template.make(two, 3, bases, ends) is None


def test_a_pool_whose_memory_moved_is_planned_from_sglang_again(sglang):
    """The template is used only while the per-batch check of the model holds:
    a pool whose pointers changed is planned from get_page_buffer_meta."""
    host = _Affine([4096, 8192], [64, 64])
    model = batch.PageModel(host, 4)
    assert plan.Template.make(model, 2, *_everything()) is not None
    host.base = [4096 + 32, 8192]
    idx = torch.arange(8, 16)
    assert model.page_numbers(idx, 2) is None and not model.ok
    assert plan.Template.make(model, 2, *_everything()) is None
