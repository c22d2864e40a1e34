"""Chaos (issue 24, "Done when"): the service killed and stopped at random moments.

For STRATA_CHAOS seconds (a duration such as 60s; a few seconds by default), a
real strata serve is SIGKILLed (and started again) or SIGSTOPped (and resumed,
or killed while stopped) at random moments, while these run at once:

- SGLang's controllers (the model's or SGLang's own), their backup, prefetch
  and I/O threads: two HiCacheControllers that share a model (one prefetches
  what the other backed up) and a HybridCacheController with a DRAFT pool in
  SGLang's default allocator beside its shm KV pool (the copy path), and the
  scheduler asking each backend for its stats at the end of every step;
- direct callers of batch_set_v1/batch_get_v1 and of the v2 multi-pool methods;
- a caller that registers a new KV pool at run time every few rounds.

Every page written holds bytes that are a function of its key (and pool), so
every hit, whoever wrote it and whichever service life stored it, is checked
against the bytes its key was written with; a page that a direct caller reuses
after a call returned is checked before its next use (a late write of an
abandoned get shows there). The test ends with 0 wrong bytes, 0 exceptions in
SGLang's threads (all alive), L3 working again (a put/get round trip on every
backend), and the process's descriptors and every client's segments (its own
and the service's count) back to their counts at the start.
"""

import gc
import hashlib
import json
import os
import random
import threading
import time
import traceback
from queue import Empty


from conftest import Serve


import torch

import harness
from fakepeer import wait_for
from strata_client import wire

PAGE = harness.PAGE
TIMEOUT = 0.4  # timeout_s: many stops outlast it, some do not


def duration() -> float:
    """STRATA_CHAOS as seconds ("60s", "60", "1.5s"); 4 when unset."""
    v = os.environ.get("STRATA_CHAOS", "").strip().lower()
    if not v:
        return 4.0
    return float(v[:-1] if v.endswith("s") else v)


# ---------------------------------------------------------------- pages of known bytes


def content(tag: str, key: str, n: int) -> torch.Tensor:
    """The n bytes a page of key holds in pools of kind tag."""
    seed = int.from_bytes(hashlib.sha256(f"{tag}|{key}".encode()).digest()[:8], "little")
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8)


def page_size_bytes(pool) -> int:
    return harness.page_bytes(pool, 0).numel()


def write_page(pool, page: int, tag: str, key: str):
    data = content(tag, key, page_size_bytes(pool))
    pool.set_from_flat_data_page(page * pool.page_size, data.view(pool.dtype))


def holds(pool, page: int, tag: str, key: str) -> bool:
    got = harness.page_bytes(pool, page)
    return got.equal(content(tag, key, got.numel()))


class Tally:
    def __init__(self):
        self.lock = threading.Lock()
        self.rounds = 0
        self.hits = 0
        self.reused = 0  # pages checked for a late write before their reuse
        self.per = {}  # worker -> [rounds, hits]
        self.wrong = []  # what was wrong, for the failure message
        self.errors = []
        self.kills = self.stops = self.killed_stopped = 0

    def add(self, **kw):
        with self.lock:
            for k, v in kw.items():
                setattr(self, k, getattr(self, k) + v)

    def worker(self, name: str, rounds: int, hits: int):
        with self.lock:
            r = self.per.setdefault(name, [0, 0])
            r[0] += rounds
            r[1] += hits
            self.rounds += rounds
            self.hits += hits

    def bad(self, what: str):
        with self.lock:
            self.wrong.append(what)


class Registry:
    """Keys (or token lists) that were written, to read back."""

    def __init__(self):
        self.lock = threading.Lock()
        self.items = []

    def add(self, xs):
        with self.lock:
            self.items.extend(xs)
            del self.items[:-400]

    def sample(self, rnd, n):
        with self.lock:
            return rnd.sample(self.items, min(n, len(self.items)))


# ---------------------------------------------------------------- SGLang's pieces


def hicache(sock, host, model):
    return harness.controller(sock, host, model=model, timeout_s=TIMEOUT, reconnect_max_s=0.1)


