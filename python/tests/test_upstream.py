"""SGLang as it is now, not only at the pinned commit.

Every model goes through the unified radix cache: the backend gets a
HostPoolGroup and v2 calls, upstream passes extra_info to them, and some host
pools ignore the shm allocator (Mamba states, the DSA indexer pool, the legacy
draft pool): each is served, by the copy path when the service cannot map it,
with one warning. get_stats() is what the scheduler logs; close() and clear()
work whenever they are called.
"""

import logging
import threading
import time

import pytest

import harness
from drive import backup, prefetch, same_pages, stop, tokens
from fakepeer import wait_for

PAGE = harness.PAGE


def warnings_of(caplog, text):
    return [
        r.getMessage()
        for r in caplog.records
        if r.name == "strata_sglang" and r.levelno >= logging.WARNING and text in r.getMessage()
    ]


def hybrid(sock, kv, **sidecars):
    c = harness.hybrid(sock, harness.group(kv, **sidecars))
    assert c.storage_backend.client.wait_connected(10)
    return c


def test_the_seeds_fd_less_draft_pool_beside_a_shm_kv_pool_gets_l3(sglang, serve, caplog):
    """SGLang issue 28873's deployment: the target KV pool in shm, the EAGLE
    draft pool in SGLang's default allocator. The draft pages go through the
    staging buffer; an EAGLE request's hit counts both pools' pages."""
    src, dst = harness.host_pool("mha", "page_first"), harness.host_pool("mha", "page_first")
    dsrc = harness.host_pool("mha", "page_first", allocator="default", label="draft", layers=1)
    ddst = harness.host_pool("mha", "page_first", allocator="default", label="draft", layers=1)
    with caplog.at_level(logging.WARNING, logger="strata_sglang"):
        a, b = hybrid(serve.socket, src, draft=dsrc), hybrid(serve.socket, dst, draft=ddst)
    try:
        for c in (a, b):
            st = c.storage_backend.pool_status()
            assert st["kv"] == "enabled" and st["draft"].startswith("enabled (copy path"), st
        # One warning per engine, naming the fix.
        copy = warnings_of(caplog, "staging buffer")
        assert len(copy) == 2 and all("'draft'" in m and "inline" in m for m in copy), copy
        sidecar = [
            harness.PoolTransfer(name=harness.PoolName.DRAFT, indices_from_pool=harness.PoolName.KV)
        ]
        toks = tokens(6, seed=5)
        n = len(toks) // PAGE
        idx, _, hashes, op = backup(a, src, toks, extra_pools=sidecar, seed=3, draft=dsrc)
        assert op.completed_tokens == len(toks)
        assert op.pool_storage_result.extra_pool_hit_pages[harness.PoolName.DRAFT] == n
        r = b.storage_backend.batch_exists_v2(
            hashes, [harness.PoolTransfer(name=harness.PoolName.DRAFT)]
        )
        assert r.kv_hit_pages == n and r.extra_pool_hit_pages[harness.PoolName.DRAFT] == n
        sidecar = [
            harness.PoolTransfer(name=harness.PoolName.DRAFT, indices_from_pool=harness.PoolName.KV)
        ]
        op, got = prefetch(b, dst, toks + tokens(2, seed=77), extra_pools=sidecar)
        assert op.completed_tokens == len(toks)
        assert op.pool_storage_result.extra_pool_hit_pages[harness.PoolName.DRAFT] == n
        assert same_pages(src, idx, dst, got) and same_pages(dsrc, idx, ddst, got)
        assert a.backup_thread.is_alive() and b.prefetch_io_aux_thread.is_alive()
    finally:
        stop(a)
        stop(b)


