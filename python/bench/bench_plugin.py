"""Benchmark: the plugin against storage/nodeclient and a Ping, like for like, in one run.

Starts one ``strata serve`` and two clients of it, each with a host pool of the
same geometry (Llama-3-8B, 32-token pages, page_first: one 2 MiB K and one 2 MiB
V range per page) and its own memfd:

- Go: ``storage/nodeclient`` in ``python/bench/nodeclient_baseline`` (built and
  started by this script), batch Put and Get of ``--pages`` pages;
- Python: the plugin over an SGLang host pool in the shm allocator (the
  project's model of SGLang; SGLang's own ``MHATokenToKVPoolHost`` with
  ``--sglang DIR`` or STRATA_SGLANG_SIDE=real), ``batch_set_v1`` and
  ``batch_get_v1`` of the same pages.

Each round runs ``--batches`` put+get batches of fresh keys on each side, a Go
batch and a Python one in turn, which goes first alternating; each round gives
one plugin/Go ratio per direction. Then, per round, ``batch_exists``
of ``--pages`` stored keys against a bare Ping round trip, interleaved in
blocks. Prints every round, and the median and min-max of the ratios, with the
machine's load average. Not a test: figures depend on the machine and what else
runs on it; compare ratios measured in one run.

    /usr/bin/python3 python/bench/bench_plugin.py [--rounds 7] [--batches 4] [--json FILE]
"""

import argparse
import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))


