"""StrataStorage: SGLang's HiCache L3 over ``strata serve``.

SGLang loads it through its ``dynamic`` storage backend::

    --enable-hierarchical-cache --hicache-storage-backend dynamic \\
    --hicache-storage-backend-extra-config '{"backend_name":"strata","module_path":"strata_sglang",
        "class_name":"StrataStorage","interface_v1":1,"allocator":"shm","socket":"/run/strata/strata.sock"}'

The host pools SGLang allocates with its shm allocator are memfds; each one is
registered with the service once, and from then on a batch names each page's
bytes as (segment, offset, length) ranges: the service copies them with one
memcpy, no data on the socket. Every method returns what SGLang's docstrings
promise and never raises: while the service is down, slow or restarting, reads
are misses and writes report failure, after one warning, and the plugin
reconnects and registers its pools again by itself.
"""

from __future__ import annotations

import bisect
import ctypes
import hashlib
import logging
import mmap
import os
import struct
import threading
import time
from typing import Any, Dict, List, Optional

import torch

from sglang.srt.mem_cache.hicache_storage import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
)

from . import batch, wire
from .client import Client, NotRegistered, SegmentRefused, Timeout, Unavailable

logger = logging.getLogger("strata_sglang")

DEFAULT_SOCKET = "/run/strata/strata.sock"
FORMAT_VERSION = "strata-sglang/1"

MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")

_SAFE = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")


def escape_name(s: str) -> str:
    """Spell s with letters, digits, '.', '-' and _XX escapes (one per other byte).

    Injective, and the result is a valid object name for the service and its
    spill directory: a Hugging Face id "org/model" becomes "org_2fmodel".
    """
    out = []
    for b in s.encode("utf-8"):
        out.append(chr(b) if b in _SAFE else "_%02x" % b)
    e = "".join(out)
    if len(e) > 100:  # keep object names well under the service's file name limit
        e = e[:80] + "-" + hashlib.sha256(s.encode()).hexdigest()[:16]
    return e


def model_prefix(cfg: HiCacheStorageConfig, extra: dict) -> str:
    """The object name prefix of a model and pipeline/context-parallel rank.

    "{model}:" as storage/pagekey spells it, with ":pp{rank}-{size}" and
    ":cp{rank}-{size}" added only when those are parallel, so one rank's objects
    never meet another's.
    """
    model = cfg.model_name or extra.get("model") or ""
    parts = [escape_name(model)] if model else []
    if (cfg.pp_size or 1) > 1:
        parts.append(f"pp{cfg.pp_rank}-{cfg.pp_size}")
    if (getattr(cfg, "attn_cp_size", 1) or 1) > 1:
        parts.append(f"cp{cfg.attn_cp_rank}-{cfg.attn_cp_size}")
    return ":".join(parts) + ":" if parts else ""


def _format_of(desc: str) -> int:
    v = int.from_bytes(hashlib.sha256(desc.encode()).digest()[:8], "little")
    return v or 1


def _key_ok(k) -> bool:
    return isinstance(k, str) and 0 < len(k) <= 400 and k.isascii() and k.isprintable()


_PRINTABLE = bytes(range(0x20, 0x7F))


def _keys_ok(keys: List[str]) -> int:
    """How many leading keys are valid (_key_ok), checked in a few C calls.

    (str.isprintable looks every character up in the Unicode tables: 16 us for
    128 page hashes; deleting the printable bytes of the ASCII encoding is 5.)
    """
    try:
        joined = "".join(keys)
        lens = set(map(len, keys))
    except TypeError:  # not all str
        joined, lens = "\0", set()
    if joined.isascii() and not joined.encode("ascii").translate(None, _PRINTABLE):
        if not lens or (min(lens) > 0 and max(lens) <= 400):
            return len(keys)
    for i, k in enumerate(keys):
        if not _key_ok(k):
            return i
    return len(keys)


def _mmap_base(mm) -> int:
    c = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(c)
    finally:
        del c  # release the export at once: SGLang owns the mapping's life