def test_a_prefix_far_longer_than_a_batch_is_one_hit_query(sglang, serve):
    """The hybrid controller asks batch_exists_v2 about the whole prefix at
    once; the plugin cuts it into requests the protocol allows."""
    geo = dict(size=2048)  # 4096 host slots: 1024 pages of 4
    src, dst = harness.host_pool("mha", "page_first", **geo), harness.host_pool(
        "mha", "page_first", **geo
    )
    dsrc = harness.host_pool("mha", "page_first", label="draft", layers=1, **geo)
    ddst = harness.host_pool("mha", "page_first", label="draft", layers=1, **geo)
    a, b = hybrid(serve.socket, src, draft=dsrc), hybrid(serve.socket, dst, draft=ddst)
    try:
        pages = 700  # > 128-page batches, and > the 4096-item request limit in names (2 per page)
        toks = tokens(pages, seed=9)
        sidecar = [
            harness.PoolTransfer(name=harness.PoolName.DRAFT, indices_from_pool=harness.PoolName.KV)
        ]
        idx, _, hashes, op = backup(a, src, toks, extra_pools=sidecar, seed=4, draft=dsrc)
        assert op.completed_tokens == len(toks)
        longer = hashes + harness.keys(300, "past")
        draft = [harness.PoolTransfer(name=harness.PoolName.DRAFT)]
        r = b.storage_backend.batch_exists_v2(longer, draft)
        assert r.kv_hit_pages == pages and r.extra_pool_hit_pages[harness.PoolName.DRAFT] == pages
        assert b.storage_backend.batch_exists(longer) == pages
        sidecar = [
            harness.PoolTransfer(name=harness.PoolName.DRAFT, indices_from_pool=harness.PoolName.KV)
        ]
        op, got = prefetch(b, dst, toks, extra_pools=sidecar)
        assert op.completed_tokens == len(toks)
        assert same_pages(src, idx, dst, got) and same_pages(dsrc, idx, ddst, got)
    finally:
        stop(a)
        stop(b)


def test_a_state_pool_that_ignores_the_shm_allocator_is_served(sglang, serve, backends, caplog):
    """A Mamba-like pool: one slot a page, several state buffers a slot, in
    anonymous memory whatever the allocator. Its pages are stored per TP rank
    (Mamba state is sharded even beside replicated MLA KV), through staging,
    and its trailing-page hit clamps the KV hit."""
    if not harness.HAS_STATE_POOLS:
        pytest.skip(
            f"{harness.NAME} side: SGLang's Mamba pool needs device classes the CPU stubs lack"
        )
    P = harness.PoolName
    mk = lambda: (harness.host_pool("mla", "page_first"), harness.state_pool())  # noqa: E731
    (kva, sa), (kvb, sb) = mk(), mk()
    with caplog.at_level(logging.WARNING, logger="strata_sglang"):
        w = backends(serve.socket, mla=True, tp_rank=1, tp_size=2)
        w.register_mem_host_pool_v2(kva, P.KV)
        w.register_mem_host_pool_v2(sa, P.MAMBA)
    assert len(warnings_of(caplog, "staging buffer")) == 1, caplog.text
    assert w.pool_status()["mamba"].startswith("enabled (copy path")
    keys = harness.keys(4, "mamba")
    kv_idx = harness.indices(kva, [1, 2, 3, 4])
    harness.fill(kva, [1, 2, 3, 4], seed=1)
    harness.fill(sa, [5], seed=2)
    # TP rank 1 of an MLA model: the KV pages are rank 0's to write, the state is its own.
    state = harness.PoolTransfer(
        name=P.MAMBA, keys=keys[-1:], host_indices=harness.indices(sa, [5]),
        hit_policy=harness.PoolHitPolicy.TRAILING_PAGES,
    )  # fmt: skip
    got = w.batch_set_v2([harness.PoolTransfer(name=P.KV, keys=keys, host_indices=kv_idx), state])
    assert got[P.KV] == [False] * 4 and got[P.MAMBA] == [True]
    r0 = backends(serve.socket, mla=True, tp_rank=0, tp_size=2)
    r0.register_mem_host_pool_v2(kvb, P.KV)
    r0.register_mem_host_pool_v2(sb, P.MAMBA)
    assert r0.batch_set_v1(keys, harness.indices(kvb, [1, 2, 3, 4])) == [True] * 4
    trailing = [
        harness.PoolTransfer(
            name=P.MAMBA, keys=keys[-1:], hit_policy=harness.PoolHitPolicy.TRAILING_PAGES
        )
    ]
    assert r0.batch_exists_v2(keys, trailing).kv_hit_pages == 0  # rank 0's state was never written
    r1 = backends(serve.socket, mla=True, tp_rank=1, tp_size=2)
    kvc, sc = mk()
    r1.register_mem_host_pool_v2(kvc, P.KV)
    r1.register_mem_host_pool_v2(sc, P.MAMBA)
    res = r1.batch_exists_v2(keys, trailing)
    assert res.kv_hit_pages == 4 and res.extra_pool_hit_pages[P.MAMBA] == 4
    # A prefix one page shorter has no state at its end: no hit.
    assert r1.batch_exists_v2(keys[:3], trailing).kv_hit_pages == 0
    into = harness.PoolTransfer(name=P.MAMBA, keys=keys[-1:], host_indices=harness.indices(sc, [9]))
    assert r1.batch_get_v2([into])[P.MAMBA] == [True]
    assert harness.page_bytes(sc, 9).equal(harness.page_bytes(sa, 5))


