package wire

import (
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"google.golang.org/protobuf/encoding/protowire"
)

// The golden frames check the protocol's other implementation, the SGLang
// plugin's codec (python/strata_client/wire.py), against this one:
//
//   - testdata/golden/go/NAME.bin are frames this codec encodes, and
//     testdata/golden/manifest.json says what each holds; the plugin's tests
//     (python/tests/test_wire.py) decode them and encode the same messages to the
//     same bytes.
//   - testdata/golden/py/NAME.bin are the same messages encoded by the plugin
//     (STRATA_UPDATE_GOLDEN=1 python3 -m pytest python/tests/test_wire.py); this
//     test decodes them.
//   - testdata/golden/malformed/NAME.bin are frames both decoders must reject.
//
// After a deliberate change to the protocol, rewrite them with
// go test ./node/wire -run TestGolden -update-golden, then the plugin's.
var updateGolden = flag.Bool("update-golden", false, "rewrite node/wire/testdata/golden from this codec")

const goldenDir = "testdata/golden"

type goldenCase struct {
	name string
	id   uint64
	msg  Message
}

func goldenCases() []goldenCase {
	ranges := func(n int, seg uint32, off, step, length uint64) []Range {
		out := make([]Range, n)
		for i := range out {
			out[i] = Range{Segment: seg, Offset: off + uint64(i)*step, Length: length}
		}
		return out
	}
	key := "meta-llama_2fLlama-3.1-8B:" + strings.Repeat("0123456789abcdef", 4) + "_1_k"
	return []goldenCase{
		{"hello", 1, &Hello{Version: Version, ClientName: "sglang-tp0-ü", PID: 4242}},
		{"hello_negative_pid", 2, &Hello{Version: Version, ClientName: "x", PID: -7}},
		{"hello_reply", 1, &HelloReply{ClientID: 1 << 40, ServerVersion: "strata v1.2.3", MaxBatch: MaxItems}},
		{"hello_reply_clock", 1, &HelloReply{ClientID: 3, ServerVersion: "strata v1.3.0", MaxBatch: MaxItems, ClockNS: 1<<63 + 12345}},
		{"hello_reply_restart", 1, &HelloReply{ClientID: 4, ServerVersion: "strata v1.4.0", MaxBatch: MaxItems, ClockNS: 99,
			InstanceID: 0xfedcba9876543210, ContentID: 0x0123456789abcdef, Starting: true, ReadyPercent: 37, Warm: true}},
		{"register_segment", 3, &RegisterSegment{Size: 3<<30 + 4096, Name: "kv"}},
		{"register_fence", 2, &RegisterSegment{Size: FenceBytes, Name: "fence", Fence: true}},
		{"register_segment_reply", 3, &RegisterSegmentReply{SegmentID: 4294967295}},
		{"unregister_segment", 4, &UnregisterSegment{SegmentID: 2}},
		{"exists", 5, &Exists{Keys: []string{key, "a", strings.Repeat("z", MaxKey)}, Format: 0xfedcba9876543210}},
		{"exists_empty", 6, &Exists{}},
		{"exists_reply", 5, &ExistsReply{Present: 4096}},
		{"exists_reply_zero", 6, &ExistsReply{}},
		{"put_page_first", 1 << 63, &Put{Items: []Item{
			{Key: key, Format: 1, Ranges: []Range{{Segment: 1, Offset: 0, Length: 1 << 20}}},
			{Key: strings.Replace(key, "_k", "_v", 1), Format: 1, Ranges: []Range{{Segment: 1, Offset: 1 << 40, Length: 1 << 20}}},
		}}},
		{"get_layer_first_mla", 9, &Get{Items: []Item{
			{Key: "deepseek-ai_2fDeepSeek-V3:abc__k", Format: ^uint64(0), Ranges: ranges(61, 2, 4096, 1<<24, 36864)},
		}}},
		{"put_deadline", 17, &Put{DeadlineNS: 987654321012345, Items: []Item{
			{Key: key, Format: 1, Ranges: []Range{{Segment: 1, Offset: 4096, Length: 65536}}},
		}}},
		{"get_deadline_fence", 18, &Get{DeadlineNS: ^uint64(0), FenceSlot: FenceSlots, Items: []Item{
			{Key: key, Format: 2, Ranges: ranges(3, 4, 0, 8192, 4096)},
			{Key: strings.Replace(key, "_k", "_v", 1), Format: 2, Ranges: ranges(1, 5, 1<<30, 0, 4096)},
		}}},
		{"get_fence_slot_only", 19, &Get{FenceSlot: 1, Items: []Item{{Key: "k", Format: 3, Ranges: ranges(1, 1, 0, 0, 1)}}}},
		{"hello_revision", 20, &Hello{Version: Version, ClientName: "sglang-tp1", PID: 77, Revision: Revision}},
		{"hello_reply_revision", 20, &HelloReply{ClientID: 5, ServerVersion: "strata v1.5.0", MaxBatch: MaxItems, ClockNS: 7,
			InstanceID: 1, ContentID: 2, Revision: Revision}},
		{"put_runs", 21, &Put{DeadlineNS: 1 << 40, FenceSlot: 3, Items: []Item{
			{Key: key, Format: 1, Runs: []Run{{Segment: 1, Offset: 4096, Length: 1152, Stride: 1 << 24, Count: 61}}},
			{Key: strings.Replace(key, "_k", "_v", 1), Format: 1, Runs: []Run{
				{Segment: 2, Offset: 0, Length: 8192, Stride: 8192, Count: MaxRunCount / 2},
				{Segment: 2, Offset: 1 << 40, Length: 1, Count: 1},
				{Segment: 1<<32 - 1, Offset: 1<<64 - 1<<20, Length: 4096, Stride: 1 << 16, Count: 4}}},
			{Key: "k", Format: 1, Ranges: []Range{{Segment: 1, Offset: 1 << 30, Length: 1152}}},
		}}},
		{"get_runs_mla", 22, &Get{FenceSlot: 9, Items: []Item{
			{Key: "deepseek-ai_2fDeepSeek-V3:abc__k", Format: ^uint64(0), Runs: []Run{{Segment: 2, Offset: 4096, Length: 36864, Stride: 1 << 24, Count: 61}}},
			{Key: "deepseek-ai_2fDeepSeek-V3:abd__k", Format: ^uint64(0), Runs: []Run{{Segment: 2, Offset: 4096 + 36864, Length: 36864, Stride: 1 << 24, Count: 61}}},
		}}},
		{"get_max_ranges", 10, &Get{Items: []Item{{Key: "k", Format: 3, Ranges: ranges(MaxRanges, 7, 0, 128, 64)}}}},
		{"batch_reply", 9, &BatchReply{Results: []Result{
			{Status: OK}, {Status: NotFound}, {Status: BadRange, Message: "segment 2 \"kv\" faulted — re-register"},
			{Status: FormatMismatch}, {Status: Unavailable, Message: strings.Repeat("m", MaxMessage)},
		}}},
		{"batch_reply_empty", 11, &BatchReply{}},
		{"remove", 12, &Remove{Keys: []string{"a", "b"}}},
		{"remove_reply", 12, &RemoveReply{Removed: 2}},
		{"stats", 13, &Stats{}},
		{"stats_reply", 13, &StatsReply{JSON: []byte(`{"version":"v1","clients":[]}`)}},
		{"ping", 14, &Ping{Nonce: 0x0123456789abcdef}},
		{"pong", 14, &Pong{Nonce: 0x0123456789abcdef}},
		{"ack", 15, &Ack{}},
		{"error", 16, &Error{Code: Quota, Message: "over quota: raise --client-quota"}},
	}
}

