"""vLLM's real offloading manager with StrataTier as its secondary tier,
driven with the calls of vllm_model/engine.py's Engine, so that one test
body runs on both sides: the real OffloadingSpecFactory builds the real
TieringOffloadingSpec from an OffloadingConfig, which makes the real CPU
primary tier on /dev/shm and loads the tier by ``module_path``, as vLLM does.
"""

from __future__ import annotations

from typing import Dict, List, Optional

import numpy as np

from vllm.v1.kv_offload.base import LookupResult, ReqContext, ScheduleEndContext
from vllm.v1.kv_offload.config import (
    OffloadingCacheConfig,
    OffloadingConfig,
    OffloadingGroupConfig,
    OffloadingModelConfig,
    OffloadingParallelConfig,
)
from vllm.v1.kv_offload.factory import OffloadingSpecFactory


class _Primary:
    """The primary tier's rows by key, as the model's Engine.primary: in it
    when the real primary tier answers HIT, at the row prepare_load names."""

    def __init__(self, engine):
        self.e = engine

    def __contains__(self, k) -> bool:
        return (
            self.e.manager.primary_tier.lookup(k, ReqContext("strata-test-probe"))
            is LookupResult.HIT
        )

    def __getitem__(self, k) -> int:
        req = ReqContext("strata-test-probe")
        spec = self.e.manager.primary_tier.prepare_load([k], req)
        self.e.manager.primary_tier.complete_load([k], req)
        return int(np.asarray(spec.block_ids)[0])


def offloading_config(
    engine_id: str, rows: int, stride: int, tier: dict, model=None, events: bool = True
):
    """vLLM's OffloadingConfig for a TieringOffloadingSpec of rows rows of
    stride bytes with one secondary tier (its config dict), as vLLM builds it
    for one worker."""
    name, dtype = model or ("meta-llama/Llama-3.1-8B", "bfloat16")
    return OffloadingConfig(
        groups=(OffloadingGroupConfig(16, tuple(f"model.layers.{i}.self_attn" for i in range(4))),),
        worker_kv_bytes_per_block=stride,
        enable_kv_cache_events=events,
        extra_config={
            "spec_name": "TieringOffloadingSpec",
            "cpu_bytes_to_use": rows * stride,
            "secondary_tiers": [tier],
        },
        engine_id=engine_id,
        model=OffloadingModelConfig(name=name, dtype=dtype),
        cache=OffloadingCacheConfig(tokens_per_hash=16, blocks_per_chunk=1),
        parallel=OffloadingParallelConfig(
            rank=0,
            world_size=1,
            tp_size=1,
            pp_size=1,
            pcp_size=1,
            dcp_size=1,
            data_parallel_index=0,
            data_parallel_size=1,
            data_parallel_rank_local=None,
            is_parallelism_agnostic=False,
        ),
    )


class RealEngine:
    def __init__(self, engine_id: str, rows: int, stride: int, tier_kwargs: dict, model=None):
        tier = dict(tier_kwargs, type="StrataTier", module_path="strata_vllm")
        cfg = offloading_config(engine_id, rows, stride, tier, model)
        self.spec = OffloadingSpecFactory.create_spec(cfg)
        self.manager = self.spec.get_manager()
        self.tier = self.manager.secondary_tiers[0]
        view = self.manager.primary_tier.get_kv_memoryview()
        flat = view.cast("B") if view.ndim > 1 else view
        self._flat = flat
        self.array = np.frombuffer(flat, dtype=np.uint8).reshape(view.shape[0], -1)
        self.region = self  # tests read e.region.array
        self.primary = _Primary(self)
        self.failed_jobs = 0
        self._seen: set = set()
        real = self.tier.get_finished_jobs

        def counted():
            out = list(real())
            self.failed_jobs += sum(1 for r in out if not r.success)
            return out

        self.tier.get_finished_jobs = counted

    @property
    def jobs(self) -> Dict[int, object]:
        return self.manager._jobs

    def _begin(self, req: ReqContext):
        if req.req_id not in self._seen:
            self._seen.add(req.req_id)
            self.manager.on_new_request(req)

    def write(self, req: ReqContext, blocks: Dict[bytes, bytes]):
        self._begin(req)
        keys = list(blocks)
        out = self.manager.prepare_store(keys, req)
        assert out is not None, "the real primary tier refused the store"
        stored = list(out.keys_to_store)
        for k, b in zip(stored, np.asarray(out.store_spec.block_ids).tolist()):
            data = blocks[k]
            self.array[b, : len(data)] = np.frombuffer(data, dtype=np.uint8)
        self.manager.complete_store(stored, req)

    def drop_primary(self):
        self.manager.reset_cache()

    def lookup_prefix(self, req: ReqContext, keys: List[bytes]) -> Optional[int]:
        self._begin(req)
        hits, deferred = 0, False
        for k in keys:
            got = self.manager.lookup(k, req)
            if got is LookupResult.HIT:
                hits += 1
            elif got is LookupResult.HIT_PENDING:
                hits, deferred = hits + 1, True
            elif got is LookupResult.RETRY:
                deferred = True
            else:
                break
        return None if deferred else hits

    def end_step(self, new_req_ids=()):
        self.manager.on_schedule_end(ScheduleEndContext(list(new_req_ids), []))

    def poll(self):
        self.manager._process_finished_jobs()

    def reset_cache(self):
        self.manager.reset_cache()
        assert not self.jobs, f"reset_cache returned with jobs {sorted(self.jobs)}"

    def shutdown(self):
        self.array = None
        try:
            self._flat.release()
        except (BufferError, ValueError):
            pass
        self.manager.shutdown()
