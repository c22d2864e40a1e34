"""The package builds and installs offline with what Debian ships, and its
doctors, run as the README runs them (the venv's python, ``-m strata_sglang
doctor``, ``-m strata_vllm doctor``), pass from the install (not from this
source tree) against a real strata serve."""

import glob
import importlib.util
import os
import shutil
import subprocess
import sys

from conftest import PYTHON_DIR, need
from test_doctor import engine_site


def run(cmd, cwd, env):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, f"{' '.join(cmd)}:\n{r.stdout}\n{r.stderr}"
    return r


def test_wheel_builds_and_installs_offline_and_its_doctor_passes(serve, tmp_path):
    need(
        importlib.util.find_spec("ensurepip") is not None,
        "no ensurepip: apt-get install python3-venv",
    )
    need(importlib.util.find_spec("wheel") is not None, "no wheel: apt-get install python3-wheel")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PIP_INDEX_URL")}
    env["PIP_NO_INDEX"] = "1"  # offline: nothing from the network
    venv = str(tmp_path / "venv")
    run([sys.executable, "-m", "venv", "--system-site-packages", venv], str(tmp_path), env)
    pip = os.path.join(venv, "bin", "pip")
    # Built from a copy: setuptools writes build/ and *.egg-info beside the sources.
    src = str(tmp_path / "src")
    skip = shutil.ignore_patterns("tests", "bench", "build", "*.egg-info", "__pycache__", ".*")
    shutil.copytree(PYTHON_DIR, src, ignore=skip)
    dist = str(tmp_path / "dist")
    run(
        [pip, "wheel", "--no-build-isolation", "--no-index", "--no-deps", "-w", dist, src],
        str(tmp_path),
        env,
    )
    wheels = glob.glob(os.path.join(dist, "strata_sglang-*.whl"))
    assert len(wheels) == 1, wheels
    run([pip, "install", "--no-index", wheels[0]], str(tmp_path), env)
    py = os.path.join(venv, "bin", "python")
    where = run(
        [py, "-c", "import strata_sglang; print(strata_sglang.__file__)"], str(tmp_path), env
    )
    assert where.stdout.startswith(venv), where.stdout  # the install, not the source tree
    # The doctors exactly as the README runs them: the venv's python, -m.
    # This venv has neither engine: each says so, names this python, and
    # still runs the service's checks.
    for module, engine in (("strata_sglang", "SGLang"), ("strata_vllm", "vLLM")):
        r = doctor(env, tmp_path, py, "-m", module, "doctor", "--socket", serve.socket)
        assert r.returncode == 1, r.stdout + r.stderr
        assert f"this python ({py}) is not the one {engine} runs with" in r.stdout, r.stdout
        assert "same bytes" in r.stdout and f"Start {engine} with" not in r.stdout, r.stdout
    # With the engines (the project's models of them, from a folder with no
    # plugin code: the plugin is still the installed one), both pass.
    env = dict(env, PYTHONPATH=engine_site(tmp_path))
    for module, engine in (("strata_sglang", "SGLang"), ("strata_vllm", "vLLM")):
        r = doctor(env, tmp_path, py, "-m", module, "doctor", "--socket", serve.socket)
        assert r.returncode == 0, r.stdout + r.stderr
        assert "same bytes" in r.stdout and f"Start {engine} with" in r.stdout, r.stdout
        assert "FAIL" not in r.stdout, r.stdout
    # The console script too.
    r = doctor(
        env,
        tmp_path,
        os.path.join(venv, "bin", "strata-sglang"),
        "doctor",
        "--socket",
        serve.socket,
    )
    assert r.returncode == 0, r.stdout + r.stderr


def doctor(env, cwd, *cmd):
    return subprocess.run(
        list(cmd), cwd=str(cwd), env=env, capture_output=True, text=True, timeout=120
    )
