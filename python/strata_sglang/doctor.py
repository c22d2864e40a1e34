"""``python -m strata_sglang doctor``: check that SGLang can use a node's strata serve."""

from __future__ import annotations

import importlib
import json
import os
import sys

from strata_client import doctor as common

FLAGS = (
    "--enable-hierarchical-cache --hicache-storage-backend dynamic "
    "--hicache-storage-backend-extra-config '{config}'"
)


def sglang_flags(socket_path: str) -> str:
    """The SGLang flags that load the plugin against socket_path (inline JSON: it must be)."""
    cfg = {
        "backend_name": "strata",
        "module_path": "strata_sglang",
        "class_name": "StrataStorage",
        "interface_v1": 1,
        "allocator": "shm",
        "socket": socket_path,
    }
    return FLAGS.format(config=json.dumps(cfg, separators=(",", ":")))


def _host_pool(size: int) -> int:
    """A host pool's memory made the way SGLang's ShmHostTensorAllocator makes it."""
    fd = os.memfd_create("sglang_host_pool_doctor", os.MFD_CLOEXEC)
    os.ftruncate(fd, size)
    return fd


def _sglang_imports(socket_path: str):
    """Whether the plugin's StrataStorage imports here, with SGLang's
    HiCacheStorage interface: (ok, what, fix). A python with the plugin and
    without SGLang (the system's python3 beside SGLang's environment) passes
    every service check and still cannot load the plugin."""
    try:
        importlib.import_module(".storage", __package__)  # StrataStorage's: the import is the check
    except Exception as e:  # noqa: BLE001 - ImportError, or what SGLang's own imports raise
        return (
            False,
            f"SGLang's HiCache storage interface does not import in this python: "
            f"{type(e).__name__}: {e}",
            common.engine_fix("SGLang", "sglang", "strata_sglang", socket_path),
        )
    return (
        True,
        f"the plugin imports with SGLang's HiCache storage interface ({sys.executable})",
        "",
    )


def doctor(socket_path: str, timeout: float = 5.0, out=sys.stdout) -> int:
    """Run the checks; print each; return the exit status (0 when all pass)."""
    return common.doctor(
        socket_path,
        timeout,
        out,
        "SGLang",
        _host_pool,
        "a shm host pool built the way SGLang builds it (an unsealed memfd)",
        sglang_flags(socket_path),
        engine_check=lambda: _sglang_imports(socket_path),
    )
