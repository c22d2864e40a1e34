"""StrataStorage against SGLang's real host pools and a real strata serve."""

import logging
import time

import pytest


import harness

LAYOUTS = harness.LAYOUTS


def test_factory_loads_the_plugin_from_inline_json(sglang, serve, backends):
    from strata_sglang import StrataStorage
    from harness import HiCacheStorage

    b = backends(serve.socket)
    assert isinstance(b, StrataStorage) and isinstance(b, HiCacheStorage)
    assert b.client.wait_connected(10)


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_every_layout_round_trips_with_misses_and_partial_hits(
    sglang, serve, backends, kind, layout
):
    mla = kind == "mla"
    writer, reader = backends(serve.socket, mla=mla), backends(serve.socket, mla=mla)
    src = harness.host_pool(kind, layout)
    dst = harness.host_pool(kind, layout)
    writer.register_mem_pool_host(src)
    reader.register_mem_pool_host(dst)
    assert writer.client.wait_connected(10) and reader.client.wait_connected(10)
    assert writer.pool_status() == {"kv": "enabled"}

    keys = harness.keys(8, tag=kind + layout)
    pages = [1, 2, 3, 4, 5, 6]
    harness.fill(src, pages, seed=7)
    ok = writer.batch_set_v1(keys[:6], harness.indices(src, pages))
    assert ok == [True] * 6 and all(type(x) is bool for x in ok)

    # Another engine (reader) finds them under the same names and format.
    n = reader.batch_exists(keys)
    assert n == 6 and type(n) is int
    into = [10, 11, 12, 13, 14, 15, 16, 17]
    got = reader.batch_get_v1(keys, harness.indices(dst, into))
    assert got == [True] * 6 + [False] * 2
    for p, q in zip(pages, into):
        assert harness.page_bytes(src, p).equal(harness.page_bytes(dst, q)), (p, q)

    # A partial hit: SGLang counts the leading successes.
    mixed = [keys[0], harness.keys(1, "absent")[0], keys[2]]
    got = reader.batch_get_v1(mixed, harness.indices(dst, [20, 21, 22]))
    assert got == [True, False, True]
    assert reader.batch_exists(mixed) == 1

    # Another layout (or geometry) never reads these bytes: a miss.
    other = "page_first" if layout != "page_first" else "layer_first"
    alien = backends(serve.socket, mla=mla)
    alien.register_mem_pool_host(harness.host_pool(kind, other))
    assert alien.client.wait_connected(10)
    assert alien.batch_exists(keys) == 0
    bigger = backends(serve.socket, mla=mla)
    bigger.register_mem_pool_host(harness.host_pool(kind, layout, layers=4))
    assert bigger.client.wait_connected(10)
    assert bigger.batch_exists(keys) == 0

    # The same page hash under another model name is another object.
    model2 = backends(serve.socket, mla=mla, model="org/model-2")
    model2.register_mem_pool_host(harness.host_pool(kind, layout))
    assert model2.client.wait_connected(10)
    assert model2.batch_exists(keys) == 0


def test_a_pool_registered_twice_registers_its_memfd_once(sglang, serve, backends):
    from harness import PoolName

    b = backends(serve.socket)
    pool = harness.host_pool("mha", "page_first")
    b.register_mem_pool_host(pool)
    b.register_mem_host_pool_v2(pool, PoolName.KV)
    b.register_mem_pool_host(pool)
    assert b.client.wait_connected(10)
    assert len(b.client._segments) == 1


def test_copy_path_keys(sglang, serve, backends):
    import torch

    b = backends(serve.socket)
    pool = harness.host_pool("mha", "layer_first")
    b.register_mem_pool_host(pool)
    assert b.client.wait_connected(10)
    harness.fill(pool, [1, 2], seed=3)
    keys = [k + ".draft" for k in harness.keys(3, "copy")]
    pages = [pool.get_data_page(p * pool.page_size) for p in (1, 2)]
    assert b.batch_set(keys[:2], pages) is True
    assert b.exists(keys[0]) is True and b.exists(keys[2]) is False
    targets = [pool.get_dummy_flat_data_page() for _ in keys]
    got = b.batch_get(keys, targets)
    assert got[0] is targets[0] and got[1] is targets[1] and got[2] is None
    assert got[0].view(torch.uint8).equal(pages[0].view(torch.uint8))
    one = pool.get_dummy_flat_data_page()
    assert b.get(keys[1], one) is one and one.equal(pages[1])
    assert b.get(keys[2], pool.get_dummy_flat_data_page()) is None
    assert b.set(keys[2], pages[0]) is True
    assert b.batch_set([], []) is False
    # The zero-copy draft objects ({key}_0_draft_k) are other objects.
    assert b.batch_exists([k.split(".")[0] for k in keys]) == 0


