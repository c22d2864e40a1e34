"""The plugin's codecs held to node/wire/strata.proto, the protocol's schema.

wire.py (the generic codec) and batch.py (the vectorised item encoder) write
field numbers and tags by hand, as the Go codec does; node/wire's schema_test.go
holds the Go side to the same file. Here a small parser reads the .proto (the
subset it uses: enums and messages of singular and repeated scalar, enum and
message fields; anything else fails the parse by name) and a codec driven by it
alone encodes and decodes messages, so a field added, renumbered or retyped in
one place only fails here: message types, statuses, each dataclass's fields,
and each message both ways through wire.py, and batch.py's items through the
schema's decoder.
"""

import dataclasses
import os
import re
import struct

import pytest

from conftest import REPO
from strata_client import wire

PROTO = os.path.join(REPO, "node", "wire", "strata.proto")

VARINT, FIXED64, BYTES, FIXED32 = 0, 1, 2, 5
SCALARS = {
    "uint32": VARINT,
    "uint64": VARINT,
    "int32": VARINT,
    "bool": VARINT,
    "fixed64": FIXED64,
    "string": BYTES,
    "bytes": BYTES,
}
U64 = (1 << 64) - 1


class Schema:
    """A parsed .proto: enums {name: {value name: number}}, messages {name:
    [(field name, type, number, repeated)]}, and its comments' text."""

    def __init__(self, src: str):
        self.enums, self.messages = {}, {}
        self.comments = " ".join(m.group(1) for m in re.finditer(r"//(.*)", src))
        self.comments = " ".join(self.comments.split())
        code = re.sub(r"//.*", "", src)
        if "/*" in code:
            raise ValueError("block comments are not read by the parser")
        self.toks = re.findall(r'"[^"]*"|[A-Za-z_][\w.]*|\d+|[{}=;]|\S', code)
        self.pos = 0
        while self.pos < len(self.toks):
            kw = self.next()
            if kw in ("syntax", "option"):
                if kw == "option":
                    self.next()
                self.expect("=")
                value = self.next()
                if kw == "syntax" and value != '"proto3"':
                    raise ValueError(f"syntax {value}: the parser reads proto3 only")
                self.expect(";")
            elif kw == "package":
                self.next()
                self.expect(";")
            elif kw == "enum":
                self.enum()
            elif kw == "message":
                self.message()
            else:
                raise ValueError(f"unexpected {kw!r} at the top level")
        for name, fields in self.messages.items():
            for fname, typ, _, repeated in fields:
                if typ not in SCALARS and typ not in self.enums and typ not in self.messages:
                    raise ValueError(f"{name}.{fname}: unknown type {typ}")
                if repeated and self.wire_type(typ) != BYTES:
                    raise ValueError(f"{name}.{fname}: packed repeated fields are not read")

    def next(self):
        self.pos += 1
        return self.toks[self.pos - 1]

    def expect(self, tok):
        got = self.next()
        if got != tok:
            raise ValueError(f"want {tok!r}, got {got!r}")

    def number(self):
        self.expect("=")
        n = int(self.next())
        self.expect(";")
        return n

    def enum(self):
        name = self.next()
        self.expect("{")
        values = {}
        while self.toks[self.pos] != "}":
            vname = self.next()
            values[vname] = self.number()
        self.pos += 1
        if len(set(values.values())) != len(values) or 0 not in values.values():
            raise ValueError(f"enum {name}: duplicate numbers or no 0")
        self.enums[name] = values

    def message(self):
        name = self.next()
        self.expect("{")
        fields = []
        while self.toks[self.pos] != "}":
            repeated = self.toks[self.pos] == "repeated"
            if repeated:
                self.pos += 1
            typ = self.next()
            if typ in ("message", "enum", "oneof", "map", "reserved", "optional", "option"):
                raise ValueError(f"message {name}: {typ!r} is not read by the parser")
            fname = self.next()
            num = self.number()
            if any(f[0] == fname or f[2] == num for f in fields):
                raise ValueError(f"message {name}: {fname} = {num} clashes")
            fields.append((fname, typ, num, repeated))
        self.pos += 1
        self.messages[name] = fields

    def wire_type(self, typ):
        if typ in SCALARS:
            return SCALARS[typ]
        return VARINT if typ in self.enums else BYTES

    # ---- the schema's own codec

    def encode(self, name, msg) -> bytes:
        """msg (a wire dataclass) encoded by the schema: fields in its order,
        zero singular fields left out."""
        out = b""
        for fname, typ, num, repeated in self.messages[name]:
            v = getattr(msg, fname)
            for x in v if repeated else ([v] if v else []):
                out += wire.varint(num << 3 | self.wire_type(typ)) + self.value(typ, x)
        return out

    def value(self, typ, x) -> bytes:
        if typ == "fixed64":
            return struct.pack("<Q", x)
        if typ in ("string", "bytes"):
            b = x.encode() if typ == "string" else x
            return wire.varint(len(b)) + b
        if typ in self.messages:
            b = self.encode(typ, x)
            return wire.varint(len(b)) + b
        return wire.varint(int(x) & U64)

    def decode(self, name, cls, body):
        """body decoded by the schema into a cls; ValueError on what it refuses."""
        fields = {f[2]: f for f in self.messages[name]}
        vals = {f[0]: [] for f in fields.values() if f[3]}
        i, b = 0, bytes(body)
        while i < len(b):
            key, i = read_varint(b, i)
            num, wt = key >> 3, key & 7
            if wt == VARINT:
                v, i = read_varint(b, i)
            elif wt in (FIXED64, FIXED32):
                n = 8 if wt == FIXED64 else 4
                if i + n > len(b):
                    raise ValueError("truncated")
                v, i = int.from_bytes(b[i : i + n], "little"), i + n
            elif wt == BYTES:
                n, i = read_varint(b, i)
                if i + n > len(b):
                    raise ValueError("truncated")
                v, i = b[i : i + n], i + n
            else:
                raise ValueError(f"wire type {wt}")
            if num not in fields:
                continue
            fname, typ, _, repeated = fields[num]
            if wt != self.wire_type(typ):
                raise ValueError(f"{name}.{fname}: wire type {wt}")
            v = self.typed(typ, v, cls, fname)
            if repeated:
                vals[fname].append(v)
            else:
                vals[fname] = v
        return cls(**vals)

    def typed(self, typ, v, cls, fname):
        if typ in self.messages:
            return self.decode(typ, element_class(cls, fname), v)
        if typ == "string":
            return v.decode()
        if typ == "bytes":
            return v
        if typ == "uint32" and v > 0xFFFFFFFF or typ == "bool" and v > 1:
            raise ValueError(f"{v} does not fit {typ}")
        if typ in self.enums and v not in self.enums[typ].values():
            raise ValueError(f"{v} is not a {typ}")
        if typ == "int32":
            v = v - (1 << 64) if v >> 63 else v
            if not -(1 << 31) <= v < 1 << 31:
                raise ValueError(f"{v} does not fit int32")
        return bool(v) if typ == "bool" else v


