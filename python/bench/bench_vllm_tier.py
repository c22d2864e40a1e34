"""strata_vllm's tier next to what a vLLM user runs instead: vLLM's own
file-system secondary tier (``tiering/fs``) on tmpfs, and a memcpy of the
same rows, for chunks of 16, 64 and 256 tokens of an MHA and an MLA model.

Each tier is vLLM's real class in vLLM's real TieringOffloadingSpec (its CPU
primary tier's rows on /dev/shm), driven directly with submit_store and
submit_load jobs of every row of a chunk size (about 256 MiB), polled through
get_finished_jobs, alternated round by round (Strata, fs, memcpy, Strata, ...);
the loaded rows are checked against what was stored. memcpy is numpy's copy
of the same rows with as many threads as the tier has I/O threads.

    STRATA_VLLM_DIR=$PWD/.vllm /usr/bin/python3 python/bench/bench_vllm_tier.py [--rounds 3]

It needs a fetched vLLM (STRATA_VLLM_DIR, as the tests' real side) and a
strata binary (STRATA_BIN, or it builds one).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
TESTS = os.path.join(os.path.dirname(HERE), "tests")
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, TESTS)
sys.path.insert(0, os.path.join(TESTS, "vllm_real"))

# Bytes per token of each model's KV, per worker: Llama-3.1-8B (MHA: K and V,
# 32 layers, 8 KV heads of 128, bf16) and DeepSeek-V3 (MLA: 61 layers, a
# 512 + 64 latent, bf16).
MODELS = {"mha": 2 * 32 * 8 * 128 * 2, "mla": 61 * (512 + 64) * 2}
TOKENS = (16, 64, 256)
TOTAL = 256 << 20
IO_THREADS = 2


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def build_manager(rows: int, stride: int, tier: dict):
    """vLLM's real tiering manager over rows rows of stride bytes with tier."""
    from vllm.v1.kv_offload.factory import OffloadingSpecFactory
    from vllm_real.engine import offloading_config

    cfg = offloading_config(
        f"strata-bench-{uuid.uuid4().hex[:10]}", rows, stride, tier, ("bench", "bfloat16"), False
    )
    return OffloadingSpecFactory.create_spec(cfg).get_manager()


class Run:
    """One tier over every row of the primary tier: a store of all, a load of all."""

    def __init__(self, manager, rows: int):
        import numpy as np

        self.m = manager
        self.tier = manager.secondary_tiers[0]
        view = manager.primary_tier.get_kv_memoryview()
        self.flat = view.cast("B")
        self.rows = np.frombuffer(self.flat, dtype=np.uint8).reshape(rows, -1)
        self.n = rows
        self.ids = iter(range(1, 1 << 30))

    def _job(self, keys, promotion):
        import numpy as np
        from vllm.v1.kv_offload.base import ReqContext
        from vllm.v1.kv_offload.tiering.base import TransferJob

        return TransferJob(
            next(self.ids),
            keys,
            np.arange(len(keys), dtype=np.int64),
            promotion,
            ReqContext(f"bench-{uuid.uuid4().hex[:6]}"),
        )

    def _wait(self, job_id) -> bool:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            for r in self.tier.get_finished_jobs():
                if r.job_id == job_id:
                    return r.success
            time.sleep(0.0002)
        raise TimeoutError("a job did not finish in 120 s")

    def store(self, keys) -> float:
        job = self._job(keys, False)
        t0 = time.perf_counter()
        self.tier.submit_store(job)
        ok = self._wait(job.job_id)
        took = time.perf_counter() - t0
        if not ok:
            raise RuntimeError(f"{self.tier.tier_type}: the store failed")
        return took

    def load(self, keys) -> float:
        job = self._job(keys, True)
        t0 = time.perf_counter()
        self.tier.submit_load(job)
        ok = self._wait(job.job_id)
        took = time.perf_counter() - t0
        if not ok:
            raise RuntimeError(f"{self.tier.tier_type}: the load failed")
        return took

    def close(self):
        self.rows = None
        try:
            self.flat.release()
        except (BufferError, ValueError):
            pass
        self.m.shutdown()


