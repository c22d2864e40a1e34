"""Boot shim: make vLLM's real kv_offload scheduler-side code importable on a
CPU-only Debian python3 (3.11, torch 1.13, numpy 1.24, no PyPI).

Nothing in the vLLM tree is modified or copied into it. We only:
  * put the *parent* of the vLLM package dir on sys.path,
  * pre-empt a handful of module names with our own stubs (stubs/*.py),
  * replace a few heavy package __init__.py files with empty packages whose
    __path__ still points at the real directory (so real submodules load),
  * redirect bytecode to a private pycache so the vLLM tree stays untouched.

Usage:  import boot; boot.install()   (before importing anything from vllm)
Env:    VLLM_SRC=/path/to/vllm   (the package dir, i.e. the one holding
        v1/kv_offload/); default $STRATA_VLLM_DIR/vllm
"""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
STUB_DIR = os.path.join(HERE, "stubs")

# Packages whose real __init__.py drags in half of vLLM (engine, zmq, pydantic
# configs, distributed state ...). We create them as *empty* packages with the
# real directory as __path__, so real submodules below them still import.
EMPTY_PACKAGES = [
    "vllm",  # real __init__ -> env_override (torch>=2 inductor patches, real torch_utils)
    "vllm.distributed",  # real __init__ -> parallel_state, communication_op
    "vllm.distributed.kv_transfer",  # real __init__ -> kv_transfer_state
    "vllm.distributed.kv_transfer.kv_connector.v1",  # -> v1/base.py (heavy)
]

# Module name -> stub file (stubs/<name>.py). Only modules that cannot import
# here (missing deps, torch>=2 APIs) or that would pull in large unrelated
# parts of vLLM. None of kv_offload/* is stubbed.
STUB_MODULES = [
    "vllm.config",  # pydantic v2 dataclasses; we only need class names
    "vllm.platforms",  # platform detection imports attention backends etc.
    "vllm._custom_ops",  # compiled CUDA/CPU ops (_C.so)
    "vllm.utils.torch_utils",  # needs torch>=2.x (torch.library.infer_schema)
    "vllm.distributed.device_communicators.shm_broadcast",  # zmq, torch.dist
    "vllm.distributed.kv_transfer.kv_connector.factory",  # all connectors
    "vllm.distributed.parallel_state",  # lazily used by logger.*_once()
]

# Third-party modules stubbed only when they are not importable here.
OPTIONAL_THIRD_PARTY_STUBS = [
    "prometheus_client",  # Debian: python3-prometheus-client (not installed)
    "regex",  # Debian: python3-regex (not installed); only for vLLM's fs tier
]

_installed = False
stubbed = []  # names actually served from stubs/ (filled by the finder)


class _EmptyPackageLoader(importlib.abc.Loader):
    def create_module(self, spec):
        return None  # default module creation

    def exec_module(self, module):
        module.__dict__.setdefault("__harness_stub__", "empty-package")


class _HarnessFinder(importlib.abc.MetaPathFinder):
    def __init__(self, vllm_src, third_party):
        self.vllm_src = vllm_src
        self.stub_files = {
            name: os.path.join(STUB_DIR, name + ".py") for name in STUB_MODULES + third_party
        }

    def _real_dir(self, fullname):
        parts = fullname.split(".")[1:]
        return os.path.join(self.vllm_src, *parts)

    def find_spec(self, fullname, path=None, target=None):
        if fullname in EMPTY_PACKAGES:
            real_dir = self._real_dir(fullname)
            spec = importlib.machinery.ModuleSpec(fullname, _EmptyPackageLoader(), is_package=True)
            spec.submodule_search_locations = [real_dir]
            stubbed.append(fullname + " (empty package, __path__=real dir)")
            return spec
        stub = self.stub_files.get(fullname)
        if stub is not None:
            stubbed.append(fullname)
            return importlib.util.spec_from_file_location(fullname, stub)
        return None


def install(vllm_src=None):
    global _installed
    if _installed:
        return
    vllm_src = os.path.abspath(
        vllm_src
        or os.environ.get("VLLM_SRC")
        or os.path.join(os.environ.get("STRATA_VLLM_DIR", "/tmp/vllm-cpu"), "vllm")
    )
    assert os.path.isfile(
        os.path.join(vllm_src, "v1", "kv_offload", "tiering", "manager.py")
    ), f"VLLM_SRC={vllm_src} does not look like the vllm package dir"
    # Keep the (read-only) vLLM tree free of __pycache__.
    sys.pycache_prefix = os.path.join(HERE, ".pycache")
    third_party = [m for m in OPTIONAL_THIRD_PARTY_STUBS if importlib.util.find_spec(m) is None]
    sys.meta_path.insert(0, _HarnessFinder(vllm_src, third_party))
    parent = os.path.dirname(vllm_src)
    if parent not in sys.path:
        sys.path.insert(0, parent)
    if HERE not in sys.path:
        sys.path.insert(0, HERE)  # so module_path "toy_tier" resolves
    # vllm.envs / logger: quiet, deterministic defaults (real modules).
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_CONFIGURE_LOGGING", "1")
    import torch_compat

    install.torch_shims = torch_compat.apply()
    install.vllm_src = vllm_src
    _installed = True


def real_vllm_modules():
    """(module name, file) for every module executed from the real vLLM tree."""
    src = install.vllm_src + os.sep
    out = []
    for name, mod in sorted(sys.modules.items()):
        f = getattr(mod, "__file__", None)
        if f and os.path.abspath(f).startswith(src):
            out.append((name, os.path.relpath(f, os.path.dirname(src.rstrip(os.sep)))))
    return out
