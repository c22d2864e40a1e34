"""StrataTier: the node service (strata serve) as a secondary tier of vLLM's
TieringOffloadingSpec, behind vLLM's own CPU tier.

Every method runs in vLLM's scheduler and returns at once: lookups are
answered from what the service said on an earlier step (RETRY until then:
vLLM keeps scanning a prefix past RETRY, so one step gathers every key of
it, and on_schedule_end sends them in one Exists per request); stores and
loads are jobs run by the tier's own threads and reported through
get_finished_jobs. A dead or stalled service gives misses and failed jobs and
one warning per outage (strata_client), never an exception into vLLM.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional

import numpy as np

from strata_client import uniform, wire
from strata_client.client import Client, StrataError

from . import interface
from . import keys as K
from .interface import (
    JobResult,
    LookupResult,
    Medium,
    OffloadingEvent,
    RequestOffloadingContext,
    SecondaryTierManager,
)
from .rows import RowsUnavailable, Staging, open_rows, rows_path

logger = logging.getLogger("strata_vllm")

DEFAULT_SOCKET = "/run/strata/strata.sock"
# Items per request: well inside the wire's limits for keys of any length.
_CHUNK = 1024
# Failed keys remembered at most (keys of about 100 bytes each).
_MAX_FAILED = 1 << 16

# The tier's counters, as vLLM's connector exports them (get_stats): metric
# name, the stats key, what it counts.
_METRICS = (
    ("strata:tier_lookups", "lookups", "Block lookups vLLM made in Strata's node tier."),
    ("strata:tier_hits", "hits", "Block lookups in Strata's node tier that found the block."),
    (
        "strata:tier_stored_blocks",
        "stored",
        "Blocks stored from vLLM's CPU tier into Strata's node tier.",
    ),
    (
        "strata:tier_loaded_blocks",
        "loaded",
        "Blocks loaded from Strata's node tier into vLLM's CPU tier.",
    ),
    ("strata:tier_written_bytes", "written_bytes", "Bytes stored into Strata's node tier."),
    ("strata:tier_read_bytes", "read_bytes", "Bytes loaded from Strata's node tier."),
    (
        "strata:tier_failed_jobs",
        "failed_jobs",
        "Store and load jobs that failed in whole or in part.",
    ),
)


@dataclass
class _Req:
    """What the tier knows of one request's keys."""

    asked: List[bytes] = field(default_factory=list)  # RETRY given, not sent yet
    answers: Dict[bytes, LookupResult] = field(default_factory=dict)
    inflight: bool = False


