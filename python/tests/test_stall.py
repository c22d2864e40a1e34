"""A call that gave up never touches SGLang's memory afterwards (issue 24, finding 1).

SGLang reuses the pages of a get or put that returned False at once: it hands a
get's pages to another request, writes another prefix's KV into a put's. Here
the service is stopped (SIGSTOP) before or while the call is sent, the call
times out, the test reuses the pages as SGLang would, the service resumes and
handles the request (its Stats counters say so), and every byte is checked:
the reused pages keep what was written after the call returned, and the key of
a put that timed out is a miss, never the reused page's bytes. SGLang's real
host pools and a real strata serve.
"""

import json
import random
import threading
import time

import pytest


import harness
from fakepeer import wait_for
from strata_client import client as sc
from strata_client import wire

# How far past its deadline a call may end on a loaded two-core machine.
SLACK = 1.5
TIMEOUT = 0.5

# What the service counts once it has decided an item: copied (or not) and
# answered. A get item: a hit, a miss, refused for its deadline or a range; a
# put item: stored, already there, refused.
GET_DONE = ("arenaHits", "spillHits", "misses", "pastDeadline", "badRanges", "busy")
PUT_DONE = ("putObjects", "putSkipped", "pastDeadline", "noSpace", "busy", "badRanges")


def service_ops(sock) -> dict:
    """The service's operation counters, asked on a connection of the test's own."""
    c = sc.Connection(sock, 10.0, "test-stats")
    try:
        return json.loads(c.call(wire.Stats(), 10.0).json)["ops"]
    finally:
        c.close()


def decided(before: dict, sock, fields, items: int) -> bool:
    now = service_ops(sock)
    return sum(now[f] - before[f] for f in fields) >= items


class Pools:
    """The KV pool, and for v2 a DRAFT pool beside it, registered with b; for
    "v2-copy" the DRAFT pool is in SGLang's default allocator (the copy path)."""

    def __init__(self, b, v2, big: bool = False):
        from harness import PoolName

        geo = dict(size=512, layers=16, heads=4, dim=128) if big else {}
        self.kv = harness.host_pool("mha", "page_first", **geo)
        self.draft = None
        if v2:
            dgeo = dict(geo, layers=1) if big else dict(layers=1)
            alloc = "default" if v2 == "v2-copy" else "shm"
            self.draft = harness.host_pool(
                "mha", "page_first", allocator=alloc, label="draft", **dgeo
            )
            b.register_mem_host_pool_v2(self.kv, PoolName.KV)
            b.register_mem_host_pool_v2(self.draft, PoolName.DRAFT)
        else:
            b.register_mem_pool_host(self.kv)
        self.b = b
        self.v2 = v2
        assert b.client.wait_connected(10)

    @property
    def all(self):
        return [self.kv] + ([self.draft] if self.draft is not None else [])

    def items(self, n_pages: int) -> int:
        """The items the service decides, at least, once it handled the call: a
        K and a V object per page and pool. The copy path's pool goes in a
        request of its own after the KV pool's, never sent when that one timed
        out: only the KV pool's items are sure to reach the service (and the
        staged pool's pages are written only from a reply that came in time)."""
        pools = 1 if self.v2 == "v2-copy" else len(self.all)
        return 2 * n_pages * pools

    def fill(self, pages, seed):
        for i, p in enumerate(self.all):
            harness.fill(p, pages, seed=seed + 1000 * i)

    def snapshot(self, pages):
        return [[harness.page_bytes(p, x) for x in pages] for p in self.all]

    def transfer(self, op: str, keys, pages):
        """batch_{op}_v1 or _v2 of keys into/from pages: per pool, one bool per page."""
        from harness import PoolName, PoolTransfer

        idx = harness.indices(self.kv, pages)
        if not self.v2:
            f = self.b.batch_get_v1 if op == "get" else self.b.batch_set_v1
            return [f(keys, idx)]
        ts = [
            PoolTransfer(name=PoolName.KV, keys=keys, host_indices=idx),
            PoolTransfer(name=PoolName.DRAFT, keys=keys, host_indices=idx),
        ]
        f = self.b.batch_get_v2 if op == "get" else self.b.batch_set_v2
        r = f(ts)
        return [r[PoolName.KV], r[PoolName.DRAFT]]

    def reuse(self, pages, res, seed):
        """Write other bytes into the pages whose transfer failed, pool by pool,
        as SGLang does when it hands them to another request."""
        for i, (p, ok) in enumerate(zip(self.all, res)):
            harness.fill(p, [x for x, good in zip(pages, ok) if not good], seed=seed + 1000 * i)

    def exists(self, keys) -> int:
        from harness import PoolName, PoolTransfer

        if not self.v2:
            return self.b.batch_exists(keys)
        return self.b.batch_exists_v2(keys, [PoolTransfer(name=PoolName.DRAFT)]).kv_hit_pages


def same(a, b) -> bool:
    return all(x.equal(y) for pa, pb in zip(a, b) for x, y in zip(pa, pb))


def _stalled_call(serve, pools, op, keys, pages, when, rnd):
    """Run pools.transfer(op) with the service stopped before it is sent, or at a
    random moment while it runs; return (result, seconds it took, whether the
    call returned while the service was stopped). The service is left stopped
    when the call returned first (the caller reuses the pages, then resumes)."""
    out = {}

    def run():
        t0 = time.monotonic()
        out["res"] = pools.transfer(op, keys, pages)
        out["took"] = time.monotonic() - t0

    if when == "before":
        serve.pause()
        run()
        return out["res"], out["took"], True
    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    time.sleep(rnd.uniform(0, 0.008))
    serve.pause()
    worker.join(TIMEOUT + SLACK)
    if worker.is_alive():
        # Past its deadline and still here: the service stopped in the middle
        # of a copy into the call's pages, and the call waits for it to end.
        serve.resume()
        worker.join(20)
        assert not worker.is_alive(), "a call did not return 20 s after the service resumed"
        return out["res"], out["took"], False
    return out["res"], out["took"], True