def read_varint(b, i):
    v = shift = 0
    while True:
        if i >= len(b) or shift > 63:
            raise ValueError("bad varint")
        c = b[i]
        i += 1
        v |= (c & 0x7F) << shift
        if c < 0x80:
            return v, i
        shift += 7


# The dataclass of each message that is not a frame's body: a field's element type.
NESTED = {"Item": wire.Item, "Range": wire.Range, "Run": wire.Run, "Result": wire.Result}


def element_class(cls, fname):
    return NESTED[{"items": "Item", "ranges": "Range", "runs": "Run", "results": "Result"}[fname]]


def camel(upper):
    return "".join(w.capitalize() for w in upper.lower().split("_"))


@pytest.fixture(scope="module")
def schema():
    with open(PROTO) as f:
        return Schema(f.read())


def test_message_types(schema):
    types = schema.enums["MessageType"]
    assert len(wire.TYPE_NAMES) == len(types) - 1
    for vname, num in types.items():
        if num == 0:
            continue
        name = camel(vname[len("MESSAGE_TYPE_") :])
        assert wire.TYPE_NAMES.get(num) == name, vname
        assert name in schema.messages, vname
        cls = wire.MESSAGE_CLASSES[num]
        assert cls.__name__ == name and cls.TYPE == num, vname


