"""The plugin's codec against the Go codec's golden frames (node/wire/golden_test.go)."""

import json
import os

import pytest

from strata_client import wire

GOLDEN = os.path.join(
    os.path.dirname(os.path.abspath(__file__)),
    "..",
    "..",
    "node",
    "wire",
    "testdata",
    "golden",
)


def _manifest():
    with open(os.path.join(GOLDEN, "manifest.json")) as f:
        return json.load(f)


def _message(typ, fields):
    """Build the plugin's message of type typ from the manifest's fields."""
    cls = wire.MESSAGE_CLASSES[typ]
    if typ in (wire.PUT, wire.GET):
        items = [
            wire.Item(
                it["key"],
                it["format"],
                [wire.Range(r["segment"], r["offset"], r["length"]) for r in it["ranges"]],
                [
                    wire.Run(r["segment"], r["offset"], r["length"], r["stride"], r["count"])
                    for r in it.get("runs", [])
                ],
            )
            for it in fields["items"]
        ]
        return cls(items, fields["deadline_ns"], fields["fence_slot"])
    if typ == wire.BATCH_REPLY:
        return cls([wire.Result(r["status"], r["message"]) for r in fields["results"]])
    if typ == wire.STATS_REPLY:
        return cls(fields["json"].encode())
    return cls(**fields)


def _read(*parts):
    with open(os.path.join(GOLDEN, *parts), "rb") as f:
        return f.read()


CASES = _manifest()["frames"]


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_go_frames_decode_and_encode_to_the_same_bytes(case):
    frame = _read("go", case["name"] + ".bin")
    h, msg = wire.parse_frame(frame)
    want = _message(case["type"], case["msg"])
    assert (h.type, h.id) == (case["type"], case["id"])
    assert msg == want
    assert wire.encode_frame(case["id"], want) == frame


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_plugin_frames_for_go(case):
    """Writes (STRATA_UPDATE_GOLDEN=1) or checks the frames Go's test decodes."""
    frame = wire.encode_frame(case["id"], _message(case["type"], case["msg"]))
    path = os.path.join(GOLDEN, "py", case["name"] + ".bin")
    if os.environ.get("STRATA_UPDATE_GOLDEN") == "1":
        os.makedirs(os.path.dirname(path), exist_ok=True)
        with open(path, "wb") as f:
            f.write(frame)
    with open(path, "rb") as f:
        assert f.read() == frame


MALFORMED = _manifest()["malformed"]


@pytest.mark.parametrize("name", MALFORMED)
def test_malformed_frames_are_rejected(name):
    with pytest.raises(wire.Malformed):
        wire.parse_frame(_read("malformed", name + ".bin"))


def test_encoder_refuses_what_the_protocol_forbids():
    bad = [
        wire.Put([wire.Item("", 1, [wire.Range(1, 0, 1)])]),
        wire.Put([wire.Item("k\n", 1, [wire.Range(1, 0, 1)])]),
        wire.Put([wire.Item("k", 1, [])]),
        wire.Put([wire.Item("k", 1, [wire.Range(1, 0, 0)])]),
        wire.Put([wire.Item("k", 1, [wire.Range(1, 0, 1)] * (wire.MAX_RANGES + 1))]),
        wire.Get([wire.Item("k", 1, [wire.Range(1, (1 << 64) - 1, 1)])]),
        wire.Exists(["k"] * (wire.MAX_ITEMS + 1)),
        wire.RegisterSegment(0, "kv"),
        wire.Error(wire.OK, "no"),
    ]
    for m in bad:
        with pytest.raises(wire.Malformed):
            wire.encode_frame(1, m)


def test_every_truncation_of_a_reply_is_rejected_or_shorter():
    """A reply cut anywhere never decodes to more than the original held."""
    frame = _read("go", "batch_reply.bin")
    for cut in range(len(frame)):
        with pytest.raises(wire.Malformed):
            wire.parse_frame(frame[:cut])


def _generic_batch_reply(body):
    """The BatchReply the field-by-field decoder makes of body, or Malformed."""
    m = wire._decode(wire.BATCH_REPLY, body)
    wire.validate(m)
    return m


def test_batch_reply_fast_path_agrees_with_the_generic_decoder():
    ok, miss = b"\x0a\x00", b"\x0a\x02\x08\x01"
    with_message = wire.encode_body(wire.BatchReply([wire.Result(wire.BAD_RANGE, "why")]))
    bodies = [
        b"",
        ok * 256,
        ok * wire.MAX_ITEMS,
        ok * (wire.MAX_ITEMS + 1),  # too many: Malformed
        miss * 3 + ok * 2 + b"\x0a\x02\x08\x09",
        ok + with_message + miss,  # a message: the generic decoder's
        b"\x0a\x02\x08\x00" + ok,  # status 0 written out
        ok + b"\x0a\x02\x08\x0a",  # unknown status: Malformed
        ok + b"\x0a",  # truncated: Malformed
        ok + b"\x0a\x02\x08",  # truncated: Malformed
        b"\x12\x00" + ok,  # another field: skipped
    ]
    for body in bodies:
        try:
            want = _generic_batch_reply(body)
        except wire.Malformed:
            with pytest.raises(wire.Malformed):
                wire.decode(wire.BATCH_REPLY, body)
            continue
        assert wire.decode(wire.BATCH_REPLY, body) == want, body


