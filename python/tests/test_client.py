"""The client's deadlines, reconnects and registrations against a peer that misbehaves.

The peer (fakepeer.FakeService) speaks the node service's protocol on a Unix
socket and fails at one exact point: a Hello reply trickled a byte at a time, a
header announcing a huge body, half a frame and then silence, a connection
closed in the middle of a registration, a segment id of 0.
"""

import logging
import os
import shutil
import socket
import struct
import tempfile
import threading
import time

import pytest

from fakepeer import FakeService, wait_for
from strata_client import client as sc
from strata_client import wire

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
        with caplog.at_level(logging.WARNING, logger="strata_client"):
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
    with caplog.at_level(logging.WARNING, logger="strata_client"):
        c = clients(path, timeout=0.3)
        assert c.wait_connected(10)
    msgs = [r.getMessage() for r in caplog.records]
    assert not any("again" in m for m in msgs), msgs
    up = [m for m in msgs if "connected to the node service" in m]
    assert len(up) == 1 and "1 failed attempt" in up[0] and "L3 is on" in up[0], msgs


def test_wait_connected_waits_for_a_registration_retried_in_the_background(path, fake, clients):
    """A registration that timed out (a busy service) is retried while the
    connection stays up; wait_connected returns only once it took, so a call
    made right after it finds the segment registered."""
    first, release = threading.Event(), threading.Event()

    def handler(i, p):
        assert p.hello()
        if i == 0:
            h, _ = p.recv()
            assert h.type == wire.REGISTER_SEGMENT
            first.set()
            release.wait(10)  # never answered: the client's call times out
        p.serve(first_segment=7)

    fake(handler)
    c = clients(path, timeout=0.3)
    assert c.wait_connected(10)
    fd = memfd()
    try:
        s = c.add_segment(fd, "a")
        assert first.is_set() and not s.on(c.snapshot())
        assert not c.wait_connected(0.2), "wait_connected returned with a segment being retried"
        release.set()
        assert c.wait_connected(10)
        _, ids = c.resolve([s])
        assert ids == [7] or ids[0] >= 7
    finally:
        os.close(fd)


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


# ---------------------------------------------------------------- 1: a call that gave up

# The fake service's clock runs this far ahead of ours: deadlines are converted.
SKEW = 10**12


def fenced(script):
    """A handler: Hello with a clock, the fence page, then script(i, p, counters)."""

    def handler(i, p):
        if not p.hello(skew_ns=SKEW):
            return
        counters = p.fence()
        if counters is not None:
            script(i, p, counters)

    return handler


def a_get():
    return wire.Get([wire.Item("k", 1, [wire.Range(1, 0, 8)])])


def a_put():
    return wire.Put([wire.Item("k", 1, [wire.Range(1, 0, 8)])])


def in_thread(fn):
    out = {}

    def run():
        t0 = time.monotonic()
        try:
            out["ret"] = fn()
        except BaseException as e:  # noqa: BLE001 - the test looks at it
            out["err"] = e
        out["took"] = time.monotonic() - t0

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def test_puts_and_gets_carry_the_deadline_in_the_services_clock_and_a_slot(path, fake):
    seen = []
    all_in = threading.Event()
    together = threading.Event()

    def script(i, p, counters):
        held = []
        while True:
            got = p.recv()
            if got is None:
                return
            h, m = got
            seen.append((h.type, m.deadline_ns, m.fence_slot))
            if together.is_set() and h.type == wire.GET and len(held) < 7:
                held.append(h)  # answered once 8 are in flight together
                continue
            if held:
                all_in.set()
            for x in held + [h]:
                p.send(x.id, wire.BatchReply([wire.Result()]))
            held = []

    fake(fenced(script))
    conn = sc.Connection(path, 5.0, "test")
    try:
        assert conn.deadlines and conn.fence is not None
        for msg, timeout in ((a_put(), 2.0), (a_get(), 3.0)):
            before = time.monotonic_ns()
            conn.call(msg, timeout)
            typ, dl, slot = seen[-1]
            # Converted with the Hello's round trip, erring early, never late.
            assert dl <= time.monotonic_ns() + SKEW + int(timeout * 1e9)
            assert dl >= before + SKEW + int(timeout * 1e9) - int(conn.rtt * 1e9) - 1
            assert slot == 0 if typ == wire.PUT else 1 <= slot <= wire.FENCE_SLOTS
        seen.clear()
        together.set()
        threads = [in_thread(lambda: conn.call(a_get(), 5.0)) for _ in range(8)]
        for t, _ in threads:
            t.join(10)
        assert all_in.is_set() and all(
            isinstance(o.get("ret"), wire.BatchReply) for _, o in threads
        )
        slots = [s for _, _, s in seen]
        assert len(set(slots)) == 8, f"gets in flight together shared fence slots: {slots}"
    finally:
        conn.close()


