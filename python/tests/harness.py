"""Builders for SGLang's real host pools and controllers on CPU.

SGLang's device pools are GPU objects; its CPU stubs (../shared/sglang) keep
their class names, and the host pools read only plain attributes of them. These
subclasses give them those attributes, as the stubs' README says. Everything
else (host pools, the shm allocator, the storage factory, the controllers and
their threads) is SGLang's own code.
"""

import torch

from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool, MLATokenToKVPool
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
from sglang.srt.mem_cache.hicache_storage import HiCacheStorageConfig

PAGE = 4


class _Counter:
    def register_layer_transfer_counter(self, counter):
        self.layer_transfer_counter = counter


class DeviceMHA(MHATokenToKVPool, _Counter):
    def __init__(self, size=64, layers=3, heads=2, dim=8, dtype=torch.bfloat16):
        self.size, self.layer_num, self.head_num, self.head_dim = size, layers, heads, dim
        self.v_head_dim = dim
        self.store_dtype = self.dtype = dtype
        self.start_layer, self.end_layer = 0, layers - 1
        self.device = "cpu"
        self.layer_shard_enabled = False


class DeviceMLA(MLATokenToKVPool, _Counter):
    def __init__(self, size=64, layers=3, lora=16, rope=8, dtype=torch.bfloat16):
        self.size, self.layer_num = size, layers
        self.kv_lora_rank, self.qk_rope_head_dim = lora, rope
        self.index_head_dim = None
        self.store_dtype = self.dtype = dtype
        self.start_layer, self.end_layer = 0, layers - 1
        self.device = "cpu"
        self.layer_shard_enabled = False


def host_pool(kind, layout, allocator="shm", label="kv", **dev):
    """SGLang's real host pool over a CPU device pool (ratio 2: twice its slots)."""
    if kind == "mha":
        d = DeviceMHA(**dev)
        return MHATokenToKVPoolHost(
            d,
            2.0,
            0,
            PAGE,
            layout,
            pin_memory=False,
            device="cpu",
            allocator_type=allocator,
            pool_label=label,
        )
    d = DeviceMLA(**dev)
    return MLATokenToKVPoolHost(
        d,
        2.0,
        0,
        PAGE,
        layout,
        pin_memory=False,
        device="cpu",
        allocator_type=allocator,
        pool_label=label,
    )


def storage_config(socket, tp_rank=0, tp_size=1, mla=False, model="org/model-1", **extra):
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
    cfg.update(extra)
    return HiCacheStorageConfig(
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
        extra_config=cfg,
    )


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
        flat = data.view(pool.dtype)
        pool.set_from_flat_data_page(p * pool.page_size, flat)


def indices(pool, pages):
    """Host token indices of whole pages, as SGLang passes them."""
    return torch.cat([torch.arange(p * pool.page_size, (p + 1) * pool.page_size) for p in pages])


def keys(n, tag="k"):
    import hashlib

    return [hashlib.sha256(f"{tag}-{i}".encode()).hexdigest() for i in range(n)]
