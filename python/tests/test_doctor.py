"""The doctor against a real strata serve, and without one; from a python with
the engine's interface, and from one without it."""

import os
import socket
import subprocess
import sys
import time

from conftest import HERE, PYTHON_DIR, need

from strata_client import doctor as common

GIB = 1 << 30


def engine_site(tmp_path) -> str:
    """A folder for PYTHONPATH whose sitecustomize puts the project's models
    of SGLang and vLLM where the plugins import them from: a python with the
    engines, for a test machine that has neither. It holds no plugin code, so
    the plugin still comes from where the python under test has it."""
    d = tmp_path / "engine_site"
    d.mkdir(exist_ok=True)
    (d / "sitecustomize.py").write_text(
        f"import sys\nsys.path.append({HERE!r})\n"
        "import sglang_model, vllm_model\nsglang_model.install()\nvllm_model.install()\n"
    )
    return str(d)


def run_doctor(sock, *args, site=None, module="strata_sglang", **kw):
    t0 = time.monotonic()
    path = PYTHON_DIR + (os.pathsep + site if site else "")
    env = dict(os.environ, PYTHONPATH=path, PYTHONDONTWRITEBYTECODE="1")
    r = subprocess.run(
        [sys.executable, "-m", module, "doctor", "--socket", sock, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        **kw,
    )
    return r, time.monotonic() - t0


def test_doctor_passes_and_prints_the_flags(serve, tmp_path):
    r, _ = run_doctor(serve.socket, site=engine_site(tmp_path))
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok    the plugin imports with SGLang's HiCache storage interface" in r.stdout
    assert f"ok    {serve.socket} is a socket this user may connect to" in r.stdout
    assert "registers" in r.stdout and "same bytes" in r.stdout
    assert "never copied afterwards" in r.stdout
    assert '"allocator":"shm"' in r.stdout and serve.socket in r.stdout
    assert "FAIL" not in r.stdout


def test_doctor_from_a_python_without_sglang_says_which_python(serve):
    # The plugin imports (PYTHONPATH) and SGLang does not: the service's
    # checks still run, and the fix says to use SGLang's python.
    r, secs = run_doctor(serve.socket)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "FAIL  SGLang's HiCache storage interface does not import in this python" in r.stdout
    assert f"this python ({sys.executable}) is not the one SGLang runs with" in r.stdout
    assert "PYTHON -m strata_sglang doctor --socket " + serve.socket in r.stdout
    assert "same bytes" in r.stdout and "Start SGLang with" not in r.stdout and secs < 30


def test_doctor_with_an_sglang_it_does_not_know_says_to_upgrade(serve, tmp_path):
    old = tmp_path / "old_sglang"
    (old / "sglang").mkdir(parents=True)
    (old / "sglang" / "__init__.py").write_text("")  # an SGLang without HiCache storage
    r, _ = run_doctor(serve.socket, site=str(old))
    assert r.returncode == 1, r.stdout + r.stderr
    assert "does not import in this python" in r.stdout and "upgrade SGLang" in r.stdout
    assert "is not the one SGLang runs with" not in r.stdout, r.stdout


def test_doctor_fails_fast_with_a_fix_that_fits_this_machine(stopped_serve, tmp_path):
    r, secs = run_doctor(stopped_serve.socket)
    want = common.serve_command(stopped_serve.socket)
    assert r.returncode != 0 and want in r.stdout and secs < 30, r.stdout
    stale = str(tmp_path / "stale.sock")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(stale)  # a socket file that nothing listens on: the service crashed
    s.close()
    r, secs = run_doctor(stale)
    assert r.returncode != 0 and "nothing listens" in r.stdout and "outlived" in r.stdout, r.stdout
    assert common.serve_command(stale) in r.stdout and secs < 30
    plain = str(tmp_path / "plain")
    open(plain, "w").close()
    r, _ = run_doctor(plain)
    assert r.returncode != 0 and f"{plain} is a regular file, not a socket" in r.stdout, r.stdout


def test_the_proposed_arena_fits_the_machine(tmp_path):
    """A 23 GiB machine is proposed 11 GiB, not 64: half of what is available,
    what strata serve's own check leaves (1 GiB reserve), what /dev/shm holds."""
    cases = [
        (23 * GIB, 15 * GIB, "11GiB", True),
        (500 * GIB, 250 * GIB, "64GiB", True),
        (100 * GIB, 20 * GIB, "19GiB", True),
        (23 * GIB, 64 << 20, "11GiB", False),  # a container's /dev/shm: no arena file
        (23 * GIB, -1, "11GiB", False),
        (3 * GIB, 8 * GIB, "1GiB", True),
        (3 * GIB // 2, 8 * GIB, "512MiB", True),  # 1 GiB would be refused
        (0, -1, "64MiB", False),
    ]
    for avail, shm, want, with_file in cases:
        arena, f = common.proposed_arena(avail, shm)
        assert (common.format_arena(arena), f) == (want, with_file), (avail, shm)
        if avail >= common.SERVE_RESERVE + (64 << 20):
            assert arena <= avail - common.SERVE_RESERVE
    # The machine is read from files given as parameters.
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal: 24576000 kB\nMemFree: 1000 kB\nMemAvailable: 24117248 kB\n")
    cgroup = tmp_path / "cgroup"
    cgroup.mkdir()
    (cgroup / "memory.max").write_text("max\n")
    (cgroup / "memory.current").write_text("123\n")
    assert common.available_bytes(str(meminfo), str(cgroup)) == 23 * GIB
    none = str(tmp_path / "no-shm")
    cmd = common.serve_command("/run/s.sock", str(meminfo), none, str(cgroup))
    assert cmd == "strata serve --socket /run/s.sock --arena 11GiB", cmd
    (cgroup / "memory.max").write_text(str(6 * GIB))
    (cgroup / "memory.current").write_text(str(2 * GIB))
    cmd = common.serve_command("/run/s.sock", str(meminfo), none, str(cgroup))
    assert cmd.endswith("--arena 2GiB"), cmd  # the cgroup's 4 GiB headroom
    assert common.available_bytes(str(tmp_path / "missing")) == 0


def test_doctor_tells_a_hung_service_from_a_stale_socket(tmp_path):
    # Something accepts connections (the kernel's backlog) and never answers:
    # a stopped or wedged service, not a file left by a crash.
    path = str(tmp_path / "hung.sock")
    ln = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        ln.bind(path)
        ln.listen(4)
        r, secs = run_doctor(path, "--timeout", "1")
    finally:
        ln.close()
    assert r.returncode != 0 and "did not answer within 1 s" in r.stdout, r.stdout
    assert "stopped" in r.stdout and "outlived" not in r.stdout and secs < 30


def test_doctor_says_how_to_let_a_user_in(serve):
    """A user the socket's mode keeps out: as root (whom modes do not stop)
    the doctor runs as nobody; otherwise the socket is made 0000."""
    if os.getuid() == 0:
        os.chmod(os.path.dirname(serve.socket), 0o755)  # reachable, the socket 0600
        try:
            r, _ = run_doctor(serve.socket, user=65534, group=65534)
        except (OSError, subprocess.SubprocessError) as e:
            need(False, f"cannot run the doctor as nobody (uid 65534): {e}")
    else:
        os.chmod(serve.socket, 0)
        try:
            r, _ = run_doctor(serve.socket)
        finally:
            os.chmod(serve.socket, 0o600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert f"may not connect to {serve.socket}" in r.stdout, r.stdout
    assert "--socket-mode 0660 --socket-group GROUP" in r.stdout


def test_doctor_help_shows_every_default():
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run(
        [sys.executable, "-m", "strata_sglang", "doctor", "-h"],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode == 0 and r.stderr == ""
    assert "(default: /run/strata/strata.sock)" in r.stdout and "(default: 5.0)" in r.stdout