def med_range(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(xs, unit=""):
    m, lo, hi = med_range(xs)
    return f"{m:.2f}{unit} ({lo:.2f}-{hi:.2f})"


def load():
    return "%.2f %.2f %.2f" % os.getloadavg()


class GoBaseline:
    """The nodeclient_baseline process: commands on stdin, one JSON line back each."""

    def __init__(self, binary, sock, pages):
        self.p = subprocess.Popen(
            [binary, "--socket", sock, "--pages", str(pages)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def cmd(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        out = self.p.stdout.readline()
        if not out:
            raise RuntimeError(f"nodeclient_baseline exited ({self.p.wait()}) on {line!r}")
        return json.loads(out)

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--batches", type=int, default=4, help="put+get batches per side per round")
    ap.add_argument("--pages", type=int, default=128)
    ap.add_argument(
        "--exists-calls", type=int, default=300, help="per round, each of exists and Ping"
    )
    ap.add_argument("--arena", default="3GiB")
    ap.add_argument(
        "--sglang",
        default="",
        help="a fetched copy of SGLang (python/tests/sglang_copy.sh): its own host pool, not the model's",
    )
    ap.add_argument(
        "--copy-path",
        action="store_true",
        help="also time the plugin over a pool in SGLang's default allocator (no memfd: the staging copy path)",
    )
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args()
    if args.sglang:
        os.environ["STRATA_SGLANG_SIDE"] = "real"
        os.environ["STRATA_SGLANG_DIR"] = os.path.abspath(args.sglang)
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    import harness

    if harness.PROBLEM:
        raise SystemExit(f"bench_plugin: {harness.PROBLEM}")
    import torch
    from strata_client import wire
    from strata_sglang.storage import StrataStorage
    from strata_client.client import Connection, StrataError

    start_load = load()
    tmp = tempfile.mkdtemp(prefix="sgb")
    sock = os.path.join(tmp, "s.sock")
    strata, baseline = os.path.join(tmp, "strata"), os.path.join(tmp, "nodeclient_baseline")
    for out, pkg in ((strata, "./cmd/strata"), (baseline, "./python/bench/nodeclient_baseline")):
        subprocess.run(["go", "build", "-o", out, pkg], cwd=REPO, check=True)

    # SGLang's host pool first, before the service's arena takes its memory.
    if harness.NAME == "real":
        # SGLang keeps 10 GiB of host memory free for the engine; a benchmark of
        # a 1 GiB pool on a small machine needs less.
        importlib.import_module(
            "sglang.srt.mem_cache.pool_host.base"
        ).HICACHE_HOST_MEMORY_RESERVE_BYTES = (1 << 30)
    page, pages = 32, args.pages
    harness.PAGE = page
    geo = dict(size=pages * page, layers=32, heads=8, dim=128, dtype=torch.bfloat16)
    host = harness.host_pool("mha", "page_first", **geo)
    print(f"SGLang side: {harness.DESCRIPTION}")
    kv = host.kv_buffer.view(torch.uint8)  # (2, slots, layers, heads, dim) in bytes
    g = torch.Generator().manual_seed(1)
    kv.random_(0, 256, generator=g)  # every page touched
    # The same pool in SGLang's default allocator: nothing the service can map.
    copy_host = (
        harness.host_pool("mha", "page_first", allocator="default", **geo)
        if args.copy_path
        else None
    )
    if copy_host is not None:
        copy_host.kv_buffer.view(torch.uint8).copy_(kv)
    per_page = page * 32 * 8 * 128 * 2
    src_tok, dst_tok = slice(0, pages * page), slice(pages * page, 2 * pages * page)
    batch_bytes = 2 * pages * per_page

    srv = subprocess.Popen(
        [strata, "serve", "--socket", sock, "--arena", args.arena, "--admin", ""]
        + ["--log-level", "warn"],
        start_new_session=True,
    )
    go = b = copy_b = None
    try:
        # The arena is prefaulted at start, seconds per GiB: the socket accepts
        # before the service answers. Wait for a Hello answered, so that
        # neither client starts with a connection that timed out.
        up = time.monotonic() + 120
        while True:
            try:
                Connection(sock, 10.0, "bench-wait").close()
                break
            except (OSError, StrataError):
                if time.monotonic() > up:
                    raise RuntimeError("strata serve did not answer a Hello within 120 s") from None
                time.sleep(0.05)
        go = GoBaseline(baseline, sock, pages)
        b = StrataStorage(harness.storage_config(sock, model="bench/llama-3-8b"), {})
        b.register_mem_pool_host(host)
        assert b.client.wait_connected(10)
        src = harness.indices(host, range(pages))
        dst = harness.indices(host, range(pages, 2 * pages))
        serial = [0]
        copy_b = None
        if copy_host is not None:
            copy_b = StrataStorage(harness.storage_config(sock, model="bench/llama-3-8b-copy"), {})
            copy_b.register_mem_pool_host(copy_host)

        def py_round(n, backend=None, buf=None):
            backend = backend or b
            buf = kv if buf is None else buf
            puts, gets = [], []
            for _ in range(n):
                keys = harness.keys(pages, f"bench-py-{os.getpid()}-{serial[0]}")
                serial[0] += 1
                t0 = time.perf_counter()
                ok = backend.batch_set_v1(keys, src)
                t1 = time.perf_counter()
                ok2 = backend.batch_get_v1(keys, dst)
                t2 = time.perf_counter()
                assert all(ok) and all(ok2), (ok, ok2)
                # Untimed: the pages read back are the pages put.
                assert torch.equal(buf[:, src_tok], buf[:, dst_tok]), "plugin read back other bytes"
                buf[:, dst_tok].zero_()
                puts.append(t1 - t0)
                gets.append(t2 - t1)
            return puts, gets, keys

        copy_kv = copy_host.kv_buffer.view(torch.uint8) if copy_host is not None else None

        # Untimed warm-up of both clients (the service's first copies, the codecs).
        go.cmd("run 1")
        _, _, stored = py_round(1)
        sides = ["go", "py"] + (["copy"] if copy_b is not None else [])
        if copy_b is not None:
            py_round(1, copy_b, copy_kv)
        rounds = []
        for r in range(args.rounds):
            res = {side: ([], []) for side in sides}
            # Batch by batch, the side that goes first rotating: a burst of
            # other work on the machine hits every side alike.
            for i in range(args.batches):
                k = (r + i) % len(sides)
                for side in sides[k:] + sides[:k]:
                    if side == "go":
                        o = go.cmd("run 1")
                        puts, gets = o["put_s"], o["get_s"]
                    elif side == "py":
                        puts, gets, stored = py_round(1)
                    else:
                        puts, gets, _ = py_round(1, copy_b, copy_kv)
                    res[side][0].extend(puts)
                    res[side][1].extend(gets)
            gb = {
                side: [batch_bytes * len(ts) / sum(ts) / 1e9 for ts in res[side]] for side in sides
            }
            # Exists and Ping interleaved in blocks of 10, per-call medians.
            ex, pings = [], []
            for blk in range(0, args.exists_calls, 10):
                for _ in range(10):
                    t0 = time.perf_counter()
                    n = b.batch_exists(stored)
                    ex.append(time.perf_counter() - t0)
                    assert n == pages, n
                for i in range(10):
                    t0 = time.perf_counter()
                    b.client.call(wire.Ping(blk + i + 1))
                    pings.append(time.perf_counter() - t0)
            go_ex = go.cmd("exists 50")["exists_s"]
            row = {
                "go_put_gbps": gb["go"][0],
                "go_get_gbps": gb["go"][1],
                "py_put_gbps": gb["py"][0],
                "py_get_gbps": gb["py"][1],
                "put_ratio": gb["py"][0] / gb["go"][0],
                "get_ratio": gb["py"][1] / gb["go"][1],
                "exists_us": statistics.median(ex) * 1e6,
                "ping_us": statistics.median(pings) * 1e6,
                "go_exists_us": statistics.median(go_ex) * 1e6,
                "load": load(),
            }
            if copy_b is not None:
                row["copy_put_ratio"] = gb["copy"][0] / gb["py"][0]
                row["copy_get_ratio"] = gb["copy"][1] / gb["py"][1]
            row["exists_ratio"] = row["exists_us"] / row["ping_us"]
            rounds.append(row)
            print(
                f"round {r + 1}: put go {row['go_put_gbps']:5.2f} py {row['py_put_gbps']:5.2f} "
                f"GB/s = {row['put_ratio']:.2f}x   get go {row['go_get_gbps']:5.2f} py {row['py_get_gbps']:5.2f} "
                f"GB/s = {row['get_ratio']:.2f}x   exists {row['exists_us']:.0f} us / ping {row['ping_us']:.0f} us "
                f"= {row['exists_ratio']:.2f}x (Go exists {row['go_exists_us']:.0f} us)   load {row['load']}",
                flush=True,
            )
        col = {k: [r[k] for r in rounds] for k in rounds[0] if k != "load"}
        print()
        print(
            f"geometry llama-3-8b, 32-token pages, page_first ({per_page * 2 >> 20} MiB a page, 2 objects), "
            f"{pages} pages a call, {args.batches} batches per side per round, {args.rounds} rounds; "
            f"load average at start {start_load}, at end {load()}"
        )
        print("median (min-max) over rounds:")
        print(
            f"  nodeclient (Go) put {fmt(col['go_put_gbps'])} GB/s, get {fmt(col['go_get_gbps'])} GB/s"
        )
        print(
            f"  plugin (Python) put {fmt(col['py_put_gbps'])} GB/s, get {fmt(col['py_get_gbps'])} GB/s"
        )
        print(f"  batch_set_v1 / Put  {fmt(col['put_ratio'], 'x')}   (target >= 0.8x)")
        print(f"  batch_get_v1 / Get  {fmt(col['get_ratio'], 'x')}   (target >= 0.8x)")
        print(
            f"  batch_exists of {pages} keys {fmt(col['exists_us'], ' us')}, Ping {fmt(col['ping_us'], ' us')}: "
            f"{fmt(col['exists_ratio'], 'x')}   (target <= 3x; Go Exists {fmt(col['go_exists_us'], ' us')})"
        )
        if copy_b is not None:
            print(
                f"  copy path / zero copy: put {fmt(col['copy_put_ratio'], 'x')}, "
                f"get {fmt(col['copy_get_ratio'], 'x')}   (the staging buffer's extra memcpy each way)"
            )
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {"rounds": rounds, "start_load": start_load, "end_load": load()}, f, indent=1
                )
    finally:
        try:
            if b is not None:
                b.close()
            if copy_b is not None:
                copy_b.close()
            if go is not None:
                go.close()
        finally:
            os.killpg(srv.pid, signal.SIGTERM)
            srv.wait()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
