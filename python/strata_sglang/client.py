"""A client of the node service (``strata serve``) for Python engines.

One Unix-socket connection, requests pipelined from any thread (a reader thread
hands each reply to its caller by request id), a deadline on every call that
holds whatever the peer does, and a background connector that reconnects with
backoff and registers every segment again, as ``storage/nodeclient`` does in Go.
While the service is unreachable, calls fail at once with :class:`Unavailable`;
the caller turns that into misses. A connection on which MAX_TIMEOUTS calls in a
row got no answer is dropped and made again: a hung service costs each call its
deadline only until then. A Put or Get that gave up returns only once the
service can no longer touch the memory it named (fence.py): SGLang reuses that
memory at once.
"""

from __future__ import annotations

import array
import dataclasses
import logging
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from . import wire
from .fence import Fence

logger = logging.getLogger("strata_sglang")

# Calls in a row that get no answer within their deadline before the
# connection is dropped and made again: a peer that stops answering (a hung
# service, half a frame and silence) is abandoned instead of costing every call
# its full deadline for as long as it keeps the socket open.
MAX_TIMEOUTS = 2

# Refusals of a segment registration that pass: retried like a lost connection.
# Any other refusal (quota, memory the service cannot map) is final.
_TRANSIENT_REFUSALS = (wire.BUSY, wire.UNAVAILABLE)


class StrataError(Exception):
    """A call to the node service failed."""


class Unavailable(StrataError):
    """The service is not connected (down, restarting, or not started yet)."""


class NotRegistered(Unavailable):
    """A segment is not registered on the live connection yet (being registered,
    or its registration failed for a reason that passes and is being retried)."""


class SegmentRefused(StrataError):
    """A segment the service refused (final until it restarts; the client warned)."""


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


def _said(err) -> str:
    """What err says, for a log line: a record that held the exception would
    keep the frames it passed through, and the memory they name, alive for as
    long as a handler keeps the record."""
    return (str(err) or type(err).__name__) if err is not None else "no reason given"


class _PeerGone(Unavailable):
    """The service ended the connection: an end of stream, or a reset."""


class _Torn(Exception):
    """The client tore the connection down itself, with no call left on it."""


