"""Test setup: the plugin from this checkout, one side of SGLang, a real strata serve.

The side is the project's model of SGLang unless STRATA_SGLANG_SIDE=real (see
harness.py); tests that drive the plugin through SGLang's side take the
``sglang`` fixture, and only those run on the real side. strata serve is built
from this checkout with ``go build`` once per session. Tests that need what is
missing skip with a one-line reason, except under CI=true, where they fail.
"""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PYTHON_DIR = os.path.dirname(HERE)
REPO = os.path.dirname(PYTHON_DIR)
sys.path.insert(0, PYTHON_DIR)
sys.path.insert(0, HERE)

import harness  # noqa: E402 - picks the side before the plugin imports SGLang's module

CI = os.environ.get("CI") == "true"


def need(ok: bool, reason: str):
    """Skip with reason when not ok, or fail under CI=true."""
    if ok:
        return
    if CI:
        pytest.fail(reason + " (CI=true: this test must run)")
    pytest.skip(reason)


def pytest_report_header(config):
    if harness.PROBLEM:
        return f"SGLang side: {harness.NAME}: {harness.PROBLEM}"
    return f"SGLang side: {harness.DESCRIPTION}"


def pytest_collection_modifyitems(config, items):
    """On a real side, only the tests that drive that engine's side run (the
    ``sglang`` or ``vllm`` fixture); without a copy they skip, each with the
    one reason."""
    if os.environ.get("STRATA_VLLM_SIDE") == "real":
        import vllm_side

        keep = [i for i in items if "vllm" in getattr(i, "fixturenames", ())]
        dropped = [i for i in items if i not in keep]
        if dropped:
            config.hook.pytest_deselected(items=dropped)
            items[:] = keep
        if vllm_side.PROBLEM:
            mark = pytest.mark.skip(reason=vllm_side.PROBLEM)
            for i in items:
                i.add_marker(mark)
        return
    if harness.SIDE != "real":
        return
    keep = [i for i in items if "sglang" in getattr(i, "fixturenames", ())]
    dropped = [i for i in items if i not in keep]
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = keep
    if harness.PROBLEM:
        mark = pytest.mark.skip(reason=harness.PROBLEM)
        for i in items:
            i.add_marker(mark)


@pytest.fixture(scope="session")
def vllm():
    """vLLM's side for the vLLM tier's tests: the model, or the real classes
    (vllm_side.py)."""
    import vllm_side

    need(not vllm_side.PROBLEM, vllm_side.PROBLEM)
    return vllm_side


@pytest.fixture(scope="session")
def sglang():
    """SGLang's side of this run (the harness module): a test that takes it
    drives the plugin through SGLang's side and runs on both sides."""
    return harness


@pytest.fixture
def backends():
    """Build plugins as SGLang's dynamic factory does (harness.create_backend's
    arguments); each is closed when the test ends."""
    made = []

    def new(sock, **kw):
        b = harness.create_backend(sock, **kw)
        made.append(b)
        return b

    yield new
    for b in made:
        b.close()


@pytest.fixture(scope="session")
def strata_bin(tmp_path_factory):
    """strata built from this checkout."""
    path = os.environ.get("STRATA_BIN")
    if path:
        return path
    go = shutil.which("go")
    need(go is not None, "go is not installed: cannot build strata serve")
    out = str(tmp_path_factory.mktemp("bin") / "strata")
    r = subprocess.run(
        [go, "build", "-o", out, "./cmd/strata"], cwd=REPO, capture_output=True, text=True
    )
    assert r.returncode == 0, "go build ./cmd/strata failed:\n" + r.stderr
    return out


class Serve:
    """A strata serve process on a socket of its own; restartable."""

    def __init__(self, binary: str, socket_path: str, arena: str = "512MiB", args=()):
        self.binary = binary
        self.socket = socket_path
        self.arena = arena
        self.args = list(args)
        self.proc = None
        self.log = socket_path + ".log"

    def start(self, wait: bool = True):
        logf = open(self.log, "ab")
        self.proc = subprocess.Popen(
            [
                self.binary,
                "serve",
                "--socket",
                self.socket,
                "--arena",
                self.arena,
                "--admin",
                "",
                "--log-level",
                "warn",
                *self.args,
            ],
            stdout=logf,
            stderr=logf,
            start_new_session=True,
        )
        logf.close()
        if wait:
            self.wait_up()
        return self

    def wait_up(self, timeout: float = 30.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"strata serve exited with {self.proc.returncode}: {self.logs()}"
                )
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                s.connect(self.socket)
                return
            except OSError:
                time.sleep(0.02)
            finally:
                s.close()
        raise RuntimeError("strata serve did not listen within %gs: %s" % (timeout, self.logs()))

    def pause(self, timeout: float = 10.0):
        """Stall the service (SIGSTOP): its socket stays open and nothing answers.

        Returns once every thread of it is stopped (a signal takes effect
        asynchronously: a thread on another core may still answer a request).
        """
        os.killpg(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + timeout
        while not self._stopped():
            if time.monotonic() > deadline:
                raise RuntimeError(f"strata serve did not stop within {timeout:g} s of SIGSTOP")
            time.sleep(0.001)

    def _stopped(self) -> bool:
        tasks = f"/proc/{self.proc.pid}/task"
        for t in os.listdir(tasks):
            try:
                with open(f"{tasks}/{t}/stat") as f:
                    state = f.read().rpartition(")")[2].split()[0]
            except OSError:
                continue  # the thread ended
            if state not in ("T", "t"):
                return False
        return True

    def resume(self):
        os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def stop(self):
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGCONT)  # a paused service never sees SIGTERM
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def logs(self) -> str:
        try:
            with open(self.log, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""


@pytest.fixture
def sock_path():
    d = tempfile.mkdtemp(prefix="sgl")  # short: Unix socket paths hold 107 bytes
    yield os.path.join(d, "strata.sock")
    shutil.rmtree(d, ignore_errors=True)


@pytest.fixture
def serve(strata_bin, sock_path):
    s = Serve(strata_bin, sock_path).start()
    yield s
    s.stop()


@pytest.fixture
def stopped_serve(strata_bin, sock_path):
    """A service not started yet: the test starts (and kills) it."""
    s = Serve(strata_bin, sock_path)
    yield s
    s.stop()