def hybrid(sock, host, draft, model):
    grp = harness.group(host, draft=draft)
    return harness.hybrid(sock, grp, model=model, timeout_s=TIMEOUT, reconnect_max_s=0.1)


def backend(sock, model):
    return harness.create_backend(sock, model=model, timeout_s=TIMEOUT, reconnect_max_s=0.1)


# ---------------------------------------------------------------- the workers


class Direct:
    """A caller of StrataStorage with pages of its own: v1 on one KV pool, or v2
    on a KV and a DRAFT pool; with reregister, a new KV pool every few rounds."""

    def __init__(self, b, v2=False, reregister=False):
        from harness import PoolName

        self.b, self.v2, self.reregister = b, v2, reregister
        self.pools = {"kv": harness.host_pool("mha", "page_first")}
        if v2:
            self.pools["draft"] = harness.host_pool("mha", "page_first", label="draft", layers=1)
            b.register_mem_host_pool_v2(self.pools["kv"], PoolName.KV)
            b.register_mem_host_pool_v2(self.pools["draft"], PoolName.DRAFT)
        else:
            b.register_mem_pool_host(self.pools["kv"])
        self.expected = {}  # (tag, page) -> the bytes written there after the last call
        self.keys = Registry()  # stored: most gets ask for these
        self.unsure = Registry()  # not stored (as far as the call said)
        self.reregistered = 0

    def names(self):
        from harness import PoolName

        return {"kv": PoolName.KV, "draft": PoolName.DRAFT}

    def transfer(self, op, keys, pages):
        from harness import PoolTransfer

        idx = harness.indices(self.pools["kv"], pages)
        if not self.v2:
            f = self.b.batch_get_v1 if op == "get" else self.b.batch_set_v1
            return {"kv": f(keys, idx)}
        names = self.names()
        ts = [PoolTransfer(name=names[t], keys=keys, host_indices=idx) for t in self.pools]
        r = (self.b.batch_get_v2 if op == "get" else self.b.batch_set_v2)(ts)
        return {t: r[names[t]] for t in self.pools}

    def round(self, rnd, tally) -> int:
        """One put or get; returns the hits it checked."""
        from harness import PoolName

        hits = 0
        if self.reregister and rnd.random() < 0.2:
            # SGLang replaced its pool: the old one's pages are gone with it.
            self.pools["kv"] = harness.host_pool("mha", "page_first")
            self.b.register_mem_host_pool_v2(self.pools["kv"], PoolName.KV)
            self.expected.clear()
            self.reregistered += 1
        n = rnd.randint(1, 6)
        pages = rnd.sample(range(1, self.pools["kv"].page_num), n)
        for t, pool in self.pools.items():
            for p in pages:
                want = self.expected.get((t, p))
                if want is not None:
                    tally.add(reused=1)
                if want is not None and not harness.page_bytes(pool, p).equal(want):
                    tally.bad(
                        f"page {p} of {t} changed after the call that used it returned: a late write"
                    )
        if rnd.random() < 0.5 or not self.keys.items:
            keys = [os.urandom(16).hex() for _ in pages]
            for t, pool in self.pools.items():
                for p, k in zip(pages, keys):
                    write_page(pool, p, t, k)
            res = self.transfer("set", keys, pages)
            ok = [all(res[t][i] for t in self.pools) for i in range(n)]
            self.keys.add([k for k, good in zip(keys, ok) if good])
            # A put that failed may have stored some pages (before its
            # deadline); any hit of them is checked all the same.
            self.unsure.add([k for k, good in zip(keys, ok) if not good])
        else:
            keys = self.keys.sample(rnd, n)
            keys += self.unsure.sample(rnd, max(0, min(n - len(keys), rnd.randint(0, 2))))
            if len(keys) < n:
                keys += [os.urandom(16).hex() for _ in range(n - len(keys))]
            rnd.shuffle(keys)
            res = self.transfer("get", keys, pages)
            for t, pool in self.pools.items():
                for p, k, ok in zip(pages, keys, res[t]):
                    if ok:
                        hits += 1
                        if not holds(pool, p, t, k):
                            tally.bad(
                                f"a hit of {k} in {t} loaded other bytes than it was written with"
                            )
        # Whatever the outcome, SGLang reuses the pages at once.
        for t, pool in self.pools.items():
            harness.fill(pool, pages, seed=rnd.getrandbits(31))
            for p in pages:
                self.expected[(t, p)] = harness.page_bytes(pool, p)
        return hits


