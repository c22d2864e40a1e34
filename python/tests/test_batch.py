"""strata_sglang.batch: vectorised ranges and encoding, checked against the
generic codec (wire.encode_item) and SGLang's own get_page_buffer_meta."""

import random

import pytest
import torch

import harness
from strata_client import wire
from strata_client import uniform
from strata_sglang import batch


def _generic(names, fmt, sid, off, length, keep):
    out, sizes = [], []
    for i, name in enumerate(names):
        ranges = [
            wire.Range(sid[i][r], off[i][r], length[i][r]) for r in range(len(sid[i])) if keep[i][r]
        ]
        body = wire.encode_item(wire.Item(name.decode(), fmt, ranges))
        item = b"\x0a" + wire.varint(len(body)) + body
        out.append(item)
        sizes.append(len(item))
    return b"".join(out), sizes


@pytest.mark.parametrize("seed", range(12))
def test_encode_matches_the_generic_encoder(seed):
    rnd = random.Random(seed)
    n, r = rnd.randint(1, 40), rnd.randint(1, 9)
    # Values across every varint length, zero offsets (left out), big segments.
    big = [0, 1, 127, 128, 16383, 16384, (1 << 21) + 5, (1 << 35) - 1, (1 << 46) + 3]
    sid = [[rnd.choice([1, 2, 127, 128, 70000, (1 << 32) - 1]) for _ in range(r)] for _ in range(n)]
    off = [[rnd.choice(big) for _ in range(r)] for _ in range(n)]
    length = [[max(1, rnd.choice(big)) for _ in range(r)] for _ in range(n)]
    keep = [[j == 0 or rnd.random() < 0.7 for j in range(r)] for _ in range(n)]
    same = seed % 2 == 0
    names = [
        ("k" * (rnd.randint(1, 300) if not same else 90 + seed) + str(i)).encode() for i in range(n)
    ]
    if same:
        names = [x[-1:] * len(names[0]) for x in names]  # one length for all
    fmt = rnd.getrandbits(64) or 1
    fmt_field = b"\x11" + fmt.to_bytes(8, "little")
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    body, sizes = batch.encode(names, fmt_field, t(sid), t(off), t(length), torch.tensor(keep))
    want, want_sizes = _generic(names, fmt, sid, off, length, keep)
    assert body == want
    assert sizes.tolist() == want_sizes


@pytest.mark.parametrize(
    "op,deadline,slot",
    [
        (wire.PUT, 0, 0),
        (wire.PUT, 987654321012345, 0),
        (wire.GET, (1 << 64) - 1, 1024),
        (wire.GET, 0, 1),
    ],
)
def test_a_batch_frame_with_a_deadline_is_the_generic_encoders(op, deadline, slot):
    """The fast path's items with the call's deadline and fence slot before them
    are the frame the generic encoder (and Go's marshalWindow) writes."""
    names = [b"a" * 70, b"b" * 70]
    fmt_field = b"\x11" + (5).to_bytes(8, "little")
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    sid, off, length = [[1, 1], [2, 2]], [[0, 4096], [128, 8192]], [[64, 64], [32, 32]]
    keep = torch.tensor([[True, True], [True, False]])
    body, _ = batch.encode(names, fmt_field, t(sid), t(off), t(length), keep)
    cls = wire.Put if op == wire.PUT else wire.Get
    items = [
        wire.Item(names[0].decode(), 5, [wire.Range(1, 0, 64), wire.Range(1, 4096, 64)]),
        wire.Item(names[1].decode(), 5, [wire.Range(2, 128, 32)]),
    ]
    fast = wire.encode_frame(9, cls([], deadline, slot), body)
    assert fast == wire.encode_frame(9, cls(items, deadline, slot))
    h, m = wire.parse_frame(fast)
    assert (m.deadline_ns, m.fence_slot, m.items) == (deadline, slot, items)
    with pytest.raises(wire.Malformed):
        wire.encode_frame(9, cls([], deadline, wire.FENCE_SLOTS + 1), body)


def test_split_leaves_room_for_the_deadline():
    one = wire.MAX_BODY // 4
    cuts = batch.split([one] * 4)
    assert len(cuts) == 2, "four quarter-frame items and a deadline do not fit one frame"
    assert all(b1 - b0 + wire.MAX_WINDOW <= wire.MAX_BODY for _, _, b0, b1 in cuts)


