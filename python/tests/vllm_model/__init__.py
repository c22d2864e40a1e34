"""The project's model of vLLM's side of a secondary tier (contract.py, the
types; engine.py, the region, the spec and the manager's calls). install()
puts the contract where a tier imports vLLM's interface from; a real vLLM
already imported is never replaced."""

import sys
import types

from . import contract


def install():
    if "vllm.v1.kv_offload.tiering.base" in sys.modules:
        return
    names = ["vllm", "vllm.v1", "vllm.v1.kv_offload", "vllm.v1.kv_offload.tiering"]
    for n in names:
        m = sys.modules.setdefault(n, types.ModuleType(n))
        m.__path__ = []  # a package
    base = types.ModuleType("vllm.v1.kv_offload.base")
    tiering = types.ModuleType("vllm.v1.kv_offload.tiering.base")
    for name in (
        "Medium",
        "Locality",
        "ReqContext",
        "LookupResult",
        "RequestOffloadingContext",
        "ScheduleEndContext",
        "OffloadingEvent",
        "OffloadingMetricMetadata",
        "OffloadingCounterMetadata",
        "make_offload_key",
    ):
        setattr(base, name, getattr(contract, name))
    for name in ("TransferJob", "JobResult", "SecondaryTierManager"):
        setattr(tiering, name, getattr(contract, name))
    sys.modules[base.__name__] = base
    sys.modules[tiering.__name__] = tiering
    # Where the connector's stats class lives.
    for n in (
        "vllm.distributed",
        "vllm.distributed.kv_transfer",
        "vllm.distributed.kv_transfer.kv_connector",
        "vllm.distributed.kv_transfer.kv_connector.v1",
        "vllm.distributed.kv_transfer.kv_connector.v1.offloading",
    ):
        m = sys.modules.setdefault(n, types.ModuleType(n))
        m.__path__ = []
    metrics = types.ModuleType("vllm.distributed.kv_transfer.kv_connector.v1.offloading.metrics")
    metrics.OffloadingConnectorStats = contract.OffloadingConnectorStats
    sys.modules[metrics.__name__] = metrics
