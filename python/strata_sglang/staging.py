"""The plugin's staging buffer, and the calls that move whole tensors through it.

The service copies only between its tiers and memory a client registered. A
tensor SGLang hands the generic calls (``set``/``get``/``batch_set``/
``batch_get``: its draft pages under ``{hash}.draft`` keys, and whatever an
older controller sends) lives anywhere, and so do the pages of a pool SGLang
allocated where the service cannot map it. Both are copied into (or out of) a
memfd the plugin registered once, 64 MiB by default, grown to the largest
object asked for, and sealed against resizing.
"""

from __future__ import annotations

import mmap
import os
from typing import List, NamedTuple, Optional

import torch

from strata_client import wire

from . import names
from .pools import mmap_base


class Stage(NamedTuple):
    mm: mmap.mmap
    tensor: torch.Tensor
    seg: object  # client.Segment
    base: int  # the mapping's address


def _sealed_memfd(size: int) -> int:
    fd = os.memfd_create("strata_staging", os.MFD_CLOEXEC | os.MFD_ALLOW_SEALING)
    try:
        os.ftruncate(fd, size)
        try:
            import fcntl

            fcntl.fcntl(
                fd,
                fcntl.F_ADD_SEALS,
                fcntl.F_SEAL_SHRINK | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SEAL,
            )
        except (ImportError, AttributeError, OSError):
            pass
    except BaseException:
        os.close(fd)
        raise
    return fd


