"""What a call to the node service raises, in one place that every layer of the
client (connection, segments, Client) and its callers share; and the two small
helpers those layers use about deadlines and errors."""

from __future__ import annotations

import time

from . import wire


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


def _left(deadline: float) -> float:
    return deadline - time.monotonic()


def _said(err) -> str:
    """What err says, for a log line: a record that held the exception would
    keep the frames it passed through, and the memory they name, alive for as
    long as a handler keeps the record."""
    return (str(err) or type(err).__name__) if err is not None else "no reason given"
