package wire

import (
	"errors"
	"fmt"
	"math"
	"reflect"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// These tests make strata.proto the protocol's one schema: the hand-written
// codec must agree with it on every message type, status, field number, field
// type and stated limit. They read the .proto (protoschema_test.go) and drive a
// second, schema-driven codec (schemaDecode, schemaEncode) that knows the
// messages only from the .proto and reaches the Go structs by field name, so a
// field added, renumbered or retyped in one place only fails here. The
// plugin's codec is held to the same file by python/tests/test_proto_schema.py.

const protoPath = "strata.proto"

func testSchema(tb testing.TB) *protoSchema {
	tb.Helper()
	s, err := loadProtoSchema(protoPath)
	if err != nil {
		tb.Fatalf("%s: %v", protoPath, err)
	}
	return s
}

// camel turns an enum value's suffix (HELLO_REPLY) into a message name (HelloReply).
func camel(upper string) string {
	var b strings.Builder
	for _, w := range strings.Split(strings.ToLower(upper), "_") {
		if w != "" {
			b.WriteString(strings.ToUpper(w[:1]) + w[1:])
		}
	}
	return b.String()
}

// sameName matches a proto field name (client_id) with a Go field name
// (ClientID): equal but for case and underscores.
func sameName(proto, goName string) bool {
	return strings.EqualFold(strings.ReplaceAll(proto, "_", ""), goName)
}

// goField returns the field of struct v that the proto field named name maps to.
func goField(v reflect.Value, name string) (reflect.Value, bool) {
	for i := range v.NumField() {
		if sameName(name, v.Type().Field(i).Name) {
			return v.Field(i), true
		}
	}
	return reflect.Value{}, false
}

func TestSchemaMessageTypes(t *testing.T) {
	s := testSchema(t)
	e := s.enums["MessageType"]
	if e == nil {
		t.Fatal("no enum MessageType")
	}
	valid := 0
	for v := range 256 {
		if Type(v).Valid() {
			valid++
		}
	}
	if valid != len(e.values)-1 {
		t.Errorf("the codec knows %d message types, the schema %d", valid, len(e.values)-1)
	}
	for _, ev := range e.values[1:] {
		typ := Type(ev.num)
		name := camel(strings.TrimPrefix(ev.name, "MESSAGE_TYPE_"))
		if !typ.Valid() || typ.String() != name {
			t.Errorf("%s = %d: the codec's type %d is %s", ev.name, ev.num, ev.num, typ)
			continue
		}
		if s.messages[name] == nil {
			t.Errorf("%s: no message %s in the schema", ev.name, name)
		}
		if got := reflect.TypeOf(newMessage(typ)).Elem().Name(); got != name {
			t.Errorf("type %s decodes into a %s", typ, got)
		}
	}
}

func TestSchemaStatuses(t *testing.T) {
	e := testSchema(t).enums["Status"]
	if e == nil {
		t.Fatal("no enum Status")
	}
	valid := 0
	for v := range 256 {
		if Status(v).Valid() {
			valid++
		}
	}
	if valid != len(e.values) {
		t.Errorf("the codec knows %d statuses, the schema %d", valid, len(e.values))
	}
	for _, ev := range e.values {
		want := strings.ToLower(strings.TrimPrefix(ev.name, "STATUS_"))
		if st := Status(ev.num); !st.Valid() || st.String() != want {
			t.Errorf("%s = %d: the codec's status %d is %s", ev.name, ev.num, ev.num, st)
		}
	}
}

// TestSchemaFields checks that every message's Go struct has exactly the
// schema's fields, each of the Go type its proto type decodes into.
func TestSchemaFields(t *testing.T) {
	s := testSchema(t)
	seen := map[string]bool{}
	var check func(m *protoMessage, rt reflect.Type)
	check = func(m *protoMessage, rt reflect.Type) {
		if seen[m.name] {
			return
		}
		seen[m.name] = true
		for i := range rt.NumField() {
			sf := rt.Field(i)
			if !sf.IsExported() {
				continue
			}
			found := false
			for _, f := range m.fields {
				found = found || sameName(f.name, sf.Name)
			}
			if !found {
				t.Errorf("%s.%s is not in the schema's message %s", rt.Name(), sf.Name, m.name)
			}
		}
		for _, f := range m.fields {
			gv, ok := goField(reflect.New(rt).Elem(), f.name)
			if !ok {
				t.Errorf("%s.%s (%d) has no field in %s", m.name, f.name, f.num, rt.Name())
				continue
			}
			if err := s.checkGoType(f, gv.Type()); err != nil {
				t.Errorf("%s.%s: %v", m.name, f.name, err)
			}
			if nested := s.messages[f.typ]; nested != nil {
				check(nested, gv.Type().Elem())
			}
		}
	}
	for v := TypeHello; v <= maxType; v++ {
		check(s.messages[v.String()], reflect.TypeOf(newMessage(v)).Elem())
	}
	for name := range s.messages {
		if !seen[name] {
			t.Errorf("message %s is neither a frame's body nor inside one", name)
		}
	}
}

// checkGoType checks that rt, a Go field's type, holds the proto field f.
func (s *protoSchema) checkGoType(f protoField, rt reflect.Type) error {
	if f.repeated {
		if rt.Kind() != reflect.Slice {
			return fmt.Errorf("repeated, but %s is not a slice", rt)
		}
		rt = rt.Elem()
	}
	kinds := map[string]reflect.Kind{
		"uint32": reflect.Uint32, "uint64": reflect.Uint64, "fixed64": reflect.Uint64,
		"int32": reflect.Int32, "bool": reflect.Bool, "string": reflect.String,
	}
	switch {
	case f.typ == "bytes":
		if rt != reflect.TypeOf([]byte(nil)) {
			return fmt.Errorf("bytes in a %s", rt)
		}
	case kinds[f.typ] != reflect.Invalid:
		if rt.Kind() != kinds[f.typ] {
			return fmt.Errorf("%s in a %s", f.typ, rt)
		}
	case s.enums[f.typ] != nil:
		if rt.Name() != f.typ || rt.Kind() != reflect.Uint8 {
			return fmt.Errorf("enum %s in a %s", f.typ, rt)
		}
	default:
		if rt.Kind() != reflect.Struct || rt.Name() != f.typ {
			return fmt.Errorf("message %s in a %s", f.typ, rt)
		}
	}
	return nil
}

// schemaDecode is the oracle decoder: the body decoded by the schema alone,
// then the codec's Validate (the limits the schema states in prose).
func schemaDecode(s *protoSchema, t Type, body []byte) (Message, error) {
	if !t.Valid() || len(body) > MaxBody {
		return nil, errors.New("no such type, or too long")
	}
	m := newMessage(t)
	if err := s.decode(s.messages[t.String()], body, reflect.ValueOf(m).Elem()); err != nil {
		return nil, err
	}
	if err := m.Validate(); err != nil {
		return nil, err
	}
	return m, nil
}

// decode decodes b, an encoded msg, into the struct dst as proto3 reads it,
// with the protocol's rules: unknown fields skipped, groups and known fields of
// the wrong wire type refused, integers that do not fit their field and enum
// values the schema does not list refused, the last of a singular field winning.
func (s *protoSchema) decode(msg *protoMessage, b []byte, dst reflect.Value) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		b = b[n:]
		if typ != protowire.VarintType && typ != protowire.Fixed32Type && typ != protowire.Fixed64Type && typ != protowire.BytesType {
			return fmt.Errorf("field %d: wire type %d", num, typ)
		}
		n = protowire.ConsumeFieldValue(num, typ, b)
		if n < 0 {
			return protowire.ParseError(n)
		}
		val := b[:n]
		b = b[n:]
		f, ok := msg.byNum(num)
		if !ok {
			continue
		}
		if typ != s.wireType(f) {
			return fmt.Errorf("%s.%s: wire type %d", msg.name, f.name, typ)
		}
		gv, _ := goField(dst, f.name)
		if f.repeated {
			gv.Set(reflect.Append(gv, reflect.Zero(gv.Type().Elem())))
			gv = gv.Index(gv.Len() - 1)
		}
		if err := s.decodeValue(f, val, gv); err != nil {
			return fmt.Errorf("%s.%s: %w", msg.name, f.name, err)
		}
	}
	return nil
}

