"""SGLang's real cache controllers, their real backup and prefetch threads, over the plugin."""

import threading

import pytest


import harness
from drive import backup, prefetch, same_pages, stop, tokens

PAGE = harness.PAGE


def controller(sock, host, tp_rank=0, tp_size=1, draft=None, model="org/model-1"):
    c = harness.controller(sock, host, tp_rank, tp_size, draft=draft, model=model)
    assert c.storage_backend.client.wait_connected(10)
    return c


def hybrid(sock, host, draft, tp_rank=0, tp_size=1):
    c = harness.hybrid(sock, harness.group(host, draft=draft), tp_rank, tp_size)
    assert c.storage_backend.client.wait_connected(10)
    return c


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
    from harness import PoolName, PoolTransfer

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

    def make(host):
        return harness.controller(stopped_serve.socket, host, connect_wait_s=0.1)

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
