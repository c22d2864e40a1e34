"""What a vLLM block is stored under in the node service.

vLLM's block hash covers a block's tokens (and LoRA, multimodal inputs, the
cache salt), not what the bytes of its row are: the model, the KV dtype, the
parallel layout the row was written by, the layers, the block and chunk
sizes. Two engines whose rows differ in any of those must never find each
other's rows, so each of them is in a digest in the namespace; engines that
agree on all of them (data-parallel replicas among them) share their rows.
"""

from __future__ import annotations

import hashlib
import json

# The item format every vLLM row is stored with: "vLLM" in ASCII. The service
# keeps objects of another format apart (an SGLang page is never a vLLM row).
ROW_FORMAT = 0x4D4C4C76


def describe(spec, row_bytes: int) -> dict:
    """The facts of spec (vLLM's OffloadingSpec) a row's bytes depend on."""
    cfg = getattr(spec, "config", None)
    model = getattr(cfg, "model", None)
    par = getattr(cfg, "parallel", None)
    cache = getattr(cfg, "cache", None)
    groups = []
    for g in getattr(cfg, "groups", ()) or ():
        layers = "\n".join(getattr(g, "layer_names", ()) or ())
        groups.append(
            [getattr(g, "tokens_per_block", None), hashlib.sha256(layers.encode()).hexdigest()[:16]]
        )
    agnostic = bool(getattr(par, "is_parallelism_agnostic", False))
    out = {
        "model": getattr(model, "name", None),
        "dtype": str(getattr(model, "dtype", None)),
        "groups": groups,
        "tokens_per_hash": getattr(cache, "tokens_per_hash", None),
        "blocks_per_chunk": getattr(cache, "blocks_per_chunk", None),
        "worker_kv_bytes_per_block": getattr(cfg, "worker_kv_bytes_per_block", None),
        "row_bytes": row_bytes,
        "replicated_layout": bool(getattr(cfg, "replicated_layout", False)),
        "canonical_layout": bool(getattr(cfg, "canonical_layout", False)),
        "parallelism_agnostic": agnostic,
    }
    if not agnostic:
        # The row is every worker's slot side by side: its bytes depend on
        # how the model is cut. Data-parallel replicas write the same rows.
        for f in ("world_size", "tp_size", "pp_size", "pcp_size", "dcp_size"):
            out[f] = getattr(par, f, None)
    return out


def namespace(spec, row_bytes: int) -> str:
    """The prefix of every key of this engine's rows: the model's name (for
    people reading the service's stats) and a digest of describe()."""
    facts = describe(spec, row_bytes)
    digest = hashlib.sha256(json.dumps(facts, sort_keys=True).encode()).hexdigest()[:16]
    model = str(facts["model"] or "model").replace(":", "_")[:200]
    return f"vllm:{model}:{digest}:"


def key_name(ns: str, key: bytes) -> str:
    """The service's key of vLLM's OffloadKey key (its block hash and group)."""
    return ns + bytes(key).hex()


def hash_seed_problem() -> str:
    """Why this process's block hashes would not match another process's
    (then no key it stores could ever be found again), or "".

    vLLM seeds its block hashes (NONE_HASH) from PYTHONHASHSEED when it is
    set, and otherwise with a fixed seed for sha256 and sha256_cbor but
    random bytes per process for xxhash (and for every algorithm before
    upstream PR #51875). The scheduler has computed hashes by the time a
    tier stores or looks up anything, so its module is loaded then.
    """
    import os
    import sys

    if os.environ.get("PYTHONHASHSEED") is not None:
        return ""
    kvu = sys.modules.get("vllm.v1.core.kv_cache_utils")
    if kvu is None:
        return ""  # no block hashes computed in this process (a harness)
    seed_of = getattr(kvu, "get_none_hash_seed", None)
    default = getattr(kvu, "DEFAULT_NONE_HASH_SEED", None)
    if seed_of is not None and default is not None:
        if seed_of() == default:
            return ""
        why = "its block hash algorithm (xxhash) is seeded at random per process"
    else:
        why = "this vLLM seeds every block hash algorithm at random per process"
    return (
        f"{why}, so no other engine, nor this one after a restart, could find what it stores: "
        "set PYTHONHASHSEED to the same value for every vLLM on the node (or use "
        "--prefix-caching-hash-algo sha256)"
    )
