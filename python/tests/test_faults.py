"""StrataStorage when the service stalls or fails a page; replaced pools; bad indices.

SGLang's real host pools and a real strata serve; a stall is the service
SIGSTOPped (its socket open, nothing answering), as a wedged or swapped-out
service looks to the plugin.
"""

import gc
import json
import logging
import os
import threading
import time

import pytest

from conftest import Serve


import harness
from fakepeer import wait_for

# How far past its deadline a call may end on a loaded two-core machine.
SLACK = 1.5


LAYOUTS = harness.LAYOUTS


def warnings_of(caplog):
    return [
        r.getMessage()
        for r in caplog.records
        if r.levelno >= logging.WARNING and r.name == "strata_sglang"
    ]


def client_segments(b) -> int:
    """How many segments the service holds for b's connection (its Stats)."""
    from strata_client import wire

    doc = json.loads(b.client.call(wire.Stats()).json)
    me = b.client.snapshot().hello.client_id
    return [c["segmentCount"] for c in doc["clients"] if c["id"] == me][0]


# ---------------------------------------------------------------- issue 18 B


def test_writes_work_once_registration_returned_while_the_service_starts(sglang, serve, backends):
    """A fresh service holds connections in its backlog until its arena is mapped
    (seconds for a large one): registration waits for the connection attempt in
    progress, so the first write after it works."""
    pool = harness.host_pool("mha", "layer_first")
    pages = [1, 2, 3, 4, 5]
    harness.fill(pool, pages, seed=1)
    serve.pause()  # as a service still mapping its arena: the Hello waits
    resume = threading.Timer(0.3, serve.resume)
    try:
        b = backends(serve.socket, connect_wait_s=0.05)
        resume.start()
        b.register_mem_pool_host(pool)
        ok = b.batch_set_v1(harness.keys(5, "first"), harness.indices(pool, pages))
    finally:
        resume.join()
        serve.resume()
    assert ok == [True] * 5
    assert b.batch_exists(harness.keys(5, "first")) == 5


def test_a_failed_item_is_logged_once_with_the_services_reason(sglang, serve, backends, caplog):
    a = backends(serve.socket)
    b = backends(serve.socket)
    pa, pb = harness.host_pool("mha", "page_first"), harness.host_pool("mha", "layer_first")
    a.register_mem_pool_host(pa)
    b.register_mem_pool_host(pb)
    keys = harness.keys(3, "fmt")
    assert a.batch_set_v1(keys, harness.indices(pa, [1, 2, 3])) == [True] * 3
    with caplog.at_level(logging.WARNING, logger="strata_sglang"):
        for _ in range(5):
            # The same objects in another layout: the service refuses each item.
            assert b.batch_set_v1(keys, harness.indices(pb, [1, 2, 3])) == [False] * 3
    got = [m for m in warnings_of(caplog) if "format_mismatch" in m]
    assert len(got) == 1, caplog.text
    assert "write-once" in got[0]  # the service's own reason
    # A miss is not a failure: nothing logged for it.
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="strata_sglang"):
        assert b.batch_get_v1(harness.keys(2, "absent"), harness.indices(pb, [4, 5])) == [False] * 2
    assert warnings_of(caplog) == []


# ---------------------------------------------------------------- issue 24: 3 and 7


def test_a_pool_registered_during_a_stall_gets_l3_once_the_service_resumes(
    sglang, serve, backends, caplog
):
    from harness import PoolName, PoolTransfer

    b = backends(serve.socket, timeout_s=0.5)
    kv = harness.host_pool("mha", "page_first")
    draft = harness.host_pool("mha", "page_first", label="draft", layers=1)
    b.register_mem_host_pool_v2(kv, PoolName.KV)
    assert b.client.wait_connected(10)
    serve.pause()
    try:
        with caplog.at_level(logging.WARNING, logger="strata_sglang"):
            t0 = time.monotonic()
            b.register_mem_host_pool_v2(draft, PoolName.DRAFT)
            took = time.monotonic() - t0
    finally:
        serve.resume()
    assert took < 0.5 + SLACK, f"registration during a stall took {took:.1f} s"
    assert any("retrying" in m for m in warnings_of(caplog)), caplog.text

    keys = harness.keys(4, "stall")
    idx = harness.indices(kv, [1, 2, 3, 4])
    harness.fill(kv, [1, 2, 3, 4], seed=4)
    harness.fill(draft, [1, 2, 3, 4], seed=5)

    def both_stored():
        r = b.batch_set_v2(
            [
                PoolTransfer(name=PoolName.KV, keys=keys, host_indices=idx),
                PoolTransfer(name=PoolName.DRAFT, keys=keys, host_indices=idx),
            ]
        )
        return r[PoolName.KV] == [True] * 4 and r[PoolName.DRAFT] == [True] * 4

    assert wait_for(both_stored, 20), f"the draft pool never got L3: {b.pool_status()}"
    assert b.pool_status() == {"kv": "enabled", "draft": "enabled"}
    r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DRAFT)])
    assert r.kv_hit_pages == 4 and r.extra_pool_hit_pages[PoolName.DRAFT] == 4