// goldenJSON spells a message for the manifest with the plugin's field names.
func goldenJSON(m Message) map[string]any {
	item := func(it Item) map[string]any {
		rs := []map[string]any{}
		for _, r := range it.Ranges {
			rs = append(rs, map[string]any{"segment": r.Segment, "offset": r.Offset, "length": r.Length})
		}
		runs := []map[string]any{}
		for _, r := range it.Runs {
			runs = append(runs, map[string]any{"segment": r.Segment, "offset": r.Offset, "length": r.Length, "stride": r.Stride, "count": r.Count})
		}
		return map[string]any{"key": it.Key, "format": it.Format, "ranges": rs, "runs": runs}
	}
	items := func(its []Item) []map[string]any {
		out := []map[string]any{}
		for _, it := range its {
			out = append(out, item(it))
		}
		return out
	}
	keys := func(k []string) []string {
		if k == nil {
			return []string{}
		}
		return k
	}
	switch m := m.(type) {
	case *Hello:
		return map[string]any{"version": m.Version, "client_name": m.ClientName, "pid": m.PID, "revision": m.Revision}
	case *HelloReply:
		return map[string]any{"client_id": m.ClientID, "server_version": m.ServerVersion, "max_batch": m.MaxBatch, "clock_ns": m.ClockNS,
			"instance_id": m.InstanceID, "content_id": m.ContentID, "starting": m.Starting, "ready_percent": m.ReadyPercent, "warm": m.Warm, "revision": m.Revision}
	case *RegisterSegment:
		return map[string]any{"size": m.Size, "name": m.Name, "fence": m.Fence}
	case *RegisterSegmentReply:
		return map[string]any{"segment_id": m.SegmentID}
	case *UnregisterSegment:
		return map[string]any{"segment_id": m.SegmentID}
	case *Exists:
		return map[string]any{"keys": keys(m.Keys), "format": m.Format}
	case *ExistsReply:
		return map[string]any{"present": m.Present}
	case *Put:
		return map[string]any{"items": items(m.Items), "deadline_ns": m.DeadlineNS, "fence_slot": m.FenceSlot}
	case *Get:
		return map[string]any{"items": items(m.Items), "deadline_ns": m.DeadlineNS, "fence_slot": m.FenceSlot}
	case *BatchReply:
		rs := []map[string]any{}
		for _, r := range m.Results {
			rs = append(rs, map[string]any{"status": r.Status, "message": r.Message})
		}
		return map[string]any{"results": rs}
	case *Remove:
		return map[string]any{"keys": keys(m.Keys)}
	case *RemoveReply:
		return map[string]any{"removed": m.Removed}
	case *StatsReply:
		return map[string]any{"json": string(m.JSON)}
	case *Ping:
		return map[string]any{"nonce": m.Nonce}
	case *Pong:
		return map[string]any{"nonce": m.Nonce}
	case *Error:
		return map[string]any{"code": m.Code, "message": m.Message}
	}
	return map[string]any{}
}

