"""The reading side of a Connection: frames off the socket by deadline, each
reply handed to the call waiting for its request id, and the end of the stream
learnt even after the stream broke (connection.py holds the rest)."""

from __future__ import annotations

import logging
import socket
from typing import Optional

from . import wire
from .errors import Refused, Timeout, Unavailable, _left

logger = logging.getLogger("strata_client")


class _PeerGone(Unavailable):
    """The service ended the connection: an end of stream, or a reset."""


class _Torn(Exception):
    """The client tore the connection down itself, with no call left on it."""


class _Receiver:
    """Connection's receiving half: a mixin, whose state (the socket, the
    pending calls, the flags that end it) Connection.__init__ makes."""

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