class _Pool:
    """One registered host pool: geometry, object names, format, segments."""

    def __init__(self, name: str, host, owner: "StrataStorage"):
        self.name = name
        self.host = host
        self.disabled = ""
        self.segs = []  # (base address, size, Segment), sorted by base
        self.bases = self.ends = None  # the segments' [base, end), int64 tensors
        self.model = None  # batch.PageModel, made at the first batch
        self.page_size = int(getattr(host, "page_size", 0) or 0)
        self.tokens = int(getattr(host, "size", 0) or 0)  # slots: host indices are below it
        layout = getattr(host, "layout", None)
        self.mla = hasattr(host, "kv_cache_dim") and not hasattr(host, "head_dim")
        dtype = str(getattr(host, "dtype", ""))
        if self.mla:
            ok = layout in MLA_LAYOUTS
            self.parts = 1
            self.desc = (
                f"{FORMAT_VERSION}|mla|{layout}|{dtype}|page={self.page_size}"
                f"|layers={getattr(host, 'layer_num', 0)}|dim={getattr(host, 'kv_cache_dim', 0)}"
            )
        else:
            ok = layout in MHA_LAYOUTS and hasattr(host, "head_dim")
            self.parts = 2
            self.desc = (
                f"{FORMAT_VERSION}|mha|{layout}|{dtype}|page={self.page_size}"
                f"|layers={getattr(host, 'layer_num', 0)}|heads={getattr(host, 'head_num', 0)}"
                f"|dim={getattr(host, 'head_dim', 0)}"
            )
        self.format = _format_of(self.desc)
        self.fmt_field = b"\x11" + struct.pack("<Q", self.format)
        pool_part = "" if name == str(PoolName.KV) else name + "_"
        prefix = owner.prefix
        if self.mla:
            self.suffixes = [f"__{pool_part}k"]
        else:
            r = owner.tp_rank
            self.suffixes = [f"_{r}_{pool_part}k", f"_{r}_{pool_part}v"]
        self.prefix = prefix
        self.prefix_b = prefix.encode("utf-8")
        self.suffixes_b = [x.encode() for x in self.suffixes]
        # MLA KV is the same on every TP rank: rank 0 writes it, every rank reads it
        # (SGLang's controllers back up MLA from rank 0 only). A write called on
        # another rank stores nothing and answers False: what is true of it.
        self.writes = not (self.mla and owner.tp_rank != 0)
        if not ok or not hasattr(host, "get_page_buffer_meta") or self.page_size <= 0:
            self.disabled = (
                f"host pool {name!r} ({type(host).__name__}, layout {layout!r}) is not a layout the strata plugin "
                f"stores (MHA: {', '.join(MHA_LAYOUTS)}; MLA: {', '.join(MLA_LAYOUTS)})"
            )
            return
        alloc = getattr(host, "allocator", None)
        fds = list(getattr(alloc, "fds", None) or [])
        mms = list(getattr(alloc, "mms", None) or [])
        if not fds or len(fds) != len(mms):
            self.disabled = (
                f"host pool {name!r} was not allocated by SGLang's shm allocator ({type(alloc).__name__}), so "
                "strata serve cannot map it. SGLang picks its shm allocator only when "
                '--hicache-storage-backend-extra-config is inline JSON containing "allocator":"shm"; '
                "with @file.json it silently uses its default allocator. Fix: pass the config inline, e.g. "
                "--hicache-storage-backend-extra-config "
                '\'{"backend_name":"strata","module_path":"strata_sglang","class_name":"StrataStorage",'
                '"interface_v1":1,"allocator":"shm","socket":"' + owner.socket + "\"}'"
            )
            return
        for fd, mm in zip(fds, mms):
            seg = owner.client.add_segment(fd, f"{owner.prefix}{name}", wait=False)
            self.segs.append((_mmap_base(mm), len(mm), seg))
        self.segs.sort(key=lambda s: s[0])
        self.bases = torch.tensor([s[0] for s in self.segs], dtype=torch.int64)
        self.ends = torch.tensor([s[0] + s[1] for s in self.segs], dtype=torch.int64)

    def pointers(self, host_indices: torch.Tensor, n: int):
        """(ptrs, sizes), each (n pages, elements), as get_page_buffer_meta says."""
        if self.model is None:  # two threads may both make one: the same one
            self.model = batch.PageModel(self.host, self.page_size)
        got = self.model.pointers(host_indices, n)
        if got is None:
            got = batch.meta_pointers(self.host, host_indices, n)
        return got

    def item_names(self, keys: List[str], pages: List[int]):
        """The object names of the parts of keys[p] for p in pages, in order:
        the rows of a byte matrix (batch.name_rows) when the keys are of one
        length, as SGLang's page hashes are, else a list of bytes."""
        picked = keys if len(pages) == len(keys) else [keys[p] for p in pages]
        rows = batch.name_rows(self.prefix_b, picked, self.suffixes_b)
        if rows is not None:
            return rows
        return self.name_list(picked)

    def name_list(self, keys: List[str]) -> List[bytes]:
        """The object names of the parts of each key, in order, as bytes."""
        pre, sfx = self.prefix_b, self.suffixes_b
        return [pre + k.encode() + x for k in keys for x in sfx]

    def exists_body(self, keys: List[str]) -> bytes:
        """An Exists body naming every part of each (valid) key, and the format."""
        klen = len(keys[0])
        name_len = len(self.prefix) + klen + len(self.suffixes[0])
        same = all(len(x) == len(self.suffixes[0]) for x in self.suffixes)
        if same and name_len < 0x80 and len(set(map(len, keys))) == 1:
            # Every name is the same length: one length byte (a varint under
            # 0x80) for all, and a key's names are key.join(tmpl): a handful of
            # C calls per key instead of a few per name.
            lead = "\n" + chr(name_len) + self.prefix
            tmpl = [""] + [x + lead for x in self.suffixes[:-1]] + [self.suffixes[-1]]
            text = lead + lead.join([k.join(tmpl) for k in keys])
            return text.encode("latin-1") + self.fmt_field
        varint = wire.varint
        names = self.name_list(keys)
        return b"".join(b"\x0a" + varint(len(n)) + n for n in names) + self.fmt_field


