"""vLLM's CPU-tier rows, as the node service sees them.

vLLM's primary tier keeps its rows in a file of its own on /dev/shm (mode
0600, one row of ``strides[0]`` bytes per block), which the scheduler maps
and hands the tier as a memoryview. The tier registers that very file with
the service, so the service copies between the rows and its arena with no
copy in this process (zero-copy). It first makes sure the file it opened is
the memory of the view (/proc/self/maps names the inode the view's address
is mapped from), owned by this user and private: a file someone else put at
the path must never receive or give rows.

Where that cannot be (an older vLLM with the rows elsewhere, another
platform), the tier copies rows through a staging memfd of its own instead,
with one warning: Staging.
"""

from __future__ import annotations

import mmap
import os
import stat
from typing import Optional, Tuple

import numpy as np


class RowsUnavailable(Exception):
    """The CPU tier's file cannot be registered; the message says why."""


def view_address(view: memoryview) -> int:
    """The address of the first byte of view."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)


def _mapping_of(addr: int) -> Optional[Tuple[int, int, int, int]]:
    """(start, file offset, device, inode) of the mapping addr lies in."""
    with open("/proc/self/maps") as f:
        for line in f:
            parts = line.split()
            lo, hi = (int(x, 16) for x in parts[0].split("-"))
            if lo <= addr < hi:
                major, minor = (int(x, 16) for x in parts[3].split(":"))
                return lo, int(parts[2], 16), os.makedev(major, minor), int(parts[4])
    return None


def rows_path(spec) -> Optional[str]:
    """Where vLLM keeps its CPU tier's rows for spec's engine."""
    cfg = getattr(spec, "config", None)
    engine = getattr(cfg, "engine_id", None) or getattr(spec, "_engine_id", None)
    if not engine:
        return None
    return f"/dev/shm/vllm_offload_{engine}.mmap"


def open_rows(path: Optional[str], view: memoryview) -> int:
    """A descriptor of the file whose mapping view is, checked; raises
    RowsUnavailable saying why not."""
    if not path:
        raise RowsUnavailable("vLLM gave no engine id to find its CPU tier's file by")
    try:
        fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as e:
        raise RowsUnavailable(f"opening {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RowsUnavailable(f"{path} is not a regular file")
        if st.st_uid != os.getuid() or st.st_mode & 0o077:
            raise RowsUnavailable(
                f"{path} is owned by uid {st.st_uid} with mode {stat.S_IMODE(st.st_mode):o}, not this "
                f"user's (uid {os.getuid()}) alone: it is not vLLM's file of this engine"
            )
        need = view.nbytes
        if st.st_size < need:
            raise RowsUnavailable(f"{path} holds {st.st_size} bytes, the rows {need}")
        addr = view_address(view)
        m = _mapping_of(addr)
        if m is None or (m[2], m[3]) != (st.st_dev, st.st_ino) or m[1] + (addr - m[0]) != 0:
            raise RowsUnavailable(
                f"the CPU tier's rows are not the memory of {path} from its first byte"
            )
        return fd
    except BaseException:
        os.close(fd)
        raise


class Staging:
    """A memfd of `rows` rows of stride bytes that rows are copied through when
    vLLM's own file cannot be registered."""

    def __init__(self, rows: int, stride: int):
        self.rows, self.stride = rows, stride
        self.fd = os.memfd_create("strata-vllm-staging", os.MFD_CLOEXEC)
        try:
            os.ftruncate(self.fd, rows * stride)
            self.mm = mmap.mmap(self.fd, rows * stride, flags=mmap.MAP_SHARED)
        except BaseException:
            os.close(self.fd)
            raise
        self.buf = np.frombuffer(self.mm, dtype=np.uint8).reshape(rows, stride)

    def close(self):
        self.buf = None
        try:
            self.mm.close()
        except (BufferError, ValueError):
            pass  # a view still refers to it: the mapping goes with the process
        os.close(self.fd)