def test_an_outage_is_one_warning_whatever_fails_in_it(sglang, serve, backends, caplog):
    from harness import PoolName, PoolTransfer

    b = backends(serve.socket, timeout_s=0.3)
    pool = harness.host_pool("mha", "page_first")
    b.register_mem_pool_host(pool)
    assert b.client.wait_connected(10)
    keys = harness.keys(2, "outage")
    idx = harness.indices(pool, [1, 2])
    t = [PoolTransfer(name=PoolName.KV, keys=keys, host_indices=idx)]
    page = pool.get_data_page(0)
    caplog.clear()  # a fresh service may not have answered the first Hello in 0.3 s
    serve.pause()
    try:
        with caplog.at_level(logging.WARNING, logger="strata_sglang"):
            for _ in range(2):
                assert b.batch_get_v1(keys, idx) == [False, False]
                assert b.batch_set_v1(keys, idx) == [False, False]
                assert b.batch_exists(keys) == 0
                assert b.exists(keys[0]) is False
                assert b.set(keys[0], page) is False
                assert b.get(keys[0], pool.get_dummy_flat_data_page()) is None
                assert b.batch_exists_v2(keys, []).kv_hit_pages == 0
                assert b.batch_get_v2(t)[PoolName.KV] == [False, False]
                assert b.batch_set_v2(t)[PoolName.KV] == [False, False]
            during = warnings_of(caplog)
    finally:
        serve.resume()
    assert len(during) == 1, during
    assert "not answering" in during[0] or "not reachable" in during[0]
    assert b.client.wait_connected(20)
    assert wait_for(lambda: b.batch_set_v1(keys, idx) == [True, True], 20)


def test_mla_ranks_other_than_0_write_nothing_and_say_so(sglang, serve, backends):
    """MLA KV is the same on every TP rank: rank 0 writes the objects every rank
    reads, and a write on another rank stores nothing and answers False."""
    from harness import PoolName, PoolTransfer

    r1 = backends(serve.socket, mla=True, tp_rank=1, tp_size=2)
    r0 = backends(serve.socket, mla=True, tp_rank=0, tp_size=2)
    p1, p0 = harness.host_pool("mla", "page_first"), harness.host_pool("mla", "page_first")
    r1.register_mem_pool_host(p1)
    r0.register_mem_pool_host(p0)
    keys = harness.keys(2, "mla1")
    harness.fill(p1, [1, 2], seed=1)
    idx = harness.indices(p1, [1, 2])
    assert r1.batch_set_v1(keys, idx) == [False, False]
    t = [PoolTransfer(name=PoolName.KV, keys=keys, host_indices=idx)]
    assert r1.batch_set_v2(t)[PoolName.KV] == [False, False]
    assert r0.batch_exists(keys) == 0 and r1.batch_exists(keys) == 0
    harness.fill(p0, [1, 2], seed=2)
    assert r0.batch_set_v1(keys, harness.indices(p0, [1, 2])) == [True, True]
    assert r1.batch_get_v1(keys, harness.indices(p1, [3, 4])) == [True, True]
    for p, q in ((1, 3), (2, 4)):
        assert harness.page_bytes(p0, p).equal(harness.page_bytes(p1, q))


# ---------------------------------------------------------------- issue 24: 4


def test_re_registering_a_pool_releases_the_segment_it_replaces(
    sglang, strata_bin, sock_path, backends
):
    from harness import PoolName

    s = Serve(strata_bin, sock_path, args=["--max-segments-per-client", "8"]).start()
    try:
        b = backends(s.socket)
        pool = harness.host_pool("mha", "page_first")
        b.register_mem_host_pool_v2(pool, PoolName.KV)
        assert b.client.wait_connected(10)
        gc.collect()
        fds0 = len(os.listdir("/proc/self/fd"))
        for i in range(20):
            pool = harness.host_pool("mha", "page_first")
            b.register_mem_host_pool_v2(pool, PoolName.KV)
            b.register_mem_pool_host(pool)  # the same pool again: kept
        gc.collect()
        assert len(b.client._segments) == 1
        assert client_segments(b) == 1
        assert len(os.listdir("/proc/self/fd")) <= fds0 + 2
        keys = harness.keys(3, "rereg")
        harness.fill(pool, [1, 2, 3], seed=9)
        assert b.batch_set_v1(keys, harness.indices(pool, [1, 2, 3])) == [True] * 3
        assert b.pool_status() == {"kv": "enabled"}
    finally:
        s.stop()