def test_get_stats_is_what_the_scheduler_logs_while_the_threads_run(sglang, serve):
    """The scheduler calls get_stats() at the end of each step, concurrently
    with the prefetch, prefetch-I/O and backup threads: it gets SGLang's
    StorageMetrics (or None where SGLang has none) with each call's pages."""
    src, dst = harness.host_pool("mha", "page_first"), harness.host_pool("mha", "page_first")
    dsrc = harness.host_pool("mha", "page_first", label="draft", layers=1)
    ddst = harness.host_pool("mha", "page_first", label="draft", layers=1)
    a, b = hybrid(serve.socket, src, draft=dsrc), hybrid(serve.socket, dst, draft=ddst)
    errors, done = [], threading.Event()

    def probe():
        try:
            while not done.is_set():
                for c in (a, b):
                    harness.scheduler_tick(c)
                time.sleep(0.001)
        except BaseException as e:  # noqa: BLE001 - reported below
            errors.append(repr(e))

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    try:
        sidecar = lambda: [
            harness.PoolTransfer(name=harness.PoolName.DRAFT, indices_from_pool=harness.PoolName.KV)
        ]  # noqa: E731
        for i in range(6):
            toks = tokens(3, seed=100 + i)
            idx, _, _, op = backup(a, src, toks, extra_pools=sidecar(), seed=i, draft=dsrc)
            assert op.completed_tokens == len(toks)
            op, got = prefetch(b, dst, toks, extra_pools=sidecar())
            assert op.completed_tokens == len(toks) and same_pages(src, idx, dst, got)
            dst.free(got)
            src.free(idx)
    finally:
        done.set()
        t.join(10)
        stop(a)
        stop(b)
    assert not t.is_alive() and not errors, errors
    m = b.storage_backend.get_stats() if b.storage_backend else None
    assert m is None or not m.prefetch_pgs  # the probe took every interval
    if harness.NAME == "model":
        seen = a.metrics_seen + b.metrics_seen
        assert seen and all(type(x).__name__ == "StorageMetrics" for x in seen)


def test_get_stats_counts_each_calls_pages(sglang, serve, backends):
    b = backends(serve.socket)
    pool = harness.host_pool("mha", "page_first")
    b.register_mem_pool_host(pool)
    keys = harness.keys(3, "stats")
    assert b.batch_set_v1(keys, harness.indices(pool, [1, 2, 3])) == [True] * 3
    assert b.batch_get_v1(keys + harness.keys(1, "x"), harness.indices(pool, [4, 5, 6, 7])) == [
        True, True, True, False,
    ]  # fmt: skip
    m = b.get_stats()
    if harness.NAME == "real" and m is None:
        pytest.skip("this copy of SGLang has no StorageMetrics module: get_stats() is None")
    assert m.backup_pgs == [3] and m.prefetch_pgs == [3]
    assert len(m.backup_bandwidth) == 1 and m.backup_bandwidth[0] > 0
    assert b.get_stats().prefetch_pgs == []  # since the last call
    t = b.strata_stats()
    assert t["set_ok"] == 3 and t["get_hits"] == 3 and t["get_pages"] == 4


def test_close_and_clear_work_at_any_time(sglang, serve, backends, caplog):
    """Before any pool, twice, during a stall, and with calls after it: never
    an exception, calls after close are fast failures."""
    fresh = backends(serve.socket)
    fresh.close()
    fresh.close()
    b = backends(serve.socket, timeout_s=0.3)
    pool = harness.host_pool("mha", "page_first", allocator="default")  # the staging buffer too
    b.register_mem_pool_host(pool)
    keys = harness.keys(2, "close")
    idx = harness.indices(pool, [1, 2])
    assert b.batch_set_v1(keys, idx) == [True, True]
    with caplog.at_level(logging.WARNING, logger="strata_sglang"):
        assert b.clear() is False and b.clear() is False
    assert len(warnings_of(caplog, "clear()")) == 1
    assert b.batch_exists(keys) == 2  # clear() keeps what every engine shares
    serve.pause()
    try:
        closer = threading.Thread(target=b.close, daemon=True)
        caller = threading.Thread(target=lambda: b.batch_get_v1(keys, idx), daemon=True)
        caller.start()
        closer.start()
        closer.join(5)
        caller.join(5)
        assert not closer.is_alive(), "close() blocked on a stalled service"
        assert not caller.is_alive(), "a call did not end after close()"
    finally:
        serve.resume()
    t0 = time.monotonic()
    assert b.batch_get_v1(keys, idx) == [False, False]
    assert b.batch_set_v1(keys, idx) == [False, False]
    assert b.batch_exists(keys) == 0 and b.exists(keys[0]) is False
    assert b.get_stats() is None or b.get_stats().prefetch_pgs is not None
    assert b.clear() is False
    b.close()
    assert time.monotonic() - t0 < 2


