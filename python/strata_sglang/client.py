"""A client of the node service (``strata serve``) for Python engines.

One Unix-socket connection, requests pipelined from any thread (a reader thread
hands each reply to its caller by request id), a deadline on every call that
holds whatever the peer does, and a background connector that reconnects with
backoff and registers every segment again, as ``storage/nodeclient`` does in Go.
While the service is unreachable, calls fail at once with :class:`Unavailable`;
the caller turns that into misses. A connection on which MAX_TIMEOUTS calls in a
row got no answer is dropped and made again: a hung service costs each call its
deadline only until then.
"""

from __future__ import annotations

import array
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import Dict, Optional, Tuple

from . import wire

logger = logging.getLogger("strata_sglang")

# Calls in a row that get no answer within their deadline before the
# connection is dropped and made again: a peer that stops answering (a hung
# service, half a frame and silence) is abandoned instead of costing every call
# its full deadline for as long as it keeps the socket open.
MAX_TIMEOUTS = 2


class StrataError(Exception):
    """A call to the node service failed."""


class Unavailable(StrataError):
    """The service is not connected (down, restarting, or not started yet)."""


class Timeout(StrataError):
    """A call ran past its deadline."""


class Refused(StrataError):
    """The service answered the request with an Error."""

    def __init__(self, code: int, message: str):
        name = wire.STATUS_NAMES[code] if 0 <= code <= wire.MAX_STATUS else str(code)
        super().__init__(f"node service: {name}: {message}")
        self.code = code


class _Slot:
    __slots__ = ("event", "msg", "err")

    def __init__(self):
        self.event = threading.Event()
        self.msg = None
        self.err = None


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


