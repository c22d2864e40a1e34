"""SGLang's host pools as the plugin meets them: the model's own.

A host pool is the engine's L2: one buffer (MHA: K and V halves) of ``size``
token slots, ``page_size`` slots a page, in one of SGLang's layouts, allocated
by the allocator the storage backend asked for. The plugin reads a pool's
attributes (``layout``, ``dtype``, ``page_size``, ``size``, ``layer_num``,
``head_num``/``head_dim`` or ``kv_cache_dim``, ``allocator``), asks
``get_page_buffer_meta`` where each page's bytes are, and moves them; tests
write and read pages with ``get_data_page``/``set_from_flat_data_page`` and
take slots with ``alloc``/``free``, as SGLang's controllers do.

What ``get_page_buffer_meta`` answers, measured with SGLang's classes: MHA
gives 2 pointers a page (K then V) in page_first, page_first_direct and
page_head, and 2 a layer a page in layer_first; MLA gives 1 a page, or 1 a
layer a page in layer_first. Every pointer of a page in page order, K before V.
"""

from __future__ import annotations

import threading

import torch

from .memory import AnonymousAllocator, allocator_for

# The layouts' buffer shapes as (name of each axis), outermost first: "kv" is
# the K/V half (MHA only), "tok" a token slot, "page"/"in_page" a page and a
# slot inside it, "L" layers, "H" heads, "D" head dim, "C" the MLA latent dim.
MHA_AXES = {
    "layer_first": ("kv", "L", "tok", "H", "D"),
    "page_first": ("kv", "tok", "L", "H", "D"),
    "page_first_direct": ("kv", "page", "L", "in_page", "H", "D"),
    "page_head": ("kv", "page", "H", "in_page", "L", "D"),
}
MLA_AXES = {
    "layer_first": ("L", "tok", "one", "C"),
    "page_first": ("tok", "L", "one", "C"),
    "page_first_direct": ("page", "L", "in_page", "one", "C"),
}


class DeviceMHA:
    """The attributes of an MHA device pool that a host pool reads."""

    def __init__(self, size=64, layers=3, heads=2, dim=8, dtype=torch.bfloat16, store_dtype=None):
        self.size, self.layer_num, self.head_num, self.head_dim = size, layers, heads, dim
        self.v_head_dim = dim
        self.dtype = dtype  # what the model computes in (fp8 kinds are stored as uint8)
        self.store_dtype = store_dtype or dtype
        self.start_layer, self.end_layer = 0, layers - 1
        self.device = "cpu"
        self.layer_shard_enabled = False

    def register_layer_transfer_counter(self, counter):
        self.layer_transfer_counter = counter


class DeviceMLA(DeviceMHA):
    """An MLA device pool: one latent vector (lora + rope) per token and layer."""

    def __init__(self, size=64, layers=3, lora=16, rope=8, dtype=torch.bfloat16, store_dtype=None):
        super().__init__(size, layers, 1, lora + rope, dtype, store_dtype)
        del self.head_num, self.head_dim, self.v_head_dim
        self.kv_lora_rank, self.qk_rope_head_dim = lora, rope
        self.index_head_dim = None


class SlotPool:
    """Token slots handed out a page at a time, with a double-free check."""

    def __init__(self, size: int, page_size: int):
        self.size, self.page_size = size, page_size
        self.lock = threading.RLock()
        self.clear()

    def clear(self):
        with self.lock:
            self._free = list(range(0, self.size, self.page_size))
            self._used = set()

    def available_size(self) -> int:
        with self.lock:
            return len(self._free) * self.page_size

    def alloc(self, need: int):
        if need % self.page_size:
            raise ValueError(f"{need} slots is not a whole number of {self.page_size}-slot pages")
        with self.lock:
            pages = need // self.page_size
            if pages > len(self._free):
                return None
            got, self._free = self._free[:pages], self._free[pages:]
            self._used.update(got)
        step = torch.arange(self.page_size, dtype=torch.int64)
        if not got:
            return torch.empty(0, dtype=torch.int64)
        return (torch.tensor(got, dtype=torch.int64).unsqueeze(1) + step).reshape(-1)

    def free(self, indices) -> int:
        starts = indices.reshape(-1)[:: self.page_size].tolist()
        with self.lock:
            twice = [s for s in starts if s not in self._used]
            if twice:
                raise AssertionError(f"slots freed twice or never taken: {twice[:4]}")
            self._used.difference_update(starts)
            self._free.extend(starts)
        return int(indices.numel())


