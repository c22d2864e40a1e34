"""SGLang's real cache controllers, their real backup and prefetch threads, over the plugin."""

import threading
import time

import pytest

from conftest import CI, SGLANG_MISSING

if SGLANG_MISSING:
    if CI:
        pytest.fail(SGLANG_MISSING + " (CI=true: these tests must run)", pytrace=False)
    pytest.skip(SGLANG_MISSING, allow_module_level=True)

import harness  # noqa: E402 - needs SGLang's classes, checked above

PAGE = harness.PAGE


def extra(sock, **kw):
    cfg = harness.storage_config(sock).extra_config
    cfg.update(kw)
    return dict(cfg)


class _Allocator:
    """The token allocator the controller asks for its device pool."""

    def __init__(self, device_pool):
        self.device_pool = device_pool

    def get_kvcache(self):
        return self.device_pool


def controller(sock, host, tp_rank=0, tp_size=1, draft=None, model="org/model-1"):
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.runtime_context import get_parallel

    with get_parallel().override(tp_rank=tp_rank, tp_size=tp_size):
        c = HiCacheController(
            _Allocator(host.device_pool),
            host,
            PAGE,
            tp_group=None,
            load_cache_event=threading.Event(),
            io_backend="direct",
            storage_backend="dynamic",
            model_name=model,
            storage_backend_extra_config=extra(sock),
        )
    if draft is not None:
        c.set_draft_kv_pool(draft.device_pool, draft)
    assert c.storage_backend.client.wait_connected(10)
    return c


def hybrid(sock, host, draft, tp_rank=0, tp_size=1):
    from sglang.srt.mem_cache.hicache_storage import PoolName
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController
    from sglang.srt.mem_cache.memory_pool_host import HostPoolGroup, PoolEntry
    from sglang.srt.runtime_context import get_parallel

    group = HostPoolGroup(
        [
            PoolEntry(
                PoolName.KV, host, host.device_pool, lambda i: i, is_primary_index_anchor=True
            ),
            PoolEntry(PoolName.DRAFT, draft, draft.device_pool, lambda i: i),
        ]
    )
    with get_parallel().override(tp_rank=tp_rank, tp_size=tp_size):
        c = HybridCacheController(
            _Allocator(host.device_pool),
            group,
            PAGE,
            tp_group=None,
            load_cache_event=threading.Event(),
            io_backend="direct",
            storage_backend="dynamic",
            model_name="org/model-1",
            storage_backend_extra_config=extra(sock),
        )
    assert c.storage_backend.client.wait_connected(10)
    return c


def stop(c):
    c.detach_storage_backend()


def tokens(n_pages, seed):
    return [(seed * 7919 + i) % 32000 for i in range(n_pages * PAGE)]