@pytest.mark.parametrize("v2", [False, True, "v2-copy"], ids=["v1", "v2", "v2-copy"])
@pytest.mark.parametrize("when", ["before", "during"])
def test_a_get_that_timed_out_never_writes_the_reused_pages(sglang, serve, backends, v2, when):
    rnd = random.Random(f"get-{v2}-{when}")
    b = backends(serve.socket, timeout_s=TIMEOUT)
    big = when == "during"  # copies long enough to be stopped in
    pools = Pools(b, v2, big=big)
    n = 48 if big else 3
    rounds = 4 if when == "during" else 1
    for r in range(rounds):
        keys = harness.keys(n, f"stall-get-{v2}-{when}-{r}")
        src, dst = list(range(1, n + 1)), list(range(n + 1, 2 * n + 1))
        pools.fill(src, seed=10 + r)
        assert wait_for(
            lambda: pools.transfer("set", keys, src) == [[True] * n] * len(pools.all), 10
        )
        pools.fill(dst, seed=20 + r)
        before = service_ops(serve.socket)
        try:
            res, took, early = _stalled_call(serve, pools, "get", keys, dst, when, rnd)
            # SGLang hands the pages of a failed load to another request.
            pools.reuse(dst, res, seed=30 + r)
            want = pools.snapshot(dst)
        finally:
            serve.resume()
        if when == "before":
            assert res == [[False] * n] * len(pools.all)
            assert took < TIMEOUT + SLACK, f"a get with the service stopped took {took:.1f} s"
        assert wait_for(
            lambda: decided(before, serve.socket, GET_DONE, pools.items(n)), 20
        ), f"the service did not handle the get in 20 s: {service_ops(serve.socket)}"
        got = pools.snapshot(dst)
        assert same(got, want), (
            f"round {r}: the service wrote pages that SGLang had reused after the get returned "
            f"{res} (returned {'while stopped' if early else 'after the resume'})"
        )


@pytest.mark.parametrize("v2", [False, True, "v2-copy"], ids=["v1", "v2", "v2-copy"])
@pytest.mark.parametrize("when", ["before", "during"])
def test_a_put_that_timed_out_never_stores_the_reused_pages(sglang, serve, backends, v2, when):
    rnd = random.Random(f"put-{v2}-{when}")
    b = backends(serve.socket, timeout_s=TIMEOUT)
    big = when == "during"
    pools = Pools(b, v2, big=big)
    n = 48 if big else 3
    rounds = 4 if when == "during" else 1
    for r in range(rounds):
        keys = harness.keys(n, f"stall-put-{v2}-{when}-{r}")
        src, probe = list(range(1, n + 1)), list(range(n + 1, 2 * n + 1))
        pools.fill(src, seed=40 + r)
        written = pools.snapshot(src)
        before = service_ops(serve.socket)
        try:
            res, took, _ = _stalled_call(serve, pools, "set", keys, src, when, rnd)
            # SGLang writes another prefix's KV into the pages of a failed backup.
            pools.reuse(src, res, seed=50 + r)
        finally:
            serve.resume()
        if when == "before":
            assert res == [[False] * n] * len(pools.all)
            assert took < TIMEOUT + SLACK, f"a put with the service stopped took {took:.1f} s"
        assert wait_for(
            lambda: decided(before, serve.socket, PUT_DONE, pools.items(n)), 20
        ), f"the service did not handle the put in 20 s: {service_ops(serve.socket)}"
        # A key loads only with the bytes its page held when the put was
        # called: a page stored before the deadline (its reply then lost to the
        # stop) may load, but never with what SGLang wrote after the call.
        pools.fill(probe, seed=60 + r)
        untouched = pools.snapshot(probe)
        for _ in range(3):  # a get may time out on a machine this loaded: ask again
            got = pools.transfer("get", keys, probe)
            if all(h for rp, gp in zip(res, got) for ok, h in zip(rp, gp) if ok):
                break
        after = pools.snapshot(probe)
        for pool_i in range(len(pools.all)):
            for i, (ok, hit) in enumerate(zip(res[pool_i], got[pool_i])):
                if ok:
                    assert hit, f"round {r}: page {i} of pool {pool_i} was stored and does not load"
                if when == "before":
                    assert not hit, (
                        f"round {r}: the key of a put that timed out with the service stopped loads: "
                        "the resumed service stored the page SGLang had reused"
                    )
                # Each object of a page (its K and its V) is stored or not on
                # its own, and a get that failed may have written some of its
                # objects before it returned: any object it wrote holds the
                # bytes of the page when the put was called.
                parts = zip(*(x[pool_i][i].chunk(2) for x in (after, written, untouched)))
                for part, (now, then, before_get) in zip("KV", parts):
                    assert now.equal(then) or (not hit and now.equal(before_get)), (
                        f"round {r}: the {part} of page {i} of pool {pool_i} loaded other bytes than the "
                        "page held when the put was called: the service stored what SGLang wrote after "
                        "the call returned"
                    )
        if when == "before":
            assert pools.exists(keys) == 0
