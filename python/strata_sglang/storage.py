"""StrataStorage: SGLang's HiCache L3 over ``strata serve``.

SGLang loads it through its ``dynamic`` storage backend::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name":"strata","module_path":"strata_sglang",
        "class_name":"StrataStorage","interface_v1":1,"allocator":"shm","socket":"/run/strata/strata.sock"}'

The host pools SGLang allocates with its shm allocator are memfds; each one is
registered with the service once, and from then on a batch names each page's
bytes as (segment, offset, length) ranges: the service copies them with one
memcpy, no data on the socket. A pool the service cannot map (SGLang's default
allocator, or a pool that ignores the shm one) moves through the plugin's
staging buffer instead, after one warning. Every method returns what SGLang's
docstrings promise and never raises: while the service is down, slow or
restarting, reads are misses and writes report failure, after one warning,
and the plugin reconnects and registers its pools again by itself.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Dict, List, Optional

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from strata_client import wire
from strata_client.client import Client, SegmentRefused, Timeout, Unavailable

from . import names
from .moves import Transfers
from .pools import Pool
from .staging import Staging

logger = logging.getLogger("strata_sglang")

DEFAULT_SOCKET = "/run/strata/strata.sock"

# Where SGLang keeps the StorageMetrics its scheduler logs get_stats() into:
# observability.metrics_collector now, metrics.collector before.
_METRICS_MODULES = ("sglang.srt.observability.metrics_collector", "sglang.srt.metrics.collector")


def _storage_metrics_class():
    import importlib

    for mod in _METRICS_MODULES:
        try:
            return getattr(importlib.import_module(mod), "StorageMetrics")
        except Exception:  # noqa: BLE001 - absent, or its imports fail: try the next
            continue
    return None


def _name(name) -> str:
    return str(name.value if isinstance(name, PoolName) else name)


class StrataStorage(Transfers, Staging, HiCacheStorage):
    """SGLang HiCacheStorage over the node service (``strata serve``).

    extra_config keys (all optional but the loader's): ``socket`` (default
    /run/strata/strata.sock, or $STRATA_SOCKET), ``timeout_s`` (per call, 5),
    ``connect_wait_s`` (how long the constructor waits for the service, 1),
    ``reconnect_min_s`` / ``reconnect_max_s`` (backoff, 0.05 to 2),
    ``staging_bytes`` (copy-path buffer, 64 MiB), ``model`` (when SGLang passes
    no model name), ``share_across_dp`` (DP replicas read each other's pages).

    Registering a pool returns once its memory is registered with the service,
    or after timeout_s (a stalled service; the registration then goes on in the
    background). A pool registered again under its name releases the memory of
    the pool it replaces. With MLA, TP rank 0 writes the objects every rank
    reads: a write on another rank stores nothing and answers False (SGLang
    backs up MLA from rank 0 only and never calls it).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.config, self.extra = storage_config, extra
        self.socket = str(extra.get("socket") or os.environ.get("STRATA_SOCKET") or DEFAULT_SOCKET)
        self.timeout = self._setting("timeout_s", 5.0)
        self.tp_rank = int(getattr(storage_config, "tp_rank", 0) or 0)
        self.mla = bool(getattr(storage_config, "is_mla_model", False))
        # The namespace of this deployment's segments and copy-path objects; a
        # pool's objects add its KV dtype (names.namespace).
        self.prefix = names.namespace(storage_config, extra, "")
        if not names.model_part(storage_config, extra):
            logger.warning(
                "strata: SGLang passed no model name; objects are named without a model prefix, so two models "
                'of the same geometry would share them. Pass --served-model-name or "model" in the extra config'
            )
        self.staging_bytes = int(self._setting("staging_bytes", 64 << 20))
        self._pools: Dict[str, Pool] = {}
        self._lock = threading.Lock()
        self._stage_lock = threading.Lock()
        self._stage = None  # staging.Stage
        self._warned = set()
        self._item_log = {}  # (store|read, status) -> (last logged, failures not logged since)
        self._stats = dict.fromkeys(
            (
                "exists_calls",
                "get_pages",
                "get_hits",
                "set_pages",
                "set_ok",
                "get_bytes",
                "set_bytes",
                "run_items",  # items named by one strided run (revision 2), not ranges
            ),
            0,
        )
        self._stats["failures"] = 0
        self._interval = self._new_interval()
        self._metrics_cls = None  # SGLang's StorageMetrics, looked up at the first get_stats
        self.client = Client(
            self.socket,
            f"sglang-tp{self.tp_rank}-pid{os.getpid()}",
            timeout=self.timeout,
            reconnect_min=self._setting("reconnect_min_s", 0.05),
            reconnect_max=self._setting("reconnect_max_s", 2.0),
            logger=logger,
        )
        # A short wait lets the first pools register at once when the service is
        # up; when it is not, SGLang starts anyway and the client keeps trying.
        self.client.wait_connected(self._setting("connect_wait_s", 1.0))

    def _setting(self, key: str, default: float) -> float:
        """A number from the extra config; a bad one is warned about and
        replaced by its default, never an exception at SGLang's start-up."""
        v = self.extra.get(key, default)
        try:
            f = float(v)
            if f >= 0:
                return f
        except (TypeError, ValueError):
            pass
        logger.warning("strata: extra config %s=%r is not a number >= 0; using %s", key, v, default)
        return float(default)

    @staticmethod
    def _new_interval():
        return {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bw": [], "backup_bw": []}

    # ------------------------------------------------------------ helpers

    def _warn_once(self, what: str, msg: str, *args):
        with self._lock:
            if what in self._warned:
                return
            self._warned.add(what)
        logger.warning(msg, *args)

    def _failed(self, op: str, e: BaseException):
        with self._lock:
            self._stats["failures"] += 1
        if isinstance(e, (Unavailable, SegmentRefused)):
            return  # the client warned once: the service went away, or a segment's registration failed
        if isinstance(e, Timeout):
            self.client.note_failure(e)  # one warning per outage, whatever fails in it
            return
        self._warn_once(
            f"{op}:{type(e).__name__}",
            "strata: %s failed (%s: %s); L3 answers misses/failures for it. Further failures of this kind "
            "are logged at debug level",
            op,
            type(e).__name__,
            str(e),
        )
        logger.debug("strata: %s failed", op, exc_info=True)

    def _item_failed(self, op: int, res):
        """A page part the service did not store or read, for another reason than
        a miss: logged with the service's reason, once a minute per kind."""
        kind = ("store" if op == wire.PUT else "read", res.status)
        now = time.monotonic()
        with self._lock:
            last, quiet = self._item_log.get(kind, (None, 0))
            if last is not None and now - last < 60:
                self._item_log[kind] = (last, quiet + 1)
                return
            self._item_log[kind] = (now, 0)
        name = (
            wire.STATUS_NAMES[res.status] if 0 <= res.status <= wire.MAX_STATUS else str(res.status)
        )
        logger.warning(
            "strata: the node service did not %s a page: %s: %s; that page %s. Failures of this kind are "
            "logged at most once a minute%s",
            kind[0],
            name,
            res.message or "(no reason given)",
            "is not in L3" if op == wire.PUT else "is a miss",
            f" ({quiet} more since the last line)" if quiet else "",
        )

    # ------------------------------------------------------------ registration

    def _register(self, host, name) -> Optional[Pool]:
        """Register host as pool name, releasing the segments of a pool it replaces,
        and wait (within the timeout) until its memory is registered."""
        name = _name(name)
        with self._lock:
            p = self._pools.get(name)
            if p is not None and p.host is not host:
                p = None
        if p is None:
            p = Pool(name, host, self)
            if p.disabled:
                self._warn_once("pool:" + name, "strata: %s; this pool runs without L3", p.disabled)
            elif p.copy:
                self._warn_once("copy:" + name, "strata: %s", p.copy_reason)
            with self._lock:
                old = self._pools.get(name)
                self._pools[name] = p
                live = {id(s) for q in self._pools.values() for s in q.segments()}
            if old is not None and old is not p:
                # SGLang replaced the pool: its memfds are SGLang's no more.
                # Unregistering them and closing our duplicates releases them
                # (a pool re-registered 80 times kept 80 segments and their memory).
                gone = {id(s): s for s in old.segments() if id(s) not in live}
                for s in gone.values():
                    self.client.remove_segment(s)
                # SGLang's base class keeps the pool register_mem_pool_host was
                # given: a KV pool replaced by name replaces it too, or the
                # memory of the first pool would live as long as the plugin.
                if getattr(self, "mem_pool_host", None) is old.host:
                    self.mem_pool_host = host
        segs = p.segments()
        if p.copy and not p.disabled:
            segs = [self._staging_segment()]
        if segs:
            self.client.ensure_registered(segs, self.timeout)
        return p

    def _pool(self, name) -> Optional[Pool]:
        with self._lock:
            return self._pools.get(_name(name))

    def register_mem_pool_host(self, mem_pool_host):
        """Register SGLang's host pool (a pool, or a HostPoolGroup of them)."""
        try:
            super().register_mem_pool_host(mem_pool_host)
            if hasattr(mem_pool_host, "entries") and hasattr(mem_pool_host, "anchor_entry"):
                for entry in list(mem_pool_host.entries):
                    self._register(entry.host_pool, entry.name)
            else:
                self._register(mem_pool_host, PoolName.KV)
        except Exception as e:  # noqa: BLE001 - never raise into SGLang
            self._failed("register_mem_pool_host", e)

    def register_mem_host_pool_v2(self, host_pool, host_pool_name):
        """Register one pool by name (KV, DRAFT, DRAFT_SWA, ...), also at run time."""
        try:
            super().register_mem_host_pool_v2(host_pool, host_pool_name)
            self._register(host_pool, host_pool_name)
        except Exception as e:  # noqa: BLE001
            self._failed("register_mem_host_pool_v2", e)

    # ------------------------------------------------------------ v1: the KV pool

    def _v1(self, op: int, keys, host_indices) -> List[bool]:
        keys = list(keys or [])
        try:
            res = self._timed(op, [(self._pool(PoolName.KV), keys, host_indices)])[0]
        except Exception as e:  # noqa: BLE001
            self._failed("batch_get_v1" if op == wire.GET else "batch_set_v1", e)
            res = [False] * len(keys)
        return res

    def _timed(self, op: int, jobs) -> List[List[bool]]:
        """_transfer, counted for get_stats: pages asked and moved, GB/s."""
        t0 = time.monotonic()
        before = self._stats["get_bytes" if op == wire.GET else "set_bytes"]
        out = self._transfer(op, jobs)
        secs = time.monotonic() - t0
        ok = sum(sum(1 for r in res if r) for res in out)
        asked = sum(len(res) for res in out)
        with self._lock:
            moved = self._stats["get_bytes" if op == wire.GET else "set_bytes"] - before
            gbps = moved / secs / 1e9 if secs > 0 and moved > 0 else 0.0
            if op == wire.GET:
                self._stats["get_pages"] += asked
                self._stats["get_hits"] += ok
                self._interval["prefetch_pgs"].append(ok)
                self._interval["prefetch_bw"].append(gbps)
            else:
                self._stats["set_pages"] += asked
                self._stats["set_ok"] += ok
                self._interval["backup_pgs"].append(ok)
                self._interval["backup_bw"].append(gbps)
            for k in self._interval:  # a scheduler that never asks keeps a bounded list
                del self._interval[k][:-4096]
        return out

    def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        """Read the keys' pages into the KV host pool's pages: one request."""
        return self._v1(wire.GET, keys, host_indices)

    def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        """Write the KV host pool's pages as the keys' objects: one request."""
        return self._v1(wire.PUT, keys, host_indices)

    def batch_exists(self, keys, extra_info=None) -> int:
        """How many leading keys are stored (every part, this layout): one request."""
        try:
            return int(self._exists(self._pool(PoolName.KV), list(keys or [])))
        except Exception as e:  # noqa: BLE001
            self._failed("batch_exists", e)
            return 0

    # ------------------------------------------------------------ v2: several pools

    def _pool_hit(self, t: PoolTransfer, keys: List[str], kv_pages: int) -> int:
        pool = self._pool(t.name)
        if t.hit_policy == PoolHitPolicy.TRAILING_PAGES:
            trailing = max(1, len(t.keys) if t.keys else 1)
            end = kv_pages
            while end > 0:
                start = max(0, end - trailing)
                got = self._exists(pool, keys[start:end])
                if got == end - start:
                    return end
                end = start + got  # every window that holds keys[start+got] misses
            return 0
        return self._exists(pool, keys[:kv_pages])

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None):
        """The KV hit, clamped to what every other pool of the request has."""
        try:
            keys = list(keys or [])
            kv = self._exists(self._pool(PoolName.KV), keys)
            hits = {PoolName.KV: kv} if kv else {}
            final = kv
            for t in pool_transfers or []:
                if final == 0:
                    break
                b = self._pool_hit(t, keys, kv)
                if b:
                    hits[t.name] = b
                final = min(final, b)
            return PoolTransferResult(final, hits)
        except Exception as e:  # noqa: BLE001
            self._failed("batch_exists_v2", e)
            return PoolTransferResult(0, {})

    def _v2(self, op: int, transfers) -> Dict[Any, List[bool]]:
        transfers = list(transfers or [])
        out = {t.name: [False] * len(t.keys or []) for t in transfers}
        try:
            jobs = [(self._pool(t.name), list(t.keys or []), t.host_indices) for t in transfers]
            for t, res in zip(transfers, self._timed(op, jobs)):
                out[t.name] = res
        except Exception as e:  # noqa: BLE001
            self._failed("batch_get_v2" if op == wire.GET else "batch_set_v2", e)
        return out

    def batch_get_v2(self, transfers, extra_info=None) -> dict:
        """Read each transfer's pages into its pool; results keyed by pool name."""
        return self._v2(wire.GET, transfers)

    def batch_set_v2(self, transfers, extra_info=None) -> dict:
        """Write each transfer's pages from its pool; results keyed by pool name."""
        return self._v2(wire.PUT, transfers)

    # ------------------------------------------------------------ the rest

    def clear(self) -> bool:
        """Objects in strata serve are shared by every engine of the node: not removed."""
        self._warn_once(
            "clear",
            "strata: clear() leaves the node service's objects in place: they are shared by every engine on the "
            "node and age out least recently used. To drop them all, restart strata serve",
        )
        return False

    def get_stats(self):
        """Pages and GB/s of each call since the last get_stats, as SGLang's
        StorageMetrics; None when this SGLang has none (its scheduler then
        makes an empty one). The totals are in strata_stats()."""
        try:
            with self._lock:
                interval, self._interval = self._interval, self._new_interval()
            if self._metrics_cls is None:
                self._metrics_cls = _storage_metrics_class() or False
            if not self._metrics_cls:
                return None
            m = self._metrics_cls()
            m.prefetch_pgs.extend(interval["prefetch_pgs"])
            m.backup_pgs.extend(interval["backup_pgs"])
            m.prefetch_bandwidth.extend(interval["prefetch_bw"])
            m.backup_bandwidth.extend(interval["backup_bw"])
            return m
        except Exception as e:  # noqa: BLE001
            self._failed("get_stats", e)
            return None

    def strata_stats(self) -> dict:
        """The plugin's totals since it started, and its connection's state."""
        with self._lock:
            out = dict(self._stats)
        out["connected"] = self.client.connected
        out["connects"] = self.client.connects
        out["revision"] = self.client.revision  # the connection's protocol revision; 0: none
        return out

    def pool_status(self) -> Dict[str, str]:
        """Each registered pool: "enabled", "copy path: ...", or why it runs without L3."""
        with self._lock:
            pools = dict(self._pools)
        stage = self._stage
        out = {}
        for name, p in pools.items():
            if p.disabled:
                out[name] = p.disabled
                continue
            segs = p.segments() or ([stage.seg] if p.copy and stage is not None else [])
            refused = [s.refused for s in segs if s.refused]
            failing = [s.failing for s in segs if s.failing and not s.refused]
            if refused:
                out[name] = "refused: " + refused[0]
            elif failing:
                out[name] = "retrying its registration: " + failing[0]
            elif p.copy:
                out[name] = "enabled (copy path: not in memory strata serve can map)"
            else:
                out[name] = "enabled"
        return out

    def close(self):
        """Stop reconnecting, close the connection and the descriptors it holds.
        Safe at any time, twice, and concurrently with calls (they then fail)."""
        try:
            self.client.close()
            self._close_staging()
        except Exception as e:  # noqa: BLE001
            self._failed("close", e)
