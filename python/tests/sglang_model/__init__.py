"""The project's own model of SGLang's side of the HiCache storage contract.

The plugin's tests drive it through this model always, and through SGLang's
real classes when a fetched copy is present (``STRATA_SGLANG_DIR``; see the
tests' harness). It is written from SGLang's interface and from facts measured
with its real classes, never copied from SGLang's files: the ``dynamic``
factory and the storage config, host pools in every layout with their
allocators (an unsealable memfd per buffer for shm, anonymous memory
otherwise), host pool groups, and the controllers whose threads call a backend.

``install()`` puts the one module the plugin imports from SGLang,
``sglang.srt.mem_cache.hicache_storage``, and the metrics module its
``get_stats`` looks for, under their SGLang names: the plugin code is the same
on both sides.
"""

from __future__ import annotations

import sys
import types

from . import contract
from .contract import (
    HiCacheStorage,
    HiCacheStorageConfig,
    HiCacheStorageExtraInfo,
    PoolHitPolicy,
    PoolName,
    PoolTransfer,
    PoolTransferResult,
    StorageMetrics,
)
from .controller import HiCacheController
from .factory import Ranks, StorageBackendFactory
from .group import HostPoolGroup, PoolEntry
from .host_pools import DeviceMHA, DeviceMLA, MHAHostPool, MLAHostPool, StateHostPool
from .hybrid import HybridCacheController
from .memory import page_hashes

__all__ = [
    "DeviceMHA",
    "DeviceMLA",
    "HiCacheController",
    "HiCacheStorage",
    "HiCacheStorageConfig",
    "HiCacheStorageExtraInfo",
    "HostPoolGroup",
    "HybridCacheController",
    "MHAHostPool",
    "MLAHostPool",
    "PoolEntry",
    "PoolHitPolicy",
    "PoolName",
    "PoolTransfer",
    "PoolTransferResult",
    "Ranks",
    "StateHostPool",
    "StorageBackendFactory",
    "StorageMetrics",
    "install",
    "page_hashes",
]

CONTRACT_MODULE = "sglang.srt.mem_cache.hicache_storage"
METRICS_MODULE = "sglang.srt.observability.metrics_collector"


def install():
    """Make the plugin's SGLang imports resolve to the model. Refuses to run
    over a real SGLang already imported: one process, one side."""
    real = sys.modules.get(CONTRACT_MODULE)
    if real is not None and getattr(real, "__sglang_model__", False) is False:
        raise RuntimeError("SGLang's own classes are imported already: one side per process")
    names = ["sglang", "sglang.srt", "sglang.srt.mem_cache", "sglang.srt.observability"]
    for name in names:
        if name not in sys.modules:
            pkg = types.ModuleType(name)
            pkg.__path__ = []
            pkg.__sglang_model__ = True
            sys.modules[name] = pkg
    contract.__sglang_model__ = True
    sys.modules[CONTRACT_MODULE] = contract
    metrics = types.ModuleType(METRICS_MODULE)
    metrics.StorageMetrics = StorageMetrics
    metrics.__sglang_model__ = True
    sys.modules[METRICS_MODULE] = metrics