class StrataStorage(HiCacheStorage):
    """SGLang HiCacheStorage over the node service (``strata serve``).

    extra_config keys (all optional but the loader's): ``socket`` (default
    /run/strata/strata.sock, or $STRATA_SOCKET), ``timeout_s`` (per call, 5),
    ``connect_wait_s`` (how long the constructor waits for the service, 1),
    ``reconnect_min_s`` / ``reconnect_max_s`` (backoff, 0.05 to 2),
    ``staging_bytes`` (copy-path buffer, 64 MiB), ``model`` (when SGLang passes
    no model name).

    Registering a pool returns once its memory is registered with the service,
    or after timeout_s (a stalled service; the registration then goes on in the
    background). A pool registered again under its name releases the memory of
    the pool it replaces. With MLA, TP rank 0 writes the objects every rank
    reads: a write on another rank stores nothing and answers False (SGLang
    backs up MLA from rank 0 only and never calls it).
    """

    def __init__(self, storage_config: HiCacheStorageConfig, kwargs: Optional[dict] = None):
        extra = dict(getattr(storage_config, "extra_config", None) or {})
        self.config = storage_config
        self.socket = str(extra.get("socket") or os.environ.get("STRATA_SOCKET") or DEFAULT_SOCKET)
        self.timeout = float(extra.get("timeout_s", 5.0))
        self.tp_rank = int(storage_config.tp_rank or 0)
        self.mla = bool(storage_config.is_mla_model)
        self.prefix = model_prefix(storage_config, extra)
        if not self.prefix:
            logger.warning(
                "strata: SGLang passed no model name; objects are named without a model prefix, so two models "
                'of the same geometry would share them. Pass --served-model-name or "model" in the extra config'
            )
        self.staging_bytes = int(extra.get("staging_bytes", 64 << 20))
        self._pools: Dict[str, _Pool] = {}
        self._lock = threading.Lock()
        self._stage_lock = threading.Lock()
        self._stage = None  # (mmap, tensor, Segment)
        self._warned = set()
        self._item_log = {}  # (store|read, status) -> (last logged, failures not logged since)
        self._stats = {
            "exists_calls": 0,
            "get_pages": 0,
            "get_hits": 0,
            "set_pages": 0,
            "set_ok": 0,
            "get_bytes": 0,
            "set_bytes": 0,
            "failures": 0,
        }
        self._interval = {"prefetch_pgs": [], "backup_pgs": [], "prefetch_bw": [], "backup_bw": []}
        name = f"sglang-tp{self.tp_rank}-pid{os.getpid()}"
        self.client = Client(
            self.socket,
            name,
            timeout=self.timeout,
            reconnect_min=float(extra.get("reconnect_min_s", 0.05)),
            reconnect_max=float(extra.get("reconnect_max_s", 2.0)),
        )
        # A short wait lets the first pools register at once when the service is
        # up; when it is not, SGLang starts anyway and the client keeps trying.
        self.client.wait_connected(float(extra.get("connect_wait_s", 1.0)))

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

    def _register(self, host, name) -> Optional[_Pool]:
        """Register host as pool name, releasing the segments of a pool it replaces,
        and wait (within the timeout) until its segments are registered."""
        name = str(name.value if isinstance(name, PoolName) else name)
        with self._lock:
            p = self._pools.get(name)
            if p is not None and p.host is not host:
                p = None
        if p is None:
            p = _Pool(name, host, self)
            if p.disabled:
                self._warn_once("pool:" + name, "strata: %s; this pool runs without L3", p.disabled)
            with self._lock:
                old = self._pools.get(name)
                self._pools[name] = p
                live = {id(s) for q in self._pools.values() for _, _, s in q.segs}
            if old is not None and old is not p:
                # SGLang replaced the pool: its memfds are SGLang's no more.
                # Unregistering them and closing our duplicates releases them
                # (a pool re-registered 80 times kept 80 segments and their memory).
                gone = {id(s): s for _, _, s in old.segs if id(s) not in live}
                for s in gone.values():
                    self.client.remove_segment(s)
                # SGLang's base class keeps the pool register_mem_pool_host was
                # given: a KV pool replaced by name replaces it too, or the
                # memory of the first pool would live as long as the plugin.
                if getattr(self, "mem_pool_host", None) is old.host:
                    self.mem_pool_host = host
        segs = [s for _, _, s in p.segs]
        if segs:
            self.client.ensure_registered(segs, self.timeout)
        return p

    def _pool(self, name) -> Optional[_Pool]:
        name = str(name.value if isinstance(name, PoolName) else name)
        with self._lock:
            return self._pools.get(name)

    # ------------------------------------------------------------ registration

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

    # ------------------------------------------------------------ zero copy

    def _exists(self, pool: Optional[_Pool], keys: List[str]) -> int:
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
            valid = _keys_ok(chunk)
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

    def _loadable(self, pool: _Pool) -> bool:
        """Whether the pool's segments are registered on the live connection: a
        pool whose segment the service refused (or that is being registered
        again) has no L3, and a hit would send SGLang to load pages that its
        gets then fail. Unavailable when not connected."""
        try:
            self.client.resolve([s for _, _, s in pool.segs])
        except (NotRegistered, SegmentRefused):
            return False
        return True

    def _plan(self, op: int, j: int, pool: Optional[_Pool], keys: List[str], host_indices):
        """The pages of one job that can go in a request, planned (see
        batch.plan_pages), or None when none can."""
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
        flat = host_indices.reshape(-1)
        lo, top = torch.aminmax(flat)  # 7 us for 128 pages of 64; the mask below is 50
        chosen = None  # the pages (into keys) planned, when not all of them
        if int(lo) < 0 or int(top) >= tokens or int(flat[::ps].max()) + ps > tokens:
            idx = flat.view(n, ps)
            inside = ((idx >= 0) & (idx < tokens)).all(1) & (idx[:, 0] + ps <= tokens)
            self._warn_once(
                "outside:" + pool.name,
                "strata: pool %s was given host indices outside its %d slots; those pages fail",
                pool.name,
                tokens,
            )
            chosen = inside.nonzero().flatten()
            if chosen.numel() == 0:
                return None
            host_indices = idx[chosen].reshape(-1)
        m = n if chosen is None else int(chosen.numel())
        got = pool.pointers(host_indices, m)
        if got is None:
            return None
        plan = batch.plan_pages(got[0], got[1], pool.parts, pool.bases, pool.ends)
        if plan is None:
            return None
        seg, off, length, keep, good = plan
        if not bool(good.all()):
            self._warn_once(
                "ranges:" + pool.name,
                "strata: pool %s has page buffers outside its registered memory or with more than %d "
                "ranges; those pages are not stored",
                pool.name,
                wire.MAX_RANGES,
            )
        planned = keys if chosen is None else [keys[p] for p in chosen.tolist()]
        if _keys_ok(planned) < m:  # a bad key: that page is skipped, not the batch
            good = good & torch.tensor([_key_ok(k) for k in planned], dtype=torch.bool)
        if bool(good.all()):
            pages = list(range(n)) if chosen is None else chosen.tolist()
        else:
            rows = good.nonzero().flatten()
            pages = (rows if chosen is None else chosen[rows]).tolist()
            seg, off, length, keep = seg[rows], off[rows], length[rows], keep[rows]
        if not pages:
            return None
        return j, pool, pages, pool.item_names(keys, pages), seg, off, length, keep

    def _transfer(self, op: int, jobs) -> List[List[bool]]:
        """Put or get pages of several pools in as few requests as the limits allow.

        jobs: (pool, keys, host_indices). Returns one list of bools per job: a
        page is True only when every byte of every part of it was moved.
        """
        out = [[False] * len(keys) for _, keys, _ in jobs]
        plans = []
        for j, (pool, keys, host_indices) in enumerate(jobs):
            if pool is None or pool.disabled or not keys:
                continue
            if op == wire.PUT and not pool.writes:
                continue  # MLA: rank 0 writes the objects every rank reads; this rank stores nothing
            plan = self._plan(op, j, pool, keys, host_indices)
            if plan is not None:
                plans.append(plan)
        if not plans:
            return out
        # Every pool's segments resolved on one connection, together.
        segs, seg_index = [], {}
        for plan in plans:
            for _, _, seg in plan[1].segs:
                if id(seg) not in seg_index:
                    seg_index[id(seg)] = len(segs)
                    segs.append(seg)
        conn, ids = self.client.resolve(segs)
        bodies, sizes, lengths = [], [], []
        owners = []  # (first item, job, the page of each of its items)
        for j, pool, pages, names, seg, off, length, keep in plans:
            seg_ids = torch.tensor(
                [ids[seg_index[id(x)]] for _, _, x in pool.segs], dtype=torch.int64
            )
            enc = batch.encode_pages(names, pages, pool.fmt_field, seg_ids, seg, off, length, keep)
            bodies.append(enc.body)
            owners.append((len(sizes), j, enc.pages))
            sizes += enc.sizes
            lengths += enc.lengths
            # Every planned page is True until one of its parts fails.
            if len(pages) == len(out[j]):
                out[j] = [True] * len(pages)
            else:
                for p in pages:
                    out[j][p] = True
        starts = [o[0] for o in owners]

        def owner(k):
            first, j, page_of = owners[bisect.bisect_right(starts, k) - 1]
            return j, page_of[k - first]

        body = memoryview(b"".join(bodies))
        msg = wire.Put() if op == wire.PUT else wire.Get()
        moved = 0
        # An exception here (service gone, malformed reply) fails the whole call:
        # the callers answer every page False.
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
        with self._lock:
            self._stats["get_bytes" if op == wire.GET else "set_bytes"] += moved
        return out

    def _v1(self, op: int, keys, host_indices) -> List[bool]:
        keys = list(keys or [])
        t0 = time.monotonic()
        try:
            res = self._transfer(op, [(self._pool(PoolName.KV), keys, host_indices)])[0]
        except Exception as e:  # noqa: BLE001
            self._failed("batch_get_v1" if op == wire.GET else "batch_set_v1", e)
            res = [False] * len(keys)
        self._account(op, res, time.monotonic() - t0)
        return res

    def _account(self, op, res, secs):
        ok = sum(1 for r in res if r)
        with self._lock:
            if op == wire.GET:
                self._stats["get_pages"] += len(res)
                self._stats["get_hits"] += ok
                self._interval["prefetch_pgs"].append(ok)
            else:
                self._stats["set_pages"] += len(res)
                self._stats["set_ok"] += ok
                self._interval["backup_pgs"].append(ok)

    def batch_get_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        """Read the keys' pages into the KV host pool's pages: one request."""
        return self._v1(wire.GET, keys, host_indices)

    def batch_set_v1(
        self,
        keys: List[str],
        host_indices: torch.Tensor,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> List[bool]:
        """Write the KV host pool's pages as the keys' objects: one request."""
        return self._v1(wire.PUT, keys, host_indices)

    def batch_exists(
        self, keys: List[str], extra_info: Optional[HiCacheStorageExtraInfo] = None
    ) -> int:
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

    def batch_exists_v2(
        self,
        keys: List[str],
        pool_transfers: Optional[List[PoolTransfer]] = None,
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> PoolTransferResult:
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
            for t, res in zip(transfers, self._transfer(op, jobs)):
                out[t.name] = res
        except Exception as e:  # noqa: BLE001
            self._failed("batch_get_v2" if op == wire.GET else "batch_set_v2", e)
        return out

    def batch_get_v2(
        self,
        transfers: List[PoolTransfer],
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> dict:
        """Read each transfer's pages into its pool; results keyed by pool name."""
        return self._v2(wire.GET, transfers)

    def batch_set_v2(
        self,
        transfers: List[PoolTransfer],
        extra_info: Optional[HiCacheStorageExtraInfo] = None,
    ) -> dict:
        """Write each transfer's pages from its pool; results keyed by pool name."""
        return self._v2(wire.PUT, transfers)

    # ------------------------------------------------------------ copy path

    def _flat(self, key: str):
        """Object name and format of a copy-path key ("{hash}" or "{hash}.{pool}")."""
        base, dot, pool = key.rpartition(".")
        if not dot:
            base, pool = key, str(PoolName.KV)
        kv = self._pool(PoolName.KV)
        desc = f"{FORMAT_VERSION}|flat|{pool}|{kv.desc if kv else 'none'}"
        rank = "" if self.mla else str(self.tp_rank)
        return f"{self.prefix}{base}_{rank}_{pool}_flat", _format_of(desc)

    def _staging(self, need: int):
        """The copy path's registered buffer, at least need bytes (caller holds _stage_lock)."""
        if self._stage is not None and len(self._stage[0]) >= need:
            return self._stage
        size = max(self.staging_bytes, 1 << (max(need, 1) - 1).bit_length())
        old = self._stage
        fd = os.memfd_create("strata_staging", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, size)
            try:
                import fcntl

                fcntl.fcntl(
                    fd,
                    fcntl.F_ADD_SEALS,
                    fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL,
                )
            except (ImportError, AttributeError, OSError):
                pass
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            seg = self.client.add_segment(fd, f"{self.prefix}staging")
        finally:
            os.close(fd)
        self._stage = (mm, torch.frombuffer(mm, dtype=torch.uint8), seg)
        if old is not None:
            self.client.remove_segment(old[2])
        return self._stage

    def _copy_batch(
        self, op: int, keys: List[str], tensors: List[Optional[torch.Tensor]]
    ) -> List[bool]:
        """Move whole tensors through the staging buffer; one request per buffer full."""
        n = len(keys)
        ok = [False] * n
        flat = []
        for i, (k, t) in enumerate(zip(keys, tensors)):
            if t is None or not _key_ok(k):
                continue
            b = t.detach().contiguous().view(-1).view(torch.uint8)
            if b.numel() == 0 or b.device.type != "cpu":
                continue
            flat.append((i, k, b))
        with self._stage_lock:
            need = max((b.numel() for _, _, b in flat), default=0)
            if need == 0:
                return ok
            mm, stage, seg = self._staging(need)
            cap = len(mm)
            i = 0
            while i < len(flat):
                batch, off = [], 0
                while (
                    i < len(flat)
                    and off + flat[i][2].numel() <= cap
                    and len(batch) < wire.MAX_ITEMS
                ):
                    batch.append((flat[i], off))
                    off += (flat[i][2].numel() + 63) & ~63
                    i += 1
                conn, (sid,) = self.client.resolve([seg])
                items = []
                for (_, k, b), o in batch:
                    name, fmt = self._flat(k)
                    if op == wire.PUT:
                        stage[o : o + b.numel()].copy_(b)
                    items.append(wire.Item(name, fmt, [wire.Range(sid, o, b.numel())]))
                msg = wire.Put(items) if op == wire.PUT else wire.Get(items)
                r = conn.call(msg, self.timeout)
                if len(r.results) != len(items):
                    raise wire.Malformed(f"{len(r.results)} results for {len(items)} items")
                for ((idx, _, b), o), res in zip(batch, r.results):
                    if res.status != wire.OK:
                        if op == wire.PUT or res.status != wire.NOT_FOUND:
                            self._item_failed(op, res)
                        continue
                    if op == wire.GET:
                        t = tensors[idx]
                        src = stage[o : o + b.numel()]
                        if t.is_contiguous():
                            t.view(-1).view(torch.uint8).copy_(src)
                        else:
                            t.copy_(src.view(t.dtype).view(t.shape))
                    ok[idx] = True
        return ok

    def get(
        self, key: str, target_location: Optional[Any] = None, target_sizes: Optional[Any] = None
    ):
        """Read key's object into target_location and return it; None on a miss."""
        try:
            if target_location is None:
                return None
            return (
                target_location if self._copy_batch(wire.GET, [key], [target_location])[0] else None
            )
        except Exception as e:  # noqa: BLE001
            self._failed("get", e)
            return None

    def batch_get(
        self,
        keys: List[str],
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ):
        """Read each key into its target; a list with the filled target or None per key."""
        keys = list(keys or [])
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        targets += [None] * (len(keys) - len(targets))
        try:
            ok = self._copy_batch(wire.GET, keys, targets)
        except Exception as e:  # noqa: BLE001
            self._failed("batch_get", e)
            ok = [False] * len(keys)
        return [t if good else None for t, good in zip(targets, ok)]

    def set(
        self,
        key: str,
        value: Optional[Any] = None,
        target_location: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        """Write value as key's object (write-once); True when stored."""
        try:
            return bool(self._copy_batch(wire.PUT, [key], [value])[0])
        except Exception as e:  # noqa: BLE001
            self._failed("set", e)
            return False

    def batch_set(
        self,
        keys: List[str],
        values: Optional[Any] = None,
        target_locations: Optional[Any] = None,
        target_sizes: Optional[Any] = None,
    ) -> bool:
        """Write each value as its key's object; True only when all were stored."""
        keys = list(keys or [])
        values = list(values) if values is not None else []
        if len(values) != len(keys) or not keys:
            return False
        try:
            return all(self._copy_batch(wire.PUT, keys, values))
        except Exception as e:  # noqa: BLE001
            self._failed("batch_set", e)
            return False

    def exists(self, key: str) -> bool:
        """Whether key's copy-path object is stored."""
        try:
            if not _key_ok(key):
                return False
            name, fmt = self._flat(key)
            return self.client.call(wire.Exists([name], fmt)).present == 1
        except Exception as e:  # noqa: BLE001
            self._failed("exists", e)
            return False

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
        """Counters since the last call, as SGLang's StorageMetrics when it has one."""
        try:
            with self._lock:
                interval = self._interval
                self._interval = {
                    "prefetch_pgs": [],
                    "backup_pgs": [],
                    "prefetch_bw": [],
                    "backup_bw": [],
                }
                totals = dict(self._stats)
            try:
                from sglang.srt.metrics.collector import StorageMetrics
            except Exception:  # noqa: BLE001 - older or stubbed SGLang
                totals.update(interval)
                totals["connected"] = self.client.connected
                totals["connects"] = self.client.connects
                return totals
            m = StorageMetrics()
            m.prefetch_pgs.extend(interval["prefetch_pgs"])
            m.backup_pgs.extend(interval["backup_pgs"])
            return m
        except Exception as e:  # noqa: BLE001
            self._failed("get_stats", e)
            return {}

    def pool_status(self) -> Dict[str, str]:
        """Each registered pool: "enabled", or why it runs without L3."""
        with self._lock:
            pools = dict(self._pools)
        out = {}
        for name, p in pools.items():
            if p.disabled:
                out[name] = p.disabled
                continue
            refused = [s.refused for _, _, s in p.segs if s.refused]
            failing = [s.failing for _, _, s in p.segs if s.failing and not s.refused]
            if refused:
                out[name] = "refused: " + refused[0]
            elif failing:
                out[name] = "retrying its registration: " + failing[0]
            else:
                out[name] = "enabled"
        return out

    def close(self):
        """Stop reconnecting, close the connection and the descriptors it holds."""
        try:
            self.client.close()
            with self._stage_lock:
                if self._stage is not None:
                    mm = self._stage[0]
                    self._stage = None
                    try:
                        mm.close()
                    except BufferError:
                        pass  # a tensor still views it; the mapping goes with it
        except Exception as e:  # noqa: BLE001
            self._failed("close", e)
