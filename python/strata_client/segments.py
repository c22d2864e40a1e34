"""The memfds a Client registers with the service (Segment), and the Client's
half that registers, retries, refuses and resolves them on the live connection:
the segment bookkeeping, apart from connecting (client.py)."""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass, field
from typing import List, Optional

from . import wire
from .connection import Connection
from .errors import NotRegistered, Refused, SegmentRefused, StrataError, Unavailable, _left


# Refusals of a segment registration that pass: retried like a lost connection.
# Any other refusal (quota, memory the service cannot map) is final.
_TRANSIENT_REFUSALS = (wire.BUSY, wire.UNAVAILABLE)


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


class _Registrar:
    """Client's segment half: a mixin, whose state (the lock, the segments, the
    live connection, the outage) Client.__init__ makes."""

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
                self.logger.debug("strata: registering %r failed", s.name, exc_info=True)
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
                self._cond.notify_all()  # wait_connected
        if retried:
            self.logger.warning(
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
            self.logger.warning(
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
            self._cond.notify_all()  # wait_connected
            warn = not s.warned
            s.warned = True
        if warn:
            self.logger.warning(
                "strata: the node service refused host memory segment %r (%d bytes): %s. This is final: that pool "
                "runs without L3 until strata serve restarts",
                s.name,
                s.size,
                why,
            )

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