class HostPool(SlotPool):
    """What every host pool shares: sizing from the device pool, one buffer
    in a layout, pages addressed by their first token slot."""

    axes_of: dict = {}

    def __init__(
        self,
        device_pool,
        host_to_device_ratio: float = 2.0,
        page_size: int = 4,
        layout: str = "page_first",
        allocator_type: str = "default",
        pool_label: str = "kv",
    ):
        if layout not in self.axes_of:
            raise ValueError(f"{type(self).__name__} has no layout {layout!r}")
        self.device_pool = device_pool
        self.layout, self.pool_label, self.device = layout, pool_label, "cpu"
        self.dtype = device_pool.store_dtype
        self.layer_num = device_pool.layer_num
        self.start_layer, self.end_layer = device_pool.start_layer, device_pool.end_layer
        # One page more than the ratio gives: SGLang's sizing rule.
        self.page_num = int(device_pool.size * host_to_device_ratio) // page_size + 1
        super().__init__(self.page_num * page_size, page_size)
        self.allocator = allocator_for(allocator_type)
        dims = tuple(self._extent(a) for a in self.axes_of[layout])
        self.kv_buffer = self.allocator.allocate(dims, self.dtype, "cpu")
        self.fd = getattr(self.allocator, "fd", None)

    def _extent(self, axis: str) -> int:
        return {
            "kv": 2,
            "L": self.layer_num,
            "tok": self.size,
            "page": self.page_num,
            "in_page": self.page_size,
            "one": 1,
        }.get(axis) or self._geometry()[axis]

    def _geometry(self) -> dict:
        raise NotImplementedError

    def _page_view(self, index: int) -> torch.Tensor:
        """The buffer's part that holds the page starting at token slot index."""
        axes = self.axes_of[self.layout]
        cut = [slice(None)] * len(axes)
        if "tok" in axes:
            cut[axes.index("tok")] = slice(index, index + self.page_size)
        else:
            page = index // self.page_size
            cut[axes.index("page")] = slice(page, page + 1)
        return self.kv_buffer[tuple(cut)]

    def get_data_page(self, index, flat: bool = True) -> torch.Tensor:
        view = self._page_view(int(index))
        return view.flatten() if flat else view

    def get_dummy_flat_data_page(self) -> torch.Tensor:
        return torch.zeros(self._page_view(0).numel(), dtype=self.dtype)

    def set_from_flat_data_page(self, index: int, data_page: torch.Tensor) -> None:
        view = self._page_view(int(index))
        view.copy_(data_page.reshape(view.shape))

    def _page_starts(self, indices) -> torch.Tensor:
        idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1)
        if idx.numel() % self.page_size:
            raise ValueError(f"{idx.numel()} indices are not whole pages of {self.page_size}")
        return idx[:: self.page_size]

    def get_page_buffer_meta(self, indices):
        """(pointers, sizes) of every page of indices, as lists: see the module doc."""
        starts = self._page_starts(indices)
        per_token = self._token_bytes()  # one token of one layer (and one half)
        base = self.kv_buffer.data_ptr()
        if self.layout == "layer_first":
            layer = torch.arange(self.layer_num, dtype=torch.int64) * (self.size * per_token)
            runs = starts.unsqueeze(1) * per_token + layer  # (pages, layers)
            run_bytes = self.page_size * per_token
        else:
            runs = (starts * per_token * self.layer_num).unsqueeze(1)  # (pages, 1)
            run_bytes = self.page_size * per_token * self.layer_num
        runs = runs + base
        if self._halves():
            half = self.layer_num * self.size * per_token
            runs = torch.stack([runs, runs + half], 2)  # K then V, per run
        ptrs = runs.reshape(-1).tolist()
        return ptrs, [run_bytes] * len(ptrs)

    def _halves(self) -> bool:
        return self.axes_of[self.layout][0] == "kv"

    def _token_bytes(self) -> int:
        raise NotImplementedError

    def get_size_per_token(self) -> int:
        return self._token_bytes() * self.layer_num * (2 if self._halves() else 1)

    def get_ksize_per_token(self) -> int:
        return self._token_bytes() * self.layer_num