def test_statuses(schema):
    statuses = schema.enums["Status"]
    assert len(wire.STATUS_NAMES) == len(statuses) == wire.MAX_STATUS + 1
    for vname, num in statuses.items():
        assert wire.STATUS_NAMES[num] == vname[len("STATUS_") :].lower(), vname
        assert getattr(wire, vname[len("STATUS_") :]) == num, vname


def all_classes():
    return [(cls.__name__, cls) for cls in wire.MESSAGE_CLASSES.values()] + list(NESTED.items())


def test_each_dataclass_has_the_schemas_fields(schema):
    reached = set()
    for name, cls in all_classes():
        reached.add(name)
        want = [f[0] for f in schema.messages[name]]
        got = [f.name for f in dataclasses.fields(cls)]
        assert got == want, name
    assert reached == set(schema.messages)


def filled(schema, name, cls, n):
    """A cls with every field set to a value no other field has (within the
    protocol's limits), repeated fields to two of them."""
    kwargs = {}
    for fname, typ, _, repeated in schema.messages[name]:
        vals = []
        for _ in range(2 if repeated else 1):
            n[0] += 1
            k = n[0]
            if typ in schema.messages:
                vals.append(filled(schema, typ, element_class(cls, fname), n))
            elif typ in schema.enums:
                nums = sorted(schema.enums[typ].values())
                vals.append(nums[1 + k % (len(nums) - 1)])
            else:
                vals.append(
                    {
                        "uint32": k,
                        "uint64": (1 << 33) + k,
                        "fixed64": 0xF1E2D3C4B5A69788 ^ k,
                        "int32": -k,
                        "bool": True,
                        "string": f"{fname}-{k}",
                        "bytes": f'{{"{fname}":{k}}}'.encode(),
                    }[typ]
                )
        kwargs[fname] = vals if repeated else vals[0]
    if name == "Item":
        # An item names its bytes by ranges or by runs, never both: every
        # other item by each.
        kwargs["runs" if n[0] % 2 else "ranges"] = []
    return cls(**kwargs)


@pytest.mark.parametrize("typ", sorted(wire.MESSAGE_CLASSES))
def test_each_message_both_ways(schema, typ):
    """What wire.py encodes, the schema decodes to the same message; what the
    schema encodes, wire.py decodes to it."""
    cls = wire.MESSAGE_CLASSES[typ]
    msg = filled(schema, cls.__name__, cls, [0])
    wire.validate(msg)
    assert schema.decode(cls.__name__, cls, wire.encode_body(msg)) == msg
    assert wire.decode(typ, schema.encode(cls.__name__, msg)) == msg


def test_the_limits_the_schema_states(schema):
    text = schema.comments
    for pattern, want in [
        (r"Every message is one frame: a (\d+)-byte header", [wire.HEADER_SIZE]),
        (r"at most 16 MiB \((\d+)\)", [wire.MAX_BODY]),
        (r"Keys are 1 to (\d+) bytes", [wire.MAX_KEY]),
        (r"results\) has at most (\d+) entries", [wire.MAX_ITEMS]),
        (r"An item has 1 to (\d+) ranges", [wire.MAX_RANGES]),
        (r"Or an item has 1 to (\d+) runs", [wire.MAX_RUNS]),
        (r"stand for 1 to (\d+) ranges in all", [wire.MAX_RUN_COUNT]),
        (r"a count of 1 to (\d+)", [wire.MAX_RUN_COUNT]),
        (r"name at most (\d+) ranges, runs expanded", [wire.MAX_BATCH_RANGES]),
        (r"highest protocol revision the client speaks: (\d+)", [wire.REVISION]),
        (
            r"are at most (\d+) bytes; status messages at most (\d+) bytes",
            [wire.MAX_NAME, wire.MAX_MESSAGE],
        ),
        (
            r"exactly (\d+) bytes, (\d+) little-endian uint32 counters",
            [wire.FENCE_BYTES, wire.FENCE_SLOTS],
        ),
    ]:
        m = re.search(pattern, text)
        assert m, f"the schema no longer says {pattern!r}"
        assert [int(g) for g in m.groups()] == want, pattern
    assert re.search(r'magic "(\w+)"', text).group(1).encode() == wire.MAGIC


