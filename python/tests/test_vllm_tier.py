"""strata_vllm's StrataTier driven through the project's model of vLLM's side
(vllm_model: the CPU tier's region on /dev/shm, the spec, the tiering
manager's call order) against a real strata serve: lookups that answer
RETRY and then the service's answer, promotions into vLLM's rows byte-exact,
stores cascaded from them, two engines sharing rows, engines of another model
never seeing them, the copy path, outages, drain, reset and shutdown.
"""

import importlib
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid

import numpy as np
import pytest

import vllm_side  # picks the side before anything imports vLLM's interface
from fakepeer import wait_for

from vllm.v1.kv_offload.base import LookupResult, ReqContext, make_offload_key  # noqa: E402

ROW = 64 << 10  # bytes per row: a 16-token block of a small model's KV


def new_engine(sock, rows=32, model=None, **kw):
    eid = f"strata-test-{uuid.uuid4().hex[:12]}"
    kw = dict(kw, socket=sock)
    kw.setdefault("timeout_s", 5.0)
    return vllm_side.new_engine(eid, rows, ROW, kw, model=model)


@pytest.fixture
def engines(vllm):
    made = []

    def make(*a, **kw):
        e = new_engine(*a, **kw)
        made.append(e)
        return e

    yield make
    for e in made:
        e.shutdown()


def keys(n, tag):
    return [
        make_offload_key(uuid.uuid5(uuid.NAMESPACE_URL, f"{tag}-{i}").bytes * 2, 0)
        for i in range(n)
    ]


