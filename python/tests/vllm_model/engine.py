"""The project's model of vLLM's side of a secondary tier: the CPU primary
tier's region (a 0600 file on /dev/shm, one row per block, handed to the tier
as a 2-D memoryview), the offloading spec the tier reads its facts from, and
the tiering manager's calls in the order the scheduler makes them (measured
with vLLM's real classes: shared/vllm-harness/README.md):

- a request's lookups go key by key in prefix order, past RETRY, until a MISS;
  a secondary tier's HIT starts a promotion into a free primary row
  (HIT_PENDING) and the loads of one request go out in one submit_load at
  on_schedule_end;
- a block written to the primary tier is cascaded at once: one submit_store
  per batch, its keys a set (so paired with block_ids by zip, never by
  position in the request);
- finished jobs are polled once per step, a store's rows are unpinned when it
  finishes, a promotion's rows become hits (only its successful keys on a
  partial failure);
- reset_cache drains the tier's jobs before it frees the rows; shutdown
  reaches the tier and unlinks the region's file.
"""

from __future__ import annotations

import itertools
import mmap
import os
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

import numpy as np

from .contract import LookupResult, ReqContext, ScheduleEndContext, TransferJob


class Region:
    """The primary tier's rows in /dev/shm/vllm_offload_<engine>.mmap."""

    def __init__(self, engine_id: str, rows: int, stride: int):
        self.path = f"/dev/shm/vllm_offload_{engine_id}.mmap"
        self.rows, self.stride = rows, stride
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, rows * stride)
            self.mm = mmap.mmap(fd, rows * stride, flags=mmap.MAP_SHARED)
        finally:
            os.close(fd)
        self.view = memoryview(self.mm).cast("B", (rows, stride))
        self.array = np.frombuffer(self.mm, dtype=np.uint8).reshape(rows, stride)

    def close(self):
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


@dataclass(frozen=True)
class Model:
    name: str = "meta-llama/Llama-3.1-8B"
    dtype: str = "bfloat16"


@dataclass(frozen=True)
class Group:
    tokens_per_block: int = 16
    layer_names: tuple = tuple(f"model.layers.{i}.self_attn" for i in range(4))


@dataclass(frozen=True)
class Cache:
    tokens_per_hash: int = 16
    blocks_per_chunk: int = 1


@dataclass(frozen=True)
class Parallel:
    rank: int = 0
    world_size: int = 1
    tp_size: int = 1
    pp_size: int = 1
    pcp_size: int = 1
    dcp_size: int = 1
    data_parallel_index: int = 0
    data_parallel_size: int = 1
    is_parallelism_agnostic: bool = False


@dataclass(frozen=True)
class Config:
    engine_id: str
    worker_kv_bytes_per_block: int
    model: Model = Model()
    groups: tuple = (Group(),)
    cache: Cache = Cache()
    parallel: Parallel = Parallel()
    enable_kv_cache_events: bool = True
    extra_config: dict = field(default_factory=dict)
    replicated_layout: bool = False
    canonical_layout: bool = False


@dataclass(frozen=True)
class EventsConfig:
    enable_kv_cache_events: bool
    self_describing_kv_events: bool = False


class Spec:
    """The offloading spec a tier is constructed with: its config, and the
    events switch."""

    def __init__(self, config: Config):
        self.config = config
        self.extra_config = config.extra_config
        self.kv_events_config = EventsConfig(config.enable_kv_cache_events)