class Connection:
    """One session with the service: Hello done, replies dispatched by id.

    Every call ends by its deadline: connecting and the Hello together within
    timeout, each call within the timeout it is given, however slowly the peer
    sends or however much it announces (a frame body over wire.MAX_BODY is
    refused at its header, and the connection closed).
    """

    def __init__(self, path: str, timeout: float, client_name: str):
        deadline = time.monotonic() + timeout
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(timeout)
        try:
            sock.connect(path)
        except socket.timeout:
            sock.close()
            raise Timeout(
                f"connecting to the node service at {path} took over {timeout:g} s"
            ) from None
        except OSError:
            sock.close()
            raise
        self._sock = sock
        self._timeout = timeout
        self._send_lock = threading.Lock()
        self._lock = threading.Lock()
        self._pending: Dict[int, Tuple[int, _Slot]] = {}
        self._next_id = 0
        self._timeouts = 0  # calls in a row that timed out
        self.closed = False
        self.dead = threading.Event()
        self.error: Optional[BaseException] = None
        # Hello before the reader starts: a plain round trip, by the deadline.
        try:
            self._send(
                1,
                wire.Hello(wire.VERSION, client_name[: wire.MAX_NAME], os.getpid()),
                deadline=deadline,
            )
            try:
                h, msg = self._read_frame(deadline)
            except Timeout:
                raise Timeout(
                    f"the node service at {path} did not answer Hello within {timeout:g} s"
                ) from None
            if isinstance(msg, wire.Error):
                raise Refused(msg.code, msg.message)
            if not isinstance(msg, wire.HelloReply) or h.id != 1:
                raise wire.Malformed(f"answered Hello with {type(msg).__name__}")
            sock.settimeout(timeout)  # what the reader polls with, and a send's ceiling
        except socket.timeout:
            sock.close()
            raise Timeout(
                f"sending Hello to the node service at {path} took over {timeout:g} s"
            ) from None
        except BaseException:
            sock.close()
            raise
        self.hello = msg
        self._next_id = 1
        self._reader = threading.Thread(target=self._read_loop, name="strata-reader", daemon=True)
        self._reader.start()

    # -- sending

    def _send(self, req_id: int, msg, fds=(), body: Optional[bytes] = None, *, deadline: float):
        """Send one frame by deadline. Timeout when the send lock is not ours in
        time (nothing sent); socket.timeout (an OSError) when the peer stopped
        reading mid-frame: the stream is lost."""
        frame = wire.encode_frame(req_id, msg, body)
        if not self._send_lock.acquire(timeout=max(_left(deadline), 0.0)):
            raise Timeout("another request held the connection past this one's deadline")
        try:
            # The socket's timeout is shared with the reader, which treats a
            # timeout as a poll: any positive value is safe for it.
            self._sock.settimeout(max(_left(deadline), 1e-3))
            try:
                if fds:
                    anc = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds).tobytes())]
                    n = self._sock.sendmsg([frame], anc)
                    if n < len(frame):
                        self._sock.sendall(memoryview(frame)[n:])
                else:
                    self._sock.sendall(frame)
            finally:
                self._sock.settimeout(self._timeout)
        finally:
            self._send_lock.release()

    def call(self, msg, timeout: float, fds=(), body: Optional[bytes] = None):
        """Send msg and wait for its reply; returns or raises within timeout seconds.

        Raises Unavailable (the connection is gone), Timeout, Refused (an Error
        reply) or wire.Malformed (a reply that breaks the protocol). After
        MAX_TIMEOUTS timeouts in a row the connection is closed.
        """
        deadline = time.monotonic() + timeout
        slot = _Slot()
        with self._lock:
            if self.closed:
                raise Unavailable("node service connection closed")
            self._next_id += 1
            req_id = self._next_id
            self._pending[req_id] = (msg.TYPE, slot)
        try:
            self._send(req_id, msg, fds, body, deadline=deadline)
        except wire.Malformed:
            self._forget(req_id)
            raise
        except Timeout:
            self._forget(req_id)
            self._timed_out()
            raise
        except OSError as e:
            # Part of a frame may be on the socket: the stream is lost.
            self._forget(req_id)
            self.close(e)
            if isinstance(e, socket.timeout):
                raise Timeout(
                    f"the node service did not take a request within {timeout:g} s"
                ) from None
            raise Unavailable(f"send to the node service: {e}") from None
        if not slot.event.wait(max(_left(deadline), 0.0)):
            with self._lock:
                gone = self._pending.pop(req_id, None) is not None
            if gone or not slot.event.wait(1.0):  # else the reader is handing it over now
                self._timed_out()
                raise Timeout(f"no reply from the node service within {timeout:g} s")
        if isinstance(slot.err, Unavailable):
            raise slot.err
        self._answered()
        if slot.err is not None:
            raise slot.err
        return slot.msg

    def _forget(self, req_id: int):
        with self._lock:
            self._pending.pop(req_id, None)

    def _timed_out(self):
        with self._lock:
            self._timeouts += 1
            n = self._timeouts
        if n >= MAX_TIMEOUTS:
            self.close(
                Timeout(
                    f"{n} requests in a row got no reply within their deadline: the node service is hung "
                    "or overloaded; dropping the connection and making a new one"
                )
            )

    def _answered(self):
        if self._timeouts:
            with self._lock:
                self._timeouts = 0

    # -- receiving

    def _recv_exact(self, n: int, deadline: Optional[float]) -> bytes:
        """n bytes from the socket; by deadline (Timeout) when it is given."""
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            if self.closed:
                raise Unavailable("connection closed")
            if deadline is not None:
                # Before every recv, the time left: a peer that sends a byte just
                # before each timeout must not stretch the wait.
                left = _left(deadline)
                if left <= 0:
                    raise Timeout("the node service did not answer in time")
                self._sock.settimeout(left)
            try:
                k = self._sock.recv_into(view[got:])
            except socket.timeout:
                continue  # the reader polls; a deadline is checked above
            if k == 0:
                raise Unavailable("the node service closed the connection")
            got += k
        return bytes(buf)

    def _read_frame(self, deadline: Optional[float]):
        # parse_header refuses a body over wire.MAX_BODY before any of it is read.
        h = wire.parse_header(self._recv_exact(wire.HEADER_SIZE, deadline))
        body = self._recv_exact(h.length, deadline) if h.length else b""
        try:
            return h, wire.decode(h.type, body)
        except wire.Malformed as e:
            return h, e  # the stream is in sync: fail this request only

    def _read_loop(self):
        try:
            while True:
                h, msg = self._read_frame(None)
                with self._lock:
                    entry = self._pending.pop(h.id, None)
                if entry is None:
                    continue  # its caller gave up (deadline)
                req_type, slot = entry
                if isinstance(msg, wire.Malformed):
                    slot.err = msg
                elif isinstance(msg, wire.Error):
                    slot.err = Refused(msg.code, msg.message)
                elif msg.TYPE != wire.REPLY_OF.get(req_type):
                    slot.err = wire.Malformed(
                        f"the node service answered {wire.TYPE_NAMES[req_type]} with {wire.TYPE_NAMES[msg.TYPE]}"
                    )
                else:
                    slot.msg = msg
                slot.event.set()
        except BaseException as e:  # noqa: BLE001 - the connection ends, callers are told
            self.close(e)

    def close(self, err: Optional[BaseException] = None):
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self.error = err
            pending = list(self._pending.values())
            self._pending.clear()
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()
        for _, slot in pending:
            slot.err = Unavailable(
                f"node service connection lost ({err})" if err else "node service connection closed"
            )
            slot.event.set()
        self.dead.set()


