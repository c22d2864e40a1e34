"""Benchmark: the SGLang plugin with strided runs (protocol revision 2) against
ranges (revision 1, as STRATA_WIRE_REVISION=1 forces), and both against memcpy.

For each geometry (MHA Llama-3-8B in layer_first and page_first, MLA
DeepSeek-like in layer_first) and page size, one host pool in the shm
allocator and two plugins over it: one offering revision 2, one revision 1.
Each round, each plugin and a two-thread memcpy of the same bytes
(bench_sglang_peer.Memcpy2) run one ``batch_set_v1`` and one ``batch_get_v1``
of fresh keys, the order rotating; every get is checked untimed. Prints GB/s,
each plugin's ratio to memcpy, and the plugin's CPU per page: the process's
CPU time (time.process_time: every thread, the client's reader included) over
a call, divided by its pages. The revision each plugin's connection got is
printed: a service that answers revision 1 makes both plugins send ranges.

``--fake`` answers every Put and Get OK from a peer in another process
(fakepeer, revision 2) that copies nothing: the plugin's CPU alone, against a
service without runs too. Not a test: compare figures measured in one run.

    /usr/bin/python3 python/bench/bench_runs.py [--rounds 5] [--page-sizes 1,16] [--fake]
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests"), HERE]

from bench_sglang_peer import Memcpy2, cpu_name, fmt, load, page_runs, wait_ready  # noqa: E402

CASES = [("mha", "layer_first"), ("mha", "page_first"), ("mla", "layer_first")]
FAKE = """
import sys, time
from fakepeer import FakeService
def handler(i, p):
    if p.hello(revision=2):
        p.serve()
f = FakeService(sys.argv[1], handler)
while True:
    time.sleep(3600)
