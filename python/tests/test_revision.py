"""Protocol revisions: the Hello's negotiation, and strided runs (revision 2)
where the connection has them, ranges where it does not (an older service,
or STRATA_WIRE_REVISION=1).

Against a fake service (fakepeer) that answers a HelloReply with or without a
revision, and against a real strata serve: pages stored by runs and read by
ranges, and the other way round, are the same bytes.
"""

import logging
import os
import shutil
import tempfile
import threading

import pytest

import harness
from fakepeer import FakeService
from strata_client import client as sc
from strata_client import wire
from strata_client.connection import REVISION_ENV, Connection


@pytest.fixture
def path():
    d = tempfile.mkdtemp(prefix="sglr")
    yield os.path.join(d, "fake.sock")
    shutil.rmtree(d, ignore_errors=True)


def _fake(path, revision, hellos=None, batches=None):
    def handler(i, p):
        if p.hello(revision=revision, said=hellos):
            p.serve(batches=batches)

    return FakeService(path, handler)


@pytest.mark.parametrize("answer,want", [(0, 1), (1, 1), (2, 2), (9, 2)])
def test_the_connection_takes_the_lower_revision(path, monkeypatch, answer, want):
    """The Hello offers wire.REVISION; an answer without a revision (an older
    service) is 1, and one above what we offered is held to ours."""
    monkeypatch.delenv(REVISION_ENV, raising=False)
    hellos = []
    f = _fake(path, answer, hellos)
    try:
        c = Connection(path, 5.0, "t")
        try:
            assert c.revision == want and c.hello.revision == answer
            assert hellos[0].revision == wire.REVISION
        finally:
            c.close()
    finally:
        f.close()


@pytest.mark.parametrize("value,offer", [("1", 1), ("2", 2), (" 1 ", 1), ("3", 2), ("x", 2)])
def test_strata_wire_revision_sets_what_the_hello_offers(path, monkeypatch, caplog, value, offer):
    monkeypatch.setenv(REVISION_ENV, value)
    monkeypatch.setattr("strata_client.connection._warned_env", set())
    hellos = []
    f = _fake(path, 2, hellos)
    try:
        with caplog.at_level(logging.WARNING, logger="strata_client"):
            c = Connection(path, 5.0, "t")
        c.close()
    finally:
        f.close()
    assert hellos[0].revision == offer and c.revision == offer
    warned = [r for r in caplog.records if REVISION_ENV in r.getMessage()]
    assert len(warned) == (value.strip() not in ("1", "2"))


def test_the_client_says_its_connections_revision(path, monkeypatch):
    monkeypatch.delenv(REVISION_ENV, raising=False)
    c = sc.Client(path, "t", reconnect_min=0.01, reconnect_max=0.05)
    try:
        assert c.revision == 0  # not connected
        f = _fake(path, 2)
        try:
            assert c.wait_connected(10) and c.revision == 2
        finally:
            f.close()
    finally:
        c.close()


def _one_batch(path, monkeypatch, answer, kind, layout, env=None):
    """The Put and Get the plugin sends a fake service answering revision
    answer, for 3 pages of a kind/layout pool."""
    if env is None:
        monkeypatch.delenv(REVISION_ENV, raising=False)
    else:
        monkeypatch.setenv(REVISION_ENV, env)
    batches = []
    f = _fake(path, answer, batches=batches)
    b = harness.create_backend(path, mla=kind == "mla")
    try:
        pool = harness.host_pool(kind, layout)
        b.register_mem_pool_host(pool)
        assert b.client.wait_connected(10)
        keys = harness.keys(3, tag="rev")
        assert b.batch_set_v1(keys, harness.indices(pool, [1, 2, 5])) == [True] * 3
        assert b.batch_get_v1(keys, harness.indices(pool, [7, 8, 9])) == [True] * 3
        return batches, b.strata_stats(), pool
    finally:
        b.close()
        f.close()


def _expanded(it):
    return [(r.segment, r.offset, r.length) for r in it.ranges] + [
        (x.segment, x.offset, x.length) for r in it.runs for x in r.ranges()
    ]


@pytest.mark.parametrize("kind,layout", [("mla", "layer_first"), ("mha", "layer_first")])
def test_runs_only_on_a_revision_2_connection_naming_the_same_ranges(
    sglang, path, monkeypatch, kind, layout
):
    """An older service (no revision in its HelloReply) gets ranges, as
    before; a revision 2 one gets one run per object part of a layer_first
    pool, which stands for exactly those ranges; STRATA_WIRE_REVISION=1 gets
    ranges from a revision 2 service too."""
    old, old_stats, pool = _one_batch(path, monkeypatch, 0, kind, layout)
    new, new_stats, _ = _one_batch(path, monkeypatch, 2, kind, layout)
    off, off_stats, _ = _one_batch(path, monkeypatch, 2, kind, layout, env="1")
    parts = 1 if kind == "mla" else 2
    assert [len(m.items) for m in old] == [len(m.items) for m in new] == [3 * parts] * 2
    for m in old + off:
        assert all(it.ranges and not it.runs for it in m.items)
    for m in new:
        assert all(len(it.runs) == 1 and not it.ranges for it in m.items)
        assert all(it.runs[0].count == pool.layer_num for it in m.items)
    assert (old_stats["revision"], new_stats["revision"], off_stats["revision"]) == (1, 2, 1)
    assert (old_stats["run_items"], off_stats["run_items"]) == (0, 0)
    assert new_stats["run_items"] == 2 * 3 * parts
    for a, b in zip(old, new):
        assert [(x.key, x.format, _expanded(x)) for x in a.items] == [
            (y.key, y.format, _expanded(y)) for y in b.items
        ]


