"""Benchmark: StrataStorage against SGLang's own HiCacheFile, and both against memcpy.

What a SGLang user runs instead of Strata is SGLang's file backend
(``--hicache-storage-backend file``). This runs SGLang's real ``HiCacheFile``
(from a fetched copy of SGLang: ``--sglang`` or $STRATA_SGLANG_DIR, made by
python/tests/sglang_copy.sh) and ``StrataStorage`` (against a ``strata serve`` it
builds and starts) through the same real SGLang host pool, with the calls
SGLang's ``HiCacheController`` makes:

- ``v1``: the controller's own page functions, called unbound on a namespace
  holding the pool and the backend: ``_page_set_zero_copy`` /
  ``_page_get_zero_copy`` (``batch_set_v1`` / ``batch_get_v1``) for Strata, which
  SGLang picks with ``interface_v1``; ``_generic_page_set`` / ``_generic_page_get``
  (``batch_set`` / ``batch_get`` of flat page copies, then the pool's
  ``set_from_flat_data_page``) for HiCacheFile, which has no v1 calls;
- ``v2``: ``batch_set_v2`` / ``batch_get_v2`` with one KV ``PoolTransfer``, both.

HiCacheFile runs on tmpfs (/dev/shm) and on the disk (a temp dir under
``--disk-dir``, /var/tmp by default: the root file system here). Its file
evictor module (``storage/file/lru_file_evictor.py``) is not among the files the
copy holds; with eviction not configured it does nothing, and the
stand-in here does exactly nothing (it admits every write).

Geometries: MHA (Llama-3-8B: 32 layers, 8 KV heads, dim 128, bf16) in
``page_first`` and MLA (DeepSeek-like: 61 layers, kv_lora_rank 512 + rope 64,
bf16) in ``layer_first``; page sizes 1, 16 and 64 tokens; a batch is as many
pages as make ``--batch-mib`` (at most ``--max-pages``). The peer ``memcpy``
copies the same bytes (the batch's page runs, adjacent runs merged) with two
threads (``ctypes.memmove``, which releases the GIL) into and out of a buffer of
its own: the physical limit of a service that copies.

Each round, per geometry, page size and call version, every backend and the
memcpy peer run one batch set and one get of fresh keys, the order rotating
round by round (A B C D, B C D A, ...). Every get is checked untimed: the pages
read back equal the pages written, byte for byte, for every backend. Prints
GB/s and the ratios Strata / HiCacheFile and Strata / memcpy, median (min-max)
over rounds, with the CPU and the load average. Not a test: figures depend on
the machine and what else runs on it; compare ratios measured in one run.

    /usr/bin/python3 python/bench/bench_sglang_peer.py [--rounds 5] [--json FILE]

Takes about three minutes with the defaults on a busy 2-core machine (2 min 42 s at load 19).
"""

import argparse
import ctypes
import gc
import importlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))

BACKENDS = ("strata", "file-tmpfs", "file-disk", "memcpy")


def med_range(xs):
    return statistics.median(xs), min(xs), max(xs)


def fmt(xs, unit="", prec=2):
    m, lo, hi = med_range(xs)
    return f"{m:.{prec}f}{unit} ({lo:.{prec}f}-{hi:.{prec}f})"


def load():
    return "%.2f %.2f %.2f" % os.getloadavg()


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown CPU"


def install_evictor_standin():
    """SGLang's LRUFileEvictor is not in the shared copy; with no size limit
    configured it admits every write and evicts nothing: so does this."""
    name = "sglang.srt.mem_cache.storage.file.lru_file_evictor"
    if name in sys.modules:
        return
    importlib.import_module("sglang.srt.mem_cache.storage")
    pkg = types.ModuleType("sglang.srt.mem_cache.storage.file")
    pkg.__path__ = []
    mod = types.ModuleType(name)

    class LRUFileEvictor:
        def __init__(self, *args, **kwargs):
            pass

        def reserve(self, *args, **kwargs):
            return True

        def touch(self, *args, **kwargs):
            pass

        def commit(self, *args, **kwargs):
            pass

        def abort(self, *args, **kwargs):
            pass

        def clear(self, *args, **kwargs):
            pass

    mod.LRUFileEvictor = LRUFileEvictor
    sys.modules.setdefault(pkg.__name__, pkg)
    sys.modules[name] = mod