class Controller:
    """Drives one SGLang controller the way its scheduler does: backups of pages
    it filled, prefetches of what was backed up (its own or a peer's)."""

    def __init__(self, c, host, registry, draft=None):
        self.c, self.host, self.registry, self.draft = c, host, registry, draft

    def sidecar(self):
        from harness import PoolName, PoolTransfer

        if self.draft is None:
            return {}
        return {"extra_pools": [PoolTransfer(name=PoolName.DRAFT, indices_from_pool=PoolName.KV)]}

    def round(self, rnd, tally) -> int:
        """One backup or prefetch; returns the hits it checked."""
        if rnd.random() < 0.5 or not self.registry.items:
            self.backup(rnd)
            return 0
        return self.prefetch(rnd, tally)

    def backup(self, rnd):
        n = rnd.randint(1, 4)
        toks = [rnd.randrange(32000) for _ in range(n * PAGE)]
        idx = self.host.alloc(n * PAGE)
        assert idx is not None, "the host pool ran out: pages were not freed"
        hashes = self.c.get_hash_str(toks, None, page_size=PAGE)
        for i, k in enumerate(hashes):
            p = int(idx[i * PAGE]) // PAGE
            write_page(self.host, p, "kv", k)
            if self.draft is not None:
                write_page(self.draft, p, "draft", k)
        self.c.write_storage(idx, toks, hash_value=hashes, **self.sidecar())
        try:
            self.c.ack_backup_queue.get(timeout=60)
        except Empty:
            raise AssertionError(
                "a backup was not acknowledged in 60 s: the backup thread is stuck"
            )
        self.registry.add([toks])
        self.host.free(idx)  # the pages go to other requests now

    def prefetch(self, rnd, tally):
        from harness import PoolName

        (toks,) = self.registry.sample(rnd, 1)
        if rnd.random() < 0.3:
            toks = toks + [rnd.randrange(32000) for _ in range(PAGE)]  # a page past the stored ones
        self.c.prefetch(f"req-{rnd.getrandbits(32)}", toks, None, **self.sidecar())
        try:
            op = self.c.prefetch_hit_queue.get(timeout=60)
        except Empty:
            raise AssertionError(
                "a prefetch's hit query did not end in 60 s: the prefetch thread is stuck"
            )
        if op.storage_hit_count == 0:
            return 0
        op.host_indices = self.host.alloc(op.storage_hit_count)
        assert op.host_indices is not None, "the host pool ran out: pages were not freed"
        self.c.prefetch_buffer.put(op)
        deadline = time.monotonic() + 60
        while True:
            done = op.completed_tokens == op.storage_hit_count or op.is_terminated()
            if done and getattr(op, "pool_transfers_done", True):
                break
            if time.monotonic() > deadline:
                raise AssertionError(
                    "a prefetch's load did not end in 60 s: the I/O thread is stuck"
                )
            time.sleep(0.002)
        loaded = op.completed_tokens // PAGE
        drafts = 0
        if self.draft is not None and loaded == len(op.hash_value):
            drafts = op.pool_storage_result.extra_pool_hit_pages.get(PoolName.DRAFT, 0)
        for i in range(loaded):
            p = int(op.host_indices[i * PAGE]) // PAGE
            if not holds(self.host, p, "kv", op.hash_value[i]):
                tally.bad(
                    f"a prefetched page of {op.hash_value[i]} holds other bytes than it was backed up with"
                )
            if i < drafts and not holds(self.draft, p, "draft", op.hash_value[i]):
                tally.bad(f"a prefetched draft page of {op.hash_value[i]} holds other bytes")
        self.host.free(op.host_indices)
        return loaded


class Probe:
    """The scheduler's own call into each backend at the end of a step
    (get_stats), concurrent with the controllers' threads."""

    def __init__(self, controllers):
        self.controllers = controllers

    def round(self, rnd, tally) -> int:
        for c in self.controllers:
            harness.scheduler_tick(c)
        time.sleep(rnd.uniform(0, 0.01))
        return 0


