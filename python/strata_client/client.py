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

Client lives here; its parts by concern are errors.py (what a call raises),
connection.py and receiver.py (one session), and segments.py (the memfds and
their registration). Every name of them is importable from this module.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Dict, List, Optional, Tuple

from . import wire
from .connection import MAX_TIMEOUTS, Connection, _Slot
from .errors import (
    NotRegistered,
    Refused,
    SegmentRefused,
    StrataError,
    Timeout,
    Unavailable,
    _left,
    _said,
)
from .receiver import _PeerGone, _Torn
from .segments import _TRANSIENT_REFUSALS, Segment, _Registrar

# What the client's modules define, importable from here as before they were
# split (the private names too: tests reach into some of them).
__all__ = [
    "MAX_TIMEOUTS",
    "Client",
    "Connection",
    "NotRegistered",
    "Refused",
    "Segment",
    "SegmentRefused",
    "StrataError",
    "Timeout",
    "Unavailable",
    "_PeerGone",
    "_Slot",
    "_TRANSIENT_REFUSALS",
    "_Torn",
    "_left",
    "_said",
]

# The default logger; each plugin passes its own (strata_sglang, strata_vllm),
# so that an engine's operators see the client's lines under the plugin's name.
_logger = logging.getLogger("strata_client")


class Client(_Registrar):
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
        logger: Optional[logging.Logger] = None,
    ):
        self.logger = logger if logger is not None else _logger
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
                self.logger.debug("strata: connection attempt failed", exc_info=True)
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
                self.logger.debug("strata: connection watch failed", exc_info=True)
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
        conn = Connection(self.socket_path, self.timeout, self.client_name, self.logger)
        for _ in range(2):
            if not conn.deadlines or conn.rtt <= self.timeout / 10:
                break
            try:
                again = Connection(self.socket_path, self.timeout, self.client_name, self.logger)
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
        self.logger.warning(msg, self.socket_path, arg)

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
            self.logger.warning(
                "strata: connected to the node service at %s again and %s; L3 is back",
                self.socket_path,
                what,
            )
        elif failed:
            self.logger.warning(
                "strata: connected to the node service at %s after %d failed attempt%s (the last: %s); %s; L3 is on",
                self.socket_path,
                failed,
                "" if failed == 1 else "s",
                last,
                what,
            )
        else:
            self.logger.info(
                "strata: connected to the node service at %s; %s", self.socket_path, what
            )

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
            return self._unregistered_locked(conn)

    def _unregistered_locked(self, conn: Connection) -> List[Segment]:
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
        self.logger.warning(
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
        self.logger.warning(
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
        self.logger.warning(
            "strata: the node service at %s answers again; L3 is back", self.socket_path
        )

    def wait_connected(self, timeout: float) -> bool:
        """Wait until connected with every segment registered (or refused, which
        is final); False on timeout. A registration that timed out is retried
        in the background while the connection is up: this waits for that too."""
        deadline = time.monotonic() + timeout
        if not self._up.wait(timeout):
            return False
        with self._cond:
            while True:
                conn = self._conn
                if conn is not None and not conn.closed and not self._unregistered_locked(conn):
                    return True
                left = deadline - time.monotonic()
                if left <= 0 or self._closed:
                    return False
                # Registrations notify; the bound covers a connection lost meanwhile.
                self._cond.wait(min(left, 0.05))

    @property
    def connected(self) -> bool:
        return self._up.is_set()

    # -- calls

    def snapshot(self):
        """The live connection, or Unavailable at once when there is none."""
        with self._lock:
            conn = self._conn
        if conn is None or conn.closed:
            raise Unavailable(
                f"not connected to the node service at {self.socket_path} (reconnecting)"
            )
        return conn

    @property
    def revision(self) -> int:
        """The live connection's protocol revision (Connection.revision); 0
        when not connected. A request built for one connection's revision is
        sent on that connection (resolve, snapshot), never on another."""
        with self._lock:
            conn = self._conn
        return 0 if conn is None or conn.closed else conn.revision

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