class MHAHostPool(HostPool):
    """MHA: K and V, head_num x head_dim per token and layer."""

    axes_of = MHA_AXES

    def __init__(self, device_pool, *args, **kw):
        self.head_num, self.head_dim = device_pool.head_num, device_pool.head_dim
        super().__init__(device_pool, *args, **kw)

    def _geometry(self):
        return {"H": self.head_num, "D": self.head_dim}

    def _token_bytes(self):
        return self.head_num * self.head_dim * self.kv_buffer.element_size()

    k_buffer = property(lambda self: self.kv_buffer[0], doc="the K half")
    v_buffer = property(lambda self: self.kv_buffer[1], doc="the V half")


class MLAHostPool(HostPool):
    """MLA: one latent vector per token and layer, the same on every TP rank."""

    axes_of = MLA_AXES

    def __init__(self, device_pool, *args, **kw):
        self.kv_lora_rank = device_pool.kv_lora_rank
        self.qk_rope_head_dim = device_pool.qk_rope_head_dim
        self.kv_cache_dim = self.kv_lora_rank + self.qk_rope_head_dim
        super().__init__(device_pool, *args, **kw)

    def _geometry(self):
        return {"C": self.kv_cache_dim}

    def _token_bytes(self):
        return self.kv_cache_dim * self.kv_buffer.element_size()


class StateHostPool(SlotPool):
    """A Mamba-like state pool: one slot a page (page_size 1), several state
    buffers per slot, page-first. It ignores the storage's allocator (plain
    anonymous memory whatever was asked), as SGLang's Mamba, DSA indexer and
    legacy draft pools do today: a backend must copy its pages."""

    def __init__(self, slots: int = 32, shapes=((3, 16), (2, 8)), dtype=torch.float32):
        super().__init__(slots, 1)
        self.layout, self.dtype, self.device = "page_first", dtype, "cpu"
        self.page_num = slots
        self.allocator = AnonymousAllocator()
        self.buffers = [self.allocator.allocate((slots,) + tuple(s), dtype) for s in shapes]
        self.kv_buffer = self.buffers[0]

    def get_page_buffer_meta(self, indices):
        idx = torch.as_tensor(indices, dtype=torch.int64).reshape(-1).tolist()
        ptrs, sizes = [], []
        for i in idx:
            for b in self.buffers:
                per = b[0].numel() * b.element_size()
                ptrs.append(b.data_ptr() + i * per)
                sizes.append(per)
        return ptrs, sizes

    def get_data_page(self, index, flat: bool = True):
        parts = [b[int(index)].reshape(-1).view(torch.uint8) for b in self.buffers]
        return torch.cat(parts)

    def set_from_flat_data_page(self, index: int, data_page) -> None:
        raw, at = data_page.reshape(-1).view(torch.uint8), 0
        for b in self.buffers:
            n = b[0].numel() * b.element_size()
            b[int(index)].reshape(-1).view(torch.uint8).copy_(raw[at : at + n])
            at += n

    def get_dummy_flat_data_page(self):
        return torch.zeros_like(self.get_data_page(0))