def test_a_get_past_its_deadline_waits_while_the_service_copies(path, fake, caplog):
    """The service raised the get's counter (a copy into our pages runs) and
    stalls: the call returns when the copy ends, not at its deadline."""
    release = threading.Event()

    def script(i, p, counters):
        h, m = p.recv()
        counters[m.fence_slot - 1] += 1
        release.wait(20)
        counters[m.fence_slot - 1] -= 1

    fake(fenced(script))
    conn = sc.Connection(path, 5.0, "test")
    try:

        def logged():
            return any("stalled in the middle" in r.getMessage() for r in caplog.records)

        with caplog.at_level(logging.WARNING, logger="strata_client"):
            t, out = in_thread(lambda: conn.call(a_get(), 0.3))
            # Past the deadline, the call waits; after a second of it, it says so.
            assert wait_for(logged, 20), "a get held past its deadline did not log the stall"
            assert t.is_alive(), "a get returned while the service was copying into its pages"
            release.set()
            t.join(SLACK)
        assert not t.is_alive(), "a get did not return once the copy ended"
        assert isinstance(out["err"], sc.Timeout)
        stalled = [
            m for m in (r.getMessage() for r in caplog.records) if "stalled in the middle" in m
        ]
        assert len(stalled) == 1, caplog.text
        assert not conn.closed  # one timeout: the connection stays
    finally:
        release.set()
        conn.close()


def test_a_get_waiting_on_a_copy_returns_when_the_service_closes(path, fake):
    close = threading.Event()

    def script(i, p, counters):
        h, m = p.recv()
        counters[m.fence_slot - 1] += 1  # and never lowered: the service dies mid-copy
        close.wait(20)
        p.sock.shutdown(socket.SHUT_RDWR)
        p.close()

    fake(fenced(script))
    conn = sc.Connection(path, 5.0, "test")
    try:
        t, out = in_thread(lambda: conn.call(a_get(), 0.3))
        t.join(0.3 + 0.5)
        assert t.is_alive()
        close.set()
        t.join(SLACK)
        assert not t.is_alive(), "a get did not return once the service closed the connection"
        assert conn.peer_closed.is_set() and conn.wait_released(SLACK)
    finally:
        close.set()
        conn.close()


def test_dropping_the_connection_does_not_end_the_wait_for_a_copy(path, fake):
    """Two timeouts in a row drop the connection: that is the client's own end,
    which tells nothing of the copy; the get waits on for the counter."""
    release, copying = threading.Event(), threading.Event()

    def script(i, p, counters):
        h, m = p.recv()
        counters[m.fence_slot - 1] += 1
        copying.set()
        p.recv()  # a ping, never answered
        release.wait(20)
        counters[m.fence_slot - 1] -= 1

    fake(fenced(script))
    conn = sc.Connection(path, 5.0, "test")
    try:
        t, out = in_thread(lambda: conn.call(a_get(), 0.3))
        assert copying.wait(10)
        with pytest.raises(sc.Timeout):
            conn.call(wire.Ping(1), 0.3)
        assert wait_for(
            lambda: conn.closed, 10
        ), "two timeouts in a row did not drop the connection"
        t.join(1.0)
        assert t.is_alive(), "a get returned because the client dropped its connection"
        release.set()
        t.join(SLACK)
        assert not t.is_alive()
        assert conn.wait_released(SLACK), "the dropped connection's socket stayed open"
    finally:
        release.set()
        conn.close()