def memcpy(src, dst) -> float:
    import numpy as np

    parts = np.array_split(np.arange(src.shape[0]), IO_THREADS)
    t0 = time.perf_counter()
    ts = [
        threading.Thread(target=lambda p=p: np.copyto(dst[p[0] : p[-1] + 1], src[p[0] : p[-1] + 1]))
        for p in parts
    ]
    for t in ts:
        t.start()
    for t in ts:
        t.join()
    return time.perf_counter() - t0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--total", type=int, default=TOTAL, help="bytes of rows per chunk size")
    ap.add_argument("--json", default="", help="write the results here too")
    args = ap.parse_args()

    src = os.environ.get("STRATA_VLLM_DIR")
    if not src:
        sys.exit(
            "bench_vllm_tier: set STRATA_VLLM_DIR to a fetched vLLM (git archive <commit> vllm | tar -x)"
        )
    import boot

    boot.install(os.path.join(src, "vllm"))
    import numpy as np

    binary = os.environ.get("STRATA_BIN") or os.path.join(tempfile.mkdtemp(), "strata")
    if not os.environ.get("STRATA_BIN"):
        subprocess.run(["go", "build", "-o", binary, "./cmd/strata"], cwd=REPO, check=True)
    work = tempfile.mkdtemp(prefix="svb", dir="/tmp")
    sock = os.path.join(work, "s.sock")
    fsdir = tempfile.mkdtemp(prefix="strata-bench-fs-", dir="/dev/shm")

    def start_serve():
        """A service of its own per chunk size, its arena holding every round's
        rows (the rows of earlier sizes would be evicted, a region at a time,
        and misses are no measure of a copy)."""
        if os.path.exists(sock):
            os.unlink(sock)
        p = subprocess.Popen(
            [
                binary,
                "serve",
                "--socket",
                sock,
                "--arena",
                f"{(args.rounds + 2) * args.total // (1 << 20) + 256}MiB",
                "--admin",
                "",
                "--log-level",
                "warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while not os.path.exists(sock) and time.monotonic() < deadline:
            time.sleep(0.02)
        return p

    serve = None
    results = []
    try:
        for model, per_token in MODELS.items():
            for tokens in TOKENS:
                if serve is not None:
                    serve.terminate()
                    serve.wait(10)
                serve = start_serve()
                stride = (per_token * tokens + 4095) // 4096 * 4096
                rows = max(8, args.total // stride)
                strata = Run(
                    build_manager(
                        rows,
                        stride,
                        {
                            "type": "StrataTier",
                            "module_path": "strata_vllm",
                            "socket": sock,
                            "io_threads": IO_THREADS,
                        },
                    ),
                    rows,
                )
                fs = Run(
                    build_manager(
                        rows,
                        stride,
                        {
                            "type": "fs",
                            "root_dir": fsdir,
                            "n_read_threads": IO_THREADS,
                            "n_write_threads": IO_THREADS,
                        },
                    ),
                    rows,
                )
                if strata.tier._staging is not None:
                    raise RuntimeError(
                        "the Strata tier runs the copy path: vLLM's rows were not registered"
                    )
                ref = np.random.default_rng(tokens).integers(
                    0, 256, size=(rows, stride), dtype=np.uint8
                )
                scratch = np.zeros_like(ref)
                scratch[:] = 1  # touched: memcpy's pages are mapped, as the rows are
                t = {
                    "strata": {"store": [], "load": []},
                    "fs": {"store": [], "load": []},
                    "memcpy": [],
                }
                for r in range(-1, args.rounds):  # round -1 warms every path up, unmeasured
                    for name, run in (("strata", strata), ("fs", fs)):
                        keys = [uuid.uuid4().bytes * 2 + b"\0\0\0\0" for _ in range(rows)]
                        run.rows[:] = ref
                        took_store = run.store(keys)
                        run.rows[:] = 0
                        took_load = run.load(keys)
                        if not np.array_equal(run.rows, ref):
                            raise RuntimeError(
                                f"{name}: the loaded rows differ from the stored ones"
                            )
                        if r >= 0:
                            t[name]["store"].append(took_store)
                            t[name]["load"].append(took_load)
                    took_copy = memcpy(ref, scratch)
                    if r >= 0:
                        t["memcpy"].append(took_copy)
                strata.close()
                fs.close()
                shutil.rmtree(fsdir, ignore_errors=True)
                os.makedirs(fsdir, exist_ok=True)
                gb = rows * stride / 1e9
                med = {
                    k: statistics.median(v)
                    for k, v in (
                        ("s_store", t["strata"]["store"]),
                        ("s_load", t["strata"]["load"]),
                        ("f_store", t["fs"]["store"]),
                        ("f_load", t["fs"]["load"]),
                        ("copy", t["memcpy"]),
                    )
                }
                res = {
                    "model": model,
                    "tokens": tokens,
                    "row_bytes": stride,
                    "rows": rows,
                    "strata_store_GBps": gb / med["s_store"],
                    "strata_load_GBps": gb / med["s_load"],
                    "fs_store_GBps": gb / med["f_store"],
                    "fs_load_GBps": gb / med["f_load"],
                    "memcpy_GBps": gb / med["copy"],
                    "store_vs_fs": med["f_store"] / med["s_store"],
                    "load_vs_fs": med["f_load"] / med["s_load"],
                    "store_vs_memcpy": med["copy"] / med["s_store"],
                    "load_vs_memcpy": med["copy"] / med["s_load"],
                    "store_vs_fs_range": [
                        min(f / s for f, s in zip(t["fs"]["store"], t["strata"]["store"])),
                        max(f / s for f, s in zip(t["fs"]["store"], t["strata"]["store"])),
                    ],
                    "load_vs_fs_range": [
                        min(f / s for f, s in zip(t["fs"]["load"], t["strata"]["load"])),
                        max(f / s for f, s in zip(t["fs"]["load"], t["strata"]["load"])),
                    ],
                }
                results.append(res)
                print(
                    f"{model} {tokens:>3} tokens ({stride >> 10} KiB rows x {rows}): "
                    f"store {res['strata_store_GBps']:.2f} GB/s = {res['store_vs_fs']:.1f}x fs, "
                    f"{res['store_vs_memcpy']:.2f}x memcpy; load {res['strata_load_GBps']:.2f} GB/s = "
                    f"{res['load_vs_fs']:.1f}x fs, {res['load_vs_memcpy']:.2f}x memcpy "
                    f"(fs {res['fs_store_GBps']:.2f}/{res['fs_load_GBps']:.2f}, memcpy {res['memcpy_GBps']:.2f} GB/s)",
                    flush=True,
                )
    finally:
        if serve is not None:
            serve.terminate()
            serve.wait(10)
        shutil.rmtree(fsdir, ignore_errors=True)
        shutil.rmtree(work, ignore_errors=True)
    print(
        f"medians of {args.rounds} rounds, alternated; {cpu_name()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}"
    )
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"cpu": cpu_name(), "rounds": args.rounds, "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
