"""A connection's fence page: how a call that gave up knows the service has let go.

SGLang reuses the pages of a get or a put that failed at once: it hands a get's
pages to another request, writes another prefix's KV into a put's. A service
that went on copying afterwards (stopped, swapped out, slow) would write an old
object over the other request's KV, or store the new bytes under the old key.
So every Put and Get carries the call's deadline in the service's clock (the
Hello's clock_ns, converted erring early), after which the service starts no
copy for it and stores nothing it copied; and each Get names a slot of the
connection's fence page, a memfd page the client registers, where the service
counts its copies into the client's memory: it adds 1 before it looks at the
clock and subtracts 1 after the copy (node/wire/strata.proto, at Put). A call
past its deadline that reads 0 there knows that no copy runs and none can
start; otherwise it waits for the counter to fall to 0, or for the service to
close the connection, which it does only after every request of it ended.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import threading
import time

from . import wire

try:
    import fcntl
except ImportError:  # not Linux: the memfd is not sealed
    fcntl = None


class Fence:
    """The fence page of one connection and its free slots.

    Counters are read with an aligned 4-byte load (a ctypes uint32 array over
    the mapping), the size the service writes them with atomically.
    """

    def __init__(self):
        fd = os.memfd_create("strata-fence", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
        try:
            os.ftruncate(fd, wire.FENCE_BYTES)
            if fcntl is not None:
                try:
                    # The service maps it for the connection's life: it must not shrink.
                    fcntl.fcntl(
                        fd,
                        fcntl.F_ADD_SEALS,
                        fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL,
                    )
                except (AttributeError, OSError):
                    pass
            self._mm = mmap.mmap(
                fd, wire.FENCE_BYTES, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE
            )
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd  # sent with the registration, then closed (close_fd)
        self._counters = (ctypes.c_uint32 * wire.FENCE_SLOTS).from_buffer(self._mm)
        self._cond = threading.Condition()
        self._free = list(range(wire.FENCE_SLOTS, 0, -1))  # slots 1.. from the end of the list
        self._closed = False

    def close_fd(self):
        """Close the memfd once the service has it; the mapping stays."""
        if self.fd >= 0:
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = -1

    def take(self, deadline: float) -> int:
        """A free slot, waiting for one until deadline (time.monotonic()); 0 if none."""
        with self._cond:
            while not self._free:
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return 0
                self._cond.wait(left)
            return self._free.pop()

    def give(self, slot: int):
        """Give back a slot whose request is over: answered, or waited for."""
        if slot:
            with self._cond:
                self._free.append(slot)
                self._cond.notify()

    def count(self, slot: int) -> int:
        """The copies the service has under way for slot's request."""
        return self._counters[slot - 1]

    def close(self):
        """Unmap the page; nothing may read it any more."""
        self.close_fd()
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        del self._counters
        try:
            self._mm.close()
        except BufferError:
            pass  # a view is still alive; the mapping goes with it
