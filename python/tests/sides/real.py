"""The real side: SGLang's own classes from a fetched copy, on CPU.

``STRATA_SGLANG_DIR`` names a folder holding SGLang's ``python/sglang/...``
files at one commit (python/tests/sglang_copy.sh extracts them and writes the
commit to ``COMMIT``); the CPU stubs that let those files import without a GPU
are the project's own, in the shared sglang-harness folder
(``STRATA_SGLANG_HARNESS``, else ../shared/sglang-harness beside the checkout).
``problem()`` says in one line why this side cannot run, or "".
"""

from __future__ import annotations

import importlib
import os
import sys
import threading

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(os.path.dirname(HERE)))
COPY = os.environ.get("STRATA_SGLANG_DIR", "")
STUBS = os.environ.get("STRATA_SGLANG_HARNESS") or os.path.join(
    REPO, "..", "shared", "sglang-harness"
)

NAME = "real"


def commit() -> str:
    try:
        with open(os.path.join(COPY, "COMMIT")) as f:
            return f.read().strip()[:40]
    except OSError:
        return "unknown commit"


def problem() -> str:
    if not COPY:
        return (
            "SGLang's real classes: STRATA_SGLANG_DIR is not set "
            "(python/tests/sglang_copy.sh extracts a fetched SGLang into a git-ignored folder)"
        )
    if not os.path.isdir(os.path.join(COPY, "python", "sglang", "srt")):
        return f"SGLang's real classes: no python/sglang/srt under STRATA_SGLANG_DIR={COPY}"
    if not os.path.isfile(os.path.join(STUBS, "sglang_cpu_stubs.py")):
        return (
            f"SGLang's real classes: no sglang_cpu_stubs.py in {STUBS} (set STRATA_SGLANG_HARNESS)"
        )
    return ""


def load():
    """Import SGLang's classes through the CPU stubs; names this module's API."""
    if STUBS not in sys.path:
        sys.path.insert(0, STUBS)
    importlib.import_module("sglang_cpu_stubs")
    base = importlib.import_module("sglang.srt.mem_cache.pool_host.base")
    # SGLang keeps 10 GiB of available memory out of every host pool's budget,
    # a rule for a serving machine; the tests' pools are a few MiB.
    base.HICACHE_HOST_MEMORY_RESERVE_BYTES = 256 << 20
    hs = importlib.import_module("sglang.srt.mem_cache.hicache_storage")
    mph = importlib.import_module("sglang.srt.mem_cache.memory_pool_host")
    g = globals()
    for n in (
        "PoolName",
        "PoolTransfer",
        "PoolHitPolicy",
        "PoolTransferResult",
        "HiCacheStorage",
        "HiCacheStorageConfig",
        "HiCacheStorageExtraInfo",
    ):
        g[n] = getattr(hs, n)
    g["HostPoolGroup"], g["PoolEntry"] = mph.HostPoolGroup, mph.PoolEntry
    g["StorageBackendFactory"] = importlib.import_module(
        "sglang.srt.mem_cache.storage"
    ).StorageBackendFactory
    g["get_hash_str"] = importlib.import_module("sglang.srt.mem_cache.utils").get_hash_str
    g["DESCRIPTION"] = f"SGLang's real classes at {commit()} ({COPY})"
    fields = set(hs.HiCacheStorageConfig.__dataclass_fields__)
    g["CONFIG_HAS_UPSTREAM_FIELDS"] = {"dp_rank", "dp_size", "kv_cache_dtype"} <= fields


# SGLang's Mamba and DSA indexer host pools need device pool classes the CPU
# stubs do not have: the state-pool scenarios run on the model only.
HAS_STATE_POOLS = False
StorageMetrics = None  # in sglang.srt.observability, which the copy does not hold