class StrataTier(SecondaryTierManager):
    """vLLM loads it by name: ``{"type": "StrataTier", "module_path": "strata_vllm"}``.

    Keyword arguments (the tier's entries in ``secondary_tiers``): socket,
    timeout_s (each call's deadline), io_threads, staging_rows (the copy
    path's buffer, when vLLM's rows cannot be registered).
    """

    medium = Medium.CPU  # the node's DRAM, its SSD spill behind it

    def __init__(
        self,
        offloading_spec,
        primary_kv_view: memoryview,
        tier_type: str,
        socket: str = DEFAULT_SOCKET,
        timeout_s: float = 5.0,
        io_threads: int = 2,
        staging_rows: int = 64,
    ):
        super().__init__(offloading_spec, primary_kv_view, tier_type)
        self.timeout = float(timeout_s)
        self._nrows = primary_kv_view.shape[0] if primary_kv_view.ndim > 1 else 1
        self._stride = (
            primary_kv_view.strides[0] if primary_kv_view.ndim > 1 else primary_kv_view.nbytes
        )
        self._flat = primary_kv_view.cast("B") if primary_kv_view.ndim > 1 else primary_kv_view
        self._rows = np.frombuffer(self._flat, dtype=np.uint8).reshape(self._nrows, self._stride)
        self.namespace = K.namespace(offloading_spec, self._stride)
        self._fmt_field = b"\x11" + K.ROW_FORMAT.to_bytes(8, "little")  # Item.format
        events = getattr(offloading_spec, "kv_events_config", None)
        self._events_on = bool(getattr(events, "enable_kv_cache_events", False))
        engine = getattr(getattr(offloading_spec, "config", None), "engine_id", "engine")
        self.client = Client(
            socket, f"vllm-{engine}-pid{os.getpid()}", timeout=self.timeout, logger=logger
        )
        self._lock = threading.Lock()
        self._cond = threading.Condition(self._lock)
        self._reqs: Dict[str, _Req] = {}
        # Keys whose load failed: misses until stored again. Bounded: to forget
        # one costs at most one more failed promotion.
        self._failed: set = set()
        self._finished: List[JobResult] = []
        self._events: List[OffloadingEvent] = []
        self._inflight = 0  # jobs and lookups submitted and not finished
        self._closed = False
        self.stats = {m[1]: 0 for m in _METRICS}
        self._reported = dict(self.stats)  # what get_stats has handed vLLM
        self._seed_checked, self._seed_problem = False, ""
        self._staging: Optional[Staging] = None
        self._staging_lock = threading.Lock()
        self._rows_fd = -1
        path = rows_path(offloading_spec)
        try:
            self._rows_fd = open_rows(path, primary_kv_view)
            self._seg = self.client.add_segment(
                self._rows_fd, f"vllm-rows:{engine}"[: wire.MAX_NAME]
            )
        except RowsUnavailable as e:
            self._staging = Staging(max(1, int(staging_rows)), self._stride)
            self._seg = self.client.add_segment(
                self._staging.fd, f"vllm-staging:{engine}"[: wire.MAX_NAME]
            )
            logger.warning(
                "strata: vLLM's CPU-tier rows cannot be registered with the node service (%s); rows are "
                "copied through a staging buffer of %d rows instead, at a fraction of the zero-copy rate",
                e,
                self._staging.rows,
            )
        self._lookups: "queue.Queue" = queue.Queue()
        self._jobs: "queue.Queue" = queue.Queue()
        self._threads = [
            threading.Thread(target=self._lookup_loop, name="strata-vllm-lookup", daemon=True)
        ]
        for i in range(max(1, int(io_threads))):
            self._threads.append(
                threading.Thread(target=self._job_loop, name=f"strata-vllm-io{i}", daemon=True)
            )
        for t in self._threads:
            t.start()
        logger.info(
            "strata: vLLM secondary tier on %s, namespace %s, %d rows of %d bytes, %s",
            socket,
            self.namespace,
            self._nrows,
            self._stride,
            "zero-copy" if self._staging is None else "copy path",
        )

    # -- lookups

    def _unstable(self) -> bool:
        """Whether block hashes differ per process here (keys.hash_seed_problem):
        then nothing is stored or found, with one error."""
        if not self._seed_checked:
            self._seed_checked = True
            self._seed_problem = K.hash_seed_problem()
            if self._seed_problem:
                logger.error("strata: vLLM's tier stores and finds nothing: %s", self._seed_problem)
        return bool(self._seed_problem)

    def lookup(self, key, req_context) -> LookupResult:
        k = bytes(key)
        if self._unstable():
            return LookupResult.MISS
        with self._lock:
            self.stats["lookups"] += 1
            if k in self._failed:
                return LookupResult.MISS
            st = self._reqs.setdefault(req_context.req_id, _Req())
            got = st.answers.get(k)
            if got is not None:
                if got is LookupResult.HIT:
                    self.stats["hits"] += 1
                return got
            if k not in st.asked:
                st.asked.append(k)
            return LookupResult.RETRY

    def on_schedule_end(self, context) -> None:
        with self._lock:
            batches = []
            for rid, st in self._reqs.items():
                if st.asked and not st.inflight:
                    st.inflight = True
                    batches.append((st, st.asked))
                    st.asked = []
                    self._inflight += 1
        for b in batches:
            self._lookups.put(b)

    def _lookup_loop(self):
        while True:
            item = self._lookups.get()
            if item is None:
                return
            st, asked = item
            answers = {}
            try:
                answers = self._exists(asked)
            except Exception:  # noqa: BLE001 - a bug: misses, never an exception into vLLM
                logger.debug("strata: a lookup failed", exc_info=True)
            with self._cond:
                for k in asked:
                    st.answers.setdefault(k, answers.get(k, LookupResult.MISS))
                st.inflight = False
                self._inflight -= 1
                self._cond.notify_all()

    def _exists(self, asked: List[bytes]) -> Dict[bytes, LookupResult]:
        """Each key's answer: one Exists resolves the leading present keys and
        the first missing one; the rest are asked again (a sliding-window
        scan asks from the end). A failed call answers MISS for what is left."""
        out: Dict[bytes, LookupResult] = {}
        left = list(asked)
        while left:
            chunk = left[:_CHUNK]
            names = [K.key_name(self.namespace, k) for k in chunk]
            try:
                r = self.client.call(wire.Exists(names, K.ROW_FORMAT), self.timeout)
            except (StrataError, wire.Malformed, OSError):
                break  # the client warned once for the outage
            n = min(int(r.present), len(chunk))
            for k in chunk[:n]:
                out[k] = LookupResult.HIT
            if n < len(chunk):
                out[chunk[n]] = LookupResult.MISS
            left = chunk[n + 1 :] + left[len(chunk) :]
        return out

    def touch(self, keys, req_context):
        return  # the service keeps its own recency: a Get refreshes it

    def on_new_request(self, req_context):
        return RequestOffloadingContext()

    def on_request_finished(self, req_context) -> None:
        with self._lock:
            st = self._reqs.get(req_context.req_id)
            if st is not None and not st.inflight:
                del self._reqs[req_context.req_id]
            elif st is not None:
                st.asked = []  # the lookup in flight ends it

    # -- jobs

    def submit_store(self, job_metadata) -> None:
        self._submit(job_metadata, wire.PUT)

    def submit_load(self, job_metadata) -> None:
        self._submit(job_metadata, wire.GET)

    def _submit(self, job, op):
        with self._lock:
            if self._closed or self._unstable():
                self._finished.append(JobResult(job_id=job.job_id, success=False))
                return
            self._inflight += 1
        self._jobs.put((job, op))

    def _job_loop(self):
        while True:
            item = self._jobs.get()
            if item is None:
                return
            job, op = item
            t0 = time.monotonic()
            try:
                ok_keys = self._run(job, op)
            except Exception:  # noqa: BLE001 - a bug: the job failed, never an exception into vLLM
                logger.debug("strata: a transfer job failed", exc_info=True)
                ok_keys = []
            took = time.monotonic() - t0
            keys = [bytes(k) for k in job.keys]
            done = len(ok_keys) == len(keys)
            with self._cond:
                if op == wire.PUT:
                    self._failed.difference_update(ok_keys)
                    self.stats["stored"] += len(ok_keys)
                    self.stats["written_bytes"] += len(ok_keys) * self._stride
                    if self._events_on and ok_keys:
                        self._events.append(
                            OffloadingEvent(keys=list(ok_keys), medium=self.medium, removed=False)
                        )
                    res = JobResult(job_id=job.job_id, success=done, transfer_time=took)
                else:
                    self.stats["loaded"] += len(ok_keys)
                    self.stats["read_bytes"] += len(ok_keys) * self._stride
                    good = set(ok_keys)
                    for k in keys:
                        if k not in good:
                            self._failed.add(k)
                    if len(self._failed) > _MAX_FAILED:
                        self._failed.clear()
                    res = JobResult(
                        job_id=job.job_id,
                        success=done,
                        successful_keys=None if done else list(ok_keys),
                        transfer_time=took,
                    )
                if not done:
                    self.stats["failed_jobs"] += 1
                self._finished.append(res)
                self._inflight -= 1
                self._cond.notify_all()

    def _run(self, job, op) -> List[bytes]:
        """Move the job's rows; the keys that moved."""
        pairs = [(bytes(k), int(b)) for k, b in zip(job.keys, np.asarray(job.block_ids).tolist())]
        for _, b in pairs:
            if not 0 <= b < self._nrows:
                logger.warning("strata: a job names row %d of %d; the job fails", b, self._nrows)
                return []
        if self._staging is not None:
            return self._run_staged(pairs, op)
        ok: List[bytes] = []
        for i in range(0, len(pairs), _CHUNK):
            chunk = pairs[i : i + _CHUNK]
            r = self._call(op, chunk)
            if r is None:
                return ok
            ok += [k for (k, _), res in zip(chunk, r.results) if res.status == wire.OK]
        return ok

    def _call(self, op, rows):
        """One Put or Get of rows, (key, row in the registered segment); the
        reply, or None when the call failed (the client warned)."""
        try:
            conn, (sid,) = self.client.resolve([self._seg])
            body, order = self._encode(rows, sid)
            if body is None:
                items = [
                    wire.Item(
                        K.key_name(self.namespace, k),
                        K.ROW_FORMAT,
                        [wire.Range(sid, b * self._stride, self._stride)],
                    )
                    for k, b in rows
                ]
                msg = wire.Put(items) if op == wire.PUT else wire.Get(items)
            else:
                msg = wire.Put() if op == wire.PUT else wire.Get()
            r = conn.call(msg, self.timeout, body=body)
        except (StrataError, wire.Malformed, OSError):
            return None
        if len(r.results) != len(rows):
            logger.warning(
                "strata: the node service answered %d results for %d rows",
                len(r.results),
                len(rows),
            )
            return None
        if order is None or r.results.count(wire.RESULT_OK) == len(rows):
            return r  # in the rows' order, or all alike
        results = [None] * len(rows)
        for res, j in zip(r.results, order.tolist()):
            results[j] = res
        return wire.BatchReply(results)

    def _encode(self, rows, sid):
        """rows as strata_client.uniform's filled template rows: (the body, the
        order of its items) when their names are of one length, as vLLM's
        block hashes are; else (None, None), and _call encodes one wire.Item a
        row."""
        names = [K.key_name(self.namespace, k).encode() for k, _ in rows]
        if len(set(map(len, names))) != 1 or not names[0]:
            return None, None
        mat = np.frombuffer(b"".join(names), dtype=np.uint8).reshape(len(names), -1)
        off = np.fromiter((b for _, b in rows), dtype=np.int64, count=len(rows)) * self._stride
        got = uniform.ranges(mat, self._fmt_field, sid, off, self._stride)
        return (None, None) if got is None else (got[0], got[2])

    def _run_staged(self, pairs, op) -> List[bytes]:
        """The copy path: rows through the staging buffer, a buffer-full at a
        time. A Get's rows are copied into vLLM's only from a reply in time."""
        st = self._staging
        ok: List[bytes] = []
        with self._staging_lock:
            for i in range(0, len(pairs), st.rows):
                chunk = pairs[i : i + st.rows]
                rows = [b for _, b in chunk]
                if op == wire.PUT:
                    st.buf[: len(chunk)] = self._rows[rows]
                r = self._call(op, [(k, j) for j, (k, _) in enumerate(chunk)])
                if r is None:
                    return ok
                for j, ((k, b), res) in enumerate(zip(chunk, r.results)):
                    if res.status == wire.OK:
                        if op == wire.GET:
                            self._rows[b] = st.buf[j]
                        ok.append(k)
        return ok

    def get_finished_jobs(self):
        with self._lock:
            out, self._finished = self._finished, []
        return out

    def has_pending_work(self) -> bool:
        with self._lock:
            return self._inflight > 0 or any(st.asked for st in self._reqs.values())

    def take_events(self):
        with self._lock:
            out, self._events = self._events, []
        return out

    def drain_jobs(self) -> None:
        """Wait until every submitted job has finished: each call has a
        deadline, so this ends; the bound only names a bug."""
        bound = time.monotonic() + (self.timeout + 1) * 8
        with self._cond:
            while self._inflight > 0:
                left = bound - time.monotonic()
                if left <= 0:
                    logger.warning(
                        "strata: %d transfer jobs still running after drain's bound", self._inflight
                    )
                    return
                self._cond.wait(min(left, 0.5))

    def shutdown(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self.drain_jobs()
        self._lookups.put(None)
        for _ in self._threads[1:]:
            self._jobs.put(None)
        for t in self._threads:
            t.join(timeout=self.timeout + 1)
        self.client.close()
        if self._rows_fd >= 0:
            os.close(self._rows_fd)
            self._rows_fd = -1
        if self._staging is not None:
            self._staging.close()
        # vLLM closes its rows' mapping after this: no view of ours may pin it.
        self._rows = None
        if self._flat is not self._primary_kv_view:
            try:
                self._flat.release()
            except (BufferError, ValueError):
                pass

    @classmethod
    def build_metric_definitions(cls, extra_config) -> dict:
        meta = interface.OffloadingCounterMetadata
        if meta is None:
            return {}
        return {name: meta(documentation=doc) for name, _, doc in _METRICS}

    def get_stats(self):
        """vLLM's stats object with the counters' increases since the last
        call, or None when nothing changed (or vLLM's stats do not import)."""
        cls = interface.stats_class()
        if cls is None:
            return None
        with self._lock:
            deltas = {k: v - self._reported[k] for k, v in self.stats.items()}
            self._reported = dict(self.stats)
        if not any(deltas.values()):
            return None
        st = cls()
        for name, k, _ in _METRICS:
            if deltas[k]:
                st.increase_counter(name, deltas[k])
        return st

    def strata_stats(self) -> dict:
        """The tier's counters since it started."""
        with self._lock:
            return dict(self.stats, connected=self.client.connected, namespace=self.namespace)