def test_the_limits_are_node_wires():
    """The plugin refuses what the service refuses: the same limits (node/wire/messages.go)."""
    import re

    with open(os.path.join(GOLDEN, "..", "..", "messages.go")) as f:
        src = f.read()

    def go(name):
        m = re.search(r"^\s*" + name + r"\s*=\s*([0-9<\s]+)$", src, re.M)
        assert m, f"{name} is not in node/wire/messages.go"
        base, _, shift = m.group(1).partition("<<")  # 4096, or 16 << 20
        return int(base) << int(shift or 0)

    assert wire.MAX_BODY == go("MaxBody")
    assert wire.MAX_ITEMS == go("MaxItems")
    assert wire.MAX_RANGES == go("MaxRanges")
    assert wire.MAX_RUNS == go("MaxRuns") and wire.MAX_RUN_COUNT == go("MaxRunCount")
    assert re.search(r"MaxBatchRanges\s*=\s*MaxItems \* MaxRanges$", src, re.M)
    assert wire.MAX_BATCH_RANGES == wire.MAX_ITEMS * wire.MAX_RANGES
    assert wire.REVISION == go("Revision")
    assert wire.MAX_KEY == go("MaxKey")
    assert wire.MAX_NAME == go("MaxName")
    assert wire.MAX_MESSAGE == go("MaxMessage")
    assert wire.HEADER_SIZE == go("HeaderSize") and wire.VERSION == go("Version")


def _runs_frame(items, typ=wire.PUT):
    """A Put or Get of items encoded without validation (to feed the decoder
    what the encoder refuses)."""
    body = b"".join(
        b"\x0a" + wire.varint(len(b)) + b for b in (wire.encode_item(it) for it in items)
    )
    return wire._HEADER.pack(wire.MAGIC, wire.VERSION, typ, 3, len(body)) + body


@pytest.mark.parametrize("seed", range(6))
def test_runs_round_trip_and_stand_for_their_ranges(seed):
    import random

    rnd = random.Random(seed)
    big = [0, 1, 127, 128, 16383, 16384, (1 << 35) - 1, (1 << 46) + 3]
    items = []
    for i in range(rnd.randint(1, 20)):
        runs = []
        for _ in range(rnd.randint(1, 5)):
            length = max(1, rnd.choice(big))
            count = rnd.choice([1, 2, 61, 700])
            stride = 0 if count == 1 and rnd.random() < 0.5 else length + rnd.choice(big)
            runs.append(wire.Run(rnd.choice([0, 1, 70000]), rnd.choice(big), length, stride, count))
        items.append(wire.Item(f"k{i}", rnd.getrandbits(64), runs=runs))
    for cls in (wire.Put, wire.Get):
        m = cls(items, rnd.choice([0, 12345]), rnd.choice([0, 7]))
        h, got = wire.parse_frame(wire.encode_frame(5, m))
        assert got == m
    r = wire.Run(3, 4096, 36864, 1 << 24, 61)
    assert r.ranges()[60] == wire.Range(3, 4096 + 60 * (1 << 24), 36864)
    assert wire.Item("k", 1, runs=[r, wire.Run(1, 0, 8, 0, 1)]).spans() == 62


def test_encoder_and_decoder_refuse_what_the_runs_rules_forbid():
    U64 = (1 << 64) - 1
    ok = wire.Run(1, 0, 64, 128, 4)
    bad = [
        wire.Item("k", 1, [wire.Range(1, 0, 8)], [ok]),  # both
        wire.Item("k", 1, runs=[wire.Run(1, 0, 0, 8, 2)]),  # length 0
        wire.Item("k", 1, runs=[wire.Run(1, 0, 8, 8, 0)]),  # count 0
        wire.Item("k", 1, runs=[wire.Run(1, 0, 8, 8, wire.MAX_RUN_COUNT + 1)]),
        wire.Item("k", 1, runs=[wire.Run(1, 0, 8, 7, 2)]),  # overlapping
        wire.Item("k", 1, runs=[wire.Run(1, U64 - 15, 8, 8, 2)]),  # end overflows
        wire.Item("k", 1, runs=[wire.Run(1, 0, 1 << 60, 1 << 62, 8)]),  # end overflows
        wire.Item("k", 1, runs=[ok] * (wire.MAX_RUNS + 1)),
        wire.Item("k", 1, runs=[wire.Run(1, 0, 8, 8, 4000), wire.Run(1, 1 << 20, 8, 8, 97)]),
        wire.Item("k", 1, runs=[wire.Run(1 << 32, 0, 8, 8, 2)]),
    ]
    for it in bad:
        with pytest.raises(wire.Malformed):
            wire.encode_frame(1, wire.Put([it]))
        if it.runs and it.runs[0].segment <= wire._U32 and it.runs[0].count <= wire._U32:
            with pytest.raises(wire.Malformed):
                wire.parse_frame(_runs_frame([it], wire.GET))
    # Fine on their own, too many ranges together: a batch names at most
    # MAX_BATCH_RANGES ranges, runs expanded.
    full = wire.Item("k", 1, runs=[wire.Run(1, 0, 8, 8, wire.MAX_RUN_COUNT)])
    fits = wire.MAX_BATCH_RANGES // wire.MAX_RUN_COUNT
    wire.validate(wire.Put([full] * fits))
    with pytest.raises(wire.Malformed):
        wire.validate(wire.Put([full] * (fits + 1)))
    with pytest.raises(wire.Malformed):
        wire.parse_frame(_runs_frame([full] * (fits + 1)))
    for m in (wire.Hello(revision=1 << 32), wire.HelloReply(revision=-1)):
        with pytest.raises(wire.Malformed):
            wire.encode_frame(1, m)


def test_revisions():
    assert wire.REVISION == 2 and wire.revision_of(0) == 1 and wire.revision_of(2) == 2
    # An older peer's Hello and HelloReply have no revision: they decode to 0.
    assert wire.parse_frame(_read("go", "hello.bin"))[1].revision == 0
    assert wire.parse_frame(_read("go", "hello_reply.bin"))[1].revision == 0
