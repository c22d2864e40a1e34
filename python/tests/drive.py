"""Driving SGLang's controllers the way its scheduler does, on either side:
back up host pages, prefetch a prefix, compare pages. Every wait is bounded
and ends in a named failure."""

import queue
import time

import harness

PAGE = harness.PAGE


def stop(c):
    c.detach_storage_backend()


def tokens(n_pages, seed):
    return [(seed * 7919 + i) % 32000 for i in range(n_pages * PAGE)]


def backup(c, host, toks, extra_pools=None, seed=None, draft=None):
    """Fill fresh host pages (seed), back them up as toks' pages; return what was written."""
    n = len(toks) // PAGE
    idx = host.alloc(n * PAGE)
    pages = [int(idx[i * PAGE]) // PAGE for i in range(n)]
    if seed is not None:
        harness.fill(host, pages, seed=seed)
        if draft is not None:
            harness.fill(draft, pages, seed=seed + 1)
    hashes = c.get_hash_str(toks, None, page_size=PAGE)
    kw = {} if extra_pools is None else {"extra_pools": extra_pools}
    c.write_storage(idx, toks, hash_value=hashes, **kw)
    try:
        op = c.ack_backup_queue.get(timeout=30)
    except queue.Empty:
        raise AssertionError(
            "a backup was not acknowledged in 30 s: the backup thread is stuck or dead"
        )
    return idx, pages, hashes, op


def prefetch(c, host, toks, extra_pools=None):
    """Run SGLang's prefetch: hit query on its thread, then the I/O thread loads."""
    kw = {} if extra_pools is None else {"extra_pools": extra_pools}
    c.prefetch("req", toks, None, **kw)
    try:
        op = c.prefetch_hit_queue.get(timeout=30)
    except queue.Empty:
        raise AssertionError(
            "a hit query did not end in 30 s: the prefetch thread is stuck or dead"
        )
    if op.storage_hit_count == 0:
        return op, None
    op.host_indices = host.alloc(op.storage_hit_count)
    c.prefetch_buffer.put(op)
    deadline = time.monotonic() + 30
    while True:
        done = op.completed_tokens == op.storage_hit_count or op.is_terminated()
        if done and getattr(op, "pool_transfers_done", True):
            return op, op.host_indices
        if time.monotonic() > deadline:
            raise AssertionError(
                f"a prefetch did not end in 30 s: {op.completed_tokens} of {op.storage_hit_count} "
                "tokens loaded; the prefetch I/O thread is stuck or dead"
            )
        time.sleep(0.005)


def same_pages(a, a_idx, b, b_idx):
    for i in range(0, len(a_idx), PAGE):
        pa, pb = int(a_idx[i]) // PAGE, int(b_idx[i]) // PAGE
        if not harness.page_bytes(a, pa).equal(harness.page_bytes(b, pb)):
            return False
    return True