// decodeValue decodes one value of field f, val as consumed off the wire, into gv.
func (s *protoSchema) decodeValue(f protoField, val []byte, gv reflect.Value) error {
	switch s.wireType(f) {
	case protowire.Fixed64Type:
		v, _ := protowire.ConsumeFixed64(val)
		gv.SetUint(v)
		return nil
	case protowire.BytesType:
		v, _ := protowire.ConsumeBytes(val)
		switch {
		case f.typ == "string":
			gv.SetString(string(v))
		case f.typ == "bytes" && len(v) == 0:
			gv.SetBytes(nil)
		case f.typ == "bytes":
			gv.SetBytes(append([]byte(nil), v...))
		default:
			return s.decode(s.messages[f.typ], v, gv)
		}
		return nil
	}
	v, _ := protowire.ConsumeVarint(val)
	switch {
	case f.typ == "uint32" && v > math.MaxUint32,
		f.typ == "int32" && (int64(v) < math.MinInt32 || int64(v) > math.MaxInt32),
		f.typ == "bool" && v > 1:
		return fmt.Errorf("%d does not fit %s", v, f.typ)
	case s.enums[f.typ] != nil && !s.enums[f.typ].has(v):
		return fmt.Errorf("%d is not a %s", v, f.typ)
	case f.typ == "bool":
		gv.SetBool(v == 1)
	case f.typ == "int32":
		gv.SetInt(int64(v))
	default:
		gv.SetUint(v)
	}
	return nil
}

