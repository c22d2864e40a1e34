"""One host pool of SGLang's as the plugin stores it: its kind, object names,
format, and where its pages' bytes can be reached from the service.

Three kinds: MHA (a K and a V object a page, Mooncake's ``_{rank}_k``/``_v``),
MLA (one object a page, the same on every TP rank: ``__k``), and any other pool
that says where its pages are through ``get_page_buffer_meta`` (Mamba states,
DSA indexer keys, ...: one object a page holding every range it names, per TP
rank unless the deployment's KV is rank-replicated). A pool's memory is either
SGLang's shm memfds, registered with the service (zero copy: the service
copies straight between them and its arena), or memory the service cannot map
(SGLang's default allocator, or a pool that ignores the shm one): then its
pages move through the plugin's registered staging buffer, one more memcpy,
after one warning.
"""

from __future__ import annotations

import ctypes
import struct
from typing import List, Optional, Tuple

import numpy as np
import torch

from . import batch, names, plan

MHA_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_head")
MLA_LAYOUTS = ("layer_first", "page_first", "page_first_direct")

INLINE_FIX = (
    "SGLang picks its shm allocator only when --hicache-storage-backend-extra-config is inline JSON "
    'containing "allocator":"shm"; with @file.json it silently uses its default allocator. For zero copy, '
    "pass the config inline, e.g. --hicache-storage-backend-extra-config "
    '\'{"backend_name":"strata","module_path":"strata_sglang","class_name":"StrataStorage",'
    '"interface_v1":1,"allocator":"shm","socket":"%s"}\''
)


def mmap_base(mm) -> int:
    c = ctypes.c_char.from_buffer(mm)
    try:
        return ctypes.addressof(c)
    finally:
        del c  # release the export at once: SGLang owns the mapping's life


def own_memory(host) -> List[Tuple[int, int]]:
    """[(base, size)] of the CPU tensors a pool holds (its buffers), merged and
    sorted: the only memory the copy path reads or writes for it."""
    found = []

    def add(t):
        if isinstance(t, torch.Tensor) and t.device.type == "cpu" and t.numel():
            st = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
            found.append((st.data_ptr(), st.nbytes()))

    for v in list(vars(host).values()):
        if isinstance(v, (list, tuple)):
            for x in v:
                add(x)
        else:
            add(v)
    found.sort()
    merged = []
    for base, size in found:
        if merged and base <= merged[-1][0] + merged[-1][1]:
            b0, s0 = merged[-1]
            merged[-1] = (b0, max(s0, base + size - b0))
        else:
            merged.append((base, size))
    return merged


