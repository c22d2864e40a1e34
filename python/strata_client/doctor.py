"""The engine plugins' doctor (``python -m strata_sglang doctor``, ``python -m
strata_vllm doctor``): the checks of the node service every engine needs,
with the engine's own kind of memory segment and the flags that load its
plugin, run from the engine's own python, so that it also checks that the
engine's interface imports there. Each check prints ok or FAIL with the fix;
the exit status is 0 when all pass, and a failure is found within seconds.
``strata doctor`` runs the same service checks from the Go binary
(cmd/strata/doctor.go)."""

from __future__ import annotations

import grp
import importlib.util
import mmap
import os
import pwd
import socket
import stat
import sys
import time
from typing import Callable, Optional, Tuple

from . import wire
from .client import Connection, StrataError, Timeout

GIB = 1 << 30
MIB = 1 << 20
# What strata serve's own start checks refuse (node/arena's checkRoom,
# hostmem's allocator): an arena that leaves less than this of MemAvailable.
SERVE_RESERVE = GIB
# The arena file's room beyond the arena: 1/1024 of it and at most this (8 MiB
# of eviction log after a page of superblock and the unit map, the data then
# aligned to 2 MiB), as cmd/strata/doctor.go's arenaFileHeader.
ARENA_FILE_HEADER = 10 * MIB + 8 * 1024
# Where the README keeps the arena file, so that a restarted service finds its objects.
ARENA_FILE = "/dev/shm/strata/strata.arena"


def available_bytes(meminfo: str = "/proc/meminfo", cgroup: str = "/sys/fs/cgroup") -> int:
    """Memory this machine can still give: MemAvailable, lowered to the cgroup
    v2 headroom (memory.max - memory.current), as strata serve reads it; 0
    when it cannot be read."""
    avail = 0
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    avail = int(line.split()[1]) << 10
                    break
    except (OSError, ValueError, IndexError):
        return 0
    try:
        with open(os.path.join(cgroup, "memory.max")) as f:
            limit = f.read().strip()
        with open(os.path.join(cgroup, "memory.current")) as f:
            current = int(f.read().strip())
        if limit != "max":
            avail = min(avail, int(limit) - current)
    except (OSError, ValueError):
        pass
    return avail


def shm_free_bytes(shm: str = "/dev/shm") -> int:
    """The free bytes of the tmpfs the arena file would go on; -1 when there is none."""
    try:
        if not os.path.isdir(shm):
            return -1
        st = os.statvfs(shm)
    except OSError:
        return -1
    return st.f_bavail * st.f_frsize