def backup(c, host, toks, extra_pools=None, seed=None, draft=None):
    """Fill fresh host pages (seed), back them up as toks' pages; return what was written."""
    n = len(toks) // PAGE
    idx = host.alloc(n * PAGE)
    pages = [int(idx[i * PAGE]) // PAGE for i in range(n)]
    if seed is not None:
        harness.fill(host, pages, seed=seed)
        if draft is not None:
            harness.fill(draft, pages, seed=seed + 1)
    hashes = c.get_hash_str(toks, None, page_size=PAGE)
    kw = {} if extra_pools is None else {"extra_pools": extra_pools}
    c.write_storage(idx, toks, hash_value=hashes, **kw)
    op = c.ack_backup_queue.get(timeout=30)
    return idx, pages, hashes, op


def prefetch(c, host, toks, extra_pools=None):
    """Run SGLang's prefetch: hit query on its thread, then the I/O thread loads."""
    kw = {} if extra_pools is None else {"extra_pools": extra_pools}
    op = c.prefetch("req", toks, None, **kw)
    op = c.prefetch_hit_queue.get(timeout=30)
    if op.storage_hit_count == 0:
        return op, None
    op.host_indices = host.alloc(op.storage_hit_count)
    c.prefetch_buffer.put(op)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        done = op.completed_tokens == op.storage_hit_count or op.is_terminated()
        if done and getattr(op, "pool_transfers_done", True):
            break
        time.sleep(0.005)
    return op, op.host_indices


def same_pages(a, a_idx, b, b_idx):
    for i in range(0, len(a_idx), PAGE):
        pa, pb = int(a_idx[i]) // PAGE, int(b_idx[i]) // PAGE
        if not harness.page_bytes(a, pa).equal(harness.page_bytes(b, pb)):
            return False
    return True


@pytest.mark.parametrize("layout", ["layer_first", "page_first_direct"])
def test_backup_and_prefetch_threads(sglang, serve, layout):
    src, dst = harness.host_pool("mha", layout), harness.host_pool("mha", layout)
    draft_src = harness.host_pool("mha", layout, label="draft", layers=1)
    draft_dst = harness.host_pool("mha", layout, label="draft", layers=1)
    a = controller(serve.socket, src, draft=draft_src)
    b = controller(serve.socket, dst, draft=draft_dst)
    try:
        toks = tokens(6, seed=1)
        n = len(toks) // PAGE
        idx2, _, hashes, op = backup(a, src, toks, seed=5, draft=draft_src)
        assert op.completed_tokens == len(toks)
        assert a.storage_backend.batch_exists(hashes) == n

        # Another engine prefetches the prefix: batch_exists, then batch_get_v1.
        more = toks + tokens(2, seed=99)  # two pages L3 does not have
        op, got = prefetch(b, dst, more)
        assert op.storage_hit_count == len(toks) and op.completed_tokens == len(toks)
        assert same_pages(src, idx2, dst, got)
        # The draft pages went through SGLang's copy path ("{hash}.draft" keys).
        assert same_pages(draft_src, idx2, draft_dst, got)
    finally:
        stop(a)
        stop(b)


def test_hybrid_controller_draft_sidecar_through_v2(sglang, serve):
    from sglang.srt.mem_cache.hicache_storage import PoolName, PoolTransfer

    src, dst = harness.host_pool("mha", "page_first"), harness.host_pool("mha", "page_first")
    dsrc = harness.host_pool("mha", "page_first", label="draft", layers=1)
    ddst = harness.host_pool("mha", "page_first", label="draft", layers=1)
    a, b = hybrid(serve.socket, src, dsrc), hybrid(serve.socket, dst, ddst)
    try:
        assert set(a.storage_backend.pool_status()) == {"kv", "draft"}
        toks = tokens(5, seed=3)
        n = len(toks) // PAGE
        sidecar = [PoolTransfer(name=PoolName.DRAFT, indices_from_pool=PoolName.KV)]
        idx2, _, hashes, op = backup(a, src, toks, extra_pools=sidecar, seed=8, draft=dsrc)
        assert op.completed_tokens == len(toks)
        assert op.pool_storage_result.extra_pool_hit_pages[PoolName.DRAFT] == n

        # The draft pool's hit clamps the KV hit.
        r = b.storage_backend.batch_exists_v2(hashes, [PoolTransfer(name=PoolName.DRAFT)])
        assert r.kv_hit_pages == n and r.extra_pool_hit_pages[PoolName.DRAFT] == n
        longer = hashes + harness.keys(2, "x")
        r = b.storage_backend.batch_exists_v2(longer, [PoolTransfer(name=PoolName.DRAFT)])
        assert r.kv_hit_pages == n
        kv_only = harness.keys(3, "kvonly")
        b.storage_backend.batch_set_v1(kv_only, harness.indices(src, [30, 31, 32]))
        r = b.storage_backend.batch_exists_v2(kv_only, [PoolTransfer(name=PoolName.DRAFT)])
        assert r.kv_hit_pages == 0

        sidecar = [PoolTransfer(name=PoolName.DRAFT, indices_from_pool=PoolName.KV)]
        op, got = prefetch(b, dst, toks, extra_pools=sidecar)
        assert op.completed_tokens == len(toks)
        assert op.pool_storage_result.extra_pool_hit_pages[PoolName.DRAFT] == n
        assert same_pages(src, idx2, dst, got)
        assert same_pages(dsrc, idx2, ddst, got)
    finally:
        stop(a)
        stop(b)


@pytest.mark.parametrize("kind", ["mha", "mla"])
def test_tp2(sglang, serve, kind):
    """MHA ranks keep their own objects; MLA rank 1 writes nothing and reads rank 0's."""
    hosts = [harness.host_pool(kind, "page_first") for _ in range(4)]
    c0 = controller(serve.socket, hosts[0], tp_rank=0, tp_size=2)
    c1 = controller(serve.socket, hosts[1], tp_rank=1, tp_size=2)
    try:
        assert c1.storage_backend.tp_rank == 1
        toks = tokens(3, seed=21)
        n = len(toks) // PAGE
        # Rank 1 first: under MLA it writes nothing.
        idx1, _, hashes, _ = backup(c1, hosts[1], toks, seed=31)
        if kind == "mla":
            assert c0.storage_backend.batch_exists(hashes) == 0
        else:
            assert c1.storage_backend.batch_exists(hashes) == n
            assert c0.storage_backend.batch_exists(hashes) == 0  # rank 0's objects are its own
        idx0, _, _, _ = backup(c0, hosts[0], toks, seed=30)
        # Each rank prefetches into a fresh pool of its own.
        r0 = controller(serve.socket, hosts[2], tp_rank=0, tp_size=2)
        r1 = controller(serve.socket, hosts[3], tp_rank=1, tp_size=2)
        try:
            op0, got0 = prefetch(r0, hosts[2], toks)
            op1, got1 = prefetch(r1, hosts[3], toks)
            assert op0.completed_tokens == op1.completed_tokens == len(toks)
            assert same_pages(hosts[0], idx0, hosts[2], got0)
            if kind == "mla":
                assert same_pages(hosts[0], idx0, hosts[3], got1)
            else:
                assert same_pages(hosts[1], idx1, hosts[3], got1)
                assert not same_pages(hosts[0], idx0, hosts[3], got1)
        finally:
            stop(r0)
            stop(r1)
    finally:
        stop(c0)
        stop(c1)


def test_controller_threads_survive_a_restart(sglang, stopped_serve):
    """Absent at start, killed and restarted mid-run: no exception reaches SGLang's threads."""
    errors = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: errors.append(args)
    src = harness.host_pool("mha", "page_first")
    dst = harness.host_pool("mha", "page_first")
    from sglang.srt.managers.cache_controller import HiCacheController

    def make(host):
        return HiCacheController(
            _Allocator(host.device_pool),
            host,
            PAGE,
            tp_group=None,
            load_cache_event=threading.Event(),
            io_backend="direct",
            storage_backend="dynamic",
            model_name="org/model-1",
            storage_backend_extra_config=extra(stopped_serve.socket, connect_wait_s=0.1),
        )

    a, b = make(src), make(dst)
    try:
        toks = tokens(4, seed=41)
        _, _, hashes, op = backup(a, src, toks)
        assert op.completed_tokens == 0  # L3 down: the backup fails, quietly
        op, _ = prefetch(b, dst, toks)
        assert op.storage_hit_count == 0

        stopped_serve.start()
        assert a.storage_backend.client.wait_connected(20)
        assert b.storage_backend.client.wait_connected(20)
        idx1, _, _, op = backup(a, src, toks, seed=42)
        assert op.completed_tokens == len(toks)

        stopped_serve.kill()
        op, _ = prefetch(b, dst, toks)
        assert op.storage_hit_count == 0  # down: a miss, not an exception

        stopped_serve.start()
        assert b.storage_backend.client.wait_connected(20)
        assert a.storage_backend.client.wait_connected(20)
        idx2, _, _, op = backup(a, src, toks, seed=43)  # the restarted service lost its arena
        assert op.completed_tokens == len(toks)
        op, got = prefetch(b, dst, toks)
        assert op.completed_tokens == len(toks)
        assert same_pages(src, idx2, dst, got)
        assert a.backup_thread.is_alive() and b.prefetch_thread.is_alive()
        assert b.prefetch_io_aux_thread.is_alive()
    finally:
        stop(a)
        stop(b)
        threading.excepthook = old_hook
    assert errors == []