class Pool:
    """One registered host pool. ``disabled`` says why it has no L3, or is ""."""

    def __init__(self, name: str, host, owner):
        self.name, self.host = name, host
        self.disabled = ""
        self.copy = False  # pages move through the staging buffer
        self.segs = []  # zero copy: (base address, size, Segment), sorted by base
        self.extents = []  # copy: (base address, size) of the pool's own buffers
        self.bases = self.ends = None  # int64 arrays of the above's [base, end)
        self.model = None  # batch.PageModel, made at the first batch
        self.template = None  # plan.Template of the model, when it fits
        self.page_size = int(getattr(host, "page_size", 0) or 0)
        self.tokens = int(getattr(host, "size", 0) or 0)  # slots: host indices are below it
        self.layout = getattr(host, "layout", None)
        self.kind, ok = self._kind()
        cfg = owner.config
        self.prefix = names.namespace(cfg, owner.extra, names.kv_dtype(cfg, host))
        self.desc = self._describe()
        self.format = names.format_of(self.desc)
        self.fmt_field = b"\x11" + struct.pack("<Q", self.format)
        rank, part = owner.tp_rank, "" if name == "kv" else name + "_"
        # A rank-replicated pool (MLA KV and what rides with it) is the same on
        # every TP rank: rank 0 writes the objects every rank reads (SGLang's
        # controllers back it up from rank 0 only). A write on another rank
        # stores nothing and answers False: what is true of it.
        replicated = self.kind == "mla" or (owner.mla and self.kind == "pages" and name != "mamba")
        if self.kind == "mha":
            self.suffixes = [f"_{rank}_{part}k", f"_{rank}_{part}v"]
        elif replicated:
            self.suffixes = [f"__{part}k" if self.kind == "mla" else f"__{name}"]
        else:
            self.suffixes = [f"_{rank}_{name}"]
        self.parts = len(self.suffixes)
        self.writes = not (replicated and rank != 0)
        self.prefix_b = self.prefix.encode("utf-8")
        self.suffixes_b = [x.encode() for x in self.suffixes]
        if not ok:
            self.disabled = (
                f"host pool {name!r} ({type(host).__name__}, layout {self.layout!r}) is not one the strata "
                f"plugin stores (MHA: {', '.join(MHA_LAYOUTS)}; MLA: {', '.join(MLA_LAYOUTS)}; any other "
                "pool needs get_page_buffer_meta and a page size)"
            )
            return
        self._place(owner)

    def _kind(self):
        host = self.host
        whole = hasattr(host, "get_page_buffer_meta") and self.page_size > 0 and self.tokens > 0
        if hasattr(host, "kv_cache_dim") and not hasattr(host, "head_dim"):
            return "mla", whole and self.layout in MLA_LAYOUTS
        if hasattr(host, "head_dim") and hasattr(host, "head_num"):
            return "mha", whole and self.layout in MHA_LAYOUTS
        return "pages", whole and self._page_sizes() is not None

    def _page_sizes(self) -> Optional[List[int]]:
        """The byte sizes get_page_buffer_meta gives page 0's ranges, or None."""
        try:
            _, sizes = self.host.get_page_buffer_meta(
                torch.arange(self.page_size, dtype=torch.int64)
            )
            sizes = [int(s) for s in sizes]
        except Exception:  # noqa: BLE001 - a pool that cannot describe a page is not stored
            return None
        return sizes if sizes and min(sizes) > 0 else None

    def _describe(self) -> str:
        h, v = self.host, names.FORMAT_VERSION
        dtype = str(getattr(h, "dtype", ""))
        head = f"{v}|{self.kind}|{self.layout}|{dtype}|page={self.page_size}"
        if self.kind == "mla":
            return f"{head}|layers={getattr(h, 'layer_num', 0)}|dim={getattr(h, 'kv_cache_dim', 0)}"
        if self.kind == "mha":
            return (
                f"{head}|layers={getattr(h, 'layer_num', 0)}|heads={getattr(h, 'head_num', 0)}"
                f"|dim={getattr(h, 'head_dim', 0)}"
            )
        return f"{head}|{type(h).__name__}|sizes={self._page_sizes()}"

    def _place(self, owner):
        alloc = getattr(self.host, "allocator", None)
        fds = list(getattr(alloc, "fds", None) or [])
        mms = list(getattr(alloc, "mms", None) or [])
        if fds and len(fds) == len(mms):
            for fd, mm in zip(fds, mms):
                seg = owner.client.add_segment(fd, f"{owner.prefix}{self.name}", wait=False)
                self.segs.append((mmap_base(mm), len(mm), seg))
            self.segs.sort(key=lambda s: s[0])
            extents = [(b, n) for b, n, _ in self.segs]
        else:
            self.copy = True
            self.extents = extents = own_memory(self.host)
            if not extents:
                self.disabled = f"host pool {self.name!r} has no CPU buffer the plugin can find"
                return
            self.copy_reason = (
                f"host pool {self.name!r} ({type(self.host).__name__}) is not in memory strata serve can map "
                f"(allocator {type(alloc).__name__}): its pages move through the plugin's staging buffer, one "
                "more copy each way. " + INLINE_FIX % owner.socket
            )
        self.bases = np.array([b for b, _ in extents], dtype=np.int64)
        self.ends = np.array([b + n for b, n in extents], dtype=np.int64)

    def plan(self, host_indices: torch.Tensor, n: int):
        """The n pages of host_indices planned (plan.Affine or plan.Full), or
        None when get_page_buffer_meta's answer does not split into n pages."""
        if self.model is None:  # two threads may both make one: the same one
            self.model = batch.PageModel(self.host, self.page_size)
            self.template = plan.Template.make(self.model, self.parts, self.bases, self.ends)
        page = self.model.page_numbers(host_indices, n)
        if page is not None and self.template is not None:
            return plan.Affine(self.template, page)
        got = self.model.at(page) if page is not None else None
        if got is None:
            got = batch.meta_pointers(self.host, host_indices, n)
        if got is None:
            return None
        p = batch.plan_pages(got[0], got[1], self.parts, self.bases, self.ends)
        return None if p is None else plan.Full(*p)

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
        from strata_client.wire import varint

        return b"".join(b"\x0a" + varint(len(n)) + n for n in self.name_list(keys)) + self.fmt_field

    def segments(self):
        """The service segments this pool's pages are named in (none: copy path)."""
        return [s for _, _, s in self.segs]