def block(k: bytes) -> bytes:
    """A row's bytes, from its key."""
    return (k * (ROW // len(k) + 1))[:ROW]


def settle(e, req: ReqContext, ks, want: int, timeout: float = 20.0):
    """Step the engine until a lookup of ks says want leading hits, as the
    scheduler does; fail naming what it said last."""
    got = None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = e.lookup_prefix(req, ks)
        e.end_step()
        if got == want:
            return
        time.sleep(0.005)
    raise AssertionError(f"lookup of {len(ks)} keys said {got}, want {want} hits")


def settle_once(e, req: ReqContext, ks, timeout: float = 10.0):
    """The leading hits of one request once the tier has answered it."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = e.lookup_prefix(req, ks)
        e.end_step()
        if got is not None:
            return got
        time.sleep(0.005)
    return None


def finish(e, timeout: float = 20.0):
    assert wait_for(
        lambda: (e.poll(), not e.jobs)[1], timeout
    ), f"jobs never finished: {sorted(e.jobs)}"


def test_a_stored_block_is_found_and_promoted_byte_exact(serve, engines):
    e = engines(serve.socket)
    assert e.tier._staging is None, "vLLM's rows were not registered: zero-copy is off"
    req = ReqContext("r1")
    ks = keys(8, "one")
    e.write(req, {k: block(k) for k in ks})
    finish(e)
    assert e.failed_jobs == 0 and e.tier.strata_stats()["stored"] == 8
    e.drop_primary()  # gone from vLLM's CPU tier: only Strata has them
    e.region.array[:] = 0
    # The first pass only asks: every key RETRY, then the service's answer.
    assert e.lookup_prefix(ReqContext("r2"), ks) is None
    settle(e, ReqContext("r2"), ks, 8)
    for k in ks:
        assert e.region.array[e.primary[k]].tobytes() == block(
            k
        ), "a promoted row holds other bytes"


def test_a_prefix_stops_at_the_first_miss(serve, engines):
    e = engines(serve.socket)
    ks = keys(6, "prefix")
    e.write(ReqContext("w"), {k: block(k) for k in ks[:3] + ks[4:]})  # ks[3] never stored
    finish(e)
    e.drop_primary()
    settle(e, ReqContext("r"), ks, 3)


def test_two_engines_share_rows_and_another_model_sees_none(serve, engines):
    a, b = engines(serve.socket), engines(serve.socket)
    other = engines(serve.socket, model=("meta-llama/Llama-3.1-8B", "float16"))
    ks = keys(16, "shared")
    a.write(ReqContext("a"), {k: block(k) for k in ks})
    finish(a)
    assert a.tier.namespace == b.tier.namespace != other.tier.namespace
    settle(b, ReqContext("b"), ks, 16)
    for k in ks:
        assert b.region.array[b.primary[k]].tobytes() == block(
            k
        ), "engine B read other bytes than A wrote"
    settle(other, ReqContext("o"), ks, 0)


def test_the_copy_path_when_the_rows_cannot_be_registered(serve, engines, caplog, monkeypatch):
    import strata_vllm.tier as tier

    monkeypatch.setattr(tier, "rows_path", lambda spec: None)  # vLLM's file is not found
    with caplog.at_level(logging.WARNING, logger="strata_vllm"):
        e = engines(serve.socket, staging_rows=5)
    warned = [r for r in caplog.records if "staging buffer" in r.getMessage()]
    assert len(warned) == 1, caplog.text
    ks = keys(12, "copy")
    e.write(ReqContext("w"), {k: block(k) for k in ks})
    finish(e)
    e.drop_primary()
    e.region.array[:] = 0
    settle(e, ReqContext("r"), ks, 12)
    for k in ks:
        assert e.region.array[e.primary[k]].tobytes() == block(k)


def test_a_foreign_file_at_the_rows_path_is_never_used(
    serve, engines, caplog, monkeypatch, tmp_path
):
    """A file that is not the memory of vLLM's view (someone else's, or
    another mapping): the tier takes the copy path and says why."""
    import strata_vllm.tier as tier

    fake = tmp_path / "rows"
    fake.write_bytes(b"\0" * (32 * ROW))
    os.chmod(fake, 0o600)
    monkeypatch.setattr(tier, "rows_path", lambda spec: str(fake))
    with caplog.at_level(logging.WARNING, logger="strata_vllm"):
        e = engines(serve.socket)
    assert e.tier._staging is not None
    assert "not the memory of" in caplog.text, caplog.text


def test_a_dead_service_gives_misses_and_failed_jobs_never_an_exception(
    stopped_serve, engines, caplog
):
    with caplog.at_level(logging.WARNING):
        e = engines(stopped_serve.socket, timeout_s=0.5)
        ks = keys(4, "dead")
        e.write(ReqContext("w"), {k: block(k) for k in ks})
        finish(e)
        assert e.failed_jobs == 1
        e.drop_primary()
        settle(e, ReqContext("r"), ks, 0)
    outage = [r for r in caplog.records if "not reachable" in r.getMessage()]
    assert len(outage) == 1, caplog.text


def test_a_failed_load_is_a_miss_from_then_on(serve, engines):
    e = engines(serve.socket)
    ks = keys(3, "gone")
    e.write(ReqContext("w"), {k: block(k) for k in ks})
    finish(e)
    e.drop_primary()
    req = ReqContext("r")
    e.lookup_prefix(req, ks)  # RETRY, asked
    e.end_step()
    assert wait_for(lambda: ks[0] in e.tier._reqs["r"].answers, 10)
    # The service loses the block between the lookup and the load.
    from strata_client import wire
    from strata_client.client import Client

    c = Client(serve.socket, "test-remove")
    try:
        assert c.wait_connected(10)
        c.call(wire.Remove([e.tier.namespace + ks[1].hex()]))
    finally:
        c.close()
    e.lookup_prefix(req, ks)  # HIT: promotions start
    e.end_step()
    finish(e)
    assert e.failed_jobs == 1 and ks[0] in e.primary and ks[1] not in e.primary
    assert e.tier.lookup(ks[1], ReqContext("later")) is LookupResult.MISS
    # Stored again (another request computed it): found again.
    e.write(ReqContext("again"), {ks[1]: block(ks[1])})
    finish(e)
    e.drop_primary()
    settle(e, ReqContext("found-again"), ks[1:2], 1)


def test_drain_reports_every_job_and_reset_is_exact(serve, engines):
    e = engines(serve.socket, rows=128)
    for i in range(8):
        ks = keys(12, f"drain-{i}")
        e.write(ReqContext(f"w{i}"), {k: block(k) for k in ks})
    e.reset_cache()  # drains: every job reported before the rows are freed
    assert not e.tier.has_pending_work()


def test_events_name_what_was_stored(serve, engines):
    e = engines(serve.socket)
    ks = keys(5, "events")
    e.write(ReqContext("w"), {k: block(k) for k in ks})
    finish(e)
    ev = list(e.tier.take_events())
    assert sorted(k for x in ev for k in x.keys) == sorted(ks) and not any(x.removed for x in ev)
    assert list(e.tier.take_events()) == []


def test_an_unknown_vllm_interface_fails_at_load_with_the_fix(vllm):
    saved = {n: sys.modules[n] for n in list(sys.modules) if n.startswith("strata_vllm")}
    base = sys.modules["vllm.v1.kv_offload.tiering.base"]
    real = base.SecondaryTierManager
    try:
        for n in saved:
            del sys.modules[n]

        # A vLLM whose tier base class lacks the calls this tier answers.
        base.SecondaryTierManager = type("SecondaryTierManager", (), {"lookup": real.lookup})
        with pytest.raises(ImportError, match="strata_vllm needs vLLM's TieringOffloadingSpec"):
            importlib.import_module("strata_vllm").StrataTier  # what vLLM's loader takes
    finally:
        base.SecondaryTierManager = real
        for n in [n for n in sys.modules if n.startswith("strata_vllm")]:
            del sys.modules[n]
        sys.modules.update(saved)


def test_stats_count_what_moved_once(serve, engines):
    e = engines(serve.socket)
    ks = keys(6, "stats")
    e.write(ReqContext("w"), {k: block(k) for k in ks})
    finish(e)
    e.drop_primary()
    settle(e, ReqContext("r"), ks, 6)
    finish(e)
    defs = type(e.tier).build_metric_definitions({})
    st = e.tier.get_stats()
    assert st is not None, "no stats after blocks moved"
    vals = {name: v[()] for name, v in st.data["data"].items()}
    assert set(vals) <= set(defs), f"stats {sorted(vals)} not all declared in {sorted(defs)}"
    assert vals["strata:tier_stored_blocks"] == 6 and vals["strata:tier_loaded_blocks"] == 6, vals
    assert vals["strata:tier_written_bytes"] == 6 * ROW and vals["strata:tier_hits"] >= 6, vals
    assert e.tier.get_stats() is None, "the same increases reported twice"


def test_block_hashes_seeded_per_process_store_nothing_and_say_so(
    serve, engines, caplog, monkeypatch
):
    """xxhash without PYTHONHASHSEED (or an older vLLM): another engine could
    never find what this one stores, so it stores nothing, with one error."""
    import types

    monkeypatch.delenv("PYTHONHASHSEED", raising=False)
    kvu = types.ModuleType("vllm.v1.core.kv_cache_utils")
    kvu.DEFAULT_NONE_HASH_SEED = "fixed"
    kvu.get_none_hash_seed = lambda: "0f" * 32  # random, as for xxhash
    monkeypatch.setitem(sys.modules, kvu.__name__, kvu)
    with caplog.at_level(logging.ERROR, logger="strata_vllm"):
        e = engines(serve.socket)
        ks = keys(3, "seed")
        e.write(ReqContext("w"), {k: block(k) for k in ks})
        finish(e)
        e.drop_primary()
        settle(e, ReqContext("r"), ks, 0)
    errors = [
        r
        for r in caplog.records
        if r.levelno >= logging.ERROR and "PYTHONHASHSEED" in r.getMessage()
    ]
    assert len(errors) == 1, caplog.text
    assert e.failed_jobs == 1 and e.tier.strata_stats()["stored"] == 0


def test_a_load_that_timed_out_never_writes_the_rows(serve, engines):
    """vLLM reuses the rows of a failed promotion at once: once the job is
    reported failed, no byte of it may reach them, whenever the stalled
    service resumes."""
    import numpy as np
    from test_stall import GET_DONE, decided, service_ops
    from vllm.v1.kv_offload.tiering.base import TransferJob

    e = engines(serve.socket, rows=64, timeout_s=0.5)
    ks = keys(24, "stall")
    e.write(ReqContext("w"), {k: block(k) for k in ks})
    finish(e)
    rows = list(range(40, 64))  # rows the engine has not handed out
    before = service_ops(serve.socket)
    serve.pause()
    try:
        job = TransferJob(10**6, ks, np.array(rows, dtype=np.int64), True, ReqContext("stall"))
        e.tier.submit_load(job)
        got = []
        assert wait_for(
            lambda: got.extend(e.tier.get_finished_jobs()) or got, 10
        ), "the load never finished"
        assert got[0].job_id == job.job_id and not got[0].success
        e.region.array[rows] = 0xAB  # reused: another request's rows now
    finally:
        serve.resume()
    assert wait_for(lambda: decided(before, serve.socket, GET_DONE, len(ks)), 20), service_ops(
        serve.socket
    )
    assert (
        e.region.array[rows] == 0xAB
    ).all(), "the service wrote rows vLLM had reused after the load failed"


def test_a_restarted_service_is_found_again(strata_bin, sock_path, engines, tmp_path):
    """A warm restart of the service (SIGTERM, then a start on the same arena
    file): the engine reconnects by itself and finds its rows again."""
    from conftest import Serve

    shm = tempfile.mkdtemp(prefix="strata-vllm-test-", dir="/dev/shm")
    s = Serve(strata_bin, sock_path, args=["--arena-file", os.path.join(shm, "arena")]).start()
    try:
        e = engines(s.socket)
        ks = keys(8, "restart")
        e.write(ReqContext("w"), {k: block(k) for k in ks})
        finish(e)
        s.stop()
        s.start()
        e.drop_primary()
        e.region.array[:] = 0
        # Misses while the tier reconnects and the service recovers its arena
        # are answers for those requests: each attempt is a new request.
        attempt = iter(range(1 << 30))
        assert wait_for(
            lambda: settle_once(e, ReqContext(f"after-{next(attempt)}"), ks) == 8, 30
        ), "the restarted service's rows were never found again"
        for k in ks:
            assert e.region.array[e.primary[k]].tobytes() == block(k)
    finally:
        s.stop()
        shutil.rmtree(shm, ignore_errors=True)


def test_two_engine_processes_share_rows(serve, engines):
    """Another vLLM process on the node stores rows; this one loads them."""
    tag = uuid.uuid4().hex
    code = f"""
import sys, uuid
sys.path[:0] = {[os.path.dirname(os.path.abspath(__file__)), os.path.dirname(os.path.dirname(os.path.abspath(__file__)))]!r}
import test_vllm_tier as t
from vllm.v1.kv_offload.base import ReqContext
e = t.new_engine({serve.socket!r})
e.write(ReqContext("peer"), {{k: t.block(k) for k in t.keys(10, {tag!r})}})
t.finish(e)
e.shutdown()
print("stored")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "stored" in r.stdout, r.stdout + r.stderr
    e = engines(serve.socket)
    ks = keys(10, tag)
    settle(e, ReqContext("here"), ks, 10)
    for k in ks:
        assert e.region.array[e.primary[k]].tobytes() == block(
            k
        ), "rows from the other process differ"


def test_the_doctor_passes_and_prints_the_config(serve, vllm):
    import io

    from strata_vllm.doctor import doctor

    buf = io.StringIO()
    assert doctor(serve.socket, 5.0, buf) == 0, buf.getvalue()
    text = buf.getvalue()
    assert "interface is one strata_vllm knows" in text and "same bytes" in text, text
    assert '"module_path":"strata_vllm"' in text and serve.socket in text, text


def test_the_doctor_without_vllm_fails_fast_with_the_fix(serve):
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    t0 = time.monotonic()
    r = subprocess.run(
        [sys.executable, "-m", "strata_vllm", "doctor", "--socket", serve.socket],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert r.returncode != 0 and "run the doctor with vLLM's python" in r.stdout, (
        r.stdout + r.stderr
    )
    assert time.monotonic() - t0 < 20


def test_a_vllm_and_an_sglang_engine_never_see_each_others_pages(serve, engines, sglang, backends):
    """The same block hashes, the same model, one service: each engine finds
    its own pages and none of the other's, in both directions."""
    import harness

    model = "org/model-1"
    b = backends(serve.socket, model=model)
    pool = harness.host_pool("mha", "page_first")
    b.register_mem_pool_host(pool)
    assert b.client.wait_connected(10)
    hexes = harness.keys(4, "shared-hash")
    pages = list(range(1, 5))
    harness.fill(pool, pages, seed=7)
    assert b.batch_set_v1(hexes, harness.indices(pool, pages)) == [True] * 4
    e = engines(serve.socket, model=(model, "bfloat16"))
    vkeys = [make_offload_key(bytes.fromhex(h), 0) for h in hexes]  # the same block hashes
    settle(e, ReqContext("v-sees-s"), vkeys, 0)
    others = harness.keys(4, "vllm-only")
    okeys = [make_offload_key(bytes.fromhex(h), 0) for h in others]
    e.write(ReqContext("w"), {k: block(k) for k in okeys})
    finish(e)
    assert b.batch_exists(others) == 0, "SGLang found pages vLLM stored"
    assert b.batch_exists(hexes) == 4, "SGLang lost its own pages"


def test_rows_are_filled_templates_and_results_come_back_in_row_order(serve, engines):
    """A Put or Get of rows is the generic encoder's items (row offsets of
    every varint width, row 0's left out) in the order strata_client.uniform
    chose, and each result reaches its own row however the items were ordered."""
    from strata_client import wire

    e = engines(serve.socket, rows=300)
    t = e.tier
    blocks = [299, 0, 5, 40, 1, 200, 33, 2]
    ks = [bytes(k) for k in keys(len(blocks), "template")]
    rows = list(zip(ks, blocks))
    conn, (sid,) = t.client.resolve([t._seg])
    body, order = t._encode(rows, sid)
    assert order is not None and sorted(order.tolist()) == list(range(len(rows)))
    assert order.tolist() != list(range(len(rows))), "the widths did not reorder the items"
    items = wire.decode(wire.PUT, body).items
    want = [
        wire.Item(
            t.namespace + rows[j][0].hex(), 0x4D4C4C76, [wire.Range(sid, rows[j][1] * ROW, ROW)]
        )
        for j in order.tolist()
    ]
    assert items == want
    assert body == b"".join(b"\x0a" + wire.varint(len(x)) + x for x in map(wire.encode_item, want))
    # Every other row stored; a Get of all answers each row for itself.
    for k, b in rows:
        e.region.array[b] = np.frombuffer(block(k), dtype=np.uint8)
    stored = rows[::2]
    r = t._call(wire.PUT, stored)
    assert r is not None and [x.status for x in r.results] == [wire.OK] * len(stored)
    for _, b in rows:
        e.region.array[b] = 0
    r = t._call(wire.GET, rows)
    assert [x.status for x in r.results] == [
        wire.OK if i % 2 == 0 else wire.NOT_FOUND for i in range(len(rows))
    ]
    for i, (k, b) in enumerate(rows):
        got = e.region.array[b].tobytes()
        assert got == (block(k) if i % 2 == 0 else bytes(ROW)), f"row {b} holds other bytes"
