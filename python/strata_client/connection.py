"""One session with the node service (Connection): the Hello and the fence page,
calls pipelined by request id, each held to its deadline, and the close that
waits for the last of them. Its reading side is receiver.py."""

from __future__ import annotations

import array
import dataclasses
import logging
import os
import socket
import threading
import time
from typing import Dict, List, Optional, Tuple

from . import wire
from .errors import Refused, StrataError, Timeout, Unavailable, _left
from .fence import Fence
from .receiver import _Receiver

_logger = logging.getLogger("strata_client")  # the default: Client passes its own

# Calls in a row that get no answer within their deadline before the
# connection is dropped and made again: a peer that stops answering (a hung
# service, half a frame and silence) is abandoned instead of costing every call
# its full deadline for as long as it keeps the socket open.
MAX_TIMEOUTS = 2

# A troubleshooting switch: the highest protocol revision the client offers in
# its Hello (1 to wire.REVISION; unset: wire.REVISION). STRATA_WIRE_REVISION=1
# names every page by ranges, as before revision 2 (no strided runs).
REVISION_ENV = "STRATA_WIRE_REVISION"
_warned_env = set()


def offered_revision(logger: Optional[logging.Logger] = None) -> int:
    """The revision a Hello offers: $STRATA_WIRE_REVISION, else wire.REVISION."""
    v = os.environ.get(REVISION_ENV, "").strip()
    if not v:
        return wire.REVISION
    try:
        r = int(v)
    except ValueError:
        r = 0
    if not 1 <= r <= wire.REVISION:
        if v in _warned_env:
            return wire.REVISION
        _warned_env.add(v)  # once a value, not at every reconnect
        (logger or _logger).warning(
            "strata: %s=%r is not a protocol revision (1 to %d); offering %d",
            REVISION_ENV,
            v,
            wire.REVISION,
            wire.REVISION,
        )
        return wire.REVISION
    return r


class _Slot:
    __slots__ = ("event", "msg", "err")

    def __init__(self):
        self.event = threading.Event()
        self.msg = None
        self.err = None


class Connection(_Receiver):
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

    def __init__(
        self, path: str, timeout: float, client_name: str, logger: Optional[logging.Logger] = None
    ):
        self.logger = logger if logger is not None else _logger
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
        # The protocol revision of the connection: the lower of the one our
        # Hello offers and the one the service answers (1 from a service
        # before revisions). Items are named by runs only at 2 or later.
        offer = offered_revision(self.logger)
        self.revision = 1
        # Hello before the reader starts: a plain round trip, by the deadline.
        try:
            sent = time.monotonic_ns()
            self._send(
                1,
                wire.Hello(wire.VERSION, client_name[: wire.MAX_NAME], os.getpid(), offer),
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
            self.revision = min(wire.revision_of(msg.revision), offer)
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
                self.logger.warning(
                    "strata: the node service's stalled copy ended (or the service went) after %.1f s; "
                    "the get returned",
                    time.monotonic() - t0,
                )

    def _stalled(self) -> bool:
        with self._lock:
            if self._stall_logged:
                return False
            self._stall_logged = True
        self.logger.warning(
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