def test_split_respects_both_limits():
    sizes = [10] * 25
    assert batch.split(sizes, max_items=10, max_body=1000) == [
        (0, 10, 0, 100),
        (10, 20, 100, 200),
        (20, 25, 200, 250),
    ]
    assert batch.split(sizes, max_items=100, max_body=35) == [
        (a, min(a + 3, 25), 10 * a, 10 * min(a + 3, 25)) for a in range(0, 25, 3)
    ]
    with pytest.raises(wire.Malformed):
        batch.split([5, 50], max_items=10, max_body=40)


def test_plan_places_runs_and_merges_adjacent_ones():
    bases, ends = torch.tensor([1000, 5000]), torch.tensor([2000, 6000])
    # Two pages of 2 parts x 3 runs, SGLang's order (run-major, part-minor).
    ptrs = torch.tensor(
        [
            [1000, 1500, 1010, 1520, 1020, 1600],  # part 0 runs adjacent: one range
            [5000, 1995, 5100, 1700, 5200, 1800],  # a run past a segment's end
        ]
    )
    sizes = torch.full((2, 6), 10)
    seg, off, length, keep, good = batch.plan_pages(ptrs, sizes, 2, bases, ends)
    assert good.tolist() == [True, False]
    assert keep[0].tolist() == [[True, False, False], [True, True, True]]
    assert length[0].tolist() == [[30, 0, 0], [10, 10, 10]]
    assert off[0].tolist() == [[0, 10, 20], [500, 520, 600]]
    assert seg[1, 0].tolist() == [1, 1, 1]
    assert batch.plan_pages(ptrs[:, :5], sizes[:, :5], 2, bases, ends) is None


@pytest.mark.parametrize("kind,layout", harness.LAYOUTS)
def test_page_model_agrees_with_sglang(sglang, kind, layout):
    pool = harness.host_pool(kind, layout)
    model = batch.PageModel(pool, pool.page_size)
    assert model.ok
    pages = [5, 0, 31, 7, 7, 2]
    idx = harness.indices(pool, pages)
    ptrs, sizes = model.pointers(idx, len(pages))
    want, want_sizes = batch.meta_pointers(pool, idx, len(pages))
    assert ptrs.tolist() == want.tolist() and sizes.tolist() == want_sizes.tolist()


