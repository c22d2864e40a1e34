"""SGLang's HybridCacheController, storage side: the v2 calls, one pool each.

Since the unified radix cache became every model's path, a rank's host memory
is a ``HostPoolGroup``: the KV pool and its sidecars (EAGLE's draft KV, SWA
windows, Mamba states, DSA indexer keys). The KV pages still go through the v1
calls in 128-page batches; the sidecars through the v2 ones:

- the hit query is one ``batch_exists_v2`` over the whole prefix (far more
  than 128 keys), the sidecars' hits clamping the KV hit;
- a load reads the sidecars with ``batch_get_v2`` only after every KV page
  loaded, trailing-page transfers trimmed to the hit's last pages;
- a backup writes the sidecars with ``batch_set_v2`` before the KV pages;
- with MLA, TP ranks other than 0 write nothing but Mamba state;
- upstream passes ``extra_info`` to the v2 calls too (after the pinned commit).
"""

from __future__ import annotations

from .contract import HiCacheStorageExtraInfo, PoolHitPolicy, PoolName, PoolTransferResult
from .controller import HiCacheController, PrefetchOperation, StorageOperation, check_bools


def check_pool_bools(what, got, transfers):
    if not isinstance(got, dict):
        raise AssertionError(f"{what} answered {type(got).__name__}, not a dict by pool name")
    for t in transfers:
        check_bools(f"{what}[{t.name}]", got.get(t.name), len(t.keys or []))
    return got


class HybridCacheController(HiCacheController):
    def attach_storage_backend(self, kind, model_name, extra, kv_cache_dtype=None, metrics=False):
        super().attach_storage_backend(kind, model_name, extra, kv_cache_dtype, metrics)
        for entry in self.mem_pool_host.entries:
            self.storage_backend.register_mem_host_pool_v2(entry.host_pool, entry.name)

    def register_host_pool_entry(self, entry):
        """A sidecar added at run time (a draft model loaded after start-up)."""
        self.mem_pool_host.add_entry(entry)
        if self.enable_storage:
            self.storage_backend.register_mem_host_pool_v2(entry.host_pool, entry.name)

    def prefetch(
        self, request_id, new_input_tokens, last_hash=None, prefix_keys=None, extra_pools=None
    ):
        op = PrefetchOperation(request_id, new_input_tokens, last_hash, prefix_keys, extra_pools)
        self.prefetch_queue.put(op)
        return op

    def write_storage(
        self, host_indices, token_ids, hash_value=None, prefix_keys=None, extra_pools=None
    ):
        op = StorageOperation(host_indices, token_ids, hash_value, prefix_keys, extra_pools)
        self.backup_queue.put(op)
        return op

    # ------------------------------------------------------------ prefetch

    def _storage_hit_query(self, op):
        hashes = self.get_hash_str(op.token_ids, op.last_hash, page_size=self.page_size)
        info = HiCacheStorageExtraInfo(list(op.prefix_keys) if op.prefix_keys else None)
        if op.pool_transfers:
            res = self.storage_backend.batch_exists_v2(hashes, op.pool_transfers, info)
            if not isinstance(res, PoolTransferResult):
                raise AssertionError(f"batch_exists_v2 answered {type(res).__name__}")
            kv = res.kv_hit_pages
        else:
            kv = self.storage_backend.batch_exists(hashes, info)
        if type(kv) is not int or not 0 <= kv <= len(hashes):
            raise AssertionError(f"the hit query answered {kv!r} for {len(hashes)} keys")
        op.pool_storage_result.update_kv_hit_pages(kv)
        return hashes[:kv], kv * self.page_size

    def _page_transfer(self, op):
        super()._page_transfer(op)
        done = op.completed_tokens // self.page_size
        if op.pool_transfers and not op.is_terminated() and done == len(op.hash_value):
            self._trim_trailing(op.pool_transfers, op.hash_value, done)
            self._derive(op)
            info = HiCacheStorageExtraInfo(op.prefix_keys)
            got = self.storage_backend.batch_get_v2(op.pool_transfers, info)
            op.pool_storage_result.update_extra_pool_hit_pages(
                check_pool_bools("batch_get_v2", got, op.pool_transfers)
            )
        op.pool_transfers_done = True

    def _trim_trailing(self, transfers, hashes, hit):
        for t in transfers:
            if t.hit_policy != PoolHitPolicy.TRAILING_PAGES:
                continue
            n = len(t.keys) if t.keys else 1
            t.keys = hashes[max(0, hit - n) : hit]
            entry = self.mem_pool_host.entry_map.get(t.name)
            if t.host_indices is not None and entry is not None:
                want = len(t.keys) * entry.host_pool.page_size
                if t.host_indices.numel() > want:
                    entry.host_pool.free(t.host_indices[want:])
                    t.host_indices = t.host_indices[:want]

    def _derive(self, op):
        """Sidecars that share another pool's slots take its indices and keys."""
        for t in op.pool_transfers:
            src = t.indices_from_pool
            if src is None:
                continue
            if src == PoolName.KV:
                t.host_indices = op.host_indices
                t.keys = t.keys if t.keys is not None else op.hash_value
                continue
            owner = [x for x in op.pool_transfers if x.indices_from_pool is None and x.name == src]
            if not owner:
                raise AssertionError(f"sidecar {t.name} takes its slots from {src}, absent")
            t.host_indices = owner[0].host_indices
            t.keys = t.keys if t.keys is not None else owner[0].keys

    # ------------------------------------------------------------ backup

    def should_backup(self, transfer) -> bool:
        # MLA's replicated pools are written by TP rank 0; Mamba state is
        # sharded by rank even then.
        return not self.backup_skip or transfer.name == PoolName.MAMBA

    def _backup(self, op):
        # Every rank runs the sidecars' part: it decides what the rank writes.
        self._page_backup(op)
        self.ack_backup_queue.put(op)

    def _page_backup(self, op):
        mine = [t for t in op.pool_transfers or [] if self.should_backup(t)]
        if mine:
            self._derive(op)
            got = self.storage_backend.batch_set_v2(mine, HiCacheStorageExtraInfo(op.prefix_keys))
            op.pool_storage_result.update_extra_pool_hit_pages(
                check_pool_bools("batch_set_v2", got, mine)
            )
        if not self.backup_skip:
            super()._page_backup(op)
            return
        stored = bool(mine) and all(
            op.pool_storage_result.extra_pool_hit_pages.get(t.name) == len(t.keys or [])
            for t in mine
        )
        op.completed_tokens = len(op.hash_value) * self.page_size if stored else 0