// encode appends the schema's encoding of v, a msg, to b: fields in the
// schema's order, zero values of singular fields left out (proto3).
func (s *protoSchema) encode(b []byte, msg *protoMessage, v reflect.Value) []byte {
	for _, f := range msg.fields {
		gv, _ := goField(v, f.name)
		if !f.repeated {
			if !gv.IsZero() {
				b = s.encodeValue(b, f, gv)
			}
			continue
		}
		for i := range gv.Len() {
			b = s.encodeValue(b, f, gv.Index(i))
		}
	}
	return b
}

func (s *protoSchema) encodeValue(b []byte, f protoField, gv reflect.Value) []byte {
	b = protowire.AppendTag(b, f.num, s.wireType(f))
	switch {
	case f.typ == "fixed64":
		return protowire.AppendFixed64(b, gv.Uint())
	case f.typ == "string":
		return protowire.AppendString(b, gv.String())
	case f.typ == "bytes":
		return protowire.AppendBytes(b, gv.Bytes())
	case s.messages[f.typ] != nil:
		return protowire.AppendBytes(b, s.encode(nil, s.messages[f.typ], gv))
	case f.typ == "bool":
		return protowire.AppendVarint(b, 1)
	case f.typ == "int32":
		return protowire.AppendVarint(b, uint64(gv.Int()))
	}
	return protowire.AppendVarint(b, gv.Uint())
}

// fill sets every field of v, a msg, to a value no other field has (and that
// the protocol's limits allow), repeated fields to two of them, so that a
// field encoded under another's number shows.
func (s *protoSchema) fill(msg *protoMessage, v reflect.Value, n *int) {
	for _, f := range msg.fields {
		gv, _ := goField(v, f.name)
		count := 1
		if f.repeated {
			count = 2
			gv.Set(reflect.MakeSlice(gv.Type(), count, count))
		}
		for i := range count {
			dst := gv
			if f.repeated {
				dst = gv.Index(i)
			}
			*n++
			switch e := s.enums[f.typ]; {
			case e != nil:
				dst.SetUint(uint64(e.values[1+*n%(len(e.values)-1)].num))
			case s.messages[f.typ] != nil:
				s.fill(s.messages[f.typ], dst, n)
			case f.typ == "uint32":
				dst.SetUint(uint64(*n))
			case f.typ == "uint64":
				dst.SetUint(1<<33 + uint64(*n))
			case f.typ == "fixed64":
				dst.SetUint(0xf1e2d3c4b5a69788 ^ uint64(*n))
			case f.typ == "int32":
				dst.SetInt(-int64(*n))
			case f.typ == "bool":
				dst.SetBool(true)
			case f.typ == "string":
				dst.SetString(fmt.Sprintf("%s-%d", f.name, *n))
			case f.typ == "bytes":
				dst.SetBytes([]byte(fmt.Sprintf(`{"%s":%d}`, f.name, *n)))
			}
		}
	}
}

// filled returns a message of type t with every field set (fill).
func (s *protoSchema) filled(t Type) Message {
	m := newMessage(t)
	n := 0
	s.fill(s.messages[t.String()], reflect.ValueOf(m).Elem(), &n)
	// An item names its bytes by ranges or by runs, never both: the first of
	// the two items keeps its ranges, the second its runs.
	var items []Item
	switch m := m.(type) {
	case *Put:
		items = m.Items
	case *Get:
		items = m.Items
	}
	if len(items) == 2 {
		items[0].Runs, items[1].Ranges = nil, nil
	}
	return m
}

