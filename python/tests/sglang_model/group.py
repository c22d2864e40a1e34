"""Host pool groups: since SGLang made the unified radix cache the path for every
model, a backend's ``register_mem_pool_host`` gets a ``HostPoolGroup``, not a
pool. A group has ``entries`` and an ``anchor_entry`` (the KV pool, whose slots
the sidecars share), forwards the anchor's geometry and slot allocator, and has
no ``fd`` of its own; each entry is then registered again by name with
``register_mem_host_pool_v2``."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Optional


@dataclasses.dataclass
class PoolEntry:
    name: Any  # a PoolName
    host_pool: Any
    device_pool: Any = None
    layer_mapper: Optional[Callable[[int], Optional[int]]] = None
    is_primary_index_anchor: bool = False
    host_evict_fn: Optional[Callable] = None
    device_evict_fn: Optional[Callable] = None


class HostPoolGroup:
    """The pools that cache the same tokens (target KV and its draft, ...)."""

    _FORWARDED = ("layout", "page_size", "size", "device", "dtype", "kv_buffer", "allocator")

    def __init__(self, entries):
        if not entries:
            raise ValueError("a host pool group needs at least one pool")
        self.entries = list(entries)
        self.entry_map = {e.name: e for e in self.entries}
        anchors = [e for e in self.entries if e.is_primary_index_anchor]
        self.anchor_entry = anchors[0] if anchors else self.entries[0]

    def __getattr__(self, name):
        # Only the anchor's geometry and allocator show through: a group has
        # no fd, no fds of its own.
        if name in HostPoolGroup._FORWARDED:
            return getattr(self.__dict__["anchor_entry"].host_pool, name)
        raise AttributeError(name)

    def add_entry(self, entry: PoolEntry) -> None:
        if entry.name in self.entry_map:
            raise ValueError(f"host pool {entry.name} is in the group already")
        self.entries.append(entry)
        self.entry_map[entry.name] = entry

    def get_pool(self, name):
        return self.entry_map[name].host_pool

    @property
    def anchor(self):
        return self.anchor_entry.host_pool

    def get_page_buffer_meta(self, indices):
        return self.anchor.get_page_buffer_meta(indices)

    def alloc(self, need: int):
        return self.anchor.alloc(need)

    def free(self, indices) -> int:
        return self.anchor.free(indices)

    def available_size(self) -> int:
        return self.anchor.available_size()

    def get_data_page(self, index, flat: bool = True):
        return self.anchor.get_data_page(index, flat)

    def get_dummy_flat_data_page(self):
        return self.anchor.get_dummy_flat_data_page()

    def set_from_flat_data_page(self, index, data_page) -> None:
        self.anchor.set_from_flat_data_page(index, data_page)

    def clear(self) -> None:
        for e in self.entries:
            e.host_pool.clear()
