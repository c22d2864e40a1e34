"""The engine plugins' doctor (``python -m strata_sglang doctor``, ``python -m
strata_vllm doctor``): the checks of the node service every engine needs,
with the engine's own kind of memory segment and the flags that load its
plugin. Each check prints ok or FAIL with the fix; the exit status is 0 when
all pass, and a failure is found within seconds."""

from __future__ import annotations

import mmap
import os
import socket
import time
from typing import Callable

from . import wire
from .client import Connection, StrataError, Timeout


def doctor(
    socket_path: str,
    timeout: float,
    out,
    engine: str,
    make_segment: Callable[[int], int],
    segment_what: str,
    start_with: str,
) -> int:
    """Run the checks; print each; return the exit status (0 when all pass).

    engine names the engine in the messages; make_segment(size) makes a
    descriptor of size bytes of the engine's kind of memory (the caller's to
    close: it is closed here), which segment_what describes ("a shm host
    pool built the way SGLang builds it"); start_with is printed last: how
    to start the engine with the plugin."""

    def fail(what: str, fix: str) -> int:
        print(f"FAIL  {what}\n      fix: {fix}", file=out)
        return 1

    if not os.path.exists(socket_path):
        return fail(
            f"no socket at {socket_path}",
            f"start the node service: strata serve --socket {socket_path} --arena 64GiB "
            "(or pass the socket it listens on with --socket)",
        )
    t0 = time.monotonic()
    try:
        conn = Connection(socket_path, timeout, f"strata-doctor-{os.getpid()}")
    except PermissionError as e:
        return fail(
            f"cannot connect to {socket_path}: {e}",
            f"run {engine} as the service's user, or start strata serve with --socket-mode 0660 "
            f"--socket-group GROUP and add {engine}'s user to GROUP",
        )
    except ConnectionRefusedError as e:
        # Nothing listens on the path: the file outlived its service.
        return fail(
            f"nothing listens on {socket_path} ({e})",
            "the socket file outlived its service (a crash): start strata serve again",
        )
    except (socket.timeout, Timeout) as e:
        # Something accepted the connection and did not answer: a service
        # answers within milliseconds of starting, even with a large arena.
        return fail(
            f"the node service at {socket_path} accepted the connection but did not answer within {timeout:g} s: {e}",
            f"it is stopped (SIGSTOP, a debugger) or overloaded: see strata inspect --socket {socket_path} and its log",
        )
    except (OSError, StrataError, wire.Malformed) as e:
        return fail(
            f"the node service at {socket_path} does not answer: {e}",
            f"check that strata serve is running (strata inspect --socket {socket_path}) and see its log",
        )
    try:
        try:
            conn.call(wire.Ping(0x5354), timeout)
        except (StrataError, wire.Malformed) as e:
            return fail(f"ping: {e}", "restart strata serve; see its log")
        print(
            f"ok    the node service answers ({conn.hello.server_version}, "
            f"{(time.monotonic() - t0) * 1e3:.1f} ms)",
            file=out,
        )
        if conn.hello.starting:
            print(
                f"ok    the node service is starting ({conn.hello.ready_percent}% of its arena ready): "
                "it serves already, from what is ready",
                file=out,
            )
        if conn.hello.warm:
            print(
                "ok    the node service kept its contents across its last restart (warm)", file=out
            )
        if not conn.deadlines:
            return fail(
                "the node service keeps no client deadlines (an older strata serve): a call that times out "
                f"may still be copied into or out of {engine}'s memory after {engine} reused it",
                "upgrade strata serve to this plugin's release",
            )
        if conn.fence is None:
            return fail(
                f"the node service refused the connection's fence page: {conn.fence_error}",
                "see strata serve's log; upgrade or restart it",
            )
        print(
            "ok    a call that times out is never copied afterwards (deadlines, a fence page)",
            file=out,
        )
        size = 1 << 20
        fd = make_segment(size)
        try:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            try:
                r = conn.call(wire.RegisterSegment(size, "doctor"), timeout, fds=[fd])
            except (StrataError, wire.Malformed) as e:
                return fail(
                    f"the service refused {segment_what}: {e}",
                    "upgrade strata serve to a release that accepts unsealed memfds, or raise "
                    "--client-quota if the reason is the quota",
                )
            print(f"ok    {segment_what} registers", file=out)
            half = size // 2
            data = os.urandom(64 << 10)
            mm[: len(data)] = data
            key = f"strata-doctor:{os.getpid()}-{os.urandom(8).hex()}"
            rng = [wire.Range(r.segment_id, 0, len(data))]
            back = [wire.Range(r.segment_id, half, len(data))]
            try:
                put = conn.call(wire.Put([wire.Item(key, 0x5354, rng)]), timeout)
                get = conn.call(wire.Get([wire.Item(key, 0x5354, back)]), timeout)
                conn.call(wire.Remove([key]), timeout)
            except (StrataError, wire.Malformed) as e:
                return fail(f"put/get round trip: {e}", "see strata serve's log")
            if put.results[0].status != wire.OK or get.results[0].status != wire.OK:
                return fail(
                    f"put/get round trip: put {put.results[0]}, get {get.results[0]}",
                    "give strata serve a larger --arena; see its log",
                )
            if mm[half : half + len(data)] != data:
                return fail("put/get round trip returned other bytes", "report a bug")
            print("ok    a put/get round trip returns the same bytes", file=out)
            mm.close()
        finally:
            os.close(fd)
    finally:
        conn.close()
    print(f"\nStart {engine} with:\n  " + start_with, file=out)
    return 0


def main(prog: str, engine: str, run, argv=None) -> int:
    """A plugin's command line, ``python -m <plugin> doctor --socket PATH``:
    run(socket, timeout) is the plugin's doctor."""
    import argparse

    p = argparse.ArgumentParser(prog=prog)
    sub = p.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser(
        "doctor",
        help=f"check that {engine} can use the node service",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    d.add_argument("--socket", default="/run/strata/strata.sock", help="strata serve's socket")
    d.add_argument("--timeout", type=float, default=5.0, help="seconds per check")
    args = p.parse_args(argv)
    return run(args.socket, args.timeout)