def parse_geom(s, n):
    xs = [int(x) for x in s.split(",")]
    if len(xs) != n or min(xs) <= 0:
        raise SystemExit(f"geometry {s!r}: want {n} positive integers")
    return xs


class Memcpy2:
    """Two threads copying a batch's byte runs to and from a buffer of its own."""

    def __init__(self, nbytes):
        self.buf = ctypes.create_string_buffer(max(nbytes, 1))
        ctypes.memset(self.buf, 1, len(self.buf))  # touched: no page faults timed
        self.base = ctypes.addressof(self.buf)

    @staticmethod
    def halves(runs):
        """Split [(ptr, n)] into two lists of (ptr, buffer offset, n) of equal bytes."""
        total = sum(n for _, n in runs)
        half, out, off = total // 2, [[], []], 0
        for ptr, n in runs:
            while n:
                side = 0 if off < half else 1
                take = min(n, half - off) if side == 0 else n
                out[side].append((ptr, off, take))
                ptr, off, n = ptr + take, off + take, n - take
        return out, total

    def run(self, runs, into_buf):
        parts, total = self.halves(runs)
        if total > len(self.buf):
            raise ValueError("memcpy peer buffer too small")
        base, move = self.base, ctypes.memmove

        def work(part):
            for ptr, off, n in part:
                if into_buf:
                    move(base + off, ptr, n)
                else:
                    move(ptr, base + off, n)

        t = threading.Thread(target=work, args=(parts[1],))
        t0 = time.perf_counter()
        t.start()
        work(parts[0])
        t.join()
        return time.perf_counter() - t0


def page_runs(host, idx):
    """The byte runs of the pages at host indices idx, adjacent runs merged."""
    ptrs, sizes = host.get_page_buffer_meta(idx)
    runs = sorted(zip((int(p) for p in ptrs), (int(s) for s in sizes)))
    out = []
    for p, n in runs:
        if out and out[-1][0] + out[-1][1] == p:
            out[-1] = (out[-1][0], out[-1][1] + n)
        else:
            out.append((p, n))
    return out