@pytest.mark.parametrize(
    "a,b,share",
    [
        ({"kv_cache_dtype": "fp8_e4m3"}, {"kv_cache_dtype": "fp8_e5m2"}, False),
        ({"dev": "float8_e4m3fn"}, {"dev": "float8_e5m2"}, False),
        ({"kv_cache_dtype": "bf16"}, {"kv_cache_dtype": "fp8_e4m3"}, False),
        ({"dp_rank": 0, "dp_size": 2}, {"dp_rank": 1, "dp_size": 2}, False),
        ({"dp_rank": 0, "dp_size": 2}, {"dp_rank": 1, "dp_size": 2}, True),
    ],
    ids=["fp8-kinds-by-config", "fp8-kinds-by-pool", "bf16-vs-fp8", "dp-replicas", "dp-shared"],
)
def test_what_the_page_hash_omits_is_in_the_namespace(sglang, serve, backends, a, b, share):
    """SGLang's page hash omits the KV dtype and the DP rank: two deployments
    of one model that differ in either never read each other's pages (fp8
    kinds are both stored as bytes, in pools of one geometry), and one that
    restarts finds its own. DP replicas share when told to."""
    import torch

    def engine(cfg):
        cfg = dict(cfg)
        dev = cfg.pop("dev", None)
        fp8 = dev or "fp8" in str(cfg.get("kv_cache_dtype"))
        geo = dict(store_dtype=torch.uint8, dtype=dev or torch.uint8) if fp8 else {}
        if share:
            cfg["share_across_dp"] = True
        e = backends(serve.socket, **cfg)
        pool = harness.host_pool("mha", "page_first", **geo)
        e.register_mem_pool_host(pool)
        return e, pool

    keys = harness.keys(3, "ns")
    ea, pa = engine(a)
    eb, pb = engine(b)
    harness.fill(pa, [1, 2, 3], seed=1)
    harness.fill(pb, [1, 2, 3], seed=2)
    assert ea.batch_set_v1(keys, harness.indices(pa, [1, 2, 3])) == [True] * 3
    if share:
        assert eb.batch_exists(keys) == 3
        return
    assert eb.batch_exists(keys) == 0
    assert eb.batch_get_v1(keys, harness.indices(pb, [4, 5, 6])) == [False] * 3
    # Each stores its own under the same page keys.
    assert eb.batch_set_v1(keys, harness.indices(pb, [1, 2, 3])) == [True] * 3
    for cfg, pool in ((a, pa), (b, pb)):
        again, fresh = engine(cfg)  # the same deployment, restarted
        assert again.batch_exists(keys) == 3
        assert again.batch_get_v1(keys, harness.indices(fresh, [7, 8, 9])) == [True] * 3
        for p, q in zip([1, 2, 3], [7, 8, 9]):
            assert harness.page_bytes(pool, p).equal(harness.page_bytes(fresh, q))


def test_v2_calls_take_extra_info_as_upstream_passes_it(sglang, serve, backends):
    P = harness.PoolName
    b = backends(serve.socket)
    kv, draft = harness.host_pool("mha", "page_first"), harness.host_pool(
        "mha", "page_first", layers=1
    )
    b.register_mem_pool_host(harness.group(kv, draft=draft))
    keys = harness.keys(2, "info")
    idx = harness.indices(kv, [1, 2])
    info = harness.HiCacheStorageExtraInfo(prefix_keys=harness.keys(3, "before"))
    t = [harness.PoolTransfer(name=n, keys=keys, host_indices=idx) for n in (P.KV, P.DRAFT)]
    assert b.batch_set_v2(t, info) == {P.KV: [True] * 2, P.DRAFT: [True] * 2}
    assert b.batch_set_v2(t, extra_info=info)[P.DRAFT] == [True] * 2
    assert b.batch_get_v2(t, info) == {P.KV: [True] * 2, P.DRAFT: [True] * 2}
    assert b.batch_exists_v2(keys, [harness.PoolTransfer(name=P.DRAFT)], info).kv_hit_pages == 2
    assert wait_for(lambda: b.batch_get_v2(t, extra_info=info)[P.KV] == [True, True], 5)
