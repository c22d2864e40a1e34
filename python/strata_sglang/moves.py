"""How a batch of pages moves: planned once, then sent zero copy or staged.

A batch's pages are planned the same way for every pool (where each page's
ranges are, which fall outside the pool's memory, which keys are bad): see
plan.py. Pages of pools in registered memfds go in as few Put or
Get requests as the protocol's limits allow, each item naming its ranges in
SGLang's memory (or, on a connection of revision 2, one strided run for an
item whose ranges are equally spaced: a layer_first part), and the service
copies them. Pages of pools the service
cannot map go through the staging buffer: the plugin copies each object's
ranges into it (Put) or out of it once the service answered (Get), one object
a contiguous range there, so that the objects are the same bytes under the
same names as a zero-copy engine's.
"""

from __future__ import annotations

import bisect
import ctypes
from typing import List

import numpy as np
import torch

from strata_client import wire
from strata_client.client import NotRegistered, SegmentRefused

from . import batch, names
from .plan import encode as encode_planned

_ALIGN = 64


class Transfers:
    """StrataStorage's batch machinery (a mixin: it uses the storage's client,
    timeout, stats, staging buffer and warnings)."""

    def _exists(self, pool, keys: List[str]) -> int:
        """How many leading keys have every part stored in the pool's format,
        and can be loaded into the pool."""
        if pool is None or pool.disabled or not keys or not self._loadable(pool):
            return 0
        with self._lock:
            self._stats["exists_calls"] += 1
        per = max(1, wire.MAX_ITEMS // pool.parts)
        hit = 0
        for start in range(0, len(keys), per):
            chunk = keys[start : start + per]
            valid = names.keys_ok(chunk)
            if valid == 0:
                return hit
            # Our own names (checked keys, escaped prefix): encoded here, without
            # the generic encoder's per-key validation.
            r = self.client.call(wire.Exists(), body=pool.exists_body(chunk[:valid]))
            got = min(r.present // pool.parts, valid)
            hit += got
            if got < len(chunk):
                break
        return hit

    def _loadable(self, pool) -> bool:
        """Whether the pool's pages can move on the live connection: a pool
        whose segment the service refused (or that is being registered again)
        has no L3, and a hit would send SGLang to load pages that its gets then
        fail. Unavailable when not connected."""
        try:
            self.client.resolve(pool.segments() or [self._staging_segment()])
        except (NotRegistered, SegmentRefused):
            return False
        return True

    def _plan(self, op: int, j: int, pool, keys: List[str], host_indices):
        """The pages of one job that can move, planned (plan.py), or None
        when none can."""
        n = len(keys)
        if host_indices is None or int(host_indices.numel()) != n * pool.page_size:
            self._warn_once(
                "indices:" + pool.name,
                "strata: pool %s got %s host indices for %d keys of page size %d; those calls fail",
                pool.name,
                None if host_indices is None else int(host_indices.numel()),
                n,
                pool.page_size,
            )
            return None
        # A page with an index outside the pool is refused before anything
        # else: SGLang's get_page_buffer_meta answers pointers inside the pool
        # for some of them (a token past the end gives page 0's V), which would
        # read into, or store from, another page.
        ps, tokens = pool.page_size, pool.tokens
        flat = batch.arr(host_indices).reshape(-1)
        chosen = None  # the pages (into keys) planned, when not all of them
        if int(flat.min()) < 0 or int(flat.max()) >= tokens or int(flat[::ps].max()) + ps > tokens:
            idx = flat.reshape(n, ps)
            inside = ((idx >= 0) & (idx < tokens)).all(1) & (idx[:, 0] + ps <= tokens)
            self._warn_once(
                "outside:" + pool.name,
                "strata: pool %s was given host indices outside its %d slots; those pages fail",
                pool.name,
                tokens,
            )
            chosen = np.flatnonzero(inside)
            if chosen.size == 0:
                return None
            host_indices = host_indices.reshape(n, ps)[torch.from_numpy(chosen)].reshape(-1)
        m = n if chosen is None else int(chosen.size)
        plan = pool.plan(host_indices, m)
        if plan is None:
            return None
        good = plan.good
        if not bool(good.all()):
            self._warn_once(
                "ranges:" + pool.name,
                "strata: pool %s has page buffers outside its %s memory or with more than %d "
                "ranges; those pages are not stored",
                pool.name,
                "own" if pool.copy else "registered",
                wire.MAX_RANGES,
            )
        planned = keys if chosen is None else [keys[p] for p in chosen.tolist()]
        if names.keys_ok(planned) < m:  # a bad key: that page is skipped, not the batch
            good = good & np.array([names.key_ok(k) for k in planned], dtype=bool)
        if bool(good.all()):
            pages = list(range(n)) if chosen is None else chosen.tolist()
        else:
            rows = np.flatnonzero(good)
            pages = (rows if chosen is None else chosen[rows]).tolist()
            plan = plan.rows(rows)
        if not pages:
            return None
        return j, pool, pages, pool.item_names(keys, pages), plan

    def _transfer(self, op: int, jobs) -> List[List[bool]]:
        """Put or get pages of several pools.

        jobs: (pool, keys, host_indices). Returns one list of bools per job: a
        page is True only when every byte of every part of it was moved.
        """
        out = [[False] * len(keys) for _, keys, _ in jobs]
        direct, staged = [], []
        for j, (pool, keys, host_indices) in enumerate(jobs):
            if pool is None or pool.disabled or not keys:
                continue
            if op == wire.PUT and not pool.writes:
                continue  # a replicated pool on a rank other than 0 stores nothing
            plan = self._plan(op, j, pool, keys, host_indices)
            if plan is not None:
                (staged if pool.copy else direct).append(plan)
        moved = 0
        # An exception (service gone, malformed reply) fails the whole call:
        # the callers answer every page False.
        if direct:
            moved += self._zero_copy(op, direct, out)
        if staged:
            with self._stage_lock:
                moved += self._staged(op, staged, out)
        with self._lock:
            self._stats["get_bytes" if op == wire.GET else "set_bytes"] += moved
        return out

    def _zero_copy(self, op: int, plans, out) -> int:
        """Every pool's segments resolved on one connection, together; the
        items in as few requests as the limits allow."""
        segs, seg_index = [], {}
        for plan in plans:
            for seg in plan[1].segments():
                if id(seg) not in seg_index:
                    seg_index[id(seg)] = len(segs)
                    segs.append(seg)
        conn, ids = self.client.resolve(segs)
        # Strided runs only where this connection's revision has them (and
        # the STRATA_WIRE_REVISION switch did not turn them off): the body
        # goes on this connection only.
        runs = getattr(conn, "revision", 1) >= 2
        bodies, sizes, lengths = [], [], []
        run_items = 0
        owners = []  # (first item, job, the page of each of its items)
        for j, pool, pages, item_names, pl in plans:
            seg_ids = np.array([ids[seg_index[id(x)]] for x in pool.segments()], dtype=np.int64)
            enc = encode_planned(item_names, pages, pool.fmt_field, seg_ids, pl, runs)
            bodies.append(enc.body)
            run_items += enc.runs
            owners.append((len(sizes), j, enc.pages))
            sizes += enc.sizes
            lengths += enc.lengths
            _mark(out[j], pages)
        starts = [o[0] for o in owners]

        def owner(k):
            first, j, page_of = owners[bisect.bisect_right(starts, k) - 1]
            return j, page_of[k - first]

        if run_items:
            with self._lock:
                self._stats["run_items"] += run_items
        body = memoryview(b"".join(bodies))
        msg = wire.Put() if op == wire.PUT else wire.Get()
        moved = 0
        for a, z, b0, b1 in batch.split(sizes):
            r = conn.call(msg, self.timeout, body=body[b0:b1])
            if len(r.results) != z - a:
                raise wire.Malformed(f"{len(r.results)} results for {z - a} items")
            if r.results.count(wire.RESULT_OK) == z - a:
                # Every item stored or read: the common case, in C loops
                # rather than a Python loop over 1024 results.
                moved += sum(lengths[a:z])
                continue
            for k, res in enumerate(r.results, a):
                if res.status != wire.OK:
                    j, p = owner(k)
                    out[j][p] = False
                    if op == wire.PUT or res.status != wire.NOT_FOUND:
                        self._item_failed(op, res)
                else:
                    moved += lengths[k]
        return moved

    def _staged(self, op: int, plans, out) -> int:
        """Pages of pools the service cannot map, through the staging buffer
        (the caller holds _stage_lock): one object a contiguous range there."""
        moved = 0
        for j, pool, pages, item_names, pl in plans:
            seg, off, length, keep = pl.full()
            m, parts, runs = seg.shape
            n = m * parts
            addr = (pool.bases[seg] + off).reshape(n, runs).tolist()
            lens = (length * keep).reshape(n, runs).tolist()
            totals = [sum(x) for x in lens]
            page_of = [p for p in pages for _ in range(parts)]
            _mark(out[j], pages)
            stage = self._staging(max(totals))
            cap, base = len(stage.mm), stage.base
            i = 0
            while i < n:
                at, first = [], i
                used = 0
                while i < n and used + totals[i] <= cap and i - first < wire.MAX_ITEMS:
                    at.append(used)
                    used += (totals[i] + _ALIGN - 1) & ~(_ALIGN - 1)
                    i += 1
                moved += self._stage_round(
                    op,
                    pool,
                    item_names[first:i],
                    at,
                    addr[first:i],
                    lens[first:i],
                    totals[first:i],
                    [page_of[k] for k in range(first, i)],
                    out[j],
                    stage,
                    base,
                )
        return moved

    def _stage_round(
        self, op, pool, item_names, at, addr, lens, totals, page_of, res_out, stage, base
    ):
        if op == wire.PUT:
            for o, srcs, ls in zip(at, addr, lens):
                _gather(base + o, srcs, ls)
        conn, (sid,) = self.client.resolve([stage.seg])
        k = len(at)
        t = lambda v: np.array(v, dtype=np.int64).reshape(k, 1)  # noqa: E731
        body, _ = batch.encode(
            item_names,
            pool.fmt_field,
            t([sid] * k),
            t(at),
            t(totals),
            np.ones((k, 1), dtype=bool),
        )
        r = conn.call(wire.Put() if op == wire.PUT else wire.Get(), self.timeout, body=body)
        if len(r.results) != k:
            raise wire.Malformed(f"{len(r.results)} results for {k} items")
        moved = 0
        for res, o, dsts, ls, total, p in zip(r.results, at, addr, lens, totals, page_of):
            if res.status != wire.OK:
                res_out[p] = False
                if op == wire.PUT or res.status != wire.NOT_FOUND:
                    self._item_failed(op, res)
                continue
            if op == wire.GET:
                # A page is True only when every part of it was read; a part
                # copied beside one that failed is in a page SGLang will not use.
                _scatter(base + o, dsts, ls)
            moved += total
        return moved


def _mark(res: List[bool], pages: List[int]):
    """Every planned page is True until one of its parts fails."""
    if len(pages) == len(res):
        res[:] = [True] * len(pages)
    else:
        for p in pages:
            res[p] = True


def _gather(dst: int, srcs: List[int], lens: List[int]):
    for src, n in zip(srcs, lens):
        if n:
            ctypes.memmove(dst, src, n)
            dst += n


def _scatter(src: int, dsts: List[int], lens: List[int]):
    for dst, n in zip(dsts, lens):
        if n:
            ctypes.memmove(dst, src, n)
            src += n
