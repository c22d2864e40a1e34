package wire

import (
	"errors"
	"fmt"
	"net"
	"os"
	"reflect"
	"strings"
	"testing"

	"go.uber.org/goleak"
	"golang.org/x/sys/unix"
	"google.golang.org/protobuf/encoding/protowire"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// key returns a page-object key like the ones pagekey.Names spells.
func key(i int) string {
	return fmt.Sprintf("%064x_0_k", i)
}

// putItems builds pages pages of parts objects each, ranges ranges per object, in
// a layout-like pattern over two segments.
func putItems(pages, parts, ranges int) []Item {
	items := make([]Item, 0, pages*parts)
	for p := range pages {
		for part := range parts {
			it := Item{Key: fmt.Sprintf("%064x_0_%d", p, part), Format: 0x9e3779b97f4a7c15}
			for r := range ranges {
				it.Ranges = append(it.Ranges, Range{
					Segment: uint32(part + 1),
					Offset:  uint64(r)<<24 + uint64(p)<<16,
					Length:  1 << 16 / uint64(ranges),
				})
			}
			items = append(items, it)
		}
	}
	return items
}

// samples returns a message of every type, with every field set.
func samples() []Message {
	return []Message{
		&Hello{Version: Version, ClientName: "sglang-tp0 ✓", PID: 4242, Revision: Revision},
		&HelloReply{ClientID: 1 << 40, ServerVersion: "strata v0.3.0", MaxBatch: 128, ClockNS: 1<<62 + 5,
			InstanceID: 0xfedcba9876543210, ContentID: 1<<63 | 7, Starting: true, ReadyPercent: 37, Warm: true, Revision: Revision},
		&RegisterSegment{Size: 3 << 30, Name: "kv", Fence: true},
		&RegisterSegmentReply{SegmentID: 7},
		&UnregisterSegment{SegmentID: 7},
		&Exists{Keys: []string{key(1), key(2), "model:" + key(3)}, Format: 0xfedcba9876543210},
		&ExistsReply{Present: 2},
		&Put{Items: putItems(3, 2, 2), DeadlineNS: 1<<63 + 7, FenceSlot: FenceSlots},
		&Get{Items: []Item{{Key: key(9), Format: 1, Ranges: []Range{{Segment: 0, Offset: 0, Length: 1}, {Segment: 1<<32 - 1, Offset: 1<<64 - 2, Length: 1}}},
			{Key: key(10), Format: 1, Runs: []Run{{Segment: 3, Offset: 1 << 20, Length: 1152, Stride: 1 << 24, Count: 61}, {Segment: 1<<32 - 1, Offset: 1<<64 - 3, Length: 2, Count: 1}}}},
			DeadlineNS: 123456789, FenceSlot: 1},
		&BatchReply{Results: []Result{{Status: OK}, {Status: NotFound}, {Status: BadRange, Message: "range [0x10, +4096) is outside segment 3; allocate with shm"}, {Status: Unavailable}}},
		&Remove{Keys: []string{key(1), " ~printable~ "}},
		&RemoveReply{Removed: 1},
		&Stats{},
		&StatsReply{JSON: []byte(`{"objects":12,"bytes":4096}`)},
		&Ping{Nonce: 0xdeadbeefcafef00d},
		&Pong{Nonce: 1},
		&Ack{},
		&Error{Code: Busy, Message: "draining"},
	}
}

// zeroSamples returns the zero message of every type whose zero value is valid.
func zeroSamples() []Message {
	var out []Message
	for t := TypeHello; t <= maxType; t++ {
		m := newMessage(t)
		if m.Validate() == nil {
			out = append(out, m)
		}
	}
	return out
}

func TestSamplesCoverEveryType(t *testing.T) {
	seen := map[Type]bool{}
	for _, m := range samples() {
		if seen[m.Type()] {
			t.Errorf("two samples of %s", m.Type())
		}
		seen[m.Type()] = true
		if err := m.Validate(); err != nil {
			t.Errorf("sample %s does not validate: %v", m.Type(), err)
		}
	}
	for typ := TypeHello; typ <= maxType; typ++ {
		if !seen[typ] {
			t.Errorf("no sample of %s", typ)
		}
	}
}

func TestMarshalDecodeRoundTrip(t *testing.T) {
	for _, m := range append(samples(), zeroSamples()...) {
		t.Run(m.Type().String(), func(t *testing.T) {
			body := m.Marshal(nil)
			got, err := Decode(m.Type(), body)
			if err != nil {
				t.Fatalf("decode: %v", err)
			}
			if !reflect.DeepEqual(got, m) {
				t.Fatalf("round trip:\n got %+v\nwant %+v", got, m)
			}
			// Append encoding: a prefix is kept.
			pre := []byte("prefix")
			if b := m.Marshal(pre); string(b[:len(pre)]) != "prefix" || string(b[len(pre):]) != string(body) {
				t.Fatal("Marshal does not append")
			}
			// Value and pointer forms encode alike.
			v := reflect.ValueOf(m).Elem().Interface().(Message)
			if string(v.Marshal(nil)) != string(body) {
				t.Fatal("value and pointer encode differently")
			}
		})
	}
}

func TestDecodeCopies(t *testing.T) {
	m := &Put{Items: []Item{{Key: key(1), Ranges: []Range{{Length: 1}}}}}
	body := m.Marshal(nil)
	got, err := Decode(TypePut, body)
	if err != nil {
		t.Fatal(err)
	}
	for i := range body {
		body[i] = 'x'
	}
	if got.(*Put).Items[0].Key != key(1) {
		t.Fatal("decoded key aliases the body")
	}
	s := &StatsReply{JSON: []byte("{}")}
	body = s.Marshal(nil)
	got, _ = Decode(TypeStatsReply, body)
	body[len(body)-1] = 'x'
	if string(got.(*StatsReply).JSON) != "{}" {
		t.Fatal("decoded JSON aliases the body")
	}
}

func TestDecodedRangesDoNotAlias(t *testing.T) {
	m := &Put{Items: putItems(2, 1, 2)}
	got, err := Decode(TypePut, m.Marshal(nil))
	if err != nil {
		t.Fatal(err)
	}
	items := got.(*Put).Items
	items[0].Ranges = append(items[0].Ranges, Range{Segment: 99, Length: 1})
	if items[1].Ranges[0].Segment == 99 {
		t.Fatal("appending to one item's ranges overwrote the next item's")
	}
}

func TestUnknownFieldsSkipped(t *testing.T) {
	// A newer peer's extra fields: varint 15, fixed32 16, bytes 17, fixed64 1000.
	var extra []byte
	extra = protowire.AppendVarint(protowire.AppendTag(extra, 15, protowire.VarintType), 150)
	extra = protowire.AppendFixed32(protowire.AppendTag(extra, 16, protowire.Fixed32Type), 7)
	extra = protowire.AppendString(protowire.AppendTag(extra, 17, protowire.BytesType), "hi")
	extra = protowire.AppendFixed64(protowire.AppendTag(extra, 1000, protowire.Fixed64Type), 8)
	for _, m := range samples() {
		body := append(m.Marshal(nil), extra...)
		got, err := Decode(m.Type(), body)
		if err != nil {
			t.Errorf("%s with unknown fields: %v", m.Type(), err)
			continue
		}
		if !reflect.DeepEqual(got, m) {
			t.Errorf("%s with unknown fields decoded as %+v", m.Type(), got)
		}
	}
}

func TestTypeAndStatusStrings(t *testing.T) {
	for typ := TypeHello; typ <= maxType; typ++ {
		if s := typ.String(); s == "" || strings.HasPrefix(s, "Type(") {
			t.Errorf("type %d has no name", typ)
		}
		if newMessage(typ).Type() != typ {
			t.Errorf("newMessage(%s) is a %s", typ, newMessage(typ).Type())
		}
	}
	if s := Type(0).String(); s != "Type(0)" {
		t.Errorf("Type(0).String() = %q", s)
	}
	if s := Type(255).String(); s != "Type(255)" {
		t.Errorf("Type(255).String() = %q", s)
	}
	for s := OK; s <= maxStatus; s++ {
		if n := s.String(); n == "" || strings.HasPrefix(n, "Status(") {
			t.Errorf("status %d has no name", s)
		}
	}
	if s := Status(200).String(); s != "Status(200)" {
		t.Errorf("Status(200).String() = %q", s)
	}
	if TypePut.Reply() != TypeBatchReply || TypeGet.Reply() != TypeBatchReply || TypeUnregisterSegment.Reply() != TypeAck || TypeAck.Reply() != 0 {
		t.Error("Reply pairs wrong")
	}
	requests := 0
	for typ := TypeHello; typ <= maxType; typ++ {
		if typ.IsRequest() {
			requests++
			if !typ.Reply().Valid() {
				t.Errorf("%s has reply %s", typ, typ.Reply())
			}
		}
	}
	if requests != 9 {
		t.Errorf("%d request types, want 9", requests)
	}
}

func TestStatusErrors(t *testing.T) {
	if OK.Error() != nil {
		t.Fatal("OK.Error() is not nil")
	}
	if (Result{Status: OK, Message: "fine"}).Err() != nil {
		t.Fatal("an OK result has an error")
	}
	for s := NotFound; s <= maxStatus; s++ {
		err := s.Error()
		if err == nil || err.Error() == "" {
			t.Fatalf("%s.Error() = %v", s, err)
		}
		r := Result{Status: s, Message: "key abc"}.Err()
		if !errors.Is(r, s.Error()) || StatusOf(r) != s || !strings.Contains(r.Error(), "key abc") {
			t.Errorf("Result{%s}.Err() = %v: not matched by errors.Is or StatusOf", s, r)
		}
		e := fmt.Errorf("wrapped: %w", Error{Code: s, Message: "m"}.Err())
		if !errors.Is(e, s.Error()) || StatusOf(e) != s {
			t.Errorf("Error{%s}.Err() wrapped not matched", s)
		}
		if errors.Is(r, Status(1+s%maxStatus).Error()) {
			t.Errorf("%s matches another status", s)
		}
	}
	if StatusOf(nil) != OK || StatusOf(errors.New("x")) != Internal {
		t.Error("StatusOf of nil or a plain error")
	}
}

func TestClipMessage(t *testing.T) {
	if ClipMessage("short") != "short" {
		t.Error("short message changed")
	}
	long := strings.Repeat("é", MaxMessage) // 2 bytes each
	c := ClipMessage(long)
	if len(c) > MaxMessage || !strings.HasSuffix(c, "…") {
		t.Errorf("clipped to %d bytes", len(c))
	}
	if err := (Error{Code: Internal, Message: c}).Validate(); err != nil {
		t.Error(err)
	}
	if err := (Error{Code: Internal, Message: ClipMessage("bad \xff byte")}).Validate(); err != nil {
		t.Error(err)
	}
}

// socketpair returns two connected Conns.
func socketpair(t testing.TB) (*Conn, *Conn) {
	t.Helper()
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_STREAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	conn := func(fd int) *Conn {
		f := os.NewFile(uintptr(fd), "socketpair")
		defer f.Close()
		c, err := net.FileConn(f)
		if err != nil {
			t.Fatal(err)
		}
		return NewConn(c.(*net.UnixConn))
	}
	a, b := conn(fds[0]), conn(fds[1])
	t.Cleanup(func() { a.Close(); b.Close() })
	return a, b
}