@dataclass
class Segment:
    """A memfd the service maps: registered once per connection."""

    name: str
    fd: int  # our duplicate, so re-registration works after the pool's owner closed its own
    size: int
    seg_id: int = 0  # on conn; 0 when not registered
    conn: Optional[Connection] = None  # the connection seg_id belongs to
    refused: str = ""  # the service's reason, when it refused the segment
    warned: bool = False


class Client:
    """The plugin's link to strata serve: reconnects and re-registers by itself."""

    def __init__(
        self,
        socket_path: str,
        client_name: str,
        timeout: float = 5.0,
        reconnect_min: float = 0.05,
        reconnect_max: float = 2.0,
    ):
        self.socket_path = socket_path
        self.client_name = client_name
        self.timeout = timeout
        self.reconnect_min = reconnect_min
        self.reconnect_max = reconnect_max
        self._lock = threading.Lock()
        self._conn: Optional[Connection] = None
        self._segments: Dict[Tuple[int, int], Segment] = {}
        self._closed = False
        self._stop = threading.Event()
        self._up = threading.Event()
        self._warned_down = False
        self.connects = 0
        self.epoch = 0
        self._thread = threading.Thread(
            target=self._connector, name="strata-connector", daemon=True
        )
        self._thread.start()

    # -- connection management

    def _connector(self):
        backoff = self.reconnect_min
        while not self._stop.is_set():
            conn = None
            try:
                conn = Connection(self.socket_path, self.timeout, self.client_name)
                self._register_all(conn)
            except BaseException as e:  # noqa: BLE001 - retried with backoff
                if conn is not None:
                    conn.close(e)
                self._down(e)
                self._stop.wait(backoff)
                backoff = min(backoff * 2, self.reconnect_max)
                continue
            with self._lock:
                if self._closed:
                    conn.close()
                    return
                self._conn = conn
                self.connects += 1
                self.epoch += 1
                again = self.connects > 1 or self._warned_down
                self._warned_down = False
                # Segments added while registering missed the loop above.
                missed = [s for s in self._segments.values() if s.seg_id == 0 and not s.refused]
            for s in missed:
                self._register_one(conn, s)
            self._up.set()
            if again:
                logger.warning(
                    "strata: connected to the node service at %s again and registered %d host memory segments; L3 is back",
                    self.socket_path,
                    len(self._segments),
                )
            backoff = self.reconnect_min
            while not conn.dead.wait(0.5):
                if self._stop.is_set():
                    return
            with self._lock:
                if self._conn is conn:
                    self._conn = None
                    self._up.clear()
                    for s in self._segments.values():
                        s.seg_id, s.conn, s.refused = 0, None, ""
            self._down(conn.error)

    def _down(self, err):
        with self._lock:
            if self._warned_down or self._closed:
                return
            self._warned_down = True
        logger.warning(
            "strata: the node service at %s is not reachable (%s); L3 reads are misses and writes fail "
            "until it is back. Reconnecting in the background. Start it with: strata serve --socket %s",
            self.socket_path,
            err,
            self.socket_path,
        )

    def _register_all(self, conn: Connection):
        with self._lock:
            segs = list(self._segments.values())
        for s in segs:
            self._register_one(conn, s)

    def _register_one(self, conn: Connection, s: Segment):
        try:
            r = conn.call(
                wire.RegisterSegment(s.size, s.name[: wire.MAX_NAME]), self.timeout, fds=[s.fd]
            )
            with self._lock:
                s.seg_id, s.conn, s.refused = r.segment_id, conn, ""
        except Refused as e:
            with self._lock:
                s.seg_id, s.refused = 0, str(e)
                warn = not s.warned
                s.warned = True
            if warn:
                logger.warning(
                    "strata: the node service refused host memory segment %r (%d bytes): %s; that pool runs without L3",
                    s.name,
                    s.size,
                    e,
                )

    def wait_connected(self, timeout: float) -> bool:
        """Wait until connected with every segment registered; False on timeout."""
        return self._up.wait(timeout)

    @property
    def connected(self) -> bool:
        return self._up.is_set()

    # -- segments

    def add_segment(self, fd: int, name: str) -> Segment:
        """Register the memfd fd (deduplicated by inode); returns its Segment.

        The memfd's size is its fstat size. When connected the registration is
        done now; otherwise at the next connection.
        """
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            s = self._segments.get(key)
            if s is not None:
                return s
            dup = os.dup(fd)  # os.dup is close-on-exec
            s = Segment(name=name, fd=dup, size=st.st_size)
            self._segments[key] = s
            conn = self._conn
        if conn is not None:
            self._register_one(conn, s)
        return s

    def remove_segment(self, s: Segment):
        """Unregister s and close its descriptor."""
        with self._lock:
            for k, v in list(self._segments.items()):
                if v is s:
                    del self._segments[k]
            conn, seg_id = self._conn, s.seg_id
            s.seg_id = 0
        if conn is not None and seg_id:
            try:
                conn.call(wire.UnregisterSegment(seg_id), self.timeout)
            except StrataError:
                pass
            except wire.Malformed:
                pass
        os.close(s.fd)

    def snapshot(self):
        """The live connection, or Unavailable at once when there is none."""
        with self._lock:
            conn = self._conn
        if conn is None or conn.closed:
            raise Unavailable(
                f"not connected to the node service at {self.socket_path} (reconnecting)"
            )
        return conn

    def resolve(self, segs):
        """The live connection and each segment's id on it, taken together.

        Raises Unavailable when not connected, StrataError when a
        segment is not registered (refused, or registering).
        """
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                raise Unavailable(
                    f"not connected to the node service at {self.socket_path} (reconnecting)"
                )
            ids = []
            for s in segs:
                if s.conn is not conn or not s.seg_id:
                    if s.refused:
                        raise StrataError(f"segment {s.name!r} was refused: {s.refused}")
                    raise Unavailable(f"segment {s.name!r} is not registered yet")
                ids.append(s.seg_id)
        return conn, ids

    def call(self, msg, timeout: Optional[float] = None, body: Optional[bytes] = None):
        """One request on the live connection, with a deadline."""
        conn = self.snapshot()
        return conn.call(msg, self.timeout if timeout is None else timeout, body=body)

    def close(self):
        with self._lock:
            if self._closed:
                return
            self._closed = True
            conn = self._conn
            self._conn = None
            segs = list(self._segments.values())
            self._segments.clear()
        self._stop.set()
        if conn is not None:
            conn.close()
        self._thread.join(timeout=5)
        for s in segs:
            try:
                os.close(s.fd)
            except OSError:
                pass