class Connection:
    """One session with the service: Hello done, replies dispatched by id.

    Every call ends by its deadline: connecting and the Hello together within
    timeout, each call within the timeout it is given, however slowly the peer
    sends or however much it announces (a frame body over wire.MAX_BODY is
    refused at its header, and the connection closed). The one exception is a
    Get whose deadline passed while the service was copying into its pages: it
    returns once that copy has ended or the service has gone (fence.py), so
    that nothing writes SGLang's memory after the call returned.

    Every Put and Get carries its deadline in the service's clock (HelloReply
    .clock_ns, taken as read when the reply arrived, so that a converted
    deadline is never late), and a Get a slot of the connection's fence page. A
    call that ends without its reply (its deadline, the connection lost) returns
    only once the service can touch its memory no more: its deadline has passed
    and, for a Get, the slot's counter reads 0; or the service has closed the
    connection, which it does only after every request of it ended.

    close() stops new calls and shuts the sending side only: the service then
    ends the session once its requests have, and the reader, reading on, sees
    it do so. The socket and the fence page are released once no call is left
    on the connection.
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
        self._late_register = set()  # ids of RegisterSegment calls that timed out
        self._next_id = 0
        self._timeouts = 0  # calls in a row that timed out
        self.closed = False
        self.dead = threading.Event()  # closed: no new calls
        self.peer_closed = threading.Event()  # the service ended the connection
        self.error: Optional[BaseException] = None
        self.orphans: List[int] = []  # segment ids registered after their caller gave up
        self.on_recover = None  # on_recover(conn): a call was answered after timeouts
        # Deadlines (fence.py): the service keeps them when its Hello says its
        # clock; clock_off is its clock minus ours, erring early.
        self.deadlines = False
        self.clock_off = 0
        self.rtt = 0.0  # the Hello's round trip: how early converted deadlines may be
        self.fence: Optional[Fence] = None
        self.fence_error = ""  # why the service refused the fence page
        self._inflight = 0  # calls on the connection that have not returned
        self._torn = False  # the client ends the reader: no call is left
        self._reader_done = False
        self._released = False
        self._stall_logged = False
        # Hello before the reader starts: a plain round trip, by the deadline.
        try:
            sent = time.monotonic_ns()
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
            got = time.monotonic_ns()
            if isinstance(msg, wire.Error):
                raise Refused(msg.code, msg.message)
            if not isinstance(msg, wire.HelloReply) or h.id != 1:
                raise wire.Malformed(f"answered Hello with {type(msg).__name__}")
            self.rtt = (got - sent) / 1e9
            if msg.clock_ns:
                # The service read its clock before the reply arrived: as read
                # at `got`, the offset is early by at most the round trip.
                self.deadlines = True
                self.clock_off = msg.clock_ns - got
                self._register_fence(path, deadline, timeout)
            sock.settimeout(timeout)  # what the reader polls with, and a send's ceiling
        except socket.timeout:
            self._close_now()
            raise Timeout(
                f"sending Hello to the node service at {path} took over {timeout:g} s"
            ) from None
        except BaseException:
            self._close_now()
            raise
        self.hello = msg
        self._next_id = 2
        self._reader = threading.Thread(target=self._read_loop, name="strata-reader", daemon=True)
        self._reader.start()

    def _register_fence(self, path: str, deadline: float, timeout: float):
        """Register the connection's fence page (request id 2); before the reader."""
        f = Fence()
        self.fence = f
        self._send(
            2,
            wire.RegisterSegment(wire.FENCE_BYTES, "fence", fence=True),
            fds=[f.fd],
            deadline=deadline,
        )
        f.close_fd()  # the service has its own now
        try:
            h, msg = self._read_frame(deadline)
        except Timeout:
            raise Timeout(
                f"the node service at {path} did not answer the fence page's registration within {timeout:g} s"
            ) from None
        if isinstance(msg, wire.Malformed) or h.id != 2:
            raise wire.Malformed(f"answered the fence page's registration with {msg!r}")
        if isinstance(msg, wire.Error) or not getattr(msg, "segment_id", 0):
            self.fence_error = (
                str(Refused(msg.code, msg.message))
                if isinstance(msg, wire.Error)
                else f"answered {type(msg).__name__} {msg}"
            )
            self.fence = None
            f.close()

    def _close_now(self):
        """Close what the constructor made (no reader runs yet)."""
        self._sock.close()
        if self.fence is not None:
            self.fence.close()
            self.fence = None

    # -- sending

    def _send(self, req_id: int, msg, fds=(), body: Optional[bytes] = None, *, deadline: float):
        """Send one frame by deadline. Timeout when the send lock is not ours in
        time (nothing sent); an OSError (socket.timeout among them) when the
        frame could not all be sent: the stream is lost, and the service never
        has the request."""
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
        """Send msg and wait for its reply; returns or raises within timeout seconds
        (a Get the service is copying into past its deadline: when the copy ends).

        Raises Unavailable (the connection is gone), Timeout, Refused (an Error
        reply) or wire.Malformed (a reply that breaks the protocol). After
        MAX_TIMEOUTS timeouts in a row the connection is closed.
        """
        deadline_ns = time.monotonic_ns() + int(timeout * 1e9)
        with self._lock:
            if self.closed:
                raise Unavailable("node service connection closed")
            self._inflight += 1
        slot = 0
        try:
            typ = msg.TYPE
            fenced = self.deadlines and typ in (wire.PUT, wire.GET)
            if fenced:
                if typ == wire.GET and self.fence is not None:
                    slot = self.fence.take(deadline_ns / 1e9)
                    if not slot:
                        raise Timeout(
                            f"all {wire.FENCE_SLOTS} fence slots of the connection stayed busy for {timeout:g} s"
                        )
                msg = dataclasses.replace(
                    msg, deadline_ns=max(deadline_ns + self.clock_off, 1), fence_slot=slot
                )
            return self._exchange(msg, typ, fenced, slot, timeout, deadline_ns, fds, body)
        finally:
            if slot:
                self.fence.give(slot)
            self._leave()

    def _exchange(self, msg, typ, fenced, slot, timeout, deadline_ns, fds, body):
        deadline = deadline_ns / 1e9
        waiter = _Slot()
        with self._lock:
            if self.closed:
                raise Unavailable("node service connection closed")
            self._next_id += 1
            req_id = self._next_id
            self._pending[req_id] = (typ, waiter)
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
            # Part of a frame may be on the socket: the stream is lost. The
            # service never has the request (it lacks the frame's end).
            self._forget(req_id)
            self.close(e)
            if isinstance(e, socket.timeout):
                raise Timeout(
                    f"the node service did not take a request within {timeout:g} s"
                ) from None
            raise Unavailable(f"send to the node service: {e}") from None
        if not waiter.event.wait(max(_left(deadline), 0.0)):
            with self._lock:
                gone = self._pending.pop(req_id, None) is not None
                if gone and typ == wire.REGISTER_SEGMENT:
                    self._late_register.add(req_id)
            if gone or not waiter.event.wait(1.0):  # else the reader is handing it over now
                self._timed_out()
                if fenced:
                    self._settle(typ, deadline_ns, slot)
                raise Timeout(f"no reply from the node service within {timeout:g} s")
        if isinstance(waiter.err, Unavailable):
            if fenced:
                self._settle(typ, deadline_ns, slot)
            raise waiter.err
        self._answered()
        if waiter.err is not None:
            raise waiter.err
        return waiter.msg

    def _settle(self, typ: int, deadline_ns: int, slot: int):
        """Return once the service copies nothing more for a Put or Get this call
        sent and got no reply to: its deadline has passed (in our clock, so in
        the service's) and, for a Get, the slot's counter reads 0; or the
        service closed the connection. Bounded by the counter and the
        connection only: a service stopped in the middle of a copy into the
        call's pages keeps it until the copy ends or the service dies."""
        if typ == wire.GET and self.fence is None:
            # No fence page: only the connection's end tells that no copy runs.
            self.close(
                StrataError(
                    "a get timed out on a connection without a fence page: the plugin dropped the connection, "
                    "whose end tells when the service copies nothing more"
                )
            )
        t0 = time.monotonic()
        pause = 20e-6
        logged = False
        try:
            while not self.peer_closed.is_set():
                now = time.monotonic_ns()
                if now < deadline_ns:
                    self.peer_closed.wait((deadline_ns - now) / 1e9)
                    continue
                if typ == wire.PUT or (self.fence is not None and self.fence.count(slot) == 0):
                    return
                self.peer_closed.wait(pause)
                pause = min(pause * 2, 0.01)
                if not logged and time.monotonic() - t0 > 1.0:
                    logged = self._stalled()
        finally:
            if logged:
                with self._lock:
                    self._stall_logged = False
                logger.warning(
                    "strata: the node service's stalled copy ended (or the service went) after %.1f s; "
                    "the get returned",
                    time.monotonic() - t0,
                )

    def _stalled(self) -> bool:
        with self._lock:
            if self._stall_logged:
                return False
            self._stall_logged = True
        logger.warning(
            "strata: a get past its deadline waits for the node service to finish copying into SGLang's "
            "host memory: the service stalled in the middle of that copy (stopped, swapped out or "
            "overloaded). The call returns when the copy ends or the service goes, so that those pages "
            "are never written after SGLang reuses them"
        )
        return True

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
            hook = self.on_recover
            if hook is not None:
                hook(self)

    def _leave(self):
        with self._lock:
            self._inflight -= 1
        self._release()

    # -- receiving

    def _recv_exact(self, n: int, deadline: Optional[float]) -> bytes:
        """n bytes from the socket; by deadline (Timeout) when it is given."""
        buf = bytearray(n)
        view = memoryview(buf)
        got = 0
        while got < n:
            if self._torn:
                raise _Torn()
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
            except ConnectionResetError:
                raise _PeerGone("the node service reset the connection") from None
            if k == 0:
                raise _PeerGone("the node service closed the connection")
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
        peer = False
        try:
            try:
                while True:
                    h, msg = self._read_frame(None)
                    self._dispatch(h, msg)
            except BaseException as e:  # noqa: BLE001 - the connection ends, callers are told
                peer = isinstance(e, _PeerGone) and not self._torn
                self.close(None if isinstance(e, _Torn) else e)
            if not peer:
                peer = self._drain()
        except BaseException:  # noqa: BLE001 - never end without releasing
            logger.debug("strata: the connection's reader failed", exc_info=True)
        finally:
            if peer:
                self.peer_closed.set()
            with self._lock:
                self._reader_done = True
            self._release()

    def _dispatch(self, h, msg):
        with self._lock:
            entry = self._pending.pop(h.id, None)
            late = entry is None and h.id in self._late_register
            if late:
                self._late_register.discard(h.id)
                if isinstance(msg, wire.RegisterSegmentReply) and msg.segment_id:
                    # Registered after its caller gave up: the client
                    # unregisters it, so it holds nothing in the service.
                    self.orphans.append(msg.segment_id)
        if entry is None:
            return  # its caller gave up (deadline), or the connection is closed
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

    def _drain(self) -> bool:
        """After the stream broke (or the client closed): read and drop bytes
        until the service ends the connection (True) or the client tears it
        down (False), so that a call that gave up still learns of the end."""
        buf = bytearray(1 << 16)
        while not self._torn:
            try:
                k = self._sock.recv_into(buf)
            except socket.timeout:
                continue
            except ConnectionResetError:
                return not self._torn
            except OSError:
                return False
            if k == 0:
                return not self._torn
        return False

    # -- closing

    def close(self, err: Optional[BaseException] = None):
        """Stop new calls and fail those waiting for a reply; the socket is
        released once no call is left on the connection."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            # Not its traceback: the frames it passed through (a request's
            # body, the pools of its caller) stay alive with the connection.
            self.error = err.with_traceback(None) if err is not None else None
            pending = list(self._pending.values())
            self._pending.clear()
        try:
            # The service sees the end of the stream, ends its requests, then
            # closes: what a call that gave up waits for.
            self._sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        for _, slot in pending:
            slot.err = Unavailable(
                f"node service connection lost ({err})" if err else "node service connection closed"
            )
            slot.event.set()
        self.dead.set()
        self._release()

    def _release(self):
        """Once closed with no call left: end the reader, then close the socket
        and unmap the fence page."""
        with self._lock:
            if not self.closed or self._inflight or self._released:
                return
            if not self._reader_done:
                wake = not self._torn
                self._torn = True
            else:
                wake = False
                self._released = True
        if wake:
            try:
                self._sock.shutdown(socket.SHUT_RDWR)  # the reader's recv ends now
            except OSError:
                pass
            return
        if self._released and self._reader_done:
            self._sock.close()
            if self.fence is not None:
                self.fence.close()

    def wait_released(self, timeout: float) -> bool:
        """Wait until the reader has ended (after close()); False on timeout."""
        self._reader.join(timeout)
        return not self._reader.is_alive()


@dataclass(eq=False)
class Segment:
    """A memfd the service maps: registered once per connection."""

    name: str
    fd: int  # our duplicate, so re-registration works after the pool's owner closed its own
    size: int
    seg_id: int = 0  # on conn; 0 when not registered
    conn: Optional[Connection] = None  # the connection seg_id (or the refusal) belongs to
    refused: str = ""  # the service's reason, when it refused the segment (final on conn)
    failing: str = ""  # why the last registration failed, when it is being retried
    warned: bool = False  # the refusal was logged
    removed: bool = False
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def on(self, conn: Connection) -> bool:
        """Registered on conn."""
        return self.conn is conn and self.seg_id != 0


class Client:
    """The plugin's link to strata serve: reconnects and re-registers by itself.

    The connector thread never ends before close(): every failure in it (a
    connection lost while it registers, a bug) is retried with backoff.
    """

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
        self._cond = threading.Condition(self._lock)
        self._conn: Optional[Connection] = None
        self._segments: Dict[Tuple[int, int], Segment] = {}
        self._closed = False
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._up = threading.Event()
        # An outage is warned about once, whatever fails in it, and ends when
        # the service answers again (a new connection, or an answer after timeouts).
        self._outage = False
        self._failed_attempts = 0  # since the last connection
        self._last_error = ""  # what the last failed attempt said
        # Connection attempts begun and ended: a registration waits for the one
        # in progress. The first is begun here, before its thread runs.
        self._started, self._settled = 1, 0
        self.connects = 0
        self.epoch = 0
        self._deadline_warned = set()  # what _note_deadlines warned about
        self._thread = threading.Thread(
            target=self._connector, name="strata-connector", daemon=True
        )
        self._thread.start()

    # -- connection management

    def _connector(self):
        backoff = self.reconnect_min
        first = True
        while not self._stop.is_set():
            conn = None
            try:
                conn = self._attempt(first)
            except BaseException as e:  # noqa: BLE001 - never end L3 for the process: retry
                logger.debug("strata: connection attempt failed", exc_info=True)
                self._attempt_failed(e)
                conn = None
            first = False
            if conn is None:
                self._wake.wait(backoff)
                backoff = min(backoff * 2, self.reconnect_max)
                continue
            backoff = self.reconnect_min
            try:
                self._watch(conn)
            except BaseException as e:  # noqa: BLE001 - drop the connection, make another
                logger.debug("strata: connection watch failed", exc_info=True)
                conn.close(e)
            self._lost(conn)

    def _attempt(self, first: bool) -> Optional[Connection]:
        """Connect, register every segment, publish; None when that failed."""
        with self._lock:
            if self._closed:
                return None
            if not first:
                self._started += 1
        self._wake.clear()
        try:
            try:
                conn = self._connect()
            except BaseException as e:  # noqa: BLE001 - OSError, Timeout, Refused, Malformed
                self._attempt_failed(e)
                return None
            self._note_deadlines(conn)
            conn.on_recover = self._recovered
            # Registered before the connection is published: no call ever sees
            # it with the pools missing that were known when it was made.
            with self._lock:
                segs = list(self._segments.values())
            for s in segs:
                if conn.closed:
                    break
                self._ensure(conn, s)
            if conn.closed:
                self._attempt_failed(
                    conn.error or Unavailable("the connection closed while registering")
                )
                return None
            with self._lock:
                if self._closed:
                    conn.close()
                    return None
                self._conn = conn
                self.connects += 1
                self.epoch += 1
                again = self.connects > 1
                failed, last = self._failed_attempts, self._last_error
                self._failed_attempts = 0
                segs = list(self._segments.values())
            for s in segs:  # added while the others were registered
                self._ensure(conn, s)
            self._announce(conn, again, failed, last)
            self._up.set()
            return conn
        finally:
            with self._cond:
                self._settled = self._started
                self._cond.notify_all()

    def _connect(self) -> Connection:
        """A connection whose Hello was quick enough to convert deadlines with.

        The clock offset errs early by the Hello's round trip, and so does every
        deadline on the connection: a Hello held by a stalled or starting
        service would make each call's deadline that much early for the
        connection's life. One slower than a tenth of the timeout is made again
        (twice at most), keeping the quickest.
        """
        conn = Connection(self.socket_path, self.timeout, self.client_name)
        for _ in range(2):
            if not conn.deadlines or conn.rtt <= self.timeout / 10:
                break
            try:
                again = Connection(self.socket_path, self.timeout, self.client_name)
            except Exception:  # noqa: BLE001 - keep the one made
                break
            if again.rtt < conn.rtt:
                conn, again = again, conn
            again.close()
        return conn

    def _note_deadlines(self, conn: Connection):
        """Warn once when conn cannot keep a call that gave up from touching memory."""
        if not conn.deadlines:
            what = "old"
            msg = (
                "strata: the node service at %s keeps no client deadlines (an older strata serve, %s): a call "
                "that times out may still be copied into or out of SGLang's host memory afterwards; upgrade "
                "strata serve"
            )
            arg = conn.hello.server_version or "no version"
        elif conn.fence is None:
            what = "fence"
            msg = (
                "strata: the node service at %s refused the connection's fence page (%s): a get that times out "
                "drops the connection and returns once the service has closed it"
            )
            arg = conn.fence_error
        else:
            return
        with self._lock:
            if what in self._deadline_warned:
                return
            self._deadline_warned.add(what)
        logger.warning(msg, self.socket_path, arg)

    def _announce(self, conn: Connection, again: bool, failed: int, last):
        with self._lock:
            segs = list(self._segments.values())
            self._outage = False
        ok = sum(1 for s in segs if s.on(conn))
        refused = sum(1 for s in segs if s.conn is conn and s.refused)
        what = f"registered {ok} of {len(segs)} host memory segments"
        if refused:
            what += f" ({refused} refused)"
        if len(segs) - ok - refused:
            what += f" ({len(segs) - ok - refused} being retried)"
        if again:
            logger.warning(
                "strata: connected to the node service at %s again and %s; L3 is back",
                self.socket_path,
                what,
            )
        elif failed:
            logger.warning(
                "strata: connected to the node service at %s after %d failed attempt%s (the last: %s); %s; L3 is on",
                self.socket_path,
                failed,
                "" if failed == 1 else "s",
                last,
                what,
            )
        else:
            logger.info("strata: connected to the node service at %s; %s", self.socket_path, what)

    def _watch(self, conn: Connection):
        """Until conn dies: retry registrations that failed, unregister orphans."""
        retry = self.reconnect_min
        while not self._stop.is_set():
            pending = self._unregistered(conn)
            if conn.dead.wait(retry if pending else 0.5):
                return
            while conn.orphans and not conn.closed:
                seg_id = conn.orphans.pop()
                try:
                    conn.call(wire.UnregisterSegment(seg_id), self.timeout)
                except (StrataError, wire.Malformed):
                    pass  # the connection's end releases it in the service anyway
            for s in pending:
                if conn.closed:
                    return
                self._ensure(conn, s)
            retry = (
                min(retry * 2, self.reconnect_max)
                if self._unregistered(conn)
                else self.reconnect_min
            )

    def _unregistered(self, conn: Connection) -> List[Segment]:
        with self._lock:
            return [
                s
                for s in self._segments.values()
                if not s.removed and not s.on(conn) and not (s.conn is conn and s.refused)
            ]

    def _lost(self, conn: Connection):
        with self._lock:
            if self._conn is conn:
                self._conn = None
                self._up.clear()
                for s in self._segments.values():
                    s.seg_id, s.conn, s.refused = 0, None, ""
        self._down(conn.error)

    def _attempt_failed(self, err):
        with self._lock:
            self._failed_attempts += 1
            self._last_error = _said(err)
        self._down(err)

    def _down(self, err):
        if not self._begin_outage():
            return
        logger.warning(
            "strata: the node service at %s is not reachable (%s); L3 reads are misses and writes fail "
            "until it is back. Reconnecting in the background. Start it with: strata serve --socket %s",
            self.socket_path,
            _said(err),
            self.socket_path,
        )

    def _begin_outage(self) -> bool:
        """Mark an outage begun; True when it had not been (warn now)."""
        with self._lock:
            if self._outage or self._closed:
                return False
            self._outage = True
            return True

    def note_failure(self, err: BaseException):
        """A call timed out: one warning per outage, whatever fails in it."""
        if not self._begin_outage():
            return
        logger.warning(
            "strata: the node service at %s is not answering (%s); until it does, L3 reads are misses and "
            "writes fail, each call costing at most its deadline of %g s; after %d timeouts in a row the "
            "plugin reconnects. Further failures of this outage are not logged",
            self.socket_path,
            _said(err),
            self.timeout,
            MAX_TIMEOUTS,
        )

    def _recovered(self, conn: Connection):
        with self._lock:
            if self._conn is not conn or not self._outage:
                return
            self._outage = False
        logger.warning("strata: the node service at %s answers again; L3 is back", self.socket_path)

    # -- registration

    def _ensure(self, conn: Connection, s: Segment, timeout: Optional[float] = None) -> bool:
        """Register s on conn unless it is (or was refused there); never raises.
        True when s is registered on conn."""
        with s.lock:  # one registration of s at a time; remove_segment waits for it
            with self._lock:
                if s.removed or self._closed:
                    return False
                if s.on(conn) or (s.conn is conn and s.refused):
                    return s.on(conn)
            if conn.closed:
                return False
            try:
                r = conn.call(
                    wire.RegisterSegment(s.size, s.name[: wire.MAX_NAME]),
                    self.timeout if timeout is None else timeout,
                    fds=[s.fd],
                )
            except Refused as e:
                if e.code in _TRANSIENT_REFUSALS:
                    self._retrying(s, e, outage=False)
                else:
                    self._refused(s, conn, str(e))
                return False
            except wire.Malformed as e:
                self._refused(
                    s,
                    conn,
                    f"the node service answered RegisterSegment with a malformed reply: {e}",
                )
                return False
            except (StrataError, OSError) as e:  # Timeout, Unavailable: retried
                self._retrying(s, e, outage=True)
                return False
            except Exception as e:  # noqa: BLE001 - a bug: retried, never raised into SGLang
                logger.debug("strata: registering %r failed", s.name, exc_info=True)
                self._retrying(s, e, outage=False)
                return False
            if not r.segment_id:
                self._refused(
                    s,
                    conn,
                    "the node service answered segment id 0, which names no segment (a fault in strata serve: "
                    "upgrade or restart it)",
                )
                return False
            with self._lock:
                s.seg_id, s.conn, s.refused = r.segment_id, conn, ""
                retried, s.failing = s.failing, ""
        if retried:
            logger.warning(
                "strata: host memory segment %r is registered with the node service now (it failed before: %s); "
                "its pool has L3 again",
                s.name,
                retried,
            )
        return True

    def _retrying(self, s: Segment, e: BaseException, outage: bool):
        with self._lock:
            first = not s.failing
            s.failing = str(e) or type(e).__name__
        # A timeout or a lost connection is also the outage's one warning.
        if first and (self._begin_outage() if outage else True):
            logger.warning(
                "strata: registering host memory segment %r (%d bytes) with the node service at %s failed (%s); "
                "retrying in the background: that pool has no L3 until it succeeds",
                s.name,
                s.size,
                self.socket_path,
                s.failing,
            )

    def _refused(self, s: Segment, conn: Connection, why: str):
        with self._lock:
            s.seg_id, s.conn, s.refused, s.failing = 0, conn, why, ""
            warn = not s.warned
            s.warned = True
        if warn:
            logger.warning(
                "strata: the node service refused host memory segment %r (%d bytes): %s. This is final: that pool "
                "runs without L3 until strata serve restarts",
                s.name,
                s.size,
                why,
            )

    def wait_connected(self, timeout: float) -> bool:
        """Wait until connected with every segment registered; False on timeout."""
        return self._up.wait(timeout)

    @property
    def connected(self) -> bool:
        return self._up.is_set()

    # -- segments

    def add_segment(self, fd: int, name: str, wait: bool = True) -> Segment:
        """Register the memfd fd (deduplicated by inode); returns its Segment.

        The memfd's size is its fstat size. With wait, the registration is done
        before this returns (ensure_registered); otherwise in the background.
        """
        st = os.fstat(fd)
        key = (st.st_dev, st.st_ino)
        with self._lock:
            s = self._segments.get(key)
            if s is None:
                dup = os.dup(fd)  # os.dup is close-on-exec
                s = Segment(name=name, fd=dup, size=st.st_size)
                self._segments[key] = s
        if wait:
            self.ensure_registered([s], self.timeout)
        return s

    def ensure_registered(self, segs: List[Segment], timeout: float) -> bool:
        """Register segs on the live connection, within timeout seconds; never raises.

        A connection attempt in progress (a service still starting holds its
        Hello in the backlog) is waited for, unless an outage is known: then
        the segments are registered when the service is back. True when every
        one is registered now.
        """
        deadline = time.monotonic() + timeout
        with self._cond:
            while (
                (self._conn is None or self._conn.closed)
                and self._started > self._settled
                and not self._outage
                and not self._closed
            ):
                left = _left(deadline)
                if left <= 0:
                    break
                self._cond.wait(left)
            conn = self._conn
        if conn is None or conn.closed:
            return False
        ok = True
        for s in segs:
            left = _left(deadline)
            if left <= 0:
                ok = ok and s.on(conn)  # the rest in the background (_watch)
                continue
            ok = self._ensure(conn, s, left) and ok
        return ok

    def remove_segment(self, s: Segment):
        """Unregister s and close its descriptor; never raises."""
        with s.lock:  # after a registration of s in flight
            with self._lock:
                if s.removed:
                    return
                s.removed = True
                for k, v in list(self._segments.items()):
                    if v is s:
                        del self._segments[k]
                conn, seg_id = s.conn, s.seg_id
                s.seg_id, s.conn = 0, None
            if conn is not None and seg_id and not conn.closed:
                try:
                    conn.call(wire.UnregisterSegment(seg_id), self.timeout)
                except (StrataError, wire.Malformed):
                    pass  # the connection's end releases it in the service
            try:
                os.close(s.fd)
            except OSError:
                pass

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

        Raises Unavailable when not connected, NotRegistered when a segment is
        being registered, SegmentRefused when one was refused.
        """
        with self._lock:
            conn = self._conn
            if conn is None or conn.closed:
                raise Unavailable(
                    f"not connected to the node service at {self.socket_path} (reconnecting)"
                )
            ids = []
            for s in segs:
                if not s.on(conn):
                    if s.refused and s.conn is conn:
                        raise SegmentRefused(f"segment {s.name!r} was refused: {s.refused}")
                    raise NotRegistered(f"segment {s.name!r} is not registered yet")
                ids.append(s.seg_id)
        return conn, ids

    def call(self, msg, timeout: Optional[float] = None, body: Optional[bytes] = None):
        """One request on the live connection, with a deadline."""
        conn = self.snapshot()
        return conn.call(msg, self.timeout if timeout is None else timeout, body=body)

    def close(self):
        with self._cond:
            if self._closed:
                return
            self._closed = True
            conn = self._conn
            self._conn = None
            segs = list(self._segments.values())
            self._segments.clear()
            self._cond.notify_all()
        self._stop.set()
        self._wake.set()
        if conn is not None:
            conn.close()
            conn.wait_released(1.0)  # its socket closes once no call is left on it
        self._thread.join(timeout=5)
        for s in segs:
            with s.lock:
                s.removed = True
                try:
                    os.close(s.fd)
                except OSError:
                    pass
