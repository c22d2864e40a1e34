"""``python -m strata_vllm doctor``: check that vLLM can use a node's strata
serve: vLLM's tier interface imports here and is one this package knows,
and the service's checks (strata_client.doctor) with rows in a file of the
kind vLLM keeps its CPU tier in."""

from __future__ import annotations

import json
import os
import sys
import tempfile

from strata_client import doctor as common


def kv_transfer_config(socket_path: str, cpu_bytes: int = 8 << 30) -> str:
    """vLLM's --kv-transfer-config that loads the tier against socket_path."""
    cfg = {
        "kv_connector": "OffloadingConnector",
        "kv_role": "kv_both",
        "kv_connector_extra_config": {
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": cpu_bytes,
            "secondary_tiers": [
                {"type": "StrataTier", "module_path": "strata_vllm", "socket": socket_path}
            ],
        },
    }
    return "--kv-transfer-config '" + json.dumps(cfg, separators=(",", ":")) + "'"


def _rows_file(size: int) -> int:
    """Rows as vLLM keeps them: a 0600 file on /dev/shm (removed at once)."""
    fd, path = tempfile.mkstemp(prefix="strata_doctor_vllm_offload_", dir="/dev/shm")
    os.unlink(path)
    os.ftruncate(fd, size)
    return fd


def _vllm_interface(socket_path: str):
    """Whether vLLM's secondary-tier interface imports here and is one this
    package knows: (ok, what, fix)."""
    try:
        from . import interface
    except ImportError as e:
        return False, str(e), common.engine_fix("vLLM", "vllm", "strata_vllm", socket_path)
    return (
        True,
        f"vLLM's secondary-tier interface is one strata_vllm knows (pinned {interface.PINNED[:8]})",
        "",
    )


def doctor(socket_path: str, timeout: float = 5.0, out=sys.stdout) -> int:
    """Run the checks; print each; return the exit status (0 when all pass)."""
    return common.doctor(
        socket_path,
        timeout,
        out,
        "vLLM",
        _rows_file,
        "a CPU-tier file built the way vLLM builds its rows (a 0600 file on /dev/shm)",
        kv_transfer_config(socket_path),
        engine_check=lambda: _vllm_interface(socket_path),
    )