def tag(schema, message, fname):
    for name, typ, num, _ in schema.messages[message]:
        if name == fname:
            return num << 3 | schema.wire_type(typ)
    raise KeyError(f"{message}.{fname}")


def test_batch_tags_are_the_schemas(schema):
    from strata_sglang import batch

    assert batch._TAG_ITEM == tag(schema, "Put", "items") == tag(schema, "Get", "items")
    assert batch._TAG_KEY == tag(schema, "Item", "key")
    assert batch._TAG_RANGE == tag(schema, "Item", "ranges")
    assert batch._TAG_SEGMENT == tag(schema, "Range", "segment")
    assert batch._TAG_OFFSET == tag(schema, "Range", "offset")
    assert batch._TAG_LENGTH == tag(schema, "Range", "length")
    assert batch._TAG_RUN == tag(schema, "Item", "runs")
    assert batch._TAG_SEGMENT == tag(schema, "Run", "segment")
    assert batch._TAG_OFFSET == tag(schema, "Run", "offset")
    assert batch._TAG_LENGTH == tag(schema, "Run", "length")
    assert batch._TAG_STRIDE == tag(schema, "Run", "stride")
    assert batch._TAG_COUNT == tag(schema, "Run", "count")


def test_batch_items_decode_by_the_schema(schema):
    """batch.encode's items, framed as a Get, are what the schema decodes."""
    import torch

    from strata_sglang import batch

    fmt = 0x1122334455667788
    fmt_field = bytes([tag(schema, "Item", "format")]) + struct.pack("<Q", fmt)
    names = [b"k" * 20, b"key-two" * 30]
    sid = [[1, 70000, 3], [(1 << 32) - 1, 2, 2]]
    off = [[0, 1 << 40, 128], [4096, 0, 16384]]
    length = [[64, 1, (1 << 35) - 1], [300, 7, 9]]
    keep = [[True, True, False], [True, False, True]]
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    body, _ = batch.encode(names, fmt_field, t(sid), t(off), t(length), torch.tensor(keep))
    got = schema.decode("Get", wire.Get, body)
    want = wire.Get(
        items=[
            wire.Item(
                names[i].decode(),
                fmt,
                [wire.Range(sid[i][r], off[i][r], length[i][r]) for r in range(3) if keep[i][r]],
            )
            for i in range(2)
        ]
    )
    assert got == want


def test_batch_runs_decode_by_the_schema(schema):
    """batch.encode_runs's items, framed as a Put, are what the schema decodes."""
    import torch

    from strata_sglang import batch

    fmt = 0x0102030405060708
    fmt_field = bytes([tag(schema, "Item", "format")]) + struct.pack("<Q", fmt)
    names = [b"mla-key" * 3, b"x" * 200]
    cols = [[0, (1 << 32) - 1], [4096, 0], [36864, 1], [1 << 24, 0], [61, 1]]
    t = lambda v: torch.tensor(v, dtype=torch.int64)  # noqa: E731
    body, _ = batch.encode_runs(names, fmt_field, *(t(c) for c in cols))
    want = wire.Put(
        items=[
            wire.Item(names[i].decode(), fmt, runs=[wire.Run(*(c[i] for c in cols))])
            for i in range(2)
        ]
    )
    assert schema.decode("Put", wire.Put, body) == want