class _Bent:
    """A host pool whose pointers are not affine in the page number."""

    page_size, size = 4, 64

    def get_page_buffer_meta(self, indices):
        idx = indices.tolist()
        ptrs = [4096 + (i // 4) ** 2 * 64 for i in idx[:: self.page_size]]
        return ptrs, [64] * len(ptrs)


def test_page_model_refuses_pointers_it_cannot_predict():
    host = _Bent()
    assert not batch.PageModel(host, 4).ok
    # A model whose pool changes under it is caught by the per-batch check.
    model = batch.PageModel(host, 4)
    model.ok, model.pages = True, 16
    model.a, model.b, model.sizes = torch.tensor([4096]), torch.tensor([64]), torch.tensor([64])
    idx = torch.arange(8, 12)
    assert model.pointers(idx, 1) is None and not model.ok
    assert batch.meta_pointers(host, idx, 1)[0].tolist() == [[4096 + 4 * 64]]


def test_keys_ok_agrees_with_the_per_key_check():
    from strata_sglang.names import key_ok as _key_ok, keys_ok as _keys_ok

    good = harness.keys(5)
    cases = [
        good,
        [],
        good + [""],
        good[:2] + ["a\x7f"] + good,
        good[:3] + ["é"] + good,
        good[:1] + ["tab\there"] + good,
        good + ["x" * 400, "x" * 401],
        good[:2] + [None] + good,
        ["short", "a much longer key than the others", "~ !"],
    ]
    for keys in cases:
        want = next((i for i, k in enumerate(keys) if not _key_ok(k)), len(keys))
        assert _keys_ok(keys) == want, keys


@pytest.mark.parametrize("kind,model", [("mha", "org/model-1"), ("mla", "m" * 150)])
def test_exists_body_matches_the_generic_encoder(sglang, kind, model):
    from strata_sglang.storage import StrataStorage

    cfg = harness.storage_config("/nonexistent/strata.sock", model=model, connect_wait_s=0)
    b = StrataStorage(cfg, {})
    try:
        b.register_mem_pool_host(harness.host_pool(kind, "page_first"))
        pool = b._pool("kv")
        for keys in (harness.keys(7), ["k1", "key-2", harness.keys(1)[0]]):
            names = [pool.prefix + k + x for k in keys for x in pool.suffixes]
            assert pool.exists_body(keys) == wire.encode_body(wire.Exists(names, pool.format))
    finally:
        b.close()


@pytest.mark.parametrize(
    "prefix,suffixes", [(b"org_2fm:", [b"_0_k", b"_0_v"]), (b"", [b"__k"]), (b"p", [b""])]
)
def test_name_rows_are_the_names_and_encode_alike(prefix, suffixes):
    """The byte matrix of names (name_rows) holds prefix + key + suffix for each
    key and suffix in turn, and encode makes the same body of it as of the list."""
    keys = [f"{i:064x}" for i in range(5)]
    rows = batch.name_rows(prefix, keys, suffixes)
    names = [prefix + k.encode() + x for k in keys for x in suffixes]
    assert rows is not None and [bytes(r.tolist()) for r in rows] == names
    n = len(names)
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    sid, off, length = t([[3]] * n), t([[4096 * i] for i in range(n)]), t([[65536]] * n)
    keep = torch.ones(n, 1, dtype=torch.bool)
    fmt_field = b"\x11" + (9).to_bytes(8, "little")
    assert batch.encode(rows, fmt_field, sid, off, length, keep)[0] == (
        batch.encode(names, fmt_field, sid, off, length, keep)[0]
    )
    # Keys of two lengths, or not ASCII: no matrix (the caller uses a list).
    assert batch.name_rows(prefix, keys + ["abc"], suffixes) is None
    assert batch.name_rows(prefix, ["\u00e9" * 64], suffixes) is None
    assert batch.name_rows(prefix, keys, [b"_k", b"_vv"]) is None


@pytest.mark.parametrize("seed", range(8))
def test_encode_runs_matches_the_generic_encoder(seed):
    rnd = random.Random(seed)
    n = rnd.randint(1, 40)
    big = [0, 1, 127, 128, 16383, 16384, (1 << 21) + 5, (1 << 35) - 1, (1 << 46) + 3]
    sid = [rnd.choice([0, 1, 127, 128, 70000, (1 << 32) - 1]) for _ in range(n)]
    off = [rnd.choice(big) for _ in range(n)]
    length = [max(1, rnd.choice(big)) for _ in range(n)]
    count = [rnd.choice([1, 2, 61, 127, 128, 4096]) for _ in range(n)]
    stride = [
        0 if c == 1 and rnd.random() < 0.5 else x + rnd.choice(big) for c, x in zip(count, length)
    ]
    names = [("m" * rnd.randint(1, 200) + str(i)).encode() for i in range(n)]
    fmt = rnd.getrandbits(64) or 1
    fmt_field = b"\x11" + fmt.to_bytes(8, "little")
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    rows = [t(x) for x in (sid, off, length, stride, count)]
    body, sizes = batch.encode_runs(names, fmt_field, *rows)
    want, want_sizes = [], []
    for i, name in enumerate(names):
        run = wire.Run(sid[i], off[i], length[i], stride[i], count[i])
        item = wire.encode_item(wire.Item(name.decode(), fmt, runs=[run]))
        want.append(b"\x0a" + wire.varint(len(item)) + item)
        want_sizes.append(len(want[-1]))
    assert body == b"".join(want) and sizes.tolist() == want_sizes


def _expanded(item):
    return [(r.segment, r.offset, r.length) for r in item.ranges] + [
        (x.segment, x.offset, x.length) for r in item.runs for x in r.ranges()
    ]


@pytest.mark.parametrize("irregular", [0, 1, 3, 6])
def test_encode_pages_names_the_same_ranges_by_runs(irregular):
    """With runs, each item whose ranges are one run is that Run, the others
    keep their ranges (after the runs' items); every item names the same bytes
    as without runs, under the same name, for the same page."""
    m, parts, r = 6, 2, 5
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    seg = torch.zeros(m, parts, r, dtype=torch.int64)
    base = t([[1000 * p + 64 * q for q in range(parts)] for p in range(m)])
    off = base.unsqueeze(2) + (1 << 20) * torch.arange(r)
    length = torch.full((m, parts, r), 64, dtype=torch.int64)
    keep = torch.ones(m, parts, r, dtype=torch.bool)
    spoil = [(0, 1), (2, 0), (3, 1), (4, 0), (5, 0), (5, 1)][:irregular]
    for k, (p, q) in enumerate(spoil):
        if k % 3 == 0:
            off[p, q, 3] += 8  # not equally spaced
        elif k % 3 == 1:
            length[p, q, 1] = 32  # ranges of two lengths
        else:
            keep[p, q, 2:] = False  # merged ranges, as plan_pages leaves them
            length[p, q, 2:] = 0
            length[p, q, 1] = 64 * 4
    seg_ids = t([7])
    names = [f"key{p}_{q}".encode() for p in range(m) for q in range(parts)]
    pages = [3, 5, 8, 9, 10, 12]
    fmt_field = b"\x11" + (4).to_bytes(8, "little")
    plain = batch.encode_pages(names, pages, fmt_field, seg_ids, seg, off, length, keep)
    runs = batch.encode_pages(names, pages, fmt_field, seg_ids, seg, off, length, keep, True)
    assert plain.runs == 0 and runs.runs == m * parts - irregular
    a, b = wire.decode(wire.PUT, plain.body).items, wire.decode(wire.PUT, runs.body).items
    assert [len(x.runs) for x in b] == [1] * runs.runs + [0] * irregular
    assert all(not x.runs for x in a)
    by_name = {x.key: (x, pg, ln) for x, pg, ln in zip(a, plain.pages, plain.lengths)}
    for x, pg, ln, size in zip(b, runs.pages, runs.lengths, runs.sizes):
        y, pg2, ln2 = by_name.pop(x.key)
        assert (_expanded(x), pg, ln) == (_expanded(y), pg2, ln2)
        assert ln == sum(z[2] for z in _expanded(x))
    assert not by_name and sum(runs.sizes) == len(runs.body)
    # One range per item (page_first): nothing to gain, ranges as before.
    first = [x[..., :1].contiguous() for x in (seg, off, length, keep)]
    one = batch.encode_pages(names, pages, fmt_field, seg_ids, *first, True)
    assert one.runs == 0
    assert one.body == batch.encode_pages(names, pages, fmt_field, seg_ids, *first).body


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("as_run", [False, True])
def test_uniform_items_are_the_generic_encoders_in_their_order(seed, as_run, monkeypatch):
    """Items alike but for name and offset (filled templates, uniform.py)
    are, in the order encode_pages returns, the generic encoder's items; each
    keeps its page and length, and offsets of every varint width (0 left out)
    mix in one batch."""
    rnd = random.Random(seed)
    m, parts = rnd.randint(1, 60), rnd.choice([1, 2])
    nr = 61 if as_run else 1
    widths = [0, 1, 127, 128, 16383, 16384, (1 << 21) + 5, (1 << 28) + 1, (1 << 35) + 3]
    first = [[rnd.choice(widths) for _ in range(parts)] for _ in range(m)]
    stride = 0 if not as_run else rnd.choice([1152, 1 << 20])
    off = torch.tensor(first, dtype=torch.int64).unsqueeze(2) + stride * torch.arange(nr)
    length = torch.full((m, parts, nr), rnd.choice([1, 200, 65536]), dtype=torch.int64)
    seg = torch.zeros(m, parts, nr, dtype=torch.int64)
    keep = torch.ones(m, parts, nr, dtype=torch.bool)
    sid = rnd.choice([0, 1, 300, (1 << 32) - 1])
    klen = [8, 64, 130][seed % 3]  # names past 127 bytes: a two-byte length
    keys = ["%0*x" % (klen, i * 7919) for i in range(m)]
    suffixes = [b"_k", b"_v"][:parts]
    rows = batch.name_rows(b"model/", keys, suffixes)
    pages = sorted(rnd.sample(range(4 * m), m))
    fmt_field = b"\x11" + rnd.getrandbits(64).to_bytes(8, "little")
    seg_ids = torch.tensor([sid])
    filled = []
    fill = uniform.encode
    monkeypatch.setattr(uniform, "encode", lambda *a: filled.append(1) or fill(*a))
    got = batch.encode_pages(rows, pages, fmt_field, seg_ids, seg, off, length, keep, as_run)
    one_run = as_run and stride >= length[0, 0, 0]
    assert got.runs == (m * parts if one_run else 0)
    assert filled == ([1] if one_run or not as_run else [])  # 61 ranges: the general path
    items = wire.decode(wire.PUT, got.body).items
    names = [bytes(r.tolist()).decode() for r in rows]
    want = {}
    for i, name in enumerate(names):
        p, q = divmod(i, parts)
        ranges = [(sid, int(off[p, q, r]), int(length[p, q, r])) for r in range(nr)]
        want[name] = (ranges, pages[p], nr * int(length[0, 0, 0]))
    assert len(items) == len(got.pages) == len(got.lengths) == m * parts
    for x, pg, ln in zip(items, got.pages, got.lengths):
        assert (_expanded(x), pg, ln) == want.pop(x.key)
    assert not want and sum(got.sizes) == len(got.body)
    # Byte for byte the generic encoder's items, taken in the returned order.
    order = [names.index(x.key) for x in items]
    general = b"".join(
        b"\x0a" + wire.varint(len(b)) + b
        for b in (wire.encode_item(wire.Item(x.key, x.format, x.ranges, x.runs)) for x in items)
    )
    assert got.body == general and len(set(order)) == len(order)
