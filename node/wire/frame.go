package wire

import (
	"encoding/binary"
	"fmt"
	"io"
	"slices"
)

// Magic is the first two bytes of every frame.
const Magic = "ST"

// Header is a frame header, less its constant magic and version.
type Header struct {
	// Type is the message type of the body.
	Type Type
	// ID is the request id: chosen by the client, copied into the reply.
	ID uint64
	// Len is the body's length in bytes.
	Len uint32
}

// appendHeader appends the 16-byte encoding of h.
func appendHeader(b []byte, h Header) []byte {
	b = append(b, Magic[0], Magic[1], Version, byte(h.Type))
	b = binary.LittleEndian.AppendUint64(b, h.ID)
	return binary.LittleEndian.AppendUint32(b, h.Len)
}

// parseHeader decodes a frame header. A bad magic, version or length is an error
// (the stream cannot be trusted after it); an unknown type is not: the frame can
// still be skipped whole, and the caller reports it.
func parseHeader(b *[HeaderSize]byte) (Header, error) {
	if b[0] != Magic[0] || b[1] != Magic[1] {
		return Header{}, malformed("bad frame magic %#04x, want %q (is the peer a strata node client or server?)", b[:2], Magic)
	}
	if b[2] != Version {
		return Header{}, malformed("protocol version %d; this build supports version %d only: run client and server from matching releases", b[2], Version)
	}
	h := Header{
		Type: Type(b[3]),
		ID:   binary.LittleEndian.Uint64(b[4:12]),
		Len:  binary.LittleEndian.Uint32(b[12:16]),
	}
	if h.Len > MaxBody {
		return Header{}, malformed("%s frame (id %d) declares a body of %d bytes, at most %d", h.Type, h.ID, h.Len, MaxBody)
	}
	return h, nil
}

// AppendFrame validates msg and appends its whole frame (header and body) with
// request id id to b. A message that breaks the protocol's limits, or whose body
// would be over MaxBody, is an error wrapping ErrMalformed, and b is returned as it
// was.
func AppendFrame(b []byte, id uint64, msg Message) ([]byte, error) {
	if err := msg.Validate(); err != nil {
		return b, prefix("encode "+msg.Type().String(), err)
	}
	start := len(b)
	b = appendHeader(b, Header{Type: msg.Type(), ID: id})
	b = msg.Marshal(b)
	n := len(b) - start - HeaderSize
	if n > MaxBody {
		return b[:start], malformed("encode %s: body of %d bytes, at most %d; split the batch", msg.Type(), n, MaxBody)
	}
	binary.LittleEndian.PutUint32(b[start+12:], uint32(n))
	return b, nil
}

// WriteFrame writes msg as one frame with request id id to w, in one Write.
func WriteFrame(w io.Writer, id uint64, msg Message) error {
	b, err := AppendFrame(nil, id, msg)
	if err != nil {
		return err
	}
	_, err = w.Write(b)
	return err
}

// ReadFrame reads one frame from r and returns its header and body (the caller's
// to keep). It reads exactly the frame's bytes, never ahead. At a clean end of
// stream, before a frame's first byte, the error is io.EOF; a frame cut short is
// ErrMalformed wrapping io.ErrUnexpectedEOF. A frame of an unknown type is read
// whole and returned with a *MessageError; ReadFrame does not decode the body
// (Decode does). A reader that breaks io.Reader's contract (a count outside the
// buffer, endless empty reads) fails the read with an error, never a panic: r
// may be any socket, and ReadMsgUnix returns -1 bytes with its errors.
func ReadFrame(r io.Reader) (Header, []byte, error) {
	var hdr [HeaderSize]byte
	return readFrame(r, &hdr, nil, nil)
}

// readFrame is ReadFrame reading the body into buf's memory when it is large
// enough. admit, when set, runs once the header is read and before the body is:
// when it fails, the body is read and dropped (the stream stays in sync) and the
// error comes back in a *MessageError with the header. A frame that stops
// arriving part-way fails with the reader's error, wrapped in what arrived of
// which frame ("Put frame (id 7) body: 0 of 100 bytes arrived before ...").
func readFrame(r io.Reader, hdr *[HeaderSize]byte, buf []byte, admit func(Header) error) (Header, []byte, error) {
	n, err := readFull(r, hdr[:])
	switch {
	case err == io.EOF:
		return Header{}, nil, io.EOF
	case err == io.ErrUnexpectedEOF:
		return Header{}, nil, fmt.Errorf("truncated frame: header cut at %d of %d bytes: %w: %w", n, HeaderSize, ErrMalformed, io.ErrUnexpectedEOF)
	case err != nil && n == 0:
		// Nothing of a frame arrived: it is the wait for one that ended.
		return Header{}, nil, err
	case err != nil:
		return Header{}, nil, cut(r, "frame header", n, HeaderSize, err)
	}
	h, err := parseHeader(hdr)
	if err != nil {
		return Header{}, nil, err
	}
	if admit != nil {
		if aerr := admit(h); aerr != nil {
			n, err := discard(r, buf, int(h.Len))
			if err != nil {
				return Header{}, nil, bodyError(r, h, ", refused", n, err)
			}
			return h, nil, &MessageError{Header: h, Err: aerr}
		}
	}
	body, err := readBody(r, buf, int(h.Len))
	if err != nil {
		return Header{}, nil, bodyError(r, h, "", len(body), err)
	}
	if !h.Type.Valid() {
		return h, body, &MessageError{Header: h, Err: malformed("unknown message type %d (known: %d to %d)", uint8(h.Type), TypeHello, maxType)}
	}
	return h, body, nil
}

