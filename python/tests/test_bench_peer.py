"""The SGLang peer benchmark (python/bench/bench_sglang_peer.py), tiny, so it cannot rot.

It runs SGLang's real HiCacheFile and StrataStorage against a real strata serve
through a real host pool; here with small geometries, one round, both call
versions, MHA and MLA, and checks that it reports a ratio for every backend and
that every backend's pages were read back and compared with what was written.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

BENCH = os.path.join(REPO, "python", "bench", "bench_sglang_peer.py")
sys.path.insert(0, os.path.dirname(BENCH))

import bench_sglang_peer  # noqa: E402 - the bench's directory, added above


def test_memcpy_peer_halves_cover_every_byte_once():
    runs = [(1000, 10), (5000, 7), (9000, 1)]
    parts, total = bench_sglang_peer.Memcpy2.halves(runs)
    assert total == 18
    assert sum(n for _, _, n in parts[0]) == 9 and sum(n for _, _, n in parts[1]) == 9
    # Buffer offsets tile [0, total) in order; sources are the runs, split.
    pieces = parts[0] + parts[1]
    assert [o for _, o, _ in pieces] == [0, 9, 10, 17]
    assert pieces == [(1000, 0, 9), (1009, 9, 1), (5000, 10, 7), (9000, 17, 1)]


def test_page_runs_merge_adjacent_pages(sglang, monkeypatch):
    import torch
    import harness

    monkeypatch.setattr(harness, "PAGE", 1)  # the other tests' pools keep theirs
    host = harness.host_pool("mla", "layer_first", layers=3, lora=16, rope=8)
    runs = bench_sglang_peer.page_runs(host, torch.arange(0, 8))
    # Eight one-token pages of three layers: one run per layer.
    assert len(runs) == 3
    assert all(n == 8 * 24 * 2 for _, n in runs)


def test_peer_bench_without_a_copy_of_sglang_says_how_to_get_one(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "STRATA_SGLANG_DIR"}
    r = subprocess.run(
        [sys.executable, BENCH, "--sglang", ""], capture_output=True, text=True, timeout=60, env=env
    )
    assert r.returncode == 2, r.stdout + r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and "HiCacheFile" in lines[0] and "sglang_copy.sh" in lines[0], r.stderr


def test_peer_bench_tiny(sglang, strata_bin, tmp_path):
    if sglang.NAME != "real":
        pytest.skip(
            "the peer is SGLang's own HiCacheFile: it runs on the real side (STRATA_SGLANG_DIR)"
        )
    out = tmp_path / "peer.json"
    cmd = [
        sys.executable,
        BENCH,
        "--rounds",
        "1",
        "--page-sizes",
        "1,4",
        "--mha",
        "2,2,64",
        "--mla",
        "3,32,16",
        "--batch-mib",
        "1",
        "--max-pages",
        "16",
        "--arena",
        "256MiB",
        "--disk-dir",
        str(tmp_path),
        "--strata",
        strata_bin,
        "--sglang",
        os.environ["STRATA_SGLANG_DIR"],
        "--json",
        str(out),
    ]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=240, cwd=REPO)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    res = json.loads(out.read_text())
    rows = res["rows"]
    # 2 geometries x 2 page sizes x 2 apis x 2 directions.
    assert len(rows) == 16
    assert {(x["kind"], x["page"], x["api"], x["dir"]) for x in rows} == {
        (k, p, a, d)
        for k in ("mha", "mla")
        for p in (1, 4)
        for a in ("v1", "v2")
        for d in ("set", "get")
    }
    for row in rows:
        assert set(row["ratios"]) == {"file-tmpfs", "file-disk", "memcpy"}
        for peer, rs in row["ratios"].items():
            assert len(rs) == 1 and rs[0] > 0, (row, peer)
        # Warm-up plus one round, two apis: each backend's pages compared 4 times.
        for b in ("strata", "file-tmpfs", "file-disk"):
            assert row["verified"].get(b, 0) >= 4, row["verified"]
    assert "strata/file-tmpfs" in r.stdout and "strata/memcpy" in r.stdout
