"""The doctor against a real strata serve, and without one."""

import os
import subprocess
import sys
import time

from conftest import PYTHON_DIR


def run_doctor(sock):
    t0 = time.monotonic()
    env = dict(os.environ, PYTHONPATH=PYTHON_DIR)
    r = subprocess.run(
        [sys.executable, "-m", "strata_sglang", "doctor", "--socket", sock],
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
    assert r.returncode != 0 and "does not answer" in r.stdout and secs < 10