class Staging:
    """StrataStorage's staging buffer, and SGLang's generic calls over it (a mixin)."""

    def _staging(self, need: int) -> Stage:
        """The registered buffer, at least need bytes (caller holds _stage_lock)."""
        if self._stage is not None and len(self._stage.mm) >= need:
            return self._stage
        size = max(self.staging_bytes, 1 << (max(need, 1) - 1).bit_length())
        old = self._stage
        fd = _sealed_memfd(size)
        try:
            mm = mmap.mmap(fd, size, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ | mmap.PROT_WRITE)
            seg = self.client.add_segment(fd, f"{self.prefix}staging")
        finally:
            os.close(fd)
        self._stage = Stage(mm, torch.frombuffer(mm, dtype=torch.uint8), seg, mmap_base(mm))
        if old is not None:
            self.client.remove_segment(old.seg)
        return self._stage

    def _staging_segment(self):
        """The staging buffer's segment, made if there is none yet; without
        waiting for a staged call in flight (a hit query must not queue behind
        a call stalled on the service)."""
        stage = self._stage
        if stage is not None:
            return stage.seg
        with self._stage_lock:
            return self._staging(0).seg

    def _flat(self, key: str):
        """Object name and format of a copy-path key ("{hash}" or "{hash}.{pool}")."""
        base, dot, pool = key.rpartition(".")
        if not dot:
            base, pool = key, "kv"
        kv = self._pool("kv")
        desc = f"{names.FORMAT_VERSION}|flat|{pool}|{kv.desc if kv else 'none'}"
        rank = "" if self.mla else str(self.tp_rank)
        prefix = kv.prefix if kv is not None else self.prefix
        return f"{prefix}{base}_{rank}_{pool}_flat", names.format_of(desc)

    def _copy_batch(
        self, op: int, keys: List[str], tensors: List[Optional[torch.Tensor]]
    ) -> List[bool]:
        """Move whole tensors through the staging buffer; one request per buffer full."""
        n = len(keys)
        ok = [False] * n
        flat = []
        for i, (k, t) in enumerate(zip(keys, tensors)):
            if t is None or not names.key_ok(k):
                continue
            b = t.detach().contiguous().view(-1).view(torch.uint8)
            if b.numel() == 0 or b.device.type != "cpu":
                continue
            flat.append((i, k, b))
        with self._stage_lock:
            need = max((b.numel() for _, _, b in flat), default=0)
            if need == 0:
                return ok
            stage = self._staging(need)
            cap = len(stage.mm)
            i = 0
            while i < len(flat):
                batch, off = [], 0
                while (
                    i < len(flat)
                    and off + flat[i][2].numel() <= cap
                    and len(batch) < wire.MAX_ITEMS
                ):
                    batch.append((flat[i], off))
                    off += (flat[i][2].numel() + 63) & ~63
                    i += 1
                self._copy_round(op, stage, batch, tensors, ok)
        return ok

    def _copy_round(self, op, stage, batch, tensors, ok):
        conn, (sid,) = self.client.resolve([stage.seg])
        items = []
        for (_, k, b), o in batch:
            name, fmt = self._flat(k)
            if op == wire.PUT:
                stage.tensor[o : o + b.numel()].copy_(b)
            items.append(wire.Item(name, fmt, [wire.Range(sid, o, b.numel())]))
        msg = wire.Put(items) if op == wire.PUT else wire.Get(items)
        r = conn.call(msg, self.timeout)
        if len(r.results) != len(items):
            raise wire.Malformed(f"{len(r.results)} results for {len(items)} items")
        for ((idx, _, b), o), res in zip(batch, r.results):
            if res.status != wire.OK:
                if op == wire.PUT or res.status != wire.NOT_FOUND:
                    self._item_failed(op, res)
                continue
            if op == wire.GET:
                t = tensors[idx]
                src = stage.tensor[o : o + b.numel()]
                if t.is_contiguous():
                    t.view(-1).view(torch.uint8).copy_(src)
                else:
                    t.copy_(src.view(t.dtype).view(t.shape))
            ok[idx] = True

    # ------------------------------------------------------------ SGLang's generic calls

    def get(self, key, target_location=None, target_sizes=None):
        """Read key's object into target_location and return it; None on a miss."""
        try:
            if target_location is None:
                return None
            return (
                target_location if self._copy_batch(wire.GET, [key], [target_location])[0] else None
            )
        except Exception as e:  # noqa: BLE001
            self._failed("get", e)
            return None

    def batch_get(self, keys, target_locations=None, target_sizes=None):
        """Read each key into its target; a list with the filled target or None per key."""
        keys = list(keys or [])
        targets = list(target_locations) if target_locations is not None else [None] * len(keys)
        targets += [None] * (len(keys) - len(targets))
        try:
            ok = self._copy_batch(wire.GET, keys, targets)
        except Exception as e:  # noqa: BLE001
            self._failed("batch_get", e)
            ok = [False] * len(keys)
        return [t if good else None for t, good in zip(targets, ok)]

    def set(self, key, value=None, target_location=None, target_sizes=None) -> bool:
        """Write value as key's object (write-once); True when stored."""
        try:
            return bool(self._copy_batch(wire.PUT, [key], [value])[0])
        except Exception as e:  # noqa: BLE001
            self._failed("set", e)
            return False

    def batch_set(self, keys, values=None, target_locations=None, target_sizes=None) -> bool:
        """Write each value as its key's object; True only when all were stored."""
        keys = list(keys or [])
        values = list(values) if values is not None else []
        if len(values) != len(keys) or not keys:
            return False
        try:
            return all(self._copy_batch(wire.PUT, keys, values))
        except Exception as e:  # noqa: BLE001
            self._failed("batch_set", e)
            return False

    def exists(self, key: str) -> bool:
        """Whether key's copy-path object is stored."""
        try:
            if not names.key_ok(key):
                return False
            name, fmt = self._flat(key)
            return self.client.call(wire.Exists([name], fmt)).present == 1
        except Exception as e:  # noqa: BLE001
            self._failed("exists", e)
            return False

    def _close_staging(self):
        with self._stage_lock:
            if self._stage is not None:
                mm = self._stage.mm
                self._stage = None
                try:
                    mm.close()
                except BufferError:
                    pass  # a tensor still views it; the mapping goes with it
