"""SGLang's HiCacheController, storage side: the threads that call a backend.

Three threads call the backend at once, as in SGLang, and a fourth caller may
join them: the prefetch thread asks ``batch_exists`` how much of a request's
prefix is stored (128 pages a call), the prefetch I/O thread loads what the
scheduler gave host pages to (``batch_get_v1``, 128 pages a call, stopping at
the first miss), the backup thread writes pages the scheduler backed up
(``batch_set_v1``), and the scheduler itself asks ``get_stats`` at the end of
a step (``scheduler_tick``). Each thread catches ``queue.Empty`` and nothing
else: a backend that raises, or answers None where SGLang indexes a list,
ends that thread for the life of the process, silently, as in SGLang. The
model checks more than SGLang does (answers of the wrong length or type raise
in the thread that got them), so that a plugin bug shows as a dead thread.

With MLA (rank-replicated KV), only TP rank 0 backs up. An EAGLE draft pool
set with ``set_draft_kv_pool`` rides along best effort through the generic
calls, under ``{hash}.draft`` keys. Not modelled: the device side (L1<->L2),
and the MIN all-reduce of hit counts across TP ranks (one process here).
"""

from __future__ import annotations

import logging
import threading
import time
from queue import Empty, Queue

from .contract import (
    STORAGE_BATCH_SIZE,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolName,
    PoolTransferResult,
    StorageMetrics,
)
from .factory import Ranks, StorageBackendFactory
from .host_pools import MLAHostPool
from .memory import page_hashes

logger = logging.getLogger("sglang_model")


class StorageOperation:
    """A backup: host pages and the page keys they are stored under."""

    def __init__(self, host_indices, token_ids, hash_value=None, prefix_keys=None, extra=None):
        self.host_indices = host_indices
        self.token_ids = token_ids
        self.hash_value = list(hash_value or [])
        self.prefix_keys = prefix_keys
        self.completed_tokens = 0
        self.pool_transfers = extra
        self.pool_storage_result = PoolTransferResult.empty()


class PrefetchOperation(StorageOperation):
    """A prefetch: the hit query's answer, then the load's progress. Once
    terminated (by the scheduler, or a failed batch), it counts no more pages."""

    def __init__(self, request_id, token_ids, last_hash=None, prefix_keys=None, extra=None):
        super().__init__(None, token_ids, None, prefix_keys, extra)
        self.request_id = request_id
        self.last_hash = last_hash
        self.storage_hit_count = 0
        self.pool_transfers_done = not extra
        self._progress = threading.Lock()
        self._ended = threading.Event()

    def increment(self, tokens: int) -> bool:
        with self._progress:
            counted = not self._ended.is_set()
            self.completed_tokens += tokens if counted else 0
        return counted

    def mark_terminate(self):
        with self._progress:
            self._ended.set()

    def is_terminated(self) -> bool:
        return self._ended.is_set()


def check_bools(what: str, got, n: int):
    """The model's stricter reading of a backend's per-page answer."""
    if not isinstance(got, list) or len(got) != n or not all(type(x) is bool for x in got):
        raise AssertionError(f"{what} answered {got!r} for {n} pages: want a list of {n} bools")
    return got


def _is_mla(host) -> bool:
    anchor = getattr(host, "anchor_entry", None)
    return isinstance(anchor.host_pool if anchor else host, MLAHostPool)