def proposed_arena(avail: int, shm_free: int) -> Tuple[int, bool]:
    """The --arena a fix line proposes, and whether its arena file fits on
    /dev/shm: min(64 GiB, half of avail, avail less strata serve's reserve,
    what the tmpfs holds) in whole GiB; below 1 GiB of room in 64 MiB steps
    (64 MiB at least), since 1 GiB would be refused there. A /dev/shm too
    small for 1 GiB (a container's 64 MiB) does not shrink it: the proposal
    then has no arena file. The same rule as cmd/strata/doctor.go."""
    room = min(64 * GIB, avail // 2, avail - SERVE_RESERVE)
    with_file = False
    if shm_free >= 0:
        file_room = (shm_free - ARENA_FILE_HEADER) // 1025 * 1024
        if file_room >= GIB or file_room >= room:
            room, with_file = min(room, file_room), True
    if room >= GIB:
        return room // GIB * GIB, with_file
    step = 64 * MIB
    return max(room // step * step, step), with_file and room >= step


def format_arena(n: int) -> str:
    """A size as --arena reads it: 11GiB, 768MiB."""
    return f"{n // GIB}GiB" if n % GIB == 0 else f"{n // MIB}MiB"


def serve_command(
    socket_path: str, meminfo: str = "/proc/meminfo", shm: str = "/dev/shm", cgroup=None
) -> str:
    """The strata serve command line that fits this machine (meminfo, shm and
    cgroup are where it reads the machine: tests give their own)."""
    avail = available_bytes(meminfo, cgroup or "/sys/fs/cgroup")
    arena, with_file = proposed_arena(avail, shm_free_bytes(shm))
    cmd = f"strata serve --socket {socket_path} --arena {format_arena(arena)}"
    return cmd + (f" --arena-file {ARENA_FILE}" if with_file else "")


def _permission_fix(engine: str) -> str:
    return (
        f"run {engine} (and this doctor) as the service's user, or start strata serve with "
        f"--socket-mode 0660 --socket-group GROUP and add {engine}'s user to GROUP "
        "(the socket's directory must be searchable too)"
    )


def _socket_file(socket_path: str, engine: str, serve: Callable[[], str]) -> Tuple[bool, str, str]:
    """Whether socket_path is a socket this user may connect to: (ok, what, fix)."""
    try:
        st = os.stat(socket_path)
    except FileNotFoundError:
        return (
            False,
            f"no socket at {socket_path}: no node service listens there",
            f"{serve()} (or pass the socket it listens on with --socket)",
        )
    except PermissionError as e:
        return False, f"cannot look at {socket_path}: {e}", _permission_fix(engine)
    except OSError as e:
        return (
            False,
            f"cannot look at {socket_path}: {e}",
            "pass the socket strata serve listens on",
        )
    if not stat.S_ISSOCK(st.st_mode):
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "regular file"
        if not stat.S_ISDIR(st.st_mode) and not stat.S_ISREG(st.st_mode):
            kind = "special file"
        return (
            False,
            f"{socket_path} is a {kind}, not a socket",
            f"pass the socket strata serve listens on with --socket; if nothing else uses "
            f"{socket_path}, remove it and start strata serve",
        )
    try:
        owner = pwd.getpwuid(st.st_uid).pw_name
    except KeyError:
        owner = f"uid {st.st_uid}"
    try:
        group = grp.getgrgid(st.st_gid).gr_name
    except KeyError:
        group = f"gid {st.st_gid}"
    mode = stat.S_IMODE(st.st_mode)
    # connect(2) on a Unix socket needs write permission on its file.
    if not os.access(socket_path, os.W_OK):
        return (
            False,
            f"this user (uid {os.getuid()}) may not connect to {socket_path} "
            f"(owner {owner}:{group}, mode {mode:04o})",
            _permission_fix(engine),
        )
    note = ""
    if mode & 0o002:
        note = (
            "; any user of this machine may connect: --socket-mode 0660 --socket-group GROUP "
            "limits it to GROUP"
        )
    return (
        True,
        f"{socket_path} is a socket this user may connect to (owner {owner}:{group}, "
        f"mode {mode:04o}{note})",
        "",
    )


def engine_fix(engine: str, package: str, module: str, socket_path: str) -> str:
    """The fix when the engine's interface does not import here: when this
    python has no engine at all (package), run the doctor with the engine's
    python, where the plugin is installed too; otherwise the engine is one
    the plugin does not know."""
    try:
        present = package in sys.modules or importlib.util.find_spec(package) is not None
    except (ImportError, ValueError):
        present = True
    if present:
        return f"upgrade {engine} or the plugin to releases that match (the line above says which)"
    return (
        f"this python ({sys.executable}) is not the one {engine} runs with: run the doctor with "
        f"{engine}'s python, after installing the plugin there (PYTHON -m pip install ./python, "
        f"or offline --no-build-isolation --no-index ./python): PYTHON -m {module} doctor "
        f"--socket {socket_path}"
    )


def doctor(
    socket_path: str,
    timeout: float,
    out,
    engine: str,
    make_segment: Callable[[int], int],
    segment_what: str,
    start_with: str,
    engine_check: Optional[Callable[[], Tuple[bool, str, str]]] = None,
    serve: Optional[Callable[[], str]] = None,
) -> int:
    """Run the checks; print each; return the exit status (0 when all pass).

    engine names the engine in the messages; make_segment(size) makes a
    descriptor of size bytes of the engine's kind of memory (the caller's to
    close: it is closed here), which segment_what describes ("a shm host
    pool built the way SGLang builds it"); start_with is printed last: how
    to start the engine with the plugin. engine_check() says whether the
    engine's interface imports in this python, (ok, what, fix): it is run
    first, and the service's checks run whatever it says, so that one run
    shows both. serve() is the strata serve command a fix proposes
    (serve_command for this machine by default)."""

    def fail(what: str, fix: str) -> int:
        print(f"FAIL  {what}\n      fix: {fix}", file=out)
        return 1

    failed = 0
    if engine_check is not None:
        ok, what, fix = engine_check()
        if ok:
            print(f"ok    {what}", file=out)
        else:
            failed = fail(what, fix)
    serve = serve or (lambda: serve_command(socket_path))
    ok, what, fix = _socket_file(socket_path, engine, serve)
    if not ok:
        return fail(what, fix)
    print(f"ok    {what}", file=out)
    if _service(socket_path, timeout, out, engine, make_segment, segment_what, serve, fail):
        return 1
    if failed:
        return 1
    print(f"\nStart {engine} with:\n  " + start_with, file=out)
    return 0


def _service(socket_path, timeout, out, engine, make_segment, segment_what, serve, fail) -> int:
    """The node service's checks (doctor's): 0 when all pass."""
    t0 = time.monotonic()
    try:
        conn = Connection(socket_path, timeout, f"strata-doctor-{os.getpid()}")
    except PermissionError as e:
        return fail(f"cannot connect to {socket_path}: {e}", _permission_fix(engine))
    except ConnectionRefusedError as e:
        # Nothing listens on the path: the file outlived its service.
        return fail(
            f"nothing listens on {socket_path} ({e})",
            f"the socket file outlived its service (a crash): start strata serve again: {serve()}",
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