def run_worker(name, w, seed, stop, tally):
    rnd = random.Random(seed)
    try:
        while not stop.is_set():
            tally.worker(name, 1, w.round(rnd, tally))
    except BaseException:  # noqa: BLE001 - the test reports it
        tally.add(errors=[f"{name}: {traceback.format_exc()}"])


def chaos(serve, stop, rnd, tally):
    try:
        first = ["stop", "kill"]  # however short the run, both happen
        while not stop.wait(rnd.uniform(0.1, 0.8)):
            what = first.pop(0) if first else ("kill" if rnd.random() < 0.3 else "stop")
            if what == "kill":
                serve.kill()
                tally.add(kills=1)
                stop.wait(rnd.uniform(0, 0.3))
                serve.start()
                continue
            serve.pause()
            tally.add(stops=1)
            stop.wait(rnd.uniform(0.05, 1.2))
            if rnd.random() < 0.2:
                serve.kill()  # it dies stopped, maybe in the middle of a copy
                tally.add(kills=1, killed_stopped=1)
                serve.start()
            else:
                serve.resume()
    except BaseException:  # noqa: BLE001
        tally.add(errors=[f"chaos: {traceback.format_exc()}"])


# ---------------------------------------------------------------- what is counted


def fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def fd_names() -> dict:
    out = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            out[fd] = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            pass
    return out


def service_segments(sock) -> dict:
    from strata_client.client import Connection

    c = Connection(sock, 10.0, "chaos-stats")
    try:
        doc = json.loads(c.call(wire.Stats(), 10.0).json)
    finally:
        c.close()
        c.wait_released(5)
    return {x["id"]: x["segmentCount"] for x in doc["clients"]}


def segments(backends, sock):
    """Per backend: (segments it holds, segments the service holds for it)."""
    svc = service_segments(sock)
    out = []
    for b in backends:
        conn = b.client.snapshot()
        out.append((len(b.client._segments), svc.get(conn.hello.client_id)))
    return out


def round_trip(b, pool) -> bool:
    keys = [os.urandom(16).hex() for _ in range(2)]
    for p, k in zip([1, 2], keys):
        write_page(pool, p, "kv", k)
    if b.batch_set_v1(keys, harness.indices(pool, [1, 2])) != [True, True]:
        return False
    harness.fill(pool, [3, 4], seed=7)
    if b.batch_get_v1(keys, harness.indices(pool, [3, 4])) != [True, True]:
        return False
    return holds(pool, 3, "kv", keys[0]) and holds(pool, 4, "kv", keys[1])


