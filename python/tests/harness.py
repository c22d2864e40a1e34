"""What a plugin test builds on SGLang's side, whichever side this run drives.

``STRATA_SGLANG_SIDE`` picks it: ``model`` (the default) is the project's own
model of SGLang (tests/sglang_model); ``real`` is SGLang's classes from the
fetched copy that ``STRATA_SGLANG_DIR`` names (see sides/real.py). The test
bodies are the same on both: host pools, storage configs, the ``dynamic``
factory, host pool groups and the controllers all come from here.
"""

from __future__ import annotations

import hashlib
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
if HERE not in sys.path:
    sys.path.insert(0, HERE)

SIDE = os.environ.get("STRATA_SGLANG_SIDE", "model").strip() or "model"
if SIDE not in ("model", "real"):
    raise RuntimeError(f"STRATA_SGLANG_SIDE={SIDE!r}: want model or real")

if SIDE == "real":
    from sides import real as side

    PROBLEM = side.problem()
    if not PROBLEM:
        side.load()
else:
    from sides import model as side

    PROBLEM = ""

import torch  # noqa: E402 - after the side: the real side's stubs shim torch first

PAGE = 4

# Every host pool layout of SGLang's the plugin stores, (kind, layout).
LAYOUTS = [
    ("mha", "layer_first"),
    ("mha", "page_first"),
    ("mha", "page_first_direct"),
    ("mha", "page_head"),
    ("mla", "layer_first"),
    ("mla", "page_first"),
    ("mla", "page_first_direct"),
]

NAME = side.NAME
if not PROBLEM:
    DESCRIPTION = side.DESCRIPTION
    PoolName = side.PoolName
    PoolTransfer = side.PoolTransfer
    PoolHitPolicy = side.PoolHitPolicy
    PoolTransferResult = side.PoolTransferResult
    HiCacheStorage = side.HiCacheStorage
    HiCacheStorageExtraInfo = side.HiCacheStorageExtraInfo
    HostPoolGroup = side.HostPoolGroup
    PoolEntry = side.PoolEntry
    get_hash_str = side.get_hash_str
    HAS_STATE_POOLS = side.HAS_STATE_POOLS
    CONFIG_HAS_UPSTREAM_FIELDS = side.CONFIG_HAS_UPSTREAM_FIELDS


def device_pool(kind, **dev):
    """A CPU stand-in for SGLang's device pool (kind "mha" or "mla")."""
    return side.device_pool(kind, **dev)


def host_pool(kind, layout, allocator="shm", label="kv", **dev):
    """A host pool of SGLang's (kind "mha" or "mla") over a CPU device pool of
    size slots (64), twice as many host slots, pages of PAGE tokens."""
    return side.host_pool(kind, layout, allocator=allocator, label=label, page=PAGE, **dev)


def state_pool(slots=32, **kw):
    """A Mamba-like state pool (page size 1) in anonymous memory: model only."""
    return side.state_pool(slots, **kw)


def group(kv, **sidecars):
    """A HostPoolGroup: kv as the anchor, and each name=pool as a sidecar."""
    entries = [PoolEntry(PoolName.KV, kv, getattr(kv, "device_pool", None), lambda i: i, True)]
    for name, pool in sidecars.items():
        dev = getattr(pool, "device_pool", None)
        entries.append(PoolEntry(PoolName(name), pool, dev, lambda i: i))
    return HostPoolGroup(entries)


def extra_config(socket, **kw):
    """The plugin's inline extra config, as SGLang parses it."""
    cfg = {
        "backend_name": "strata",
        "module_path": "strata_sglang",
        "class_name": "StrataStorage",
        "interface_v1": 1,
        "allocator": "shm",
        "socket": socket,
        "timeout_s": 5,
        "reconnect_max_s": 0.2,
    }
    cfg.update(kw)
    return cfg


_CONFIG_FIELDS = ("dp_rank", "dp_size", "kv_cache_dtype", "pp_rank", "pp_size")


def storage_config(socket, tp_rank=0, tp_size=1, mla=False, model="org/model-1", **extra):
    """SGLang's HiCacheStorageConfig for the plugin on socket; dp_rank, dp_size,
    kv_cache_dtype, pp_rank and pp_size among extra go into the config."""
    fields = dict(
        tp_rank=tp_rank,
        tp_size=tp_size,
        pp_rank=0,
        pp_size=1,
        attn_cp_rank=0,
        attn_cp_size=1,
        is_mla_model=mla,
        enable_storage_metrics=False,
        is_page_first_layout=False,
        model_name=model,
    )
    for k in _CONFIG_FIELDS:
        if k in extra:
            fields[k] = extra.pop(k)
    return side.storage_config(fields, extra_config(socket, **extra))


def create_backend(socket, **kw):
    """The plugin as SGLang's dynamic factory builds it: cls(storage_config, {})."""
    return side.StorageBackendFactory.create_backend("dynamic", storage_config(socket, **kw), None)


def controller(socket, host, tp_rank=0, tp_size=1, draft=None, model="org/model-1", **extra):
    """SGLang's HiCacheController over the plugin (v1 KV; a draft pool rides
    along through the generic calls)."""
    return side.controller(
        extra_config(socket, **extra), host, tp_rank, tp_size, draft, model, PAGE
    )


def hybrid(socket, grp, tp_rank=0, tp_size=1, model="org/model-1", **extra):
    """SGLang's HybridCacheController over the plugin: a HostPoolGroup, v2 for sidecars."""
    return side.hybrid(extra_config(socket, **extra), grp, tp_rank, tp_size, model, PAGE)


def scheduler_tick(c):
    """The scheduler's end-of-step call into the backend (get_stats)."""
    side.scheduler_tick(c)


def page_bytes(pool, page):
    """The bytes of one page of pool, in the pool's own layout order (a copy)."""
    return pool.get_data_page(page * pool.page_size, flat=True).view(torch.uint8).clone()


def fill(pool, pages, seed):
    """Write distinct bytes into the given pages of pool."""
    g = torch.Generator().manual_seed(seed)
    for p in pages:
        page = pool.get_data_page(p * pool.page_size, flat=True)
        n = page.numel() * page.element_size()
        data = torch.randint(0, 255, (n,), generator=g, dtype=torch.uint8)
        pool.set_from_flat_data_page(p * pool.page_size, data.view(pool.dtype))


def indices(pool, pages):
    """Host token indices of whole pages, as SGLang passes them."""
    ps = pool.page_size
    return torch.cat([torch.arange(p * ps, (p + 1) * ps) for p in pages])


def keys(n, tag="k"):
    return [hashlib.sha256(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]
