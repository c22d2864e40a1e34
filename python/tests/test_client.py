"""The client's deadlines and reconnects against a peer that misbehaves.

The peer (fakepeer.FakeService) speaks the node service's protocol on a Unix
socket and fails at one exact point: a Hello reply trickled a byte at a time, a
header announcing a huge body, half a frame and then silence.
"""

import os
import shutil
import struct
import tempfile
import time

import pytest

from fakepeer import FakeService, wait_for
from strata_sglang import client as sc
from strata_sglang import wire

# How far past its deadline a call may end on a loaded two-core machine. The
# bugs these tests catch overran by seconds or forever.
SLACK = 1.5


@pytest.fixture
def path():
    d = tempfile.mkdtemp(prefix="sglc")
    yield os.path.join(d, "fake.sock")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def fake(path):
    made = []

    def start(handler):
        f = FakeService(path, handler)
        made.append(f)
        return f

    yield start
    for f in made:
        f.close()


@pytest.fixture
def clients():
    made = []

    def new(path, **kw):
        kw.setdefault("reconnect_min", 0.01)
        kw.setdefault("reconnect_max", 0.05)
        c = sc.Client(path, "test", **kw)
        made.append(c)
        return c

    yield new
    for c in made:
        c.close()


def memfd(size=1 << 16, name="seg"):
    fd = os.memfd_create(name, os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def header(typ, req_id, length):
    return struct.pack("<2sBBQI", wire.MAGIC, wire.VERSION, typ, req_id, length)


def hello_frame(req_id):
    return wire.encode_frame(req_id, wire.HelloReply(7, "fake", wire.MAX_ITEMS))


# ---------------------------------------------------------------- A: deadlines


def test_a_hello_reply_trickled_byte_by_byte_ends_by_the_deadline(path, fake):
    def handler(i, p):
        h, _ = p.recv()
        p.trickle(hello_frame(h.id), every=0.4)  # ~40 bytes: 16 s in all

    fake(handler)
    t0 = time.monotonic()
    with pytest.raises(sc.Timeout):
        sc.Connection(path, 1.0, "test")
    took = time.monotonic() - t0
    assert took < 1.0 + SLACK, f"Connection(timeout=1.0) took {took:.1f} s against a trickling peer"


def test_a_reply_announcing_a_huge_body_that_trickles_ends_by_the_deadline(path, fake):
    def handler(i, p):
        h, _ = p.recv()
        p.sock.sendall(header(wire.HELLO_REPLY, h.id, wire.MAX_BODY))
        p.trickle(b"\0" * 1000, every=0.2)

    fake(handler)
    t0 = time.monotonic()
    with pytest.raises(sc.Timeout):
        sc.Connection(path, 1.0, "test")
    took = time.monotonic() - t0
    assert took < 1.0 + SLACK, f"Connection(timeout=1.0) took {took:.1f} s against a 16 MiB trickle"


def test_a_header_over_the_body_limit_is_refused_at_once(path, fake):
    def handler(i, p):
        h, _ = p.recv()
        p.sock.sendall(header(wire.HELLO_REPLY, h.id, wire.MAX_BODY + 1))

    fake(handler)
    t0 = time.monotonic()
    with pytest.raises(wire.Malformed, match="at most"):
        sc.Connection(path, 5.0, "test")
    assert time.monotonic() - t0 < SLACK


def test_the_reader_closes_the_connection_on_a_header_over_the_limit(path, fake):
    def handler(i, p):
        assert p.hello()
        h, _ = p.recv()
        p.sock.sendall(header(wire.PONG, h.id, wire.MAX_BODY + 1))

    fake(handler)
    conn = sc.Connection(path, 5.0, "test")
    t0 = time.monotonic()
    with pytest.raises(sc.Unavailable):
        conn.call(wire.Ping(1), 5.0)
    assert time.monotonic() - t0 < SLACK
    assert conn.dead.wait(SLACK) and conn.closed
    assert isinstance(conn.error, wire.Malformed)


def test_a_call_ends_by_its_deadline_while_the_reader_is_stuck_in_a_trickled_body(path, fake):
    def handler(i, p):
        assert p.hello()
        h, _ = p.recv()
        p.sock.sendall(header(wire.PONG, h.id, wire.MAX_BODY))
        p.trickle(b"\0" * 1000, every=0.2)

    fake(handler)
    conn = sc.Connection(path, 1.0, "test")
    try:
        t0 = time.monotonic()
        with pytest.raises(sc.Timeout):
            conn.call(wire.Ping(1), 0.5)
        assert time.monotonic() - t0 < 0.5 + SLACK
    finally:
        conn.close()


# ---------------------------------------------------------------- 5: a hung peer


def test_a_peer_that_sends_half_a_frame_is_dropped_after_two_timeouts(path, fake, clients):
    def handler(i, p):
        assert p.hello()
        if i == 0:
            h, _ = p.recv()
            frame = wire.encode_frame(h.id, wire.Pong(1))
            p.sock.sendall(frame[: len(frame) // 2])
            return  # and keep the connection open, silent (FakeService holds it)
        p.serve()

    f = fake(handler)
    c = clients(path, timeout=0.3)
    assert c.wait_connected(10)
    for _ in range(2):
        with pytest.raises(sc.Timeout):
            c.call(wire.Ping(1))

    def answers():
        try:
            return isinstance(c.call(wire.Ping(2)), wire.Pong)
        except sc.StrataError:
            return False

    assert wait_for(
        answers, 10
    ), "the client kept the hung connection: every call costs its deadline"
    assert f.accepted >= 2 and c.connects >= 2


def test_timeouts_that_are_not_in_a_row_keep_the_connection(path, fake, clients):
    """A timeout between answers is a slow reply, not a hung peer."""

    def handler(i, p):
        assert p.hello()
        while True:
            got = p.recv()
            if got is None:
                return
            h, m = got
            if m.nonce:  # Ping(0) is never answered
                p.send(h.id, wire.Pong(m.nonce))

    fake(handler)
    c = clients(path, timeout=0.3)
    assert c.wait_connected(10)
    conn = c.snapshot()
    for n in range(1, 6):
        with pytest.raises(sc.Timeout):
            c.call(wire.Ping(0))
        assert c.call(wire.Ping(n)) == wire.Pong(n)
    assert c.snapshot() is conn and not conn.closed


def test_no_peer_at_all_fails_fast(path):
    t0 = time.monotonic()
    with pytest.raises(OSError):
        sc.Connection(path, 5.0, "test")
    assert time.monotonic() - t0 < SLACK