def test_chaos(sglang, strata_bin, sock_path, caplog):
    length = duration()
    seed = int(os.environ.get("STRATA_CHAOS_SEED", "0")) or random.randrange(1 << 30)
    rnd = random.Random(seed)
    hook_errors = []
    old_hook = threading.excepthook
    threading.excepthook = lambda args: hook_errors.append(
        "".join(traceback.format_exception(args.exc_type, args.exc_value, args.exc_traceback))
    )
    serve = Serve(strata_bin, sock_path, arena="256MiB").start()
    made, controllers = [], []
    try:
        # SGLang's controllers, each with its own host pool and backend.
        ctl_keys, hyb_keys = Registry(), Registry()
        ha, hb = harness.host_pool("mha", "page_first"), harness.host_pool("mha", "page_first")
        hh = harness.host_pool("mha", "page_first")
        # The draft pool beside the hybrid controller's shm KV pool is in SGLang's
        # default allocator, as in SGLang issue 28873: its pages go through staging.
        hd = harness.host_pool("mha", "page_first", allocator="default", label="draft", layers=1)
        ca, cb = hicache(sock_path, ha, "org/chaos-ctl"), hicache(sock_path, hb, "org/chaos-ctl")
        ch = hybrid(sock_path, hh, hd, "org/chaos-hybrid")
        controllers = [ca, cb, ch]
        workers = {
            "controller-a": Controller(ca, ha, ctl_keys),
            "controller-b": Controller(cb, hb, ctl_keys),
            "hybrid": Controller(ch, hh, hyb_keys, draft=hd),
            "scheduler": Probe(controllers),
        }
        for name, model, kw in (
            ("direct-v1", "org/chaos-v1", {}),
            ("direct-v2", "org/chaos-v2", {"v2": True}),
            ("reregister", "org/chaos-rereg", {"reregister": True}),
        ):
            b = backend(sock_path, model)
            made.append(b)
            workers[name] = Direct(b, **kw)
        backends = [c.storage_backend for c in controllers] + made
        for b in backends:
            assert b.client.wait_connected(20), "a backend did not connect to a healthy service"
        gc.collect()
        fds0, names0 = fds(), fd_names()
        segs0 = segments(backends, sock_path)

        tally = Tally()
        stop = threading.Event()
        threads = [
            threading.Thread(
                target=run_worker, args=(n, w, rnd.getrandbits(32), stop, tally), daemon=True
            )
            for n, w in workers.items()
        ]
        killer = threading.Thread(
            target=chaos, args=(serve, stop, random.Random(rnd.getrandbits(32)), tally), daemon=True
        )
        t0 = time.monotonic()
        for t in threads + [killer]:
            t.start()
        stop.wait(length)
        stop.set()
        killer.join(30)
        assert not killer.is_alive(), "the chaos thread did not stop in 30 s"
        if serve.proc is None or serve.proc.poll() is not None:
            serve.start()
        serve.resume()
        for t in threads:
            t.join(90)
        hung = [n for n, t in zip(workers, threads) if t.is_alive()]
        assert not hung, f"workers still running 90 s after the chaos ended: {hung}"
        ran = time.monotonic() - t0

        summary = (
            f"seed {seed}: {ran:.1f} s, {tally.rounds} rounds, {tally.hits} hits checked, "
            f"{tally.kills} kills ({tally.killed_stopped} while stopped), {tally.stops} stops, "
            f"{len(tally.wrong)} wrong bytes, {tally.reused} reused pages checked, "
            f"{workers['reregister'].reregistered} re-registrations; rounds/hits per worker "
            + ", ".join(f"{n} {r}/{h}" for n, (r, h) in sorted(tally.per.items()))
        )
        assert not tally.errors, summary + "\n" + "\n".join(tally.errors)
        assert not tally.wrong, summary + "\n" + "\n".join(tally.wrong[:20])
        assert not hook_errors, (
            summary + "\nexceptions in SGLang's threads:\n" + "\n".join(hook_errors)
        )
        for c in controllers:
            alive = [c.backup_thread.is_alive(), c.prefetch_thread.is_alive()]
            alive.append(c.prefetch_io_aux_thread.is_alive())
            assert all(alive), f"an SGLang thread died: {alive}"

        # L3 works again, on every backend.
        pools = [ha, hb, hh] + [
            workers[n].pools["kv"] for n in ("direct-v1", "direct-v2", "reregister")
        ]
        for b, pool in zip(backends, pools):
            assert b.client.wait_connected(30), summary + ": a backend did not reconnect"
            assert wait_for(lambda: round_trip(b, pool), 30), (
                summary + f": L3 did not come back for {b.prefix}: {b.pool_status()}"
            )

        # The plugin's warnings of the outages are kept by the log capture,
        # and with them the frames their exceptions passed through.
        caplog.clear()

        def settled():
            gc.collect()
            try:
                return fds() == fds0 and segments(backends, sock_path) == segs0
            except Exception:  # noqa: BLE001 - not connected yet: not settled
                return False

        assert wait_for(settled, 30, every=0.2), (
            summary
            + f": descriptors {fds0} -> {fds()} (new: {sorted(set(fd_names().items()) - set(names0.items()))}), "
            + f"segments {segs0} -> {segments(backends, sock_path)}"
        )
        print(
            f"\nchaos {summary}; fds {fds0} -> {fds()}; segments {segs0} -> {segments(backends, sock_path)}"
        )
    finally:
        for c in controllers:
            try:
                c.detach_storage_backend()
            except Exception:  # noqa: BLE001 - teardown
                pass
        for b in made:
            b.close()
        serve.stop()
        threading.excepthook = old_hook
