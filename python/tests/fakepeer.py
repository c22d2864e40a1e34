"""A peer on a Unix socket that speaks the node service's protocol and misbehaves on cue.

The plugin's deadlines, reconnects and registrations are tested against a real
strata serve where it can produce the fault (killed, SIGSTOPped); a peer that
trickles a reply one byte at a time, sends half a frame and stays, or closes the
connection at one exact request is made here. Each accepted connection runs the
test's handler(index, Peer) on a thread of its own; every wait is bounded, and
close() ends them all.
"""

import array
import ctypes
import mmap
import os
import socket
import threading
import time
from typing import Optional

from strata_client import wire


class Peer:
    """One accepted connection: frames in (with their descriptors) and out."""

    def __init__(self, sock: socket.socket, stop: threading.Event):
        self.sock = sock
        self.stop = stop
        self.fds = []  # descriptors received (closed by close())

    def recv(self, timeout: float = 10.0):
        """The next request as (Header, message); None when the client closed."""
        self.sock.settimeout(timeout)
        head = self._exact(wire.HEADER_SIZE)
        if head is None:
            return None
        h = wire.parse_header(head)
        body = self._exact(h.length) if h.length else b""
        if body is None:
            return None
        return h, wire.decode(h.type, body)

    def _exact(self, n: int):
        buf = b""
        while len(buf) < n:
            try:
                data, anc, _, _ = self.sock.recvmsg(n - len(buf), socket.CMSG_SPACE(16))
            except (socket.timeout, OSError):
                return None
            for level, typ, cdata in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(cdata[: len(cdata) - len(cdata) % a.itemsize])
                    self.fds.extend(a)
            if not data:
                return None
            buf += data
        return buf

    def send(self, req_id: int, msg):
        self.sock.sendall(wire.encode_frame(req_id, msg))

    def trickle(self, data: bytes, every: float):
        """Send data one byte every `every` seconds, until done, stopped or closed."""
        for i in range(len(data)):
            if self.stop.wait(every):
                return
            try:
                self.sock.send(data[i : i + 1])
            except OSError:
                return

    def hold(self):
        """Keep the connection open, sending nothing, until stopped or the client closes."""
        try:
            self.sock.settimeout(0.05)
        except OSError:
            return  # closed already
        while not self.stop.is_set():
            try:
                if self.sock.recv(1 << 16) == b"":
                    return
            except socket.timeout:
                continue
            except OSError:
                return

    def hello(
        self,
        client_id: int = 1,
        clock_ns: int = 0,
        skew_ns: Optional[int] = None,
        revision: int = 0,
        said: Optional[list] = None,
    ):
        """Answer the client's Hello; False when it sent something else or closed.

        clock_ns 0 is a service that keeps no deadlines (an older one); else the
        client registers its fence page next (see fence()). skew_ns instead
        gives a clock that runs that far ahead of ours, read once the Hello has
        arrived, as a service reads it: a clock read before the client sent
        its Hello would be earlier than any the client can expect. revision
        is the reply's (0: none, as from a service before revisions); the
        client's Hello is appended to said, when given.
        """
        got = self.recv()
        if got is None or got[0].type != wire.HELLO:
            return False
        if said is not None:
            said.append(got[1])
        if skew_ns is not None:
            clock_ns = time.monotonic_ns() + skew_ns
        reply = wire.HelloReply(client_id, "fake", wire.MAX_ITEMS, clock_ns, revision=revision)
        self.send(got[0].id, reply)
        return True

    def fence(self, segment_id: int = 99):
        """Take the client's fence page registration: its counters (a ctypes
        uint32 array over the page), or None when it sent something else."""
        got = self.recv()
        if got is None or got[0].type != wire.REGISTER_SEGMENT or not got[1].fence or not self.fds:
            return None
        mm = mmap.mmap(self.fds[-1], wire.FENCE_BYTES, flags=mmap.MAP_SHARED)
        self.send(got[0].id, wire.RegisterSegmentReply(segment_id))
        return (ctypes.c_uint32 * wire.FENCE_SLOTS).from_buffer(mm)

    def serve(self, first_segment: int = 1, batches: Optional[list] = None):
        """Answer like a healthy service until the client closes: segments get ids
        from first_segment, Ping a Pong, Exists 0, Put/Get ok for every item
        (each Put and Get appended to batches, when given)."""
        seg = first_segment
        while not self.stop.is_set():
            got = self.recv(timeout=0.2)
            if got is None:
                if self._closed():
                    return
                continue
            h, m = got
            if h.type == wire.REGISTER_SEGMENT:
                self.send(h.id, wire.RegisterSegmentReply(seg))
                seg += 1
            elif h.type == wire.UNREGISTER_SEGMENT:
                self.send(h.id, wire.Ack())
            elif h.type == wire.PING:
                self.send(h.id, wire.Pong(m.nonce))
            elif h.type == wire.EXISTS:
                self.send(h.id, wire.ExistsReply(0))
            elif h.type in (wire.PUT, wire.GET):
                if batches is not None:
                    batches.append(m)
                self.send(h.id, wire.BatchReply([wire.Result(wire.OK, "")] * len(m.items)))
            else:
                self.send(h.id, wire.Error(wire.INTERNAL, "fake peer: unexpected request"))

    def _closed(self) -> bool:
        try:
            self.sock.settimeout(0)
            return self.sock.recv(1, socket.MSG_PEEK) == b""
        except (BlockingIOError, socket.timeout):
            return False
        except OSError:
            return True

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass
        for fd in self.fds:
            try:
                os.close(fd)
            except OSError:
                pass
        self.fds = []


class FakeService:
    """Listens on path; connection number i (from 0) runs handler(i, Peer)."""

    def __init__(self, path: str, handler):
        self.path = path
        self.handler = handler
        self.stop = threading.Event()
        self.accepted = 0
        self._peers = []
        self._threads = []
        self._lock = threading.Lock()
        self._ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._ln.bind(path)
        self._ln.listen(16)
        self._ln.settimeout(0.05)
        t = threading.Thread(target=self._accept, name="fake-peer-accept", daemon=True)
        t.start()
        self._threads.append(t)

    def _accept(self):
        while not self.stop.is_set():
            try:
                s, _ = self._ln.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with self._lock:
                i = self.accepted
                self.accepted += 1
                p = Peer(s, self.stop)
                self._peers.append(p)
            t = threading.Thread(target=self._run, args=(i, p), name=f"fake-peer-{i}", daemon=True)
            t.start()
            with self._lock:
                self._threads.append(t)

    def _run(self, i, p):
        try:
            self.handler(i, p)
        except (OSError, wire.Malformed):
            pass  # the client went away mid-script: what these tests do to it
        finally:
            if not self.stop.is_set():
                p.hold()
            p.close()

    def close(self):
        self.stop.set()
        self._ln.close()
        with self._lock:
            threads = list(self._threads)
            peers = list(self._peers)
        for t in threads:
            t.join(timeout=10)
        for p in peers:
            p.close()
        try:
            os.unlink(self.path)
        except OSError:
            pass


def wait_for(cond, timeout: float = 20.0, every: float = 0.01) -> bool:
    """Poll cond() until it is true or timeout seconds pass; its last answer."""
    deadline = time.monotonic() + timeout
    while True:
        if cond():
            return True
        if time.monotonic() >= deadline:
            return bool(cond())
        time.sleep(every)
