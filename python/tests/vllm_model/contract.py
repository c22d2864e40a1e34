"""The types of vLLM's offloading interface that a secondary tier sees,
written from that interface (vllm/v1/kv_offload/base.py and tiering/base.py at
2f41c894): what the tier is handed, what it returns, and the base class it
must derive from. Only names and behaviour a tier relies on are modelled.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from collections import namedtuple
from enum import Enum
from typing import Any, Collection, Dict, List, Optional

import numpy as np


def make_offload_key(block_hash: bytes, group: int) -> bytes:
    """A block's key: its hash, then its KV cache group in 4 big-endian bytes."""
    return bytes(block_hash) + group.to_bytes(4, "big")


# The tier media and localities vLLM names (the values are their names).
Medium = Enum("Medium", [(n, n) for n in ("CPU", "STORAGE")])
Locality = Enum("Locality", [(n, n) for n in ("LOCAL", "REMOTE")])


class TierFilter:
    """Which tiers a request may load from: every one, unless told."""

    def __init__(self, only: Optional[Collection[Medium]] = None):
        self.only = only

    def allows(self, medium, locality) -> bool:
        return self.only is None or medium is None or medium in self.only


@dataclass
class ReqContext:
    req_id: str
    kv_transfer_params: Optional[Dict[str, Any]] = None
    load_tier_filter: TierFilter = field(default_factory=TierFilter)


# What a lookup answers: a miss, a hit, found but not readable yet, ask again.
LookupResult = Enum("LookupResult", "MISS HIT HIT_PENDING RETRY")


@dataclass
class RequestOffloadingContext:
    """A tier's preference for a request; the model keeps only the default."""

    policy: str = "block_level"


# The scheduler's step: requests new this step, and those preempted.
ScheduleEndContext = namedtuple("ScheduleEndContext", "new_req_ids preempted_req_ids")


@dataclass
class OffloadingEvent:
    keys: List[bytes]
    medium: Medium
    removed: bool
    locality: Optional[Locality] = None


@dataclass(frozen=True)
class OffloadingMetricMetadata:
    documentation: str
    labelnames: tuple = ()


@dataclass(frozen=True)
class OffloadingCounterMetadata(OffloadingMetricMetadata):
    pass


class OffloadingConnectorStats:
    """The connector's stats payload as vLLM documents it: metric types and
    values by name and label values, counters summed."""

    def __init__(self):
        self.data = {"types": {}, "data": {}}

    def is_empty(self) -> bool:
        return not self.data["data"]

    def increase_counter(self, name: str, value=1, labelvalues: tuple = ()):
        self.data["types"].setdefault(name, "counter")
        vals = self.data["data"].setdefault(name, {})
        vals[labelvalues] = vals.get(labelvalues, 0) + value


@dataclass
class TransferJob:
    job_id: int
    keys: Collection[bytes]
    block_ids: np.ndarray
    is_promotion: bool
    req_context: ReqContext


@dataclass
class JobResult:
    job_id: int
    success: bool
    successful_keys: Optional[Collection[bytes]] = None
    transfer_time: Optional[float] = None


class SecondaryTierManager(abc.ABC):
    """What a tier derives from: the abstract calls a tier must answer, the
    optional ones with vLLM's defaults (no-ops, no events, no stats)."""

    medium = None

    def __init__(self, offloading_spec, primary_kv_view: memoryview, tier_type: str):
        self._offloading_spec = offloading_spec
        self._primary_kv_view = primary_kv_view
        self.tier_type = tier_type
        self.locality = None

    @abc.abstractmethod
    def lookup(self, key, req_context) -> LookupResult:
        ...

    @abc.abstractmethod
    def submit_store(self, job_metadata: TransferJob) -> None:
        ...

    @abc.abstractmethod
    def submit_load(self, job_metadata: TransferJob) -> None:
        ...

    @abc.abstractmethod
    def get_finished_jobs(self):
        ...

    def has_pending_work(self) -> bool:
        return False

    def take_events(self):
        return ()

    def touch(self, keys, req_context):
        return None

    @abc.abstractmethod
    def on_new_request(self, req_context) -> RequestOffloadingContext:
        ...

    def on_request_finished(self, req_context) -> None:
        return None

    def serve_external_requests(self, parent) -> None:
        return None

    def on_schedule_end(self, context) -> None:
        return None

    @abc.abstractmethod
    def drain_jobs(self) -> None:
        ...

    def shutdown(self) -> None:
        return None

    @classmethod
    def build_metric_definitions(cls, extra_config) -> dict:
        return {}

    def get_stats(self):
        return None
