"""The client's deadlines, reconnects and registrations against a peer that misbehaves.

The peer (fakepeer.FakeService) speaks the node service's protocol on a Unix
socket and fails at one exact point: a Hello reply trickled a byte at a time, a
header announcing a huge body, half a frame and then silence, a connection
closed in the middle of a registration, a segment id of 0.
"""

import logging
import os
import shutil
import struct
import tempfile
import threading
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


# ---------------------------------------------------------------- 2: the connector never dies


def test_the_connector_survives_a_registration_that_fails_after_it_connected(path, fake, clients):
    holding, go = threading.Event(), threading.Event()

    def handler(i, p):
        assert p.hello()
        if i == 0:
            h, m = p.recv()
            assert h.type == wire.REGISTER_SEGMENT
            p.send(h.id, wire.RegisterSegmentReply(1))
            p.close()  # the service goes away: the client reconnects
            return
        if i == 1:
            h, m = p.recv()  # segment A, registered again
            holding.set()
            go.wait(10)
            p.send(h.id, wire.RegisterSegmentReply(1))
            p.recv()  # segment B, added meanwhile: the service closes right then
            p.close()
            return
        p.serve()

    fake(handler)
    c = clients(path, timeout=2.0)
    assert c.wait_connected(10)
    fa, fb = memfd(), memfd()
    try:
        c.add_segment(fa, "a")
        assert holding.wait(10), "the client did not register segment a again after reconnecting"
        adder = threading.Thread(target=c.add_segment, args=(fb, "b"), daemon=True)
        adder.start()
        assert wait_for(lambda: len(c._segments) == 2, 10)
        go.set()

        def both():
            try:
                c.resolve(list(c._segments.values()))
                return True
            except sc.StrataError:
                return False

        assert wait_for(both, 10), "the connector died: L3 is off for the life of the process"
        assert c._thread.is_alive()
        adder.join(10)
        assert not adder.is_alive()
    finally:
        os.close(fa)
        os.close(fb)


# ---------------------------------------------------------------- 7: what the log says


def test_segment_id_0_is_a_refusal_with_a_warning(path, fake, clients, caplog):
    def handler(i, p):
        assert p.hello()
        while True:
            got = p.recv()
            if got is None:
                return
            h, _ = got
            if h.type == wire.REGISTER_SEGMENT:
                p.send(h.id, wire.RegisterSegmentReply(0))

    fake(handler)
    c = clients(path)
    assert c.wait_connected(10)
    fd = memfd()
    try:
        with caplog.at_level(logging.WARNING, logger="strata_sglang"):
            s = c.add_segment(fd, "kv")
        assert s.refused and "segment id 0" in s.refused
        assert any("segment id 0" in r.getMessage() for r in caplog.records), caplog.text
        with pytest.raises(sc.StrataError, match="refused"):
            c.resolve([s])
    finally:
        os.close(fd)


def test_a_first_hello_that_times_out_is_logged_as_what_it_was(path, fake, clients, caplog):
    def handler(i, p):
        if i == 0:
            p.recv()  # the Hello, never answered
            return
        assert p.hello()
        p.serve()

    fake(handler)
    with caplog.at_level(logging.WARNING, logger="strata_sglang"):
        c = clients(path, timeout=0.3)
        assert c.wait_connected(10)
    msgs = [r.getMessage() for r in caplog.records]
    assert not any("again" in m for m in msgs), msgs
    up = [m for m in msgs if "connected to the node service" in m]
    assert len(up) == 1 and "1 failed attempt" in up[0] and "L3 is on" in up[0], msgs


def test_a_segment_is_unregistered_and_closed_on_remove(path, fake, clients):
    got = []

    def handler(i, p):
        assert p.hello()
        while True:
            r = p.recv()
            if r is None:
                return
            h, m = r
            got.append(h.type)
            if h.type == wire.REGISTER_SEGMENT:
                p.send(h.id, wire.RegisterSegmentReply(5))
            elif h.type == wire.UNREGISTER_SEGMENT:
                got.append(m.segment_id)
                p.send(h.id, wire.Ack())

    fake(handler)
    c = clients(path)
    assert c.wait_connected(10)
    fd = memfd()
    try:
        s = c.add_segment(fd, "kv")
        assert s.seg_id == 5
        c.remove_segment(s)
        assert wire.UNREGISTER_SEGMENT in got and got[-1] == 5
        with pytest.raises(OSError):
            os.fstat(s.fd)
        assert not c._segments
    finally:
        os.close(fd)


def test_no_peer_at_all_fails_fast(path):
    t0 = time.monotonic()
    with pytest.raises(OSError):
        sc.Connection(path, 5.0, "test")
    assert time.monotonic() - t0 < SLACK
