"""vLLM's secondary-tier interface, imported from the vLLM this process runs,
and checked: a vLLM whose interface strata_vllm does not know fails at load
with one error that says so, never later in the scheduler's thread.

strata_vllm was written against vLLM's ``vllm/v1/kv_offload/tiering/base.py``
at commit 2f41c894 (2026-08-20, upstream PR #51007's out-of-tree tiers) and
follows what changed after it where that is read by name (``OffloadPolicy``'s
members, ``ReqContext``'s fields are never constructed here).
"""

from __future__ import annotations

import dataclasses
import inspect

PINNED = "2f41c894e320a07a46a360ee72149dd84d6f4bec"

__all__ = [
    "JobResult",
    "Locality",
    "LookupResult",
    "Medium",
    "OffloadingCounterMetadata",
    "OffloadingEvent",
    "RequestOffloadingContext",
    "SecondaryTierManager",
    "TransferJob",
    "stats_class",
]

_FIX = (
    "strata_vllm needs vLLM's TieringOffloadingSpec secondary-tier interface (vLLM at "
    f"{PINNED[:8]}, 2026-08-20, or later with the same interface); upgrade vLLM or strata_vllm"
)

try:
    from vllm.v1.kv_offload.base import (  # noqa: F401 - re-exported
        LookupResult,
        Medium,
        OffloadingEvent,
        RequestOffloadingContext,
    )
    from vllm.v1.kv_offload.tiering.base import (  # noqa: F401 - re-exported
        JobResult,
        SecondaryTierManager,
        TransferJob,
    )
except ImportError as e:  # an older vLLM, or none
    raise ImportError(
        f"strata_vllm: vLLM's secondary-tier interface did not import ({e}). {_FIX}"
    ) from e

try:
    from vllm.v1.kv_offload.base import Locality  # noqa: F401 - re-exported
except ImportError:  # before tiers had a locality: every tier is local
    Locality = None

try:
    from vllm.v1.kv_offload.base import OffloadingCounterMetadata
except ImportError:  # a vLLM whose tiers declare no metrics
    OffloadingCounterMetadata = None


def stats_class():
    """vLLM's OffloadingConnectorStats, or None where it does not import."""
    try:
        from vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics import (
            OffloadingConnectorStats,
        )
    except Exception:  # noqa: BLE001 - no stats rather than a failed step
        return None
    return OffloadingConnectorStats


# What the tier calls or implements, by name: checked once, here.
_METHODS = (
    "lookup",
    "submit_store",
    "submit_load",
    "get_finished_jobs",
    "has_pending_work",
    "take_events",
    "touch",
    "on_new_request",
    "on_request_finished",
    "serve_external_requests",
    "on_schedule_end",
    "drain_jobs",
    "shutdown",
    "build_metric_definitions",
    "get_stats",
)


def _check():
    missing = [m for m in _METHODS if not hasattr(SecondaryTierManager, m)]
    for name in ("MISS", "HIT", "RETRY"):
        if not hasattr(LookupResult, name):
            missing.append(f"LookupResult.{name}")
    try:
        job_fields = {f.name for f in dataclasses.fields(TransferJob)}
        result_fields = {f.name for f in dataclasses.fields(JobResult)}
    except TypeError:
        job_fields, result_fields = set(), set()
    for f in ("job_id", "keys", "block_ids", "is_promotion"):
        if f not in job_fields:
            missing.append(f"TransferJob.{f}")
    for f in ("job_id", "success", "successful_keys"):
        if f not in result_fields:
            missing.append(f"JobResult.{f}")
    params = list(inspect.signature(SecondaryTierManager.__init__).parameters)
    if params[1:4] != ["offloading_spec", "primary_kv_view", "tier_type"]:
        missing.append(f"SecondaryTierManager.__init__{tuple(params[1:])}")
    if missing:
        raise ImportError(
            "strata_vllm: this vLLM's secondary-tier interface differs from the one strata_vllm "
            f"knows (missing or changed: {', '.join(missing)}). {_FIX}"
        )


_check()