class HiCacheController:
    """One rank's L2<->L3 traffic. ``extra_config`` is SGLang's parsed
    ``--hicache-storage-backend-extra-config``."""

    def __init__(
        self,
        mem_pool_host,
        page_size: int,
        *,
        model_name=None,
        extra_config=None,
        ranks: Ranks = None,
        kv_cache_dtype=None,
        enable_storage_metrics=False,
        storage_backend="dynamic",
    ):
        self.mem_pool_host = mem_pool_host
        self.page_size = page_size
        self.ranks = ranks or Ranks()
        self.has_draft = False
        self.mem_pool_host_draft = None
        self.storage_stop_event = threading.Event()
        self.enable_storage = False
        self.metrics_seen = []
        self.attach_storage_backend(
            storage_backend,
            model_name,
            dict(extra_config or {}),
            kv_cache_dtype,
            enable_storage_metrics,
        )

    # ------------------------------------------------------------ attach / detach

    def _storage_config(self, model_name, extra, kv_cache_dtype, metrics):
        r = self.ranks
        return HiCacheStorageConfig(
            r.tp_rank,
            r.tp_size,
            r.pp_rank,
            r.pp_size,
            r.attn_cp_rank,
            r.attn_cp_size,
            _is_mla(self.mem_pool_host),
            metrics,
            self.mem_pool_host.layout == "page_first",
            model_name,
            extra_config=extra,
            dp_rank=r.dp_rank,
            dp_size=r.dp_size,
            kv_cache_dtype=kv_cache_dtype,
        )

    def attach_storage_backend(self, kind, model_name, extra, kv_cache_dtype=None, metrics=False):
        if self.enable_storage:
            raise RuntimeError("a storage backend is attached already")
        self.get_hash_str = page_hashes
        self.storage_config = self._storage_config(model_name, extra, kv_cache_dtype, metrics)
        self.backup_skip = self.storage_config.is_mla_model and self.storage_config.tp_rank != 0
        self.storage_backend = StorageBackendFactory.create_backend(
            kind, self.storage_config, self.mem_pool_host
        )
        self.storage_backend.register_mem_pool_host(self.mem_pool_host)
        self.zero_copy = bool(extra.get("interface_v1", 0))
        self.enable_storage = True
        self._start_threads()

    def _start_threads(self):
        self.prefetch_queue, self.backup_queue = Queue(), Queue()
        self.prefetch_hit_queue, self.ack_backup_queue = Queue(), Queue()
        self.host_mem_release_queue = Queue()
        self.prefetch_thread = threading.Thread(target=self.prefetch_thread_func, daemon=True)
        self.backup_thread = threading.Thread(target=self.backup_thread_func, daemon=True)
        self.prefetch_thread.start()
        self.backup_thread.start()

    def detach_storage_backend(self):
        self.storage_stop_event.set()
        for q in ("prefetch_queue", "backup_queue", "prefetch_buffer"):
            if hasattr(self, q):
                getattr(self, q).put_nowait(None)
        for t in ("prefetch_thread", "backup_thread", "prefetch_io_aux_thread"):
            if hasattr(self, t):
                getattr(self, t).join(10)
        alive = [t for t in ("prefetch_thread", "backup_thread") if getattr(self, t).is_alive()]
        if alive:
            raise RuntimeError(f"storage threads did not stop: {alive}")
        backend, self.storage_backend = self.storage_backend, None
        self.enable_storage = False
        if backend is not None and hasattr(backend, "close"):
            backend.close()
        self.storage_stop_event.clear()

    def set_draft_kv_pool(self, draft_device_pool, draft_host_pool):
        """EAGLE's draft pool, best effort beside the target's pages."""
        self.has_draft = True
        self.mem_pool_host_draft = draft_host_pool

    # ------------------------------------------------------------ what the scheduler calls

    def prefetch(self, request_id, new_input_tokens, last_hash=None, prefix_keys=None):
        op = PrefetchOperation(request_id, new_input_tokens, last_hash, prefix_keys)
        self.prefetch_queue.put(op)
        return op

    def write_storage(self, host_indices, token_ids, hash_value=None, prefix_keys=None):
        op = StorageOperation(host_indices, token_ids, hash_value, prefix_keys)
        self.backup_queue.put(op)
        return op

    def append_host_mem_release(self, host_indices):
        if host_indices is not None and host_indices.numel():
            for page in host_indices.split(self.mem_pool_host.page_size):
                self.host_mem_release_queue.put(page)

    def scheduler_tick(self):
        """The end of a scheduler step with storage metrics on: the unified
        radix cache sets prefetch counters on what get_stats returned (a new
        StorageMetrics when it returned None) and logs it."""
        got = self.storage_backend.get_stats()
        if got is None:
            got = StorageMetrics()
        if not isinstance(got, StorageMetrics):
            raise AssertionError(f"get_stats() answered {type(got).__name__}, not StorageMetrics")
        got.prefetch_stats = {"at": time.monotonic()}
        self.metrics_seen.append(got)
        del self.metrics_seen[:-8]

    # ------------------------------------------------------------ prefetch

    def _storage_hit_query(self, op):
        hashes = self.get_hash_str(op.token_ids, op.last_hash, page_size=self.page_size)
        prefix = list(op.prefix_keys) if op.prefix_keys else None
        hit = []
        for start in range(0, len(hashes), STORAGE_BATCH_SIZE):
            batch = hashes[start : start + STORAGE_BATCH_SIZE]
            n = self.storage_backend.batch_exists(batch, HiCacheStorageExtraInfo(prefix))
            if type(n) is not int or not 0 <= n <= len(batch):
                raise AssertionError(f"batch_exists answered {n!r} for {len(batch)} keys")
            hit += batch[:n]
            if n < len(batch):
                break
            if prefix:
                prefix += batch
        return hit, len(hit) * self.page_size

    def _serve(self, q, handle):
        """A controller thread's loop: take the next operation, handle it. Only
        queue.Empty is caught, as in SGLang: anything a backend raises ends the
        thread. A None is the detach's wake-up."""
        while not self.storage_stop_event.is_set():
            try:
                op = q.get(timeout=1)
            except Empty:
                continue
            if op is not None:
                handle(op)

    def prefetch_thread_func(self):
        self.prefetch_buffer = Queue()
        self.prefetch_io_aux_thread = threading.Thread(
            target=self.prefetch_io_aux_func, daemon=True
        )
        self.prefetch_io_aux_thread.start()
        self._serve(self.prefetch_queue, self._hit_query)

    def _hit_query(self, op):
        hit, tokens = ([], 0) if op.is_terminated() else self._storage_hit_query(op)
        op.hash_value = hit[: tokens // self.page_size]
        op.storage_hit_count = tokens
        self.prefetch_hit_queue.put(op)

    def prefetch_io_aux_func(self):
        self._serve(self.prefetch_buffer, self._load)

    def _load(self, op):
        self._page_transfer(op)
        self.append_host_mem_release(op.host_indices[op.completed_tokens :])

    def _page_transfer(self, op):
        prefix = op.prefix_keys
        for start in range(0, len(op.hash_value), STORAGE_BATCH_SIZE):
            keys = op.hash_value[start : start + STORAGE_BATCH_SIZE]
            idx = op.host_indices[start * self.page_size : (start + len(keys)) * self.page_size]
            if self.has_draft:
                self._best_effort(self._draft_get, keys, idx)
            before = op.completed_tokens
            self._page_get(op, keys, idx, HiCacheStorageExtraInfo(prefix))
            if op.completed_tokens != before + len(keys) * self.page_size:
                op.mark_terminate()
                break
            if prefix:
                prefix += keys

    def _page_get(self, op, keys, idx, extra_info):
        if self.zero_copy:
            got = check_bools(
                "batch_get_v1", self.storage_backend.batch_get_v1(keys, idx, extra_info), len(keys)
            )
        else:
            pool = self.mem_pool_host
            into = [pool.get_dummy_flat_data_page() for _ in keys]
            pages = self.storage_backend.batch_get(keys, into)
            got = []
            for i, page in enumerate(pages or []):
                if page is None:
                    break
                pool.set_from_flat_data_page(int(idx[i * self.page_size]), page)
                got.append(True)
        loaded = 0
        for ok in got:
            if not ok:
                break
            loaded += self.page_size
        op.increment(loaded)

    # ------------------------------------------------------------ backup

    def backup_thread_func(self):
        self._serve(self.backup_queue, self._backup)

    def _backup(self, op):
        if not self.backup_skip:
            self._page_backup(op)
        self.ack_backup_queue.put(op)

    def _page_backup(self, op):
        prefix = op.prefix_keys
        for start in range(0, len(op.hash_value), STORAGE_BATCH_SIZE):
            keys = op.hash_value[start : start + STORAGE_BATCH_SIZE]
            idx = op.host_indices[start * self.page_size : (start + len(keys)) * self.page_size]
            if not self._page_set(keys, idx, HiCacheStorageExtraInfo(prefix)):
                logger.warning("backup: %d pages were not stored", len(keys))
                break
            if self.has_draft:
                self._best_effort(self._draft_set, keys, idx)
            if prefix:
                prefix += keys
            op.completed_tokens += len(keys) * self.page_size

    def _page_set(self, keys, idx, extra_info) -> bool:
        if self.zero_copy:
            got = self.storage_backend.batch_set_v1(keys, idx, extra_info)
            return all(check_bools("batch_set_v1", got, len(keys)))
        pool = self.mem_pool_host
        pages = [pool.get_data_page(int(idx[i * self.page_size])) for i in range(len(keys))]
        return self.storage_backend.batch_set(keys, pages) is True

    # ------------------------------------------------------------ the draft pool, generic

    @staticmethod
    def _best_effort(fn, keys, idx):
        try:
            fn(keys, idx)
        except Exception:  # noqa: BLE001 - SGLang logs at debug and goes on
            logger.debug("draft L3 transfer failed (best effort)", exc_info=True)

    def _draft_keys(self, keys):
        return [f"{k}.{PoolName.DRAFT}" for k in keys]

    def _draft_set(self, keys, idx):
        pool = self.mem_pool_host_draft
        pages = [pool.get_data_page(int(idx[i * self.page_size])) for i in range(len(keys))]
        self.storage_backend.batch_set(self._draft_keys(keys), pages)

    def _draft_get(self, keys, idx):
        pool = self.mem_pool_host_draft
        into = [pool.get_dummy_flat_data_page() for _ in keys]
        got = self.storage_backend.batch_get(self._draft_keys(keys), into)
        for i, page in enumerate(got or []):
            if page is not None:
                pool.set_from_flat_data_page(int(idx[i * self.page_size]), page)