// malformedCases are frames that both decoders must reject. Most are replies:
// those are what the plugin reads from the socket.
func malformedCases() map[string][]byte {
	frame := func(t Type, body []byte) []byte {
		b := appendHeader(nil, Header{Type: t, ID: 7, Len: uint32(len(body))})
		return append(b, body...)
	}
	field := func(num protowire.Number, typ protowire.Type, v ...byte) []byte {
		return append(protowire.AppendTag(nil, num, typ), v...)
	}
	varint := func(num protowire.Number, v uint64) []byte {
		return protowire.AppendVarint(protowire.AppendTag(nil, num, protowire.VarintType), v)
	}
	str := func(num protowire.Number, s []byte) []byte {
		return protowire.AppendBytes(protowire.AppendTag(nil, num, protowire.BytesType), s)
	}
	var manyResults []byte
	for i := 0; i <= MaxItems; i++ {
		manyResults = append(manyResults, str(1, nil)...)
	}
	badMagic := frame(TypePong, nil)
	badMagic[0] = 'X'
	badVersion := frame(TypePong, nil)
	badVersion[2] = 2
	oversize := appendHeader(nil, Header{Type: TypeBatchReply, ID: 1, Len: MaxBody + 1})
	truncated := frame(TypeBatchReply, str(1, varint(1, 1)))
	truncated = truncated[:len(truncated)-1]
	run := func(fields ...[]byte) []byte { return str(fItemRuns, bytes.Join(fields, nil)) }
	item := func(fields ...[]byte) []byte {
		return str(fBatchItems, append(str(fItemKey, []byte("k")), bytes.Join(fields, nil)...))
	}
	okRun := run(varint(fRunSegment, 1), varint(fRunLength, 8), varint(fRunStride, 8), varint(fRunCount, 2))
	return map[string][]byte{
		"item_ranges_and_runs":       frame(TypeGet, item(str(fItemRanges, varint(fRangeLength, 8)), okRun)),
		"run_count_zero":             frame(TypeGet, item(run(varint(fRunSegment, 1), varint(fRunLength, 8)))),
		"run_count_over_limit":       frame(TypePut, item(run(varint(fRunLength, 1), varint(fRunStride, 1), varint(fRunCount, MaxRunCount+1)))),
		"run_stride_under_length":    frame(TypeGet, item(run(varint(fRunLength, 8), varint(fRunStride, 7), varint(fRunCount, 2)))),
		"run_end_overflows":          frame(TypeGet, item(run(varint(fRunOffset, 1<<63), varint(fRunLength, 8), varint(fRunStride, 1<<62), varint(fRunCount, 3)))),
		"run_count_over_uint32":      frame(TypeGet, item(run(varint(fRunLength, 8), varint(fRunCount, 1<<32)))),
		"item_runs_too_many_ranges":  frame(TypeGet, item(run(varint(fRunLength, 1), varint(fRunStride, 1), varint(fRunCount, MaxRunCount)), run(varint(fRunOffset, 1<<20), varint(fRunLength, 1), varint(fRunCount, 1)))),
		"bad_magic":                  badMagic,
		"bad_version":                badVersion,
		"oversize_body":              oversize,
		"truncated_body":             truncated,
		"unknown_type":               frame(maxType+1, nil),
		"unknown_status":             frame(TypeBatchReply, str(1, varint(1, uint64(maxStatus)+1))),
		"results_wrong_wire_type":    frame(TypeBatchReply, varint(1, 1)),
		"too_many_results":           frame(TypeBatchReply, manyResults),
		"result_message_not_utf8":    frame(TypeBatchReply, str(1, str(2, []byte{0xff, 0xfe}))),
		"result_message_too_long":    frame(TypeBatchReply, str(1, str(2, bytes.Repeat([]byte{'m'}, MaxMessage+1)))),
		"present_over_batch":         frame(TypeExistsReply, varint(1, MaxItems+1)),
		"varint_overflow":            frame(TypeExistsReply, field(1, protowire.VarintType, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f)),
		"varint_truncated":           frame(TypeExistsReply, field(1, protowire.VarintType, 0x80)),
		"segment_id_over_uint32":     frame(TypeRegisterSegmentReply, varint(1, 1<<32)),
		"server_version_not_utf8":    frame(TypeHelloReply, str(2, []byte{'v', 0xc3})),
		"server_version_too_long":    frame(TypeHelloReply, str(2, bytes.Repeat([]byte{'v'}, MaxName+1))),
		"error_code_ok":              frame(TypeError, str(2, []byte("no code"))),
		"error_unknown_code":         frame(TypeError, varint(1, 200)),
		"nonce_wrong_wire_type":      frame(TypePong, varint(1, 5)),
		"group_in_ack":               frame(TypeAck, field(1, protowire.StartGroupType)),
		"bytes_past_end":             frame(TypeStatsReply, field(1, protowire.BytesType, 10, 'x')),
		"field_number_zero":          frame(TypeAck, varint(0, 1)),
		"fixed64_truncated":          frame(TypePong, field(1, protowire.Fixed64Type, 1, 2, 3)),
		"removed_over_batch":         frame(TypeRemoveReply, varint(1, MaxItems+1)),
		"stats_json_wrong_wire_type": frame(TypeStatsReply, varint(1, 1)),
		"clock_wrong_wire_type":      frame(TypeHelloReply, str(4, []byte{1})),
		"fence_not_a_bool":           frame(TypeRegisterSegment, append(varint(1, FenceBytes), varint(3, 2)...)),
		"fence_slot_over_limit":      frame(TypeGet, varint(3, FenceSlots+1)),
		"deadline_wrong_wire_type":   frame(TypePut, field(2, protowire.Fixed64Type, 1, 2, 3, 4, 5, 6, 7, 8)),
	}
}

