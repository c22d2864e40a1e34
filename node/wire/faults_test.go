package wire

import (
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// fault is what one read of a faultSource does; a schedule byte b is fault
// b%numFaults, with b/numFaults as its size or variant.
type fault byte

const (
	faultNone     fault = iota // a plain read: as much as the buffer takes
	faultShort                 // 1 + size bytes at most
	faultEmpty                 // no bytes and no error
	faultDeadline              // a deadline error with -1 bytes (ReadMsgUnix's) or, variant odd, 0
	faultClosed                // the connection closed under the read, -1 bytes (ReadMsgUnix's)
	faultEOF                   // the stream ends here
	faultDataEOF               // 1 + size bytes at most, and the stream ends with them
	faultBadCount              // more bytes than the buffer holds or, variant odd, -1, and no error
	numFaults
)

// faultSource is a stream of data whose reads fail as a schedule says, one
// schedule byte a read; past the schedule its reads are plain. It records what
// it injected since frame(), for the check of what the frame reader made of it.
type faultSource struct {
	data     []byte
	pos      int
	schedule []byte
	ended    bool // an end of stream was injected: every read from now on is at the end

	injected    error // the error of the last read, if it had one
	badCount    bool  // a read returned a count outside its buffer
	emptyRun    int
	maxEmptyRun int
}

func (s *faultSource) frame() {
	s.injected, s.badCount, s.emptyRun, s.maxEmptyRun = nil, false, 0, 0
}

// read is one read into p: the count (possibly outside p, as the fault says),
// whether control data's count is -1 too, and the error.
func (s *faultSource) read(p []byte) (n int, negOOB bool, err error) {
	f, size := faultNone, 0
	if len(s.schedule) > 0 && !s.ended {
		f, size = fault(s.schedule[0]%byte(numFaults)), int(s.schedule[0]/byte(numFaults))
		s.schedule = s.schedule[1:]
	}
	take := func(max int) int {
		m := copy(p[:min(len(p), max)], s.data[s.pos:])
		s.pos += m
		return m
	}
	s.injected = nil
	if f == faultEmpty {
		s.emptyRun++
		s.maxEmptyRun = max(s.maxEmptyRun, s.emptyRun)
		return 0, false, nil
	}
	s.emptyRun = 0
	switch {
	case s.ended || s.pos == len(s.data) && f != faultBadCount:
		s.ended, s.injected = true, io.EOF
		return 0, false, io.EOF
	case f == faultNone:
		return take(len(p)), false, nil
	case f == faultShort:
		return take(1 + size), false, nil
	case f == faultDeadline:
		s.injected = os.ErrDeadlineExceeded
		if size%2 == 1 {
			return 0, false, os.ErrDeadlineExceeded
		}
		return -1, size%4 == 2, os.ErrDeadlineExceeded
	case f == faultClosed:
		s.injected = net.ErrClosed
		return -1, false, net.ErrClosed
	case f == faultEOF:
		s.ended, s.injected = true, io.EOF
		return 0, false, io.EOF
	case f == faultDataEOF:
		s.ended, s.injected = true, io.EOF
		return take(1 + size), false, io.EOF
	}
	s.badCount = true
	if size%2 == 1 {
		return -1, false, nil
	}
	take(len(p))
	return len(p) + 1, false, nil
}

// plainFaults is any io.Reader that fails: what ReadFrame is given.
type plainFaults struct{ s *faultSource }

func (r plainFaults) Read(p []byte) (int, error) {
	n, _, err := r.s.read(p)
	return n, err
}

// faultConn stands in for the socket under Conn's fdReader, failing the ways
// ReadMsgUnix does: -1 bytes with a deadline or a close, errors in an OpError.
type faultConn struct{ s *faultSource }

func (c faultConn) ReadMsgUnix(p, _ []byte) (n, oobn, flags int, addr *net.UnixAddr, err error) {
	n, negOOB, err := c.s.read(p)
	if negOOB {
		oobn = -1
	}
	if err != nil {
		err = &net.OpError{Op: "read", Net: "unix", Err: err}
	}
	return n, oobn, 0, nil, err
}

func (faultConn) SetReadDeadline(time.Time) error { return nil }

// readerKind is which frame reader a fault run drives.
type readerKind int

const (
	plainReader readerKind = iota // ReadFrame's, over any io.Reader
	connReader                    // Conn's, an fdReader over recvmsg
)

// gateMode is whether the reader has a gate and what it answers: none is a
// client's reader, a gate is a server's.
type gateMode int

const (
	noGate gateMode = iota
	gateAdmits
	gateRefuses
)

var errRefused = errors.New("the gate refuses the frame")

// driveFaults reads data frame by frame through a reader that fails as
// schedule says, and checks every outcome against a clean ReadFrame of the
// same bytes: a frame read without an error is the clean frame, whole; a frame
// cut by a fault fails with an error that the fault explains; nothing panics.
func driveFaults(t testing.TB, data, schedule []byte, kind readerKind, gate gateMode) {
	t.Helper()
	src := &faultSource{data: data, schedule: schedule}
	var r io.Reader = plainFaults{src}
	var fr *fdReader
	if kind == connReader {
		fr = &fdReader{uc: faultConn{src}, oob: make([]byte, unix.CmsgSpace(maxFDs*4)), frameTimeout: time.Second}
		r = fr
	}
	var admit func(Header) error
	switch gate {
	case gateAdmits:
		admit = func(Header) error { return nil }
	case gateRefuses:
		admit = func(Header) error { return errRefused }
	}
	var hdr [HeaderSize]byte
	var buf []byte
	for range 64 {
		start := src.pos
		clean := bytes.NewReader(data[start:])
		hRef, bodyRef, errRef := ReadFrame(clean)
		refLen := len(data) - start - clean.Len()
		var meRef *MessageError
		refMessage := errors.As(errRef, &meRef)

		src.frame()
		if fr != nil {
			fr.reset()
		}
		h, body, err := readFrame(r, &hdr, buf, admit)
		got := src.pos - start
		if body != nil {
			buf = body[:0]
		}
		var me *MessageError
		switch {
		case err == nil:
			if errRef != nil || gate == gateRefuses || h != hRef || !bytes.Equal(body, bodyRef) || got != refLen {
				t.Fatalf("frame at %d read as %+v (%d bytes of body, %d read) without an error; a clean read gives %+v, %d bytes, %d read, %v",
					start, h, len(body), got, hRef, len(bodyRef), refLen, errRef)
			}
			continue
		case errors.As(err, &me):
			// Read whole: the stream is in sync, the next frame follows.
			if me.Header != h || !errors.Is(err, ErrMalformed) && !errors.Is(err, errRefused) || got != HeaderSize+int(h.Len) {
				t.Fatalf("MessageError %v for header %+v after %d bytes", err, h, got)
			}
			if refused := errors.Is(err, errRefused); refused && (gate != gateRefuses || body != nil || errRef != nil && !refMessage) ||
				!refused && (!refMessage || meRef.Header != h || got != refLen) {
				t.Fatalf("MessageError %v (gate %d, body %d bytes) where a clean read gives %v", err, gate, len(body), errRef)
			}
			continue
		}
		// A stream error: the frame reader is done with this stream.
		if h != (Header{}) || body != nil {
			t.Fatalf("stream error %v with header %+v and %d bytes of body", err, h, len(body))
		}
		if err == io.EOF && got != 0 {
			t.Fatalf("io.EOF %d bytes into a frame", got)
		}
		explained := src.injected == io.EOF && (err == io.EOF || errors.Is(err, io.ErrUnexpectedEOF)) ||
			src.injected != nil && src.injected != io.EOF && errors.Is(err, src.injected) ||
			src.badCount && errors.Is(err, errBadCount) ||
			src.maxEmptyRun >= maxEmptyReads && errors.Is(err, io.ErrNoProgress) ||
			errRef != nil && !refMessage && errors.Is(err, ErrMalformed)
		if !explained {
			t.Fatalf("frame at %d: error %v after %d bytes; the reader injected %v (bad count %v, %d empty reads), a clean read gives %v",
				start, err, got, src.injected, src.badCount, src.maxEmptyRun, errRef)
		}
		if src.injected == os.ErrDeadlineExceeded && got > 0 && errors.Is(err, os.ErrDeadlineExceeded) && !strings.Contains(err.Error(), "bytes arrived before") {
			t.Fatalf("a frame cut by a deadline %d bytes in: %q does not say how much arrived", got, err)
		}
		return
	}
}

// faultSchedules are the schedules a test per frame type runs: each fault
// after every count of one-byte reads up to a frame's length (every 7th count
// past 64 bytes), and runs of empty reads either side of the limit.
func faultSchedules(frameLen int) [][]byte {
	var out [][]byte
	for at := 0; at <= frameLen; at++ {
		if at > 64 && at%7 != 0 && at != frameLen {
			continue
		}
		for f := range numFaults {
			variants := byte(4) // sizes, or -1 against 0 bytes, and control data
			if f == faultNone || f == faultEmpty || f == faultClosed || f == faultEOF {
				variants = 1
			}
			for variant := range variants {
				s := bytes.Repeat([]byte{byte(faultShort)}, at)
				out = append(out, append(s, byte(f)+variant*byte(numFaults)))
			}
		}
	}
	out = append(out,
		bytes.Repeat([]byte{byte(faultEmpty)}, maxEmptyReads-1),
		bytes.Repeat([]byte{byte(faultEmpty)}, maxEmptyReads),
		append(bytes.Repeat([]byte{byte(faultShort)}, HeaderSize+1), bytes.Repeat([]byte{byte(faultEmpty)}, maxEmptyReads)...))
	return out
}

// Every frame reader (ReadFrame's, and Conn's on a server, gated, and on a
// client) survives every fault at every point of a frame of every type: short
// and empty reads, deadline errors with -1 or 0 bytes, a close, an end of
// stream, counts outside the buffer. Before, a -1 count made readBody panic.
func TestFrameReadersSurviveFaultsEveryFrameType(t *testing.T) {
	readers := []struct {
		name string
		kind readerKind
		gate gateMode
	}{
		{"ReadFrame", plainReader, noGate},
		{"client", connReader, noGate},
		{"server", connReader, gateAdmits},
		{"server, gate refuses", connReader, gateRefuses},
		{"ReadFrame, gate refuses", plainReader, gateRefuses},
	}
	for _, m := range samples() {
		t.Run(m.Type().String(), func(t *testing.T) {
			t.Parallel()
			fr := frame(t, 9, m)
			// A second frame after it: one read whole leaves the stream in sync.
			data := append(append([]byte(nil), fr...), frame(t, 10, &Ping{Nonce: 1})...)
			schedules := faultSchedules(len(fr))
			for _, rd := range readers {
				t.Run(rd.name, func(t *testing.T) {
					for _, s := range schedules {
						driveFaults(t, data, s, rd.kind, rd.gate)
					}
				})
			}
		})
	}
}

// fdReader keeps io.Reader's contract whatever recvmsg returns: -1 bytes with
// an error is 0 bytes with it, a count outside the buffer is an error.
func TestFdReaderCounts(t *testing.T) {
	cases := []struct {
		name     string
		schedule []byte
		n        int
		err      error
	}{
		{"deadline, -1 bytes", []byte{byte(faultDeadline)}, 0, os.ErrDeadlineExceeded},
		{"deadline, -1 bytes and control data", []byte{byte(faultDeadline) + 2*byte(numFaults)}, 0, os.ErrDeadlineExceeded},
		{"deadline, 0 bytes", []byte{byte(faultDeadline) + byte(numFaults)}, 0, os.ErrDeadlineExceeded},
		{"closed, -1 bytes", []byte{byte(faultClosed)}, 0, net.ErrClosed},
		{"-1 bytes, no error", []byte{byte(faultBadCount) + byte(numFaults)}, 0, errBadCount},
		{"past the buffer", []byte{byte(faultBadCount)}, 0, errBadCount},
		{"end of stream", []byte{byte(faultEOF)}, 0, io.EOF},
		{"plain", nil, 8, nil},
	}
	for _, c := range cases {
		src := &faultSource{data: make([]byte, 64), schedule: c.schedule}
		r := &fdReader{uc: faultConn{src}, oob: make([]byte, unix.CmsgSpace(maxFDs*4))}
		n, err := r.Read(make([]byte, 8))
		if n != c.n || !errors.Is(err, c.err) || (c.err == nil) != (err == nil) || r.n != c.n {
			t.Errorf("%s: Read = %d, %v (%d counted); want %d, %v", c.name, n, err, r.n, c.n, c.err)
		}
	}
}

func FuzzFrameReaderFaults(f *testing.F) {
	for i, m := range samples() {
		fr := frame(f, uint64(i), m)
		f.Add(fr, []byte{byte(faultShort) + 15*byte(numFaults), byte(faultDeadline)}, byte(i))
		f.Add(fr, []byte{byte(faultNone), byte(faultShort), byte(faultEmpty), byte(faultDeadline) + byte(numFaults)}, byte(i+1))
		f.Add(fr, []byte{byte(faultShort) + 1*byte(numFaults), byte(faultDataEOF) + 3*byte(numFaults)}, byte(i+2))
		f.Add(fr, []byte{byte(faultShort) + 20*byte(numFaults), byte(faultClosed)}, byte(i+3))
		f.Add(fr, []byte{byte(faultBadCount)}, byte(i+4))
	}
	f.Add(rawHeader(Magic, Version, byte(TypePut), 1, 100), []byte{byte(faultNone), byte(faultDeadline)}, byte(2))
	f.Add(rawHeader(Magic, Version, 200, 1, 2), []byte{byte(faultShort) + 10*byte(numFaults), byte(faultEOF)}, byte(5))
	f.Add([]byte("ST"), bytes.Repeat([]byte{byte(faultEmpty)}, maxEmptyReads), byte(1))
	f.Fuzz(func(t *testing.T, data, schedule []byte, mode byte) {
		driveFaults(t, data, schedule, readerKind(mode%2), gateMode(mode/2%3))
	})
}