// TestSchemaCodec holds the codec to the schema both ways: what the codec
// encodes, the schema decodes to the same message, and what the schema
// encodes, the codec decodes to it.
func TestSchemaCodec(t *testing.T) {
	s := testSchema(t)
	for typ := TypeHello; typ <= maxType; typ++ {
		want := s.filled(typ)
		if err := want.Validate(); err != nil {
			t.Fatalf("%s: the filled message is invalid: %v", typ, err)
		}
		got, err := schemaDecode(s, typ, want.Marshal(nil))
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the codec's encoding decodes by the schema as %+v, %v; want %+v", typ, got, err, want)
		}
		body := s.encode(nil, s.messages[typ.String()], reflect.ValueOf(want).Elem())
		got, err = Decode(typ, body)
		if err != nil || !reflect.DeepEqual(got, want) {
			t.Errorf("%s: the schema's encoding decodes as %+v, %v; want %+v", typ, got, err, want)
		}
	}
}

// TestSchemaLimits checks the limits the schema states in its comments
// against the codec's constants.
func TestSchemaLimits(t *testing.T) {
	text := strings.Join(strings.Fields(testSchema(t).comments), " ")
	for _, c := range []struct {
		re   string
		want []int
	}{
		{`Every message is one frame: a (\d+)-byte header`, []int{HeaderSize}},
		{`magic "(ST)"`, nil},
		{`at most 16 MiB \((\d+)\)`, []int{MaxBody}},
		{`Keys are 1 to (\d+) bytes`, []int{MaxKey}},
		{`results\) has at most (\d+) entries`, []int{MaxItems}},
		{`An item has 1 to (\d+) ranges`, []int{MaxRanges}},
		{`an item has 1 to (\d+) runs`, []int{MaxRuns}},
		{`which stand for 1 to (\d+) ranges in all`, []int{MaxRunCount}},
		{`a count of 1 to (\d+)`, []int{MaxRunCount}},
		{`The items of one batch name at most (\d+) ranges`, []int{MaxBatchRanges}},
		{`are at most (\d+) bytes; status messages at most (\d+) bytes`, []int{MaxName, MaxMessage}},
		{`exactly (\d+) bytes, (\d+) little-endian uint32 counters`, []int{FenceBytes, FenceSlots}},
	} {
		m := regexp.MustCompile(c.re).FindStringSubmatch(text)
		if m == nil {
			t.Errorf("the schema no longer says %q", c.re)
			continue
		}
		if c.want == nil {
			if m[1] != Magic {
				t.Errorf("the schema's magic is %q, the codec's %q", m[1], Magic)
			}
			continue
		}
		for i, w := range c.want {
			if got, _ := strconv.Atoi(m[1+i]); got != w {
				t.Errorf("%q: the schema says %d, the codec %d", c.re, got, w)
			}
		}
	}
}

// FuzzDecodeSchema holds Decode, fast paths and all, to the schema's decoder:
// both accept a body or both refuse it, and what they accept they decode alike.
func FuzzDecodeSchema(f *testing.F) {
	s := testSchema(f)
	for typ := TypeHello; typ <= maxType; typ++ {
		m := s.filled(typ)
		f.Add(byte(typ), m.Marshal(nil))
		f.Add(byte(typ), s.encode(nil, s.messages[typ.String()], reflect.ValueOf(m).Elem()))
	}
	for _, m := range append(samples(), zeroSamples()...) {
		f.Add(byte(m.Type()), m.Marshal(nil))
	}
	f.Fuzz(func(t *testing.T, typ byte, body []byte) {
		sameDecoding(t, s, Type(typ), body)
	})
}

// sameDecoding fails t unless Decode and schemaDecode agree on body.
func sameDecoding(t *testing.T, s *protoSchema, typ Type, body []byte) {
	t.Helper()
	got, err := Decode(typ, body)
	want, werr := schemaDecode(s, typ, body)
	if (err == nil) != (werr == nil) || err == nil && !reflect.DeepEqual(got, want) {
		t.Fatalf("%s: Decode %+v, %v; by the schema %+v, %v", typ, got, err, want, werr)
	}
	if err != nil && !errors.Is(err, ErrMalformed) {
		t.Fatalf("%s: error %v is not ErrMalformed", typ, err)
	}
}