func writeGolden(t *testing.T, rel string, b []byte) {
	t.Helper()
	path := filepath.Join(goldenDir, rel)
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, b, 0o644); err != nil {
		t.Fatal(err)
	}
}

func decodeFrame(b []byte) (Header, Message, error) {
	r := bytes.NewReader(b)
	h, body, err := ReadFrame(r)
	if err != nil {
		return h, nil, err
	}
	if r.Len() != 0 {
		return h, nil, malformed("%d bytes after the frame", r.Len())
	}
	m, err := Decode(h.Type, body)
	return h, m, err
}

func TestGoldenFrames(t *testing.T) {
	cases := goldenCases()
	var manifest struct {
		Frames    []map[string]any `json:"frames"`
		Malformed []string         `json:"malformed"`
	}
	for _, c := range cases {
		frame, err := AppendFrame(nil, c.id, c.msg)
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		manifest.Frames = append(manifest.Frames, map[string]any{
			"name": c.name, "type": c.msg.Type(), "id": c.id, "msg": goldenJSON(c.msg)})
		rel := filepath.Join("go", c.name+".bin")
		if *updateGolden {
			writeGolden(t, rel, frame)
		} else if old, err := os.ReadFile(filepath.Join(goldenDir, rel)); err != nil || !bytes.Equal(old, frame) {
			t.Errorf("%s: the codec's frame differs from %s (%v): the protocol changed; if on purpose, run go test ./node/wire -run TestGolden -update-golden and update the plugin's codec", c.name, rel, err)
		}
		h, m, err := decodeFrame(frame)
		if err != nil || h.ID != c.id || !reflect.DeepEqual(m, c.msg) {
			t.Errorf("%s: round trip: %+v %v", c.name, m, err)
		}
	}
	mal := malformedCases()
	for name, frame := range mal {
		manifest.Malformed = append(manifest.Malformed, name)
		if _, _, err := decodeFrame(frame); !errors.Is(err, ErrMalformed) {
			t.Errorf("malformed %s: decoded without ErrMalformed: %v", name, err)
		}
		if *updateGolden {
			writeGolden(t, filepath.Join("malformed", name+".bin"), frame)
		}
	}
	if *updateGolden {
		slices.Sort(manifest.Malformed)
		b, err := json.MarshalIndent(manifest, "", " ")
		if err != nil {
			t.Fatal(err)
		}
		writeGolden(t, "manifest.json", append(b, '\n'))
	}

	// The plugin's frames of the same messages.
	for _, c := range cases {
		rel := filepath.Join("py", c.name+".bin")
		b, err := os.ReadFile(filepath.Join(goldenDir, rel))
		if errors.Is(err, os.ErrNotExist) {
			if os.Getenv("CI") == "true" {
				t.Errorf("%s is missing: run STRATA_UPDATE_GOLDEN=1 /usr/bin/python3 -m pytest -q python/tests/test_wire.py", rel)
				continue
			}
			t.Skipf("%s is missing: the plugin's frames are written by STRATA_UPDATE_GOLDEN=1 /usr/bin/python3 -m pytest -q python/tests/test_wire.py", rel)
		}
		if err != nil {
			t.Fatal(err)
		}
		h, m, err := decodeFrame(b)
		if err != nil || h.ID != c.id || !reflect.DeepEqual(m, c.msg) {
			t.Errorf("%s: the plugin's frame decodes to %+v (id %d), %v; want %+v", c.name, m, h.ID, err, c.msg)
		}
	}
}