def _device_classes():
    from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool

    class Counter:
        def register_layer_transfer_counter(self, counter):
            self.layer_transfer_counter = counter

    class DeviceMHA(MHATokenToKVPool, Counter):
        def __init__(self, size=64, layers=3, heads=2, dim=8, dtype=None, store_dtype=None):
            import torch

            self.size, self.layer_num, self.head_num, self.head_dim = size, layers, heads, dim
            self.v_head_dim = dim
            self.dtype = dtype or torch.bfloat16
            self.store_dtype = store_dtype or self.dtype
            self.start_layer, self.end_layer = 0, layers - 1
            self.device = "cpu"
            self.layer_shard_enabled = False

    class DeviceMLA(MLATokenToKVPool, Counter):
        def __init__(self, size=64, layers=3, lora=16, rope=8, dtype=None, store_dtype=None):
            import torch

            self.size, self.layer_num = size, layers
            self.kv_lora_rank, self.qk_rope_head_dim = lora, rope
            self.index_head_dim = None
            self.dtype = dtype or torch.bfloat16
            self.store_dtype = store_dtype or self.dtype
            self.start_layer, self.end_layer = 0, layers - 1
            self.device = "cpu"
            self.layer_shard_enabled = False

    return DeviceMHA, DeviceMLA


def device_pool(kind, **dev):
    mha, mla = _device_classes()
    return mha(**dev) if kind == "mha" else mla(**dev)


def host_pool(kind, layout, allocator="shm", label="kv", page=4, **dev):
    if kind == "mha":
        from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost as cls
    else:
        from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost as cls
    return cls(
        device_pool(kind, **dev),
        2.0,
        0,
        page,
        layout,
        pin_memory=False,
        device="cpu",
        allocator_type=allocator,
        pool_label=label,
    )


def state_pool(slots=32, **kw):
    raise RuntimeError("the real side has no state pool (HAS_STATE_POOLS is False)")


def storage_config(cfg_fields: dict, extra: dict):
    cfg_fields = dict(cfg_fields)
    later = {
        k: cfg_fields.pop(k) for k in ("dp_rank", "dp_size", "kv_cache_dtype") if k in cfg_fields
    }
    cfg = globals()["HiCacheStorageConfig"](extra_config=extra, **cfg_fields)  # set by load()
    for k, v in later.items():
        setattr(cfg, k, v)  # as the SGLang that has these fields passes them
    return cfg


class _Allocator:
    """The token allocator a controller asks for its device pool."""

    def __init__(self, device_pool):
        self.device_pool = device_pool

    def get_kvcache(self):
        return self.device_pool


def _build(cls, host, extra, tp_rank, tp_size, model, page):
    """One of SGLang's controllers over host (a pool or a group), as the
    scheduler of TP rank tp_rank builds it (the ranks are read at build time)."""
    from sglang.srt.runtime_context import get_parallel

    anchor = getattr(host, "anchor_entry", None)
    device = (anchor.host_pool if anchor else host).device_pool
    with get_parallel().override(tp_rank=tp_rank, tp_size=tp_size):
        return cls(
            _Allocator(device),
            host,
            page,
            tp_group=None,
            load_cache_event=threading.Event(),
            io_backend="direct",
            storage_backend="dynamic",
            model_name=model,
            storage_backend_extra_config=extra,
        )


def controller(extra, host, tp_rank=0, tp_size=1, draft=None, model="org/model-1", page=4):
    from sglang.srt.managers.cache_controller import HiCacheController

    c = _build(HiCacheController, host, extra, tp_rank, tp_size, model, page)
    if draft is not None:
        c.set_draft_kv_pool(draft.device_pool, draft)
    return c


def hybrid(extra, group, tp_rank=0, tp_size=1, model="org/model-1", page=4):
    from sglang.srt.mem_cache.hybrid_cache.hybrid_cache_controller import HybridCacheController

    return _build(HybridCacheController, group, extra, tp_rank, tp_size, model, page)


def scheduler_tick(c):
    """What the unified radix cache does with get_stats() at the end of a step
    (its module is not in the copy): None becomes an empty StorageMetrics, and
    it sets prefetch_stats on what it got and logs its lists."""
    got = c.storage_backend.get_stats()
    if got is None:
        return
    got.prefetch_stats = {}
    for f in ("prefetch_pgs", "backup_pgs", "prefetch_bandwidth", "backup_bandwidth"):
        if not isinstance(getattr(got, f), list):
            raise AssertionError(f"get_stats() answered a {type(got).__name__} without a list {f}")