def test_a_page_first_pool_keeps_its_one_range(sglang, path, monkeypatch):
    new, stats, _ = _one_batch(path, monkeypatch, 2, "mha", "page_first")
    assert stats["run_items"] == 0
    assert all(len(it.ranges) == 1 and not it.runs for m in new for it in m.items)


# ------------------------------------------------------------ a real service


def _backend(backends, serve, monkeypatch, kind, env):
    if env is None:
        monkeypatch.delenv(REVISION_ENV, raising=False)
    else:
        monkeypatch.setenv(REVISION_ENV, env)
    b = backends(serve.socket, mla=kind == "mla")
    pool = harness.host_pool(kind, "layer_first")
    b.register_mem_pool_host(pool)
    assert b.client.wait_connected(10)
    return b, pool


@pytest.mark.parametrize("kind", ["mla", "mha"])
def test_runs_and_ranges_move_the_same_bytes_through_strata_serve(
    sglang, serve, backends, monkeypatch, kind
):
    """A writer by runs, a reader by ranges, and the other way round, against
    one strata serve: the same objects, byte for byte. Against a service that
    answers revision 1, both name ranges, and the pages still round-trip."""
    by_runs, src = _backend(backends, serve, monkeypatch, kind, None)
    by_ranges, dst = _backend(backends, serve, monkeypatch, kind, "1")
    revision = by_runs.client.revision
    assert revision in (1, 2) and by_ranges.client.revision == 1
    pages = [1, 2, 3, 6]
    harness.fill(src, pages, seed=11)
    harness.fill(dst, [20, 21, 22, 23], seed=12)
    keys = harness.keys(4, tag="runs" + kind)
    assert by_runs.batch_set_v1(keys, harness.indices(src, pages)) == [True] * 4
    assert by_ranges.batch_get_v1(keys, harness.indices(dst, [20, 21, 22, 23])) == [True] * 4
    for p, q in zip(pages, [20, 21, 22, 23]):
        assert harness.page_bytes(src, p).equal(harness.page_bytes(dst, q)), (p, q)
    # And back: stored by ranges, read by runs.
    back = harness.keys(4, tag="ranges" + kind)
    harness.fill(dst, [24, 25, 26, 27], seed=13)
    assert by_ranges.batch_set_v1(back, harness.indices(dst, [24, 25, 26, 27])) == [True] * 4
    assert by_runs.batch_get_v1(back, harness.indices(src, [10, 11, 12, 13])) == [True] * 4
    for p, q in zip([24, 25, 26, 27], [10, 11, 12, 13]):
        assert harness.page_bytes(dst, p).equal(harness.page_bytes(src, q)), (p, q)
    parts = 1 if kind == "mla" else 2
    want = 2 * 4 * parts if revision >= 2 else 0
    assert by_runs.strata_stats()["run_items"] == want
    assert by_ranges.strata_stats()["run_items"] == 0
    if revision < 2:
        pytest.skip("this strata serve answers revision 1: the runs half ran as ranges")


def test_the_plugin_serves_on_while_the_service_is_swapped_for_an_older_one(
    sglang, path, monkeypatch
):
    """A reconnect to a service of a lower revision: the next batch is ranges."""
    monkeypatch.delenv(REVISION_ENV, raising=False)
    batches, answer = [], [2]
    lock = threading.Lock()

    def handler(i, p):
        with lock:
            rev = answer[0]
        if p.hello(revision=rev):
            p.serve(batches=batches)

    f = FakeService(path, handler)
    b = harness.create_backend(path, mla=True)
    try:
        pool = harness.host_pool("mla", "layer_first")
        b.register_mem_pool_host(pool)
        assert b.client.wait_connected(10) and b.client.revision == 2
        keys = harness.keys(2, tag="swap")
        assert b.batch_set_v1(keys, harness.indices(pool, [1, 2])) == [True] * 2
        with lock:
            answer[0] = 0
        b.client.snapshot().close()  # the service went; an older one answers next
        for _ in range(200):
            if b.client.wait_connected(0.05) and b.client.revision == 1:
                break
        assert b.client.revision == 1
        assert b.batch_set_v1(keys, harness.indices(pool, [3, 4])) == [True] * 2
        assert batches[0].items[0].runs and not batches[-1].items[0].runs
    finally:
        b.close()
        f.close()
