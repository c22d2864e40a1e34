"""Host memory as SGLang's host pools get it, and SGLang's page hash.

Two allocators, as SGLang has: its default one maps anonymous shared memory and
keeps no descriptor (a node service cannot map it: the plugin must copy), and
its shm one makes one memfd per buffer, created with MFD_CLOEXEC only, so it can
never be sealed, and keeps the descriptors in ``fds`` and the mappings in
``mms``. Measured with SGLang's real allocator: ``F_GET_SEALS`` answers
``F_SEAL_SEAL`` and the memfd's size is the buffer rounded up to a page.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import mmap
import os
import struct

import torch


def _rounded(nbytes: int) -> int:
    return max(mmap.PAGESIZE, -(-nbytes // mmap.PAGESIZE) * mmap.PAGESIZE)


def _nbytes(dims, dtype) -> int:
    return math.prod(dims) * torch.empty((), dtype=dtype).element_size()


def _as_tensor(mm, dims, dtype) -> torch.Tensor:
    return torch.frombuffer(mm, dtype=dtype, count=math.prod(dims)).reshape(dims)


class AnonymousAllocator:
    """SGLang's default host allocator: MAP_SHARED|MAP_ANONYMOUS, prefaulted,
    no descriptor. It has neither ``fds`` nor ``mms``."""

    def __init__(self):
        self.dims = self.dtype = None

    def allocate(self, dims, dtype, device="cpu") -> torch.Tensor:
        if device != "cpu":
            raise ValueError(f"host buffers live on the CPU, not {device!r}")
        self.dims, self.dtype = tuple(dims), dtype
        flags = mmap.MAP_SHARED | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
        mm = mmap.mmap(-1, _rounded(_nbytes(dims, dtype)), flags=flags)
        return _as_tensor(mm, dims, dtype)


class ShmAllocator(AnonymousAllocator):
    """SGLang's shm host allocator ("allocator": "shm" in the inline extra
    config): one unsealable memfd per buffer, descriptors kept open."""

    def __init__(self):
        super().__init__()
        self.fds = []
        self.mms = []

    # The first buffer's descriptor and mapping, as SGLang's allocator offers them.
    fd = property(lambda self: (self.fds or [None])[0])
    mm = property(lambda self: (self.mms or [None])[0])

    def allocate(self, dims, dtype, device="cpu") -> torch.Tensor:
        if device != "cpu":
            raise ValueError(f"host buffers live on the CPU, not {device!r}")
        self.dims, self.dtype = tuple(dims), dtype
        fd = os.memfd_create("sglang_model_host_pool", os.MFD_CLOEXEC)
        try:
            size = _rounded(_nbytes(dims, dtype))
            os.ftruncate(fd, size)
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0))
        except BaseException:
            os.close(fd)
            raise
        self.fds.append(fd)
        self.mms.append(mm)
        return _as_tensor(mm, dims, dtype)

    def __del__(self):
        # The pool's memory lives as long as its mappings; the descriptors go
        # with the allocator (SGLang closes them when the pool is dropped).
        fds, self.fds = list(getattr(self, "fds", ())), []
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)


def allocator_for(kind: str):
    """The allocator SGLang picks for an allocator type ("shm", else its default)."""
    return ShmAllocator() if kind == "shm" else AnonymousAllocator()


def page_hashes(token_ids, prior_hash=None, page_size=None):
    """SGLang's chained page hash: for each page, SHA-256 over the previous
    page's digest (or bytes.fromhex(prior_hash)) and the page's tokens as
    little-endian uint32, in lowercase hex. A last page may be short; with
    page_size None, one hash over every token."""
    tokens = list(token_ids)
    prev = bytes.fromhex(prior_hash) if prior_hash else b""

    def link(chunk) -> bytes:
        h = hashlib.sha256(prev)
        h.update(struct.pack("<%dI" % len(chunk), *chunk))
        return h.digest()

    if page_size is None:
        return link(tokens).hex()
    out = []
    for start in range(0, len(tokens), page_size):
        prev = link(tokens[start : start + page_size])
        out.append(prev.hex())
    return out