// bodyError describes a read of h's body that failed after got bytes: the
// stream ended (a truncated frame), or the read did (cut).
func bodyError(r io.Reader, h Header, how string, got int, err error) error {
	if err == io.EOF || err == io.ErrUnexpectedEOF {
		return fmt.Errorf("truncated frame: %s body (id %d) cut at %d of %d bytes: %w: %w", h.Type, h.ID, got, h.Len, ErrMalformed, io.ErrUnexpectedEOF)
	}
	return cut(r, fmt.Sprintf("%s frame (id %d) body%s", h.Type, h.ID, how), got, int(h.Len), err)
}

// cut describes a frame that stopped arriving part-way: which part, how much
// of it came and, for a timeout, the limit that ended the wait, so that an
// operator sees a stalled peer rather than a bare "i/o timeout".
func cut(r io.Reader, part string, got, want int, err error) error {
	if !isTimeout(err) {
		return fmt.Errorf("%s: %d of %d bytes arrived: %w", part, got, want, err)
	}
	limit := "the read's deadline"
	if b, ok := r.(interface{ bound() string }); ok {
		limit = b.bound()
	}
	return fmt.Errorf("%s: %d of %d bytes arrived before %s: %w", part, got, want, limit, err)
}

// readBody reads n bytes into buf's memory, growing it as the bytes arrive rather
// than all at once, so that a peer that declares a large body and sends nothing
// costs little. It returns what arrived with the error.
func readBody(r io.Reader, buf []byte, n int) ([]byte, error) {
	const step = 64 << 10
	buf = buf[:0]
	for len(buf) < n {
		if len(buf) == cap(buf) {
			buf = slices.Grow(buf, min(n-len(buf), max(step, len(buf))))
		}
		end := min(n, cap(buf))
		m, err := readFull(r, buf[len(buf):end])
		buf = buf[:len(buf)+m]
		if err != nil {
			return buf, err
		}
	}
	return buf, nil
}

// discardChunk is the most a refused frame's body takes of memory of its own.
const discardChunk = 4 << 10

// discard reads and drops n bytes, through scratch's memory when it has any: a
// frame the gate refused must cost no memory of its size.
func discard(r io.Reader, scratch []byte, n int) (int, error) {
	if n == 0 {
		return 0, nil
	}
	if cap(scratch) < min(n, discardChunk) {
		scratch = make([]byte, min(n, discardChunk))
	}
	scratch = scratch[:cap(scratch)]
	done := 0
	for done < n {
		m, err := readFull(r, scratch[:min(n-done, len(scratch))])
		done += m
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// maxEmptyReads is how many reads in a row may return neither bytes nor an
// error before readFull gives up, as bufio does: a reader that does that for
// ever would otherwise hold the connection's reader for ever.
const maxEmptyReads = 100

// readFull is io.ReadFull that trusts no reader's count. io.ReadFull adds
// whatever a reader returns, and a negative count (ReadMsgUnix's -1 with a
// deadline error) or one past the buffer made the caller's slice panic; here
// it is an error wrapping errBadCount (and the reader's error, if any). Like
// io.ReadFull it returns io.EOF only when nothing was read, and
// io.ErrUnexpectedEOF when the stream ended part-way.
func readFull(r io.Reader, p []byte) (int, error) {
	n, empty := 0, 0
	for n < len(p) {
		m, err := r.Read(p[n:])
		if m < 0 || m > len(p)-n {
			if err != nil {
				return n, fmt.Errorf("read returned %d bytes for a %d-byte buffer: %w: %w", m, len(p)-n, errBadCount, err)
			}
			return n, fmt.Errorf("read returned %d bytes for a %d-byte buffer: %w", m, len(p)-n, errBadCount)
		}
		n += m
		switch {
		case err != nil && n == len(p):
			return n, nil
		case err == io.EOF && n > 0:
			return n, io.ErrUnexpectedEOF
		case err != nil:
			return n, err
		case m > 0:
			empty = 0
		default:
			if empty++; empty >= maxEmptyReads {
				return n, io.ErrNoProgress
			}
		}
	}
	return n, nil
}
