"""The doctor against a real strata serve, and without one."""

import os
import socket
import subprocess
import sys
import time

from conftest import PYTHON_DIR


def run_doctor(sock, *args):
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run(
        [sys.executable, "-m", "strata_sglang", "doctor", "--socket", sock, *args],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    return r, time.monotonic() - t0


def test_doctor_passes_and_prints_the_flags(serve):
    r, _ = run_doctor(serve.socket)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "registers" in r.stdout and "same bytes" in r.stdout
    assert "never copied afterwards" in r.stdout
    assert '"allocator":"shm"' in r.stdout and serve.socket in r.stdout


def test_doctor_fails_fast_with_the_fix(stopped_serve, tmp_path):
    r, secs = run_doctor(stopped_serve.socket)
    assert r.returncode != 0 and "strata serve --socket" in r.stdout and secs < 10
    stale = str(tmp_path / "stale.sock")
    open(stale, "w").close()
    r, secs = run_doctor(stale)
    assert (
        r.returncode != 0 and "nothing listens" in r.stdout and "outlived" in r.stdout and secs < 10
    )


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
    assert "stopped" in r.stdout and "outlived" not in r.stdout and secs < 10


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