def test_a_call_whose_connection_is_lost_returns_no_sooner_than_its_deadline(path, fake):
    """The client closed the connection (as after a malformed reply) while a put
    and a get were in the service: until their deadline the service may still
    copy for them, so they return after it."""
    both, done = threading.Event(), threading.Event()

    def script(i, p, counters):
        p.recv()
        p.recv()
        both.set()
        done.wait(20)  # the connection open, whatever the client does

    fake(fenced(script))
    conn = sc.Connection(path, 5.0, "test")
    try:
        calls = [in_thread(lambda m=m: conn.call(m, 2.0)) for m in (a_put(), a_get())]
        assert both.wait(10)
        conn.close()
        for t, out in calls:
            t.join(2.0 + SLACK)
            assert not t.is_alive()
            # Unavailable: the connection was lost (or, on a machine slow enough
            # to reach the deadline first, Timeout): never before the deadline.
            assert isinstance(out["err"], (sc.Unavailable, sc.Timeout))
            assert (
                out["took"] >= 1.99
            ), f"a call returned {out['took']:.2f} s in, before its deadline"
    finally:
        done.set()
        conn.close()


def test_a_get_without_a_fence_page_waits_for_the_service_to_close(path, fake, clients, caplog):
    ended = threading.Event()

    def handler(i, p):
        if not p.hello(skew_ns=0):
            return
        h, m = p.recv()
        assert m.fence
        p.send(h.id, wire.Error(wire.BAD_RANGE, "no fence pages here"))
        while True:
            got = p.recv(timeout=20)
            if got is None:
                ended.set()
                return  # the client ended its side: the service closes
            h, m = got
            if h.type == wire.REGISTER_SEGMENT:
                p.send(h.id, wire.RegisterSegmentReply(1))
            elif h.type == wire.PING:
                p.send(h.id, wire.Pong(m.nonce))
            # a get is never answered

    fake(handler)
    with caplog.at_level(logging.WARNING, logger="strata_client"):
        c = clients(path, timeout=0.3)
        assert c.wait_connected(10)
        conn = c.snapshot()
        assert conn.deadlines and conn.fence is None and "no fence pages" in conn.fence_error
        with pytest.raises(sc.Timeout):
            conn.call(a_get(), 0.3)
    assert ended.is_set() and conn.peer_closed.is_set()
    assert sum("refused the connection's fence page" in r.getMessage() for r in caplog.records) == 1


def test_an_older_service_gets_no_deadlines_and_one_warning(path, fake, clients, caplog):
    got = []

    def handler(i, p):
        if not p.hello():  # clock_ns 0
            return
        while True:
            r = p.recv()
            if r is None:
                return
            h, m = r
            got.append(m)
            if h.type == wire.REGISTER_SEGMENT:
                p.send(h.id, wire.RegisterSegmentReply(1))
            elif h.type in (wire.PUT, wire.GET):
                p.send(h.id, wire.BatchReply([wire.Result()] * len(m.items)))

    fake(handler)
    with caplog.at_level(logging.WARNING, logger="strata_client"):
        c = clients(path)
        assert c.wait_connected(10)
        conn = c.snapshot()
        conn.call(a_put(), 1.0)
        conn.call(a_get(), 1.0)
    assert not conn.deadlines and conn.fence is None
    assert [(m.deadline_ns, m.fence_slot) for m in got] == [(0, 0), (0, 0)]
    assert sum("keeps no client deadlines" in r.getMessage() for r in caplog.records) == 1


def test_a_slow_hello_is_made_again(path, fake, clients):
    """A Hello held by a stalled service makes every deadline of its connection
    early by as long: the client connects again and keeps the quicker one."""

    def handler(i, p):
        if i == 0:
            got = p.recv()
            if got is None:
                return
            time.sleep(0.3)  # a tenth of the timeout is 0.1 s
            p.send(got[0].id, wire.HelloReply(1, "fake", wire.MAX_ITEMS, time.monotonic_ns()))
        elif not p.hello(skew_ns=0):
            return
        p.serve()

    f = fake(handler)
    c = clients(path, timeout=1.0)
    assert c.wait_connected(10)
    assert f.accepted >= 2 and c.snapshot().rtt < 0.3
    assert c.connects == 1