"""


def start_service(args, tmp):
    sock = os.path.join(tmp, "s.sock")
    if args.fake:
        cmd = [sys.executable, "-c", FAKE, sock]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path[:3]))
    else:
        strata = args.strata or os.path.join(tmp, "strata")
        if not args.strata:
            subprocess.run(["go", "build", "-o", strata, "./cmd/strata"], cwd=REPO, check=True)
        cmd = [strata, "serve", "--socket", sock, "--arena", args.arena, "--admin", ""]
        cmd += ["--log-level", "warn"]
        env = None
    return subprocess.Popen(cmd, start_new_session=True, env=env), sock


def run_case(kind, layout, page, args, sock):
    import harness
    import torch

    layers, heads, dim = 32, 8, 128
    per_tok = 2 * layers * heads * dim * 2 if kind == "mha" else 61 * (512 + 64) * 2
    pages = max(1, min(args.max_pages, (args.batch_mib << 20) // (per_tok * page)))
    n = pages * page
    harness.PAGE = page
    if kind == "mha":
        geo = dict(size=n, layers=layers, heads=heads, dim=dim, dtype=torch.bfloat16)
    else:
        geo = dict(size=n, layers=61, lora=512, rope=64, dtype=torch.bfloat16)
    host = harness.host_pool(kind, layout, **geo)
    kv = host.kv_buffer.view(torch.uint8)
    kv.random_(0, 256, generator=torch.Generator().manual_seed(7))
    ax = list(kv.shape[:-1]).index(host.size)  # the token axis: 2 for MHA layer_first
    src, dst = torch.arange(0, n), torch.arange(n, 2 * n)
    memcpy = Memcpy2(pages * per_tok * page)
    src_runs, dst_runs = page_runs(host, src), page_runs(host, dst)
    plugins = {}
    for rev in ("r1", "r2"):
        os.environ["STRATA_WIRE_REVISION"] = rev[1]
        b = harness.create_backend(sock, mla=kind == "mla", model=f"bench/{kind}-{rev}")
        b.register_mem_pool_host(host)
        if not b.client.wait_connected(10):
            raise RuntimeError("the plugin did not connect")
        plugins[rev] = b
    os.environ.pop("STRATA_WIRE_REVISION", None)
    got = {r: b.client.revision for r, b in plugins.items()}
    sides = ["r1", "r2", "memcpy"]
    res = {s: {"set": [], "get": [], "set_cpu": [], "get_cpu": []} for s in sides}
    serial = 0
    try:
        for r in range(args.rounds + 1):  # round 0: an untimed warm-up
            k = r % len(sides)
            for side in sides[k:] + sides[:k]:
                if side == "memcpy":
                    ts = memcpy.run(src_runs, True), memcpy.run(dst_runs, False)
                    cpu = (0.0, 0.0)
                else:
                    b = plugins[side]
                    keys = harness.keys(
                        pages, f"bench-runs-{os.getpid()}-{kind}{layout}{page}-{serial}"
                    )
                    serial += 1
                    c0, t0 = time.process_time(), time.perf_counter()
                    ok = b.batch_set_v1(keys, src)
                    c1, t1 = time.process_time(), time.perf_counter()
                    ok2 = b.batch_get_v1(keys, dst)
                    c2, t2 = time.process_time(), time.perf_counter()
                    assert all(ok) and all(ok2), (side, ok, ok2)
                    if not args.fake:
                        assert torch.equal(kv.narrow(ax, 0, n), kv.narrow(ax, n, n)), side
                        kv.narrow(ax, n, n).zero_()
                    ts, cpu = (t1 - t0, t2 - t1), (c1 - c0, c2 - c1)
                if r:
                    for op, t, c in zip(("set", "get"), ts, cpu):
                        res[side][op].append(pages * per_tok * page / t / 1e9)
                        res[side][op + "_cpu"].append(c / pages * 1e6)
        runs = plugins["r2"].strata_stats()["run_items"]
    finally:
        for b in plugins.values():
            b.close()
        del host, kv
    mc = res["memcpy"]
    print(
        f"\n{kind} {layout}, {page}-token pages ({per_tok * page / 1024:.0f} KiB), {pages} pages "
        f"a batch; revisions got: r1 {got['r1']}, r2 {got['r2']} ({runs} items sent as runs)"
    )
    print(f"  memcpy (2 threads)  set {fmt(mc['set'])} GB/s  get {fmt(mc['get'])} GB/s")
    out = {"kind": kind, "layout": layout, "page": page, "pages": pages, "revisions": got}
    for side in ("r1", "r2"):
        x = res[side]
        rs = [a / b for a, b in zip(x["set"], mc["set"])]
        rg = [a / b for a, b in zip(x["get"], mc["get"])]
        print(
            f"  plugin {side}  set {fmt(x['set'])} GB/s = {fmt(rs, 'x')}   "
            f"get {fmt(x['get'])} GB/s = {fmt(rg, 'x')}   CPU/page set "
            f"{fmt(x['set_cpu'], ' us', 1)} get {fmt(x['get_cpu'], ' us', 1)}",
            flush=True,
        )
        out[side] = dict(x, set_ratio=rs, get_ratio=rg)
    out["memcpy"] = mc
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--page-sizes", default="1,16")
    ap.add_argument("--cases", default=",".join(f"{k}:{lay}" for k, lay in CASES))
    ap.add_argument("--batch-mib", type=int, default=32, help="bytes a batch, at most")
    ap.add_argument("--max-pages", type=int, default=512, help="pages a batch, at most")
    ap.add_argument("--arena", default="2GiB")
    ap.add_argument("--strata", help="a strata binary (default: go build ./cmd/strata)")
    ap.add_argument("--fake", action="store_true", help="a peer that copies nothing")
    ap.add_argument("--torch-threads", type=int, default=1)
    ap.add_argument("--json", help="write the figures to this file")
    args = ap.parse_args(argv)
    import torch

    torch.set_num_threads(args.torch_threads)
    tmp = tempfile.mkdtemp(prefix="sgr")
    srv, sock = start_service(args, tmp)
    rows = []
    try:
        wait_ready(sock, srv)
        print(
            f"CPU {cpu_name()}, {os.cpu_count()} CPUs, load average at start {load()}; "
            f"{'a fake peer that copies nothing' if args.fake else 'strata serve'}; "
            f"{args.rounds} rounds, median (min-max)",
            flush=True,
        )
        for case in args.cases.split(","):
            kind, layout = case.split(":")
            for page in (int(x) for x in args.page_sizes.split(",")):
                rows.append(run_case(kind, layout, page, args, sock))
        print(f"\nload average at end {load()}")
        if args.json:
            import json

            with open(args.json, "w") as f:
                json.dump({"cpu": cpu_name(), "fake": args.fake, "rows": rows}, f, indent=1)
    finally:
        os.killpg(srv.pid, signal.SIGTERM)
        srv.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
