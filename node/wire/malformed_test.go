package wire

import (
	"bytes"
	"encoding/binary"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// rawHeader builds a frame header with any field values.
func rawHeader(magic string, version, typ byte, id uint64, n uint32) []byte {
	b := append([]byte(magic), version, typ)
	b = binary.LittleEndian.AppendUint64(b, id)
	return binary.LittleEndian.AppendUint32(b, n)
}

func frame(t testing.TB, id uint64, m Message) []byte {
	t.Helper()
	b, err := AppendFrame(nil, id, m)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestReadFrame(t *testing.T) {
	var stream []byte
	for i, m := range samples() {
		stream = append(stream, frame(t, uint64(i)+100, m)...)
	}
	r := bytes.NewReader(stream)
	for i, m := range samples() {
		h, body, err := ReadFrame(r)
		if err != nil {
			t.Fatalf("frame %d: %v", i, err)
		}
		if h.Type != m.Type() || h.ID != uint64(i)+100 || int(h.Len) != len(body) {
			t.Fatalf("frame %d: header %+v, body %d bytes", i, h, len(body))
		}
		if string(body) != string(m.Marshal(nil)) {
			t.Fatalf("frame %d: body differs", i)
		}
	}
	if _, _, err := ReadFrame(r); err != io.EOF {
		t.Fatalf("at the end: %v, want io.EOF", err)
	}
}

func TestMalformedFrames(t *testing.T) {
	ping := frame(t, 9, &Ping{Nonce: 5})
	cases := []struct {
		name    string
		in      []byte
		message bool   // a *MessageError: the frame was read whole
		text    string // in the error
	}{
		{"bad magic", rawHeader("SX", Version, byte(TypePing), 1, 0), false, "magic"},
		{"HTTP", []byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"), false, "magic"},
		{"version 2", rawHeader(Magic, 2, byte(TypePing), 1, 0), false, "supports version 1"},
		{"version 0", rawHeader(Magic, 0, byte(TypePing), 1, 0), false, "supports version 1"},
		{"type 0", rawHeader(Magic, Version, 0, 1, 0), true, "unknown message type 0"},
		{"type 255 with body", append(rawHeader(Magic, Version, 255, 1, 3), 1, 2, 3), true, "unknown message type 255"},
		{"type 19", rawHeader(Magic, Version, 19, 1, 0), true, "unknown message type"},
		{"truncated header", ping[:5], false, "truncated"},
		{"header only 15", ping[:15], false, "truncated"},
		{"truncated body", ping[:len(ping)-1], false, "truncated"},
		{"body missing", ping[:HeaderSize], false, "truncated"},
		{"length over MaxBody", rawHeader(Magic, Version, byte(TypeStatsReply), 1, MaxBody+1), false, "at most"},
		{"length 4 GiB", rawHeader(Magic, Version, byte(TypePut), 1, 1<<32-1), false, "at most"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			h, _, err := ReadFrame(bytes.NewReader(c.in))
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("err = %v, want ErrMalformed", err)
			}
			if !strings.Contains(err.Error(), c.text) {
				t.Errorf("err %q does not say %q", err, c.text)
			}
			var me *MessageError
			if got := errors.As(err, &me); got != c.message {
				t.Errorf("MessageError: %v, want %v (%v)", got, c.message, err)
			}
			if c.message && (me.Header.ID != 1 || h.ID != 1) {
				t.Errorf("MessageError header %+v, returned %+v", me.Header, h)
			}
			if strings.HasPrefix(c.name, "truncated") && !errors.Is(err, io.ErrUnexpectedEOF) {
				t.Errorf("truncated frame error %v does not wrap io.ErrUnexpectedEOF", err)
			}
		})
	}
}

// headerOnly returns a header and then fails the test if read again: a reader
// that would block.
type headerOnly struct {
	t    *testing.T
	b    []byte
	done bool
}

func (r *headerOnly) Read(p []byte) (int, error) {
	if r.done {
		r.t.Fatal("ReadFrame read past a header that declares an oversize body")
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	r.done = len(r.b) == 0
	return n, nil
}

func TestOversizeBodyRefusedBeforeAllocation(t *testing.T) {
	hdr := rawHeader(Magic, Version, byte(TypeStatsReply), 1, 1<<32-1)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	allocs := testing.AllocsPerRun(100, func() {
		if _, _, err := ReadFrame(&headerOnly{t: t, b: hdr}); !errors.Is(err, ErrMalformed) {
			t.Fatal(err)
		}
	})
	runtime.ReadMemStats(&after)
	if allocs > 16 { // the header and the error's text; the point is no body
		t.Errorf("%v allocations to refuse an oversize frame", allocs)
	}
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("%d bytes allocated for 101 refusals", d)
	}
}

func TestBodyGrowsAsItArrives(t *testing.T) {
	// A frame that declares MaxBody and delivers 10 bytes costs far less than
	// MaxBody.
	in := append(rawHeader(Magic, Version, byte(TypeStatsReply), 1, MaxBody), make([]byte, 10)...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, _, err := ReadFrame(bytes.NewReader(in)); !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if d := after.TotalAlloc - before.TotalAlloc; d > 1<<20 {
		t.Errorf("%d bytes allocated for a 10-byte body", d)
	}
}

// pb builds protobuf bodies by hand.
type pb []byte

func (b pb) varint(num protowire.Number, v uint64) pb {
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}
func (b pb) fixed64(num protowire.Number, v uint64) pb {
	return protowire.AppendFixed64(protowire.AppendTag(b, num, protowire.Fixed64Type), v)
}
func (b pb) bytes(num protowire.Number, v []byte) pb {
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}
func (b pb) raw(v ...byte) pb { return append(b, v...) }

// negative returns the varint value of -v, as proto encodes negative integers.
func negative(v int64) uint64 { return uint64(-v) }

func manyKeys(n int) []string {
	keys := make([]string, n)
	for i := range keys {
		keys[i] = key(i)
	}
	return keys
}

func TestMalformedMessages(t *testing.T) {
	okRange := []Range{{Segment: 1, Length: 64}}
	item := func(k string, r ...Range) Item { return Item{Key: k, Format: 1, Ranges: r} }
	put := func(items ...Item) []byte { return Put{Items: items}.Marshal(nil) }
	cases := []struct {
		name string
		t    Type
		body []byte
	}{
		// Bad protobuf.
		{"truncated varint", TypeHello, pb{}.raw(0x08, 0x80)},
		{"truncated tag", TypeHello, pb{}.raw(0x80)},
		{"varint over 10 bytes", TypeHello, pb{}.raw(0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)},
		{"field number 0", TypePing, pb{}.raw(0x00, 0x01)},
		{"wrong wire type", TypeHello, pb{}.fixed64(fHelloVersion, 1)},
		{"wrong wire type for nonce", TypePing, pb{}.varint(fNonce, 1)},
		{"wrong wire type for items", TypePut, pb{}.varint(fBatchItems, 1)},
		{"wrong wire type for key", TypeExists, pb{}.varint(fExistsKeys, 1)},
		{"group", TypeAck, pb{}.raw(1<<3|3, 1<<3|4)},
		{"end group", TypeStats, pb{}.raw(1<<3 | 4)},
		{"bytes past the end", TypeStatsReply, pb{}.raw(0x0a, 100, '{', '}')},
		{"bad protobuf inside an item", TypePut, pb{}.bytes(fBatchItems, []byte{0x0a, 0x05, 'a'})},
		{"bad protobuf inside a range", TypeGet, pb{}.bytes(fBatchItems, pb{}.bytes(fItemRanges, []byte{0x08}))},
		{"bad protobuf inside a result", TypeBatchReply, pb{}.bytes(fBatchReplyResults, []byte{0x10})},
		{"body over MaxBody", TypeStatsReply, make([]byte, MaxBody+1)},
		{"unknown type", Type(0), nil},
		{"unknown type 200", Type(200), nil},
		// Limits.
		{"too many items", TypePut, Put{Items: putItems(MaxItems+1, 1, 1)}.Marshal(nil)},
		{"too many keys", TypeExists, Exists{Keys: manyKeys(MaxItems + 1)}.Marshal(nil)},
		{"too many remove keys", TypeRemove, Remove{Keys: manyKeys(MaxItems + 1)}.Marshal(nil)},
		{"too many results", TypeBatchReply, BatchReply{Results: make([]Result, MaxItems+1)}.Marshal(nil)},
		{"too many ranges", TypeGet, Get{Items: putItems(1, 1, MaxRanges+1)}.Marshal(nil)},
		{"no ranges", TypePut, put(item(key(1)))},
		{"empty key", TypePut, put(item("", okRange...))},
		{"empty key in Exists", TypeExists, Exists{Keys: []string{key(1), ""}}.Marshal(nil)},
		{"key too long", TypeRemove, Remove{Keys: []string{strings.Repeat("k", MaxKey+1)}}.Marshal(nil)},
		{"key with newline", TypeExists, Exists{Keys: []string{"abc\n"}}.Marshal(nil)},
		{"key with DEL", TypeExists, Exists{Keys: []string{"abc\x7f"}}.Marshal(nil)},
		{"key not ASCII", TypePut, put(item("clé", okRange...))},
		{"length 0", TypePut, put(item(key(1), Range{Segment: 1, Offset: 4096}))},
		{"offset+length overflows", TypeGet, Get{Items: []Item{item(key(1), Range{Offset: 1 << 63, Length: 1 << 63})}}.Marshal(nil)},
		{"offset max", TypeGet, Get{Items: []Item{item(key(1), Range{Offset: 1<<64 - 1, Length: 1})}}.Marshal(nil)},
		{"total length overflows", TypePut, put(item(key(1), Range{Length: 1 << 63}, Range{Length: 1 << 63}))},
		{"segment over uint32", TypeGet, pb{}.bytes(fBatchItems, pb{}.bytes(fItemKey, []byte("k")).bytes(fItemRanges, pb{}.varint(fRangeSegment, 1<<32).varint(fRangeLength, 1)))},
		{"segment id over uint32", TypeUnregisterSegment, pb{}.varint(fSegmentID, 1<<32)},
		{"version over uint32", TypeHello, pb{}.varint(fHelloVersion, 1<<33)},
		{"pid over int32", TypeHello, pb{}.varint(fHelloPID, 1<<40)},
		{"pid under int32", TypeHello, pb{}.varint(fHelloPID, negative(1<<40))},
		{"present over MaxItems", TypeExistsReply, ExistsReply{Present: MaxItems + 1}.Marshal(nil)},
		{"removed over MaxItems", TypeRemoveReply, RemoveReply{Removed: 1 << 31}.Marshal(nil)},
		{"segment size 0", TypeRegisterSegment, RegisterSegment{Name: "kv"}.Marshal(nil)},
		{"unknown status", TypeBatchReply, BatchReply{Results: []Result{{Status: maxStatus + 1}}}.Marshal(nil)},
		{"status beyond uint8", TypeBatchReply, pb{}.bytes(fBatchReplyResults, pb{}.varint(fResultStatus, 256))},
		{"negative status", TypeError, pb{}.varint(fErrorCode, uint64(1<<64-1))},
		{"error code OK", TypeError, Error{Message: "what"}.Marshal(nil)},
		{"unknown error code", TypeError, Error{Code: 77}.Marshal(nil)},
		{"client name not UTF-8", TypeHello, Hello{ClientName: "a\xffb"}.Marshal(nil)},
		{"client name too long", TypeHello, Hello{ClientName: strings.Repeat("n", MaxName+1)}.Marshal(nil)},
		{"server version not UTF-8", TypeHelloReply, HelloReply{ServerVersion: "\xc3"}.Marshal(nil)},
		{"ready percent over 100", TypeHelloReply, pb{}.varint(fHelloReplyReadyPercent, 101)},
		{"starting neither 0 nor 1", TypeHelloReply, pb{}.varint(fHelloReplyStarting, 2)},
		{"content id as a varint", TypeHelloReply, pb{}.varint(fHelloReplyContentID, 5)},
		{"segment name not UTF-8", TypeRegisterSegment, RegisterSegment{Size: 1, Name: "\xed\xa0\x80"}.Marshal(nil)},
		{"result message not UTF-8", TypeBatchReply, BatchReply{Results: []Result{{Status: Corrupt, Message: "\xff"}}}.Marshal(nil)},
		{"result message too long", TypeBatchReply, BatchReply{Results: []Result{{Status: Corrupt, Message: strings.Repeat("m", MaxMessage+1)}}}.Marshal(nil)},
		{"error message too long", TypeError, Error{Code: Internal, Message: strings.Repeat("m", MaxMessage+1)}.Marshal(nil)},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			m, err := Decode(c.t, c.body)
			if !errors.Is(err, ErrMalformed) {
				t.Fatalf("Decode = %+v, %v; want ErrMalformed", m, err)
			}
			if m != nil {
				t.Errorf("a message with the error: %+v", m)
			}
			// The same input through a frame reader and a Conn-like stream: a
			// MessageError, the stream still in sync.
			if len(c.body) <= MaxBody {
				in := append(rawHeader(Magic, Version, byte(c.t), 77, uint32(len(c.body))), c.body...)
				in = append(in, frame(t, 78, &Ping{Nonce: 1})...)
				r := bytes.NewReader(in)
				h, body, err := ReadFrame(r)
				if err == nil {
					_, err = Decode(h.Type, body)
				}
				if !errors.Is(err, ErrMalformed) {
					t.Fatalf("via ReadFrame: %v", err)
				}
				if h, _, err := ReadFrame(r); err != nil || h.ID != 78 {
					t.Fatalf("next frame: %+v, %v", h, err)
				}
			}
		})
	}
}

// Send refuses what Decode would refuse, before writing anything.
func TestAppendFrameValidates(t *testing.T) {
	for _, m := range []Message{
		Put{Items: []Item{{Key: "", Ranges: []Range{{Length: 1}}}}},
		Exists{Keys: manyKeys(MaxItems + 1)},
		Error{},
		BatchReply{Results: []Result{{Status: 42}}},
	} {
		b, err := AppendFrame([]byte("keep"), 1, m)
		if !errors.Is(err, ErrMalformed) || string(b) != "keep" {
			t.Errorf("%s: AppendFrame = %q, %v", m.Type(), b, err)
		}
	}
	// Valid items whose encoding is over MaxBody: 4096 items of 256 ranges.
	big := Put{Items: putItems(MaxItems/2, 2, MaxRanges)}
	for _, it := range big.Items {
		for r := range it.Ranges {
			it.Ranges[r].Offset |= 1 << 60 // 10-byte varints: over 16 MiB in all
		}
	}
	if _, err := AppendFrame(nil, 1, big); !errors.Is(err, ErrMalformed) || !strings.Contains(err.Error(), "split the batch") {
		t.Errorf("oversize Put: %v", err)
	}
}
