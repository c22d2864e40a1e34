"""The types a HiCache storage backend meets: the model's version of SGLang's
``sglang.srt.mem_cache.hicache_storage`` module (what the plugin imports).

Written from SGLang's interface as the plugin sees it, not from its files: a
backend subclasses ``HiCacheStorage``, is built from a ``HiCacheStorageConfig``,
and answers v1 calls (one KV pool, page keys and host indices) and v2 calls (one
``PoolTransfer`` per pool, results keyed by pool name).
"""

from __future__ import annotations

import abc
import dataclasses
import enum
from typing import Any, Dict, List, Optional

# How many pages SGLang's controllers put in one batch_get_v1/batch_set_v1 (and
# in one batch_exists on the HiCacheController's hit query).
STORAGE_BATCH_SIZE = 128


def _config_fields():
    """HiCacheStorageConfig's fields, in SGLang's order, with the model's notes.

    The first ten are positional in SGLang; the rest have defaults, and the
    last three (dp_rank, dp_size, kv_cache_dtype) arrive upstream after the
    pinned commit: a backend reads every field with getattr.
    """
    required = (
        ("tp_rank", int),  # the attention TP rank under DP attention
        ("tp_size", int),
        ("pp_rank", int),
        ("pp_size", int),
        ("attn_cp_rank", int),
        ("attn_cp_size", int),
        ("is_mla_model", bool),  # "rank replicated": MLA and DeepSeek V4 pools
        ("enable_storage_metrics", bool),
        ("is_page_first_layout", bool),
        ("model_name", Optional[str]),
    )
    optional = (
        ("tp_lcm_size", Optional[int], None),
        ("should_split_heads", bool, False),
        ("extra_config", Optional[dict], None),
        ("dp_rank", int, 0),
        ("dp_size", int, 1),
        ("kv_cache_dtype", Optional[str], None),
    )
    return list(required) + [(n, t, dataclasses.field(default=d)) for n, t, d in optional]


HiCacheStorageConfig = dataclasses.make_dataclass("HiCacheStorageConfig", _config_fields())
HiCacheStorageConfig.__doc__ = "What SGLang tells a backend about the rank that builds it."


@dataclasses.dataclass
class HiCacheStorageExtraInfo:
    """Passed with v1 and (upstream, after the pin) v2 calls: the keys of the
    pages before the batch, when the operator asked for them."""

    prefix_keys: Optional[List[str]] = None
    extra_info: Optional[dict] = None


# Names of host pools: the KV pool and its sidecars (draft KV for EAGLE, SWA
# windows, Mamba states, DSA indexer keys). A str enum, so "kv" == PoolName.KV,
# and str() of one is its value.
PoolName = enum.Enum(
    "PoolName",
    [
        (v.upper(), v)
        for v in ("kv", "mamba", "swa", "indexer", "draft", "draft_indexer", "draft_swa")
    ],
    type=str,
)
PoolName.__str__ = lambda self: str(self.value)


# How a sidecar pool's pages count in batch_exists_v2: all the KV hit's pages,
# or only the last len(keys) of them (state that covers a tail).
PoolHitPolicy = enum.Enum(
    "PoolHitPolicy", [("ALL_PAGES", "all_pages"), ("TRAILING_PAGES", "trailing_pages")], type=str
)


@dataclasses.dataclass
class PoolTransfer:
    """One pool's part of a v2 call: its keys and host indices (storage side),
    or host and device indices (the L1/L2 side). indices_from_pool names the
    pool whose indices this one reuses (a draft pool shares the KV slots)."""

    name: PoolName
    host_indices: Any = None
    device_indices: Any = None
    keys: Optional[List[str]] = None
    hit_policy: PoolHitPolicy = PoolHitPolicy.ALL_PAGES
    nodes_to_load: Optional[List[Any]] = None
    indices_from_pool: Optional[PoolName] = None


def leading_hits(results: Dict[Any, List[bool]]) -> Dict[Any, int]:
    """Per pool, how many pages from the first one succeeded: a sidecar's pages
    are usable only as a prefix."""
    out = {}
    for name, oks in results.items():
        run = 0
        for ok in oks:
            if not ok:
                break
            run += 1
        out[name] = run
    return out


@dataclasses.dataclass
class PoolTransferResult:
    """batch_exists_v2's answer: the usable KV prefix and each pool's hit."""

    kv_hit_pages: int
    extra_pool_hit_pages: Dict[Any, int]

    @classmethod
    def empty(cls) -> "PoolTransferResult":
        return cls(0, {})

    def update_kv_hit_pages(self, pages: int) -> None:
        self.kv_hit_pages = max(self.kv_hit_pages, pages)

    def update_extra_pool_hit_pages(self, results: Dict[Any, List[bool]]) -> None:
        # A controller passes a v2 call's per-page results straight in: a
        # backend that answered None or a non-list kills the calling thread.
        self.extra_pool_hit_pages.update(leading_hits(results))


class HiCacheStorage(abc.ABC):
    """The base class SGLang's factory insists on (issubclass) for a dynamic
    backend. The zero-copy and v2 methods raise until a backend overrides
    them: a None would kill the controller thread that indexes it."""

    def register_mem_pool_host(self, mem_pool_host) -> None:
        self.mem_pool_host = mem_pool_host

    def register_mem_host_pool_v2(self, host_pool, host_pool_name) -> None:
        pools = self.__dict__.setdefault("registered_pools", {})
        pools[host_pool_name] = host_pool

    def batch_exists_v2(self, keys, pool_transfers=None, extra_info=None) -> PoolTransferResult:
        raise NotImplementedError("batch_exists_v2")

    def batch_get_v2(self, transfers, extra_info=None) -> Dict[Any, List[bool]]:
        raise NotImplementedError("batch_get_v2")

    def batch_set_v2(self, transfers, extra_info=None) -> Dict[Any, List[bool]]:
        raise NotImplementedError("batch_set_v2")

    def batch_get_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        raise NotImplementedError("batch_get_v1")

    def batch_set_v1(self, keys, host_indices, extra_info=None) -> List[bool]:
        raise NotImplementedError("batch_set_v1")

    @abc.abstractmethod
    def get(self, key, target_location=None, target_sizes=None):
        """The page of key into target_location, returned; None on a miss."""

    @abc.abstractmethod
    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """A list: the filled target or None, per key."""

    @abc.abstractmethod
    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        """Store value under key."""

    @abc.abstractmethod
    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        """True only when every value was stored."""

    @abc.abstractmethod
    def exists(self, key) -> bool:
        """Whether key is stored."""

    def batch_exists(self, keys, extra_info=None) -> int:
        """How many leading keys are stored (one exists() each unless overridden)."""
        for i, k in enumerate(keys):
            if not self.exists(k):
                return i
        return len(keys)

    def clear(self) -> None:
        return None

    def get_stats(self):
        return None


@dataclasses.dataclass
class StorageMetrics:
    """What get_stats() hands the scheduler's metrics collector (SGLang's
    observability.metrics_collector.StorageMetrics): lists of per-call counts."""

    prefetch_pgs: List[int] = dataclasses.field(default_factory=list)
    backup_pgs: List[int] = dataclasses.field(default_factory=list)
    prefetch_bandwidth: List[float] = dataclasses.field(default_factory=list)
    backup_bandwidth: List[float] = dataclasses.field(default_factory=list)