class Engine:
    """A primary tier of rows and one secondary tier, driven as vLLM's
    tiering manager drives it."""

    def __init__(self, engine_id: str, rows: int, stride: int, make_tier, model: Model = Model()):
        self.region = Region(engine_id, rows, stride)
        self.spec = Spec(Config(engine_id=engine_id, worker_kv_bytes_per_block=stride, model=model))
        try:
            self.tier = make_tier(self.spec, self.region.view)
        except BaseException:
            self.region.close()
            raise
        self.primary: "OrderedDict[bytes, int]" = OrderedDict()  # key -> row, LRU first
        self.free = list(range(rows))
        self.pins: Dict[int, int] = {}
        self.incoming: Dict[bytes, int] = {}  # promotions in flight: key -> row
        self.jobs: Dict[int, TransferJob] = {}
        self.pending_loads: Dict[str, List[Tuple[bytes, int]]] = {}
        self.ids = itertools.count(1)
        self.failed_jobs = 0

    # -- the primary tier

    def _row(self) -> Optional[int]:
        if self.free:
            return self.free.pop()
        for k, r in self.primary.items():  # least recently used first
            if not self.pins.get(r):
                del self.primary[k]
                return r
        return None

    def write(self, req: ReqContext, blocks: Dict[bytes, bytes]):
        """The GPU worker's store: rows written, then cascaded to the tier."""
        rows = {}
        for k, data in blocks.items():
            r = self._row()
            assert r is not None, "the model's primary tier is full of pinned rows"
            self.region.array[r, : len(data)] = np.frombuffer(data, dtype=np.uint8)
            self.primary[k] = r
            rows[k] = r
        keys = set(rows)  # vLLM hands a set
        ids = np.array([rows[k] for k in keys], dtype=np.int64)
        for r in ids.tolist():
            self.pins[r] = self.pins.get(r, 0) + 1
        job = TransferJob(next(self.ids), keys, ids, False, req)
        self.jobs[job.job_id] = job
        self.tier.submit_store(job)

    def drop_primary(self):
        """Evict every unpinned row: what a busy primary tier does over time."""
        for k in [k for k, r in self.primary.items() if not self.pins.get(r)]:
            self.free.append(self.primary.pop(k))

    # -- the scheduler's step

    def lookup_prefix(self, req: ReqContext, keys: List[bytes]) -> Optional[int]:
        """One scheduler pass over a request's keys: the number of leading
        hits, or None when the tier deferred (RETRY or a promotion pending)."""
        self.poll()
        hits, deferred = 0, False
        for k in keys:
            if k in self.primary:
                self.primary.move_to_end(k)
                hits += 1
                continue
            if k in self.incoming:
                hits, deferred = hits + 1, True
                continue
            got = self.tier.lookup(k, req)
            if got is LookupResult.HIT:
                r = self._row()
                if r is None:
                    break
                self.incoming[k] = r
                self.pins[r] = self.pins.get(r, 0) + 1
                self.pending_loads.setdefault(req.req_id, []).append((k, r))
                hits, deferred = hits + 1, True
            elif got is LookupResult.RETRY:
                deferred = True
            elif got is LookupResult.MISS:
                break
            else:
                raise AssertionError(f"a secondary tier answered {got}")
        return None if deferred else hits

    def end_step(self, new_req_ids=()):
        for rid, loads in self.pending_loads.items():
            job = TransferJob(
                next(self.ids),
                [k for k, _ in loads],
                np.array([r for _, r in loads], dtype=np.int64),
                True,
                ReqContext(rid),
            )
            self.jobs[job.job_id] = job
            self.tier.submit_load(job)
        self.pending_loads.clear()
        self.tier.on_schedule_end(ScheduleEndContext(list(new_req_ids), []))

    def poll(self):
        for res in self.tier.get_finished_jobs():
            job = self.jobs.pop(res.job_id)
            if not res.success:
                self.failed_jobs += 1
            if job.is_promotion:
                good = set(job.keys) if res.success else set(res.successful_keys or ())
                for k, r in zip(job.keys, job.block_ids.tolist()):
                    self.incoming.pop(k, None)
                    self.pins[r] -= 1
                    if k in good:
                        self.primary[k] = r
                    else:
                        self.free.append(r)
            else:
                for r in job.block_ids.tolist():
                    self.pins[r] -= 1

    def reset_cache(self):
        self.tier.drain_jobs()
        self.poll()
        assert not self.jobs, f"drain_jobs returned with jobs {sorted(self.jobs)} unreported"
        self.free = list(range(self.region.rows))
        self.primary.clear()
        self.incoming.clear()
        self.pins.clear()

    def shutdown(self):
        try:
            self.tier.shutdown()
        finally:
            self.region.close()