# ---------------------------------------------------------------- issue 24: 6


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_indices_outside_the_pool_are_refused_for_every_method(
    sglang, serve, backends, kind, layout
):
    from harness import PoolName, PoolTransfer

    mla = kind == "mla"
    b = backends(serve.socket, mla=mla)
    pool = harness.host_pool(kind, layout)
    b.register_mem_pool_host(pool)
    assert b.client.wait_connected(10)
    n = pool.page_num
    harness.fill(pool, list(range(n)), seed=12)
    before = [harness.page_bytes(pool, p) for p in range(n)]
    keys = harness.keys(3, "edge" + kind + layout)
    assert b.batch_set_v1(keys, harness.indices(pool, [1, 2, 3])) == [True] * 3

    import torch

    ps = pool.page_size
    past = torch.arange(n * ps, (n + 2) * ps)  # pages page_num, page_num + 1
    neg = torch.arange(-ps, 0)
    mixed = torch.cat([harness.indices(pool, [4]), past[:ps]])
    assert b.batch_get_v1(keys[:2], past) == [False, False]
    assert b.batch_get_v1(keys[:1], neg) == [False]
    assert b.batch_get_v1(keys[:2], mixed) == [True, False]
    t = [PoolTransfer(name=PoolName.KV, keys=keys[:2], host_indices=past)]
    assert b.batch_get_v2(t)[PoolName.KV] == [False, False]
    other = harness.keys(2, "edge-set" + kind + layout)
    assert b.batch_set_v1(other, past) == [False, False]
    t = [PoolTransfer(name=PoolName.KV, keys=other, host_indices=past)]
    assert b.batch_set_v2(t)[PoolName.KV] == [False, False]
    # A page whose indices are in the pool but whose first token's page runs
    # past its end (SGLang reads page_size tokens from the first index).
    wraps = torch.tensor([n * ps - 1] + list(range(ps - 1)))
    assert b.batch_set_v1(other[:1], wraps) == [False]
    assert b.batch_exists(other) == 0
    # Nothing but page 4 (a hit read into it) changed.
    for p in range(n):
        if p != 4:
            assert harness.page_bytes(pool, p).equal(before[p]), f"page {p} was overwritten"


# ---------------------------------------------------------------- a refused pool


@pytest.mark.parametrize("refused", ["kv", "draft"])
def test_a_pool_whose_segment_was_refused_reports_no_hits(
    sglang, strata_bin, sock_path, backends, refused
):
    """Its gets fail (the service cannot reach its memory), so a hit that exists
    reports would send SGLang to load pages that never come: it has no L3."""
    from harness import PoolName, PoolTransfer

    s = Serve(strata_bin, sock_path, args=["--max-segments-per-client", "1"]).start()
    try:
        pools = {n: harness.host_pool("mha", "page_first", label=n) for n in ("kv", "draft")}
        names = {"kv": PoolName.KV, "draft": PoolName.DRAFT}
        keys = harness.keys(3, "refused-" + refused)
        idx = harness.indices(pools["kv"], [1, 2, 3])
        # Another engine (one segment each) stores both pools' objects.
        for n in ("kv", "draft"):
            w = backends(s.socket)
            w.register_mem_host_pool_v2(harness.host_pool("mha", "page_first", label=n), names[n])
            assert w.client.wait_connected(10)
            t = [PoolTransfer(name=names[n], keys=keys, host_indices=idx)]
            assert w.batch_set_v2(t)[names[n]] == [True] * 3
        b = backends(s.socket)
        other = "draft" if refused == "kv" else "kv"
        b.register_mem_host_pool_v2(pools[other], names[other])  # takes the one segment
        b.register_mem_host_pool_v2(pools[refused], names[refused])
        assert b.pool_status()[refused].startswith("refused"), b.pool_status()
        t = [PoolTransfer(name=PoolName.DRAFT, keys=keys, host_indices=idx)]
        if refused == "kv":
            assert b.batch_exists(keys) == 0
            assert b.batch_get_v1(keys, idx) == [False] * 3
        r = b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DRAFT)])
        assert r.kv_hit_pages == 0 and not r.extra_pool_hit_pages.get(names[refused])
        assert b.batch_get_v2(t)[PoolName.DRAFT] == ([True] * 3 if refused == "kv" else [False] * 3)
    finally:
        s.stop()


def test_a_replaced_pool_is_freed_after_an_outage_was_logged(sglang, serve, backends, caplog):
    """A pool SGLang replaced at run time must go with its memory: neither
    SGLang's base class (which keeps the pool register_mem_pool_host was
    given) nor a log record of an outage (an exception would keep the frames
    it passed through, the pools of the failed call among them) may keep it."""
    import weakref

    from harness import PoolName

    b = backends(serve.socket, timeout_s=0.3)
    first = harness.host_pool("mha", "page_first")
    b.register_mem_pool_host(first)
    b.register_mem_host_pool_v2(first, PoolName.KV)
    assert b.client.wait_connected(10)
    keys = harness.keys(2, "freed")
    serve.pause()
    try:
        with caplog.at_level(logging.WARNING, logger="strata_sglang"):
            assert b.batch_get_v1(keys, harness.indices(first, [1, 2])) == [False, False]
    finally:
        serve.resume()
    assert warnings_of(caplog), "the outage was not logged"
    gone = weakref.ref(first)
    del first
    second = harness.host_pool("mha", "page_first")
    b.register_mem_host_pool_v2(second, PoolName.KV)
    gc.collect()
    assert gone() is None, "the pool SGLang replaced is still alive, and its memory with it"
    assert wait_for(lambda: b.batch_set_v1(keys, harness.indices(second, [1, 2])) == [True] * 2, 20)