@pytest.mark.parametrize("kind,layout", LAYOUTS)
def test_a_pool_outside_memfds_moves_through_staging_with_one_warning(
    sglang, serve, backends, caplog, kind, layout
):
    """SGLang's default allocator (and pools that ignore the shm one) give the
    service nothing to map: the pages are copied through the plugin's staging
    buffer, into the same objects a zero-copy engine reads and writes."""
    mla = kind == "mla"
    b = backends(serve.socket, mla=mla)
    pool = harness.host_pool(kind, layout, allocator="default")
    with caplog.at_level(logging.WARNING, logger="strata_sglang"):
        b.register_mem_pool_host(pool)
        b.register_mem_pool_host(pool)
    warnings = [r.getMessage() for r in caplog.records if "staging buffer" in r.getMessage()]
    assert len(warnings) == 1, caplog.text
    assert "inline" in warnings[0] and '"allocator":"shm"' in warnings[0]
    assert b.pool_status()["kv"].startswith("enabled (copy path")
    keys = harness.keys(5, "copy" + kind + layout)
    harness.fill(pool, [1, 2, 3], seed=21)
    assert b.batch_set_v1(keys[:3], harness.indices(pool, [1, 2, 3])) == [True] * 3

    # A zero-copy engine reads what the copy path wrote, and the other way round.
    z = backends(serve.socket, mla=mla)
    zpool = harness.host_pool(kind, layout)
    z.register_mem_pool_host(zpool)
    assert z.batch_exists(keys) == 3
    assert z.batch_get_v1(keys[:3], harness.indices(zpool, [4, 5, 6])) == [True] * 3
    for p, q in zip([1, 2, 3], [4, 5, 6]):
        assert harness.page_bytes(pool, p).equal(harness.page_bytes(zpool, q))
    harness.fill(zpool, [7, 8], seed=22)
    assert z.batch_set_v1(keys[3:], harness.indices(zpool, [7, 8])) == [True] * 2
    before = [harness.page_bytes(pool, p) for p in range(pool.page_num)]
    got = b.batch_get_v1(keys[3:] + harness.keys(1, "absent"), harness.indices(pool, [9, 10, 11]))
    assert got == [True, True, False]
    for p, q in zip([9, 10], [7, 8]):
        assert harness.page_bytes(pool, p).equal(harness.page_bytes(zpool, q))
    for p in range(pool.page_num):  # a miss and the pages not asked for are untouched
        if p not in (9, 10):
            assert harness.page_bytes(pool, p).equal(before[p]), p
    assert b.batch_exists(keys) == 5


def test_service_absent_at_start_then_killed_and_restarted(sglang, stopped_serve, backends, caplog):
    sock = stopped_serve.socket
    with caplog.at_level(logging.WARNING, logger="strata_sglang"):
        b = backends(sock, connect_wait_s=0.1)
        pool = harness.host_pool("mha", "page_first")
        b.register_mem_pool_host(pool)
        keys = harness.keys(4, "restart")
        idx = harness.indices(pool, [1, 2, 3, 4])
        harness.fill(pool, [1, 2, 3, 4], seed=11)
        t0 = time.monotonic()
        for _ in range(20):
            assert b.batch_set_v1(keys, idx) == [False] * 4
            assert b.batch_get_v1(keys, idx) == [False] * 4
            assert b.batch_exists(keys) == 0
            assert b.exists(keys[0]) is False and b.set(keys[0], pool.get_data_page(0)) is False
        assert time.monotonic() - t0 < 2, "calls while the service is down must be fast misses"
        down = [r for r in caplog.records if "not reachable" in r.getMessage()]
        assert len(down) == 1, caplog.text

        stopped_serve.start()
        assert b.client.wait_connected(20)
        assert b.batch_set_v1(keys, idx) == [True] * 4
        want = [harness.page_bytes(pool, p) for p in (1, 2, 3, 4)]

        stopped_serve.kill()
        deadline = time.monotonic() + 20
        while b.client.connected and time.monotonic() < deadline:
            time.sleep(0.01)
        assert b.batch_exists(keys) == 0
        assert b.batch_get_v1(keys, harness.indices(pool, [5, 6, 7, 8])) == [False] * 4

        stopped_serve.start()
        assert b.client.wait_connected(20)
        # The restarted service has an empty arena; the plugin re-registered its pool by itself.
        assert b.batch_exists(keys) == 0
        assert b.batch_set_v1(keys, idx) == [True] * 4
        assert b.batch_get_v1(keys, harness.indices(pool, [5, 6, 7, 8])) == [True] * 4
        for w, p in zip(want, (5, 6, 7, 8)):
            assert harness.page_bytes(pool, p).equal(w)
    assert any("again" in r.getMessage() for r in caplog.records)
