"""What a page's objects are called, and which bytes they must hold.

An object's name is the deployment's namespace, the page key SGLang computed,
and a suffix for the rank and part ("{ns}{key}_{tp_rank}_k", as Mooncake's
names run). SGLang's page key is a hash of the tokens only: it says nothing of
the model, the KV dtype, the pipeline or context-parallel rank, or the DP
replica. So the namespace says all of those, and two deployments that differ
in any of them never read each other's pages (fp8_e4m3 and fp8_e5m2 KV are
both stored as bytes, in pools of the same geometry: only the name keeps them
apart). The object's format, a hash of its layout description, is checked by
the service on every access: a reader of another geometry misses.
"""

from __future__ import annotations

import hashlib
from typing import List

FORMAT_VERSION = "strata-sglang/1"

_SAFE = set(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.-")


def escape_name(s: str) -> str:
    """Spell s with letters, digits, '.', '-' and _XX escapes (one per other byte).

    Injective, and the result is a valid object name for the service and its
    spill directory: a Hugging Face id "org/model" becomes "org_2fmodel".
    """
    out = []
    for b in s.encode("utf-8"):
        out.append(chr(b) if b in _SAFE else "_%02x" % b)
    e = "".join(out)
    if len(e) > 100:  # keep object names well under the service's file name limit
        e = e[:80] + "-" + hashlib.sha256(s.encode()).hexdigest()[:16]
    return e


# SGLang's --kv-cache-dtype spellings and torch's dtype names, to one tag each,
# so that an engine that passes kv_cache_dtype and one whose pool says it name
# the same KV alike.
_DTYPE_TAGS = {
    "bfloat16": "bf16",
    "bf16": "bf16",
    "float16": "fp16",
    "half": "fp16",
    "fp16": "fp16",
    "float32": "fp32",
    "float": "fp32",
    "fp32": "fp32",
    "float8_e4m3fn": "fp8_e4m3",
    "float8_e4m3fnuz": "fp8_e4m3",
    "fp8_e4m3": "fp8_e4m3",
    "float8_e5m2": "fp8_e5m2",
    "float8_e5m2fnuz": "fp8_e5m2",
    "fp8_e5m2": "fp8_e5m2",
    "fp4_e2m1": "fp4_e2m1",
    "uint8": "u8",
    "int8": "i8",
}


def dtype_tag(x) -> str:
    """A short, name-safe tag of a dtype (torch's, or SGLang's spelling)."""
    s = str(x or "").strip().lower()
    s = s[len("torch.") :] if s.startswith("torch.") else s
    return _DTYPE_TAGS.get(s) or escape_name(s or "unknown")


def kv_dtype(cfg, host) -> str:
    """The KV dtype a pool's pages hold: the config's kv_cache_dtype (arriving
    upstream) when it names one, else the device pool's dtype (fp8 KV is
    stored as uint8, so the host pool's own dtype cannot tell the kinds of
    fp8 apart), else the host pool's."""
    named = getattr(cfg, "kv_cache_dtype", None)
    if named and str(named).lower() not in ("auto", "none"):
        return dtype_tag(named)
    dev = getattr(host, "device_pool", None)
    return dtype_tag(getattr(dev, "dtype", None) or getattr(host, "dtype", None))


def _coord(cfg, name: str) -> int:
    try:
        return int(getattr(cfg, name, 0) or 0)
    except (TypeError, ValueError):
        return 0


def model_part(cfg, extra: dict) -> str:
    """The escaped model name (SGLang's, or the extra config's "model")."""
    model = getattr(cfg, "model_name", None) or extra.get("model") or ""
    return escape_name(str(model)) if model else ""


def ranks_part(cfg, extra: dict) -> List[str]:
    """The parallel coordinates that change what a page holds, only where they
    are parallel: pipeline stage, context-parallel rank, and DP replica (the
    last can be shared with "share_across_dp": true, for replicas whose KV is
    the same by construction)."""
    parts = []
    for short, rank, size in (("pp", "pp_rank", "pp_size"), ("cp", "attn_cp_rank", "attn_cp_size")):
        if (_coord(cfg, size) or 1) > 1:
            parts.append(f"{short}{_coord(cfg, rank)}-{_coord(cfg, size)}")
    dp_size = _coord(cfg, "dp_size") or 1
    if dp_size > 1 and not extra.get("share_across_dp"):
        parts.append(f"dp{_coord(cfg, 'dp_rank')}-{dp_size}")
    return parts


def namespace(cfg, extra: dict, dtype: str) -> str:
    """ "{model}:{dtype}[:pp..][:cp..][:dp..]:", the prefix of every object name."""
    parts = [p for p in [model_part(cfg, extra), dtype] if p] + ranks_part(cfg, extra)
    return ":".join(parts) + ":" if parts else ""


def format_of(desc: str) -> int:
    """The 64-bit format the service checks: a hash of the layout description."""
    v = int.from_bytes(hashlib.sha256(desc.encode()).digest()[:8], "little")
    return v or 1


def key_ok(k) -> bool:
    return isinstance(k, str) and 0 < len(k) <= 400 and k.isascii() and k.isprintable()


_PRINTABLE = bytes(range(0x20, 0x7F))


def keys_ok(keys: List[str]) -> int:
    """How many leading keys are valid (key_ok), checked in a few C calls.

    (str.isprintable looks every character up in the Unicode tables: 16 us for
    128 page hashes; deleting the printable bytes of the ASCII encoding is 5.)
    """
    try:
        joined = "".join(keys)
        lens = set(map(len, keys))
    except TypeError:  # not all str
        joined, lens = "\0", set()
    if joined.isascii() and not joined.encode("ascii").translate(None, _PRINTABLE):
        if not lens or (min(lens) > 0 and max(lens) <= 400):
            return len(keys)
    for i, k in enumerate(keys):
        if not key_ok(k):
            return i
    return len(keys)
