package wire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"testing"
)

func FuzzDecode(f *testing.F) {
	for _, m := range append(samples(), zeroSamples()...) {
		f.Add(byte(m.Type()), m.Marshal(nil))
	}
	f.Add(byte(TypePut), Put{Items: putItems(2, 2, 3)}.Marshal(nil))
	f.Add(byte(TypeGet), Get{Items: runItems(3, 61), FenceSlot: 4}.Marshal(nil))
	f.Add(byte(TypePut), Put{Items: append(runItems(2, 2), putItems(1, 1, 2)...)}.Marshal(nil))
	f.Add(byte(TypePut), []byte(pb{}.bytes(fBatchItems, pb{}.bytes(fItemKey, []byte("k")).bytes(fItemRuns, pb{}.varint(fRunLength, 8).varint(fRunCount, 2)))))
	f.Add(byte(TypeHello), Hello{Version: Version, Revision: Revision}.Marshal(nil))
	f.Add(byte(TypeHello), []byte{0x08, 0x80})
	f.Add(byte(TypePut), []byte(pb{}.bytes(fBatchItems, pb{}.bytes(fItemKey, []byte("k")).bytes(fItemRanges, pb{}.varint(fRangeLength, 0)))))
	f.Add(byte(0), []byte{})
	f.Add(byte(255), []byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, typ byte, body []byte) {
		m, err := Decode(Type(typ), body)
		if err != nil {
			if !errors.Is(err, ErrMalformed) || m != nil {
				t.Fatalf("Decode = %v, %v: an error that is not ErrMalformed, or a message with an error", m, err)
			}
			return
		}
		if m.Type() != Type(typ) {
			t.Fatalf("decoded a %s from a %s body", m.Type(), Type(typ))
		}
		if err := m.Validate(); err != nil {
			t.Fatalf("decoded message does not validate: %v", err)
		}
		b := m.Marshal(nil)
		m2, err := Decode(Type(typ), b)
		if err != nil {
			t.Fatalf("re-encoding does not decode: %v\nmessage %+v", err, m)
		}
		if !reflect.DeepEqual(m, m2) {
			t.Fatalf("re-encoding decodes differently:\n%+v\n%+v", m, m2)
		}
		if b2 := m2.Marshal(nil); !bytes.Equal(b, b2) {
			t.Fatalf("encoding is not stable")
		}
		if _, err := AppendFrame(nil, 1, m); err != nil && len(body) <= MaxBody {
			t.Fatalf("a decoded message does not frame: %v", err)
		}
	})
}

func FuzzReadFrame(f *testing.F) {
	var stream []byte
	for i, m := range samples() {
		fr := frame(f, uint64(i), m)
		f.Add(fr)
		stream = append(stream, fr...)
	}
	f.Add(stream)
	f.Add(rawHeader(Magic, 2, byte(TypePing), 1, 0))
	f.Add(rawHeader(Magic, Version, 200, 1, 2))
	f.Add(rawHeader(Magic, Version, byte(TypePing), 1, MaxBody+1))
	f.Add([]byte("ST"))
	f.Fuzz(func(t *testing.T, data []byte) {
		r := bytes.NewReader(data)
		for range 64 {
			start := len(data) - r.Len()
			h, body, err := ReadFrame(r)
			if err == io.EOF {
				if r.Len() != 0 || start != len(data) {
					t.Fatalf("io.EOF with %d bytes left", r.Len())
				}
				return
			}
			var me *MessageError
			if errors.As(err, &me) {
				// Read whole: the stream is still in sync.
				if me.Header != h || !errors.Is(err, ErrMalformed) || len(data)-r.Len()-start != HeaderSize+int(h.Len) {
					t.Fatalf("MessageError %v for header %+v after %d bytes", err, h, len(data)-r.Len()-start)
				}
				continue
			}
			if err != nil {
				if !errors.Is(err, ErrMalformed) || h != (Header{}) || body != nil {
					t.Fatalf("ReadFrame = %+v, %d bytes, %v", h, len(body), err)
				}
				return
			}
			if int(h.Len) != len(body) || h.Len > MaxBody || !h.Type.Valid() {
				t.Fatalf("header %+v with a body of %d bytes", h, len(body))
			}
			consumed := data[start : len(data)-r.Len()]
			if want := append(appendHeader(nil, h), body...); !bytes.Equal(consumed, want) {
				t.Fatalf("frame %+v does not re-encode to the bytes it was read from", h)
			}
			if m, err := Decode(h.Type, body); err != nil && !errors.Is(err, ErrMalformed) || err == nil && m.Type() != h.Type {
				t.Fatalf("Decode(%s) = %v, %v", h.Type, m, err)
			}
		}
	})
}
