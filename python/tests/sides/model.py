"""The model side: SGLang's side of the contract as the project models it
(tests/sglang_model). Always available: it needs torch and nothing of SGLang."""

from __future__ import annotations

import sglang_model as m

m.install()

NAME = "model"
DESCRIPTION = "the project's model of SGLang's side (tests/sglang_model)"

PoolName = m.PoolName
PoolTransfer = m.PoolTransfer
PoolHitPolicy = m.PoolHitPolicy
PoolTransferResult = m.PoolTransferResult
HiCacheStorage = m.HiCacheStorage
HiCacheStorageConfig = m.HiCacheStorageConfig
HiCacheStorageExtraInfo = m.HiCacheStorageExtraInfo
StorageMetrics = m.StorageMetrics
HostPoolGroup = m.HostPoolGroup
PoolEntry = m.PoolEntry
StorageBackendFactory = m.StorageBackendFactory
get_hash_str = m.page_hashes

# What this side can build: every scenario runs here.
HAS_STATE_POOLS = True
CONFIG_HAS_UPSTREAM_FIELDS = True  # dp_rank, dp_size, kv_cache_dtype


def device_pool(kind, **dev):
    return m.DeviceMHA(**dev) if kind == "mha" else m.DeviceMLA(**dev)


def host_pool(kind, layout, allocator="shm", label="kv", page=4, **dev):
    cls = m.MHAHostPool if kind == "mha" else m.MLAHostPool
    return cls(device_pool(kind, **dev), 2.0, page, layout, allocator, label)


def state_pool(slots=32, **kw):
    """A Mamba-like state pool that ignores the shm allocator (anonymous memory)."""
    return m.StateHostPool(slots, **kw)


def storage_config(cfg_fields: dict, extra: dict):
    return m.HiCacheStorageConfig(extra_config=extra, **cfg_fields)


def controller(extra, host, tp_rank=0, tp_size=1, draft=None, model="org/model-1", page=4):
    c = m.HiCacheController(
        host, page, model_name=model, extra_config=extra, ranks=m.Ranks(tp_rank, tp_size)
    )
    if draft is not None:
        c.set_draft_kv_pool(None, draft)
    return c


def hybrid(extra, group, tp_rank=0, tp_size=1, model="org/model-1", page=4):
    return m.HybridCacheController(
        group, page, model_name=model, extra_config=extra, ranks=m.Ranks(tp_rank, tp_size)
    )


def scheduler_tick(c):
    c.scheduler_tick()