class Case:
    """One geometry and page size: a host pool, its backends, its batches."""

    def __init__(self, ctx, kind, page, args):
        torch, harness = ctx.torch, ctx.harness
        self.ctx, self.kind, self.page = ctx, kind, page
        if kind == "mha":
            layers, heads, dim = args.mha
            per_tok = 2 * layers * heads * dim * 2
            layout = "page_first"
        else:
            layers, lora, rope = args.mla
            per_tok = layers * (lora + rope) * 2
            layout = "layer_first"
        self.page_bytes = per_tok * page
        self.pages = max(1, min(args.max_pages, (args.batch_mib << 20) // self.page_bytes))
        self.batch_bytes = self.pages * self.page_bytes
        self.layout = layout
        harness.PAGE = page
        n = self.pages * page
        if kind == "mha":
            dev = harness.device_pool("mha", size=n, layers=layers, heads=heads, dim=dim)
            self.host = ctx.MHAHost(
                dev, 2.0, 0, page, layout, pin_memory=False, device="cpu", allocator_type="shm"
            )
        else:
            dev = harness.device_pool("mla", size=n, layers=layers, lora=lora, rope=rope)
            self.host = ctx.MLAHost(
                dev, 2.0, 0, page, layout, pin_memory=False, device="cpu", allocator_type="shm"
            )
        # Both layouts keep tokens on axis 1 of kv_buffer.
        self.kv = self.host.kv_buffer.view(torch.uint8)
        g = torch.Generator().manual_seed(7)
        self.kv.random_(0, 256, generator=g)
        self.src_idx = torch.arange(0, n, dtype=torch.int64)
        self.dst_idx = torch.arange(n, 2 * n, dtype=torch.int64)
        self.src = self.kv.narrow(1, 0, n)
        self.dst = self.kv.narrow(1, n, n)
        self.src_runs = page_runs(self.host, self.src_idx)
        self.dst_runs = page_runs(self.host, self.dst_idx)
        self.memcpy = Memcpy2(self.batch_bytes)
        mla = kind == "mla"
        model = "bench/deepseek-v3" if mla else "bench/llama-3-8b"
        self.backends = {}
        st = ctx.Strata(harness.storage_config(ctx.sock, mla=mla, model=model), {})
        self.backends["strata"] = st
        for name, d in (("file-tmpfs", ctx.tmpfs_dir), ("file-disk", ctx.disk_dir)):
            cfg = harness.storage_config(ctx.sock, mla=mla, model=model)
            self.backends[name] = ctx.HiCacheFile(cfg, file_path=d)
        for b in self.backends.values():
            b.register_mem_pool_host(self.host)
            b.register_mem_host_pool_v2(self.host, ctx.PoolName.KV)
        if not st.client.wait_connected(10):
            raise RuntimeError("the plugin did not connect to strata serve")
        self.serial = 0
        self.verified = {}  # backend: batches read back and compared equal

    def shim(self, backend):
        """What HiCacheController's page functions read of self."""
        return types.SimpleNamespace(
            mem_pool_host=self.host, page_size=self.page, storage_backend=backend
        )

    def one(self, name, api):
        """One timed set and one timed get of fresh keys: (set s, get s)."""
        if name == "memcpy":
            return (
                self.memcpy.run(self.src_runs, True),
                self.memcpy.run(self.dst_runs, False),
            )
        ctx = self.ctx
        b = self.backends[name]
        keys = ctx.harness.keys(
            self.pages, f"peer-{os.getpid()}-{self.kind}-{self.page}-{self.serial}"
        )
        self.serial += 1
        ctl = ctx.Controller
        if api == "v1":
            shim = self.shim(b)
            op = types.SimpleNamespace(request_id="bench", done=[0])

            def inc(n):
                op.done[0] += n
                return True

            op.increment = inc
            zero_copy = name == "strata"
            t0 = time.perf_counter()
            if zero_copy:
                ok = ctl._page_set_zero_copy(shim, keys, self.src_idx)
            else:
                ok = ctl._generic_page_set(shim, keys, self.src_idx)
            t1 = time.perf_counter()
            if zero_copy:
                ctl._page_get_zero_copy(shim, op, keys, self.dst_idx)
            else:
                ctl._generic_page_get(shim, op, keys, self.dst_idx)
            t2 = time.perf_counter()
            got = op.done[0] == self.pages * self.page
        else:
            kv = ctx.PoolName.KV
            t0 = time.perf_counter()
            r = b.batch_set_v2([ctx.PoolTransfer(name=kv, host_indices=self.src_idx, keys=keys)])
            t1 = time.perf_counter()
            r2 = b.batch_get_v2([ctx.PoolTransfer(name=kv, host_indices=self.dst_idx, keys=keys)])
            t2 = time.perf_counter()
            ok, got = all(r[kv]), all(r2[kv])
        if not ok or not got:
            raise RuntimeError(f"{name} {api}: set ok {ok}, get ok {got}")
        # Untimed: the pages read back are the pages written, then cleared.
        if not ctx.torch.equal(self.src, self.dst):
            raise RuntimeError(f"{name} {api}: pages read back differ from the pages written")
        self.verified[name] = self.verified.get(name, 0) + 1
        self.dst.zero_()
        if name != "strata":
            b.clear()
        return t1 - t0, t2 - t1

    def close(self):
        self.backends["strata"].close()
        self.backends.clear()
        self.host = self.kv = self.src = self.dst = None


def run_case(case, args, apis, backends):
    """Rounds of every backend and api, order rotating; per-round GB/s."""
    gbps = {(api, b, d): [] for api in apis for b in backends for d in ("set", "get")}
    for name in backends:  # untimed warm-up: first copies, codecs, file creation
        for api in apis:
            case.one(name, api)
    for r in range(args.rounds):
        for i, api in enumerate(apis):
            k = (r + i) % len(backends)
            for name in backends[k:] + backends[:k]:
                s, g = case.one(name, api)
                gbps[(api, name, "set")].append(case.batch_bytes / s / 1e9)
                gbps[(api, name, "get")].append(case.batch_bytes / g / 1e9)
    return gbps


def report(case, gbps, apis, backends):
    rows = []
    print(
        f"\n{case.kind.upper()} {case.layout}, page {case.page} token(s) = {case.page_bytes / 1024:.1f} KiB, "
        f"{case.pages} pages a batch ({case.batch_bytes / (1 << 20):.1f} MiB), load {load()}"
    )
    for api in apis:
        for d in ("set", "get"):
            st = gbps[(api, "strata", d)]
            line = [
                f"  {api} {d}: "
                + ", ".join(f"{b} {fmt(gbps[(api, b, d)])}" for b in backends)
                + " GB/s"
            ]
            row = {"kind": case.kind, "layout": case.layout, "page": case.page, "pages": case.pages}
            row.update({"api": api, "dir": d, "gbps": {b: gbps[(api, b, d)] for b in backends}})
            row["verified"] = dict(case.verified)
            row["ratios"] = {}
            for b in backends:
                if b == "strata":
                    continue
                rs = [x / y for x, y in zip(st, gbps[(api, b, d)])]
                row["ratios"][b] = rs
                line.append(f"strata/{b} {fmt(rs, 'x')}")
            print("    ".join(line[:1]) + "\n      " + "   ".join(line[1:]), flush=True)
            rows.append(row)
    return rows


def wait_ready(sock, srv, timeout=120.0):
    """Wait until the service at sock answers a Hello that no longer says
    "starting": until then its arena warm-up takes a core and a put may wait
    for memory not populated yet, neither of which belongs to the copy."""
    from strata_client.client import Connection, StrataError

    up = time.monotonic() + timeout
    while True:
        try:
            conn = Connection(sock, 10.0, "bench-wait")
            starting = conn.hello.starting
            conn.close()
            if not starting:
                return
        except (OSError, StrataError):
            pass
        if srv.poll() is not None or time.monotonic() > up:
            raise RuntimeError(f"the service was not up and ready within {timeout:.0f} s")
        time.sleep(0.05)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--batch-mib", type=int, default=64, help="bytes a batch, at most")
    ap.add_argument("--max-pages", type=int, default=512, help="pages a batch, at most")
    ap.add_argument("--page-sizes", default="1,16,64")
    ap.add_argument("--models", default="mha,mla")
    ap.add_argument("--apis", default="v1,v2")
    ap.add_argument("--mha", default="32,8,128", help="layers,kv heads,head dim (bf16)")
    ap.add_argument("--mla", default="61,512,64", help="layers,kv_lora_rank,rope dim (bf16)")
    ap.add_argument(
        "--disk-dir", default="/var/tmp", help="where HiCacheFile's disk directory goes"
    )
    ap.add_argument("--no-disk", action="store_true", help="HiCacheFile on tmpfs only")
    ap.add_argument("--arena", default="1GiB")
    ap.add_argument("--torch-threads", type=int, default=1, help="torch intra-op threads")
    ap.add_argument("--strata", help="a strata binary (default: go build ./cmd/strata)")
    ap.add_argument(
        "--sglang",
        default=os.environ.get("STRATA_SGLANG_DIR", ""),
        help="a fetched copy of SGLang (python/tests/sglang_copy.sh makes one); $STRATA_SGLANG_DIR",
    )
    ap.add_argument(
        "--plugin",
        help="the python/ folder to import strata_sglang from (another checkout's, for A/B)",
    )
    ap.add_argument("--json", help="write every round's figures to this file")
    args = ap.parse_args(argv)
    args.mha, args.mla = parse_geom(args.mha, 3), parse_geom(args.mla, 3)
    pages = [int(x) for x in args.page_sizes.split(",")]
    kinds = [x for x in args.models.split(",") if x]
    apis = [x for x in args.apis.split(",") if x]
    if set(kinds) - {"mha", "mla"} or set(apis) - {"v1", "v2"} or min(pages) <= 0:
        raise SystemExit("--models is mha,mla; --apis v1,v2; page sizes positive")
    backends = [b for b in BACKENDS if not (args.no_disk and b == "file-disk")]

    # SGLang's own HiCacheFile is the peer: the real side of the tests' harness
    # loads it from the fetched copy, through the project's CPU stubs.
    os.environ["STRATA_SGLANG_SIDE"] = "real"
    if args.sglang:
        os.environ["STRATA_SGLANG_DIR"] = os.path.abspath(args.sglang)
    sys.path.insert(0, os.path.join(os.path.dirname(HERE), "tests"))
    import harness

    if harness.PROBLEM:
        print(
            f"bench_sglang_peer: SGLang's HiCacheFile is the peer, and {harness.PROBLEM}",
            file=sys.stderr,
        )
        raise SystemExit(2)
    import torch

    # HiCacheFile copies every page with torch (flatten, zeros, index_put):
    # with two intra-op threads each of those small copies wakes torch's thread
    # pool, milliseconds a page on a busy 2-core machine. One thread is its best
    # case here; the plugin's few batch-wide torch calls do not care.
    torch.set_num_threads(args.torch_threads)

    if args.plugin:
        sys.path.insert(0, os.path.abspath(args.plugin))
    from strata_sglang.storage import StrataStorage
    import sglang.srt.mem_cache.pool_host.base as host_base
    from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost
    from sglang.srt.mem_cache.pool_host.mla import MLATokenToKVPoolHost
    from sglang.srt.managers.cache_controller import HiCacheController
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, PoolName, PoolTransfer

    install_evictor_standin()
    # SGLang keeps 10 GiB of host memory free for the engine; a benchmark of
    # pools of a few hundred MiB on a small machine needs less.
    host_base.HICACHE_HOST_MEMORY_RESERVE_BYTES = 1 << 30

    start_load = load()
    tmp = tempfile.mkdtemp(prefix="sgp")
    tmpfs_dir = tempfile.mkdtemp(prefix="sgp-file", dir="/dev/shm")
    disk_dir = tempfile.mkdtemp(prefix="sgp-file", dir=args.disk_dir)
    sock = os.path.join(tmp, "s.sock")
    strata = args.strata
    srv = None
    cases_out = []
    try:
        if not strata:
            strata = os.path.join(tmp, "strata")
            subprocess.run(["go", "build", "-o", strata, "./cmd/strata"], cwd=REPO, check=True)
        srv = subprocess.Popen(
            [strata, "serve", "--socket", sock, "--arena", args.arena, "--admin", ""]
            + ["--log-level", "warn"],
            start_new_session=True,
        )
        wait_ready(sock, srv)
        ctx = types.SimpleNamespace(
            torch=torch,
            harness=harness,
            sock=sock,
            tmpfs_dir=tmpfs_dir,
            disk_dir=disk_dir,
            Strata=StrataStorage,
            HiCacheFile=HiCacheFile,
            Controller=HiCacheController,
            PoolName=PoolName,
            PoolTransfer=PoolTransfer,
            MHAHost=MHATokenToKVPoolHost,
            MLAHost=MLATokenToKVPoolHost,
        )
        print(f"plugin {os.path.dirname(importlib.import_module('strata_sglang').__file__)}")
        print(
            f"CPU {cpu_name()}, {os.cpu_count()} CPUs, load average at start {start_load}; "
            f"HiCacheFile on {tmpfs_dir} (tmpfs) and {disk_dir}; {args.rounds} rounds, "
            "median (min-max) over rounds",
            flush=True,
        )
        for kind in kinds:
            for page in pages:
                case = Case(ctx, kind, page, args)
                try:
                    gbps = run_case(case, args, apis, backends)
                    cases_out += report(case, gbps, apis, backends)
                finally:
                    case.close()
                    del case
                    gc.collect()
        print(f"\nload average at end {load()}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump(
                    {
                        "cpu": cpu_name(),
                        "start_load": start_load,
                        "end_load": load(),
                        "backends": backends,
                        "rows": cases_out,
                    },
                    f,
                    indent=1,
                )
        return cases_out
    finally:
        if srv is not None:
            os.killpg(srv.pid, signal.SIGTERM)
            srv.wait()
        for d in (tmp, tmpfs_dir, disk_dir):
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
