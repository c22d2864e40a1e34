package wire

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"time"

	"golang.org/x/sys/unix"
)

// msgConn is the socket an fdReader reads: a *net.UnixConn, or in tests a
// stand-in that fails the ways recvmsg does.
type msgConn interface {
	ReadMsgUnix(b, oob []byte) (n, oobn, flags int, addr *net.UnixAddr, err error)
	SetReadDeadline(t time.Time) error
}

// fdReader reads a stream socket with recvmsg, collecting the file descriptors
// that arrive with the bytes. readFrame never asks it for bytes past the current
// frame, so every descriptor it collects came with that frame.
type fdReader struct {
	uc        msgConn
	oob       []byte
	fds       []int // received since reset
	n         int   // bytes read since reset
	truncated bool  // the kernel cut the control data (too many descriptors)
	err       error // control data that did not parse

	// The frame's bounds, for Recv's frame timeout: once the first byte arrives,
	// the read deadline moves to the earlier of deadline and frameBy
	// (now+frameTimeout).
	ctx          context.Context
	deadline     time.Time
	frameTimeout time.Duration
	frameBy      time.Time // zero until the frame timeout started
}

func (r *fdReader) reset() {
	r.fds, r.n, r.truncated, r.err, r.frameBy = nil, 0, false, nil, time.Time{}
}

// Read is one recvmsg. It keeps the io.Reader contract (0 <= n <= len(p)) that
// ReadMsgUnix does not: when recvmsg fails (a deadline, a close), ReadMsgUnix
// passes on the kernel's -1 as the byte count, and io.ReadFull, adding it to
// what it has, made readBody slice at -1 and panic.
func (r *fdReader) Read(p []byte) (int, error) {
	n, oobn, flags, _, err := r.uc.ReadMsgUnix(p, r.oob)
	if n < 0 || oobn < 0 {
		if err == nil {
			err = fmt.Errorf("recvmsg returned %d bytes and %d of control data with no error: %w", n, oobn, errBadCount)
		}
		n, oobn, flags = max(n, 0), max(oobn, 0), 0
	}
	if oobn > len(r.oob) {
		return 0, fmt.Errorf("recvmsg returned %d bytes of control data for a %d-byte buffer: %w", oobn, len(r.oob), errBadCount)
	}
	if oobn > 0 {
		r.collect(r.oob[:oobn]) // before any other check: Recv closes what was collected
	}
	if flags&unix.MSG_CTRUNC != 0 {
		r.truncated = true
	}
	if n > len(p) {
		return 0, fmt.Errorf("recvmsg returned %d bytes for a %d-byte buffer: %w", n, len(p), errBadCount)
	}
	if r.n == 0 && n > 0 && r.frameTimeout > 0 {
		r.startFrame()
	}
	r.n += n
	if errors.Is(err, io.EOF) {
		err = io.EOF // ReadMsgUnix wraps it; io.ReadFull needs it bare
	}
	return n, err
}

// startFrame tightens the read deadline when a frame's first byte arrived.
func (r *fdReader) startFrame() {
	r.frameBy = time.Now().Add(r.frameTimeout)
	dl := r.frameBy
	if !r.deadline.IsZero() && r.deadline.Before(dl) {
		dl = r.deadline
	}
	_ = r.uc.SetReadDeadline(dl)
	// The context's watch may have moved the deadline into the past just before
	// this moved it forward again: do what it did once more.
	if r.ctx != nil && r.ctx.Err() != nil {
		_ = r.uc.SetReadDeadline(time.Unix(1, 0))
	}
}

// bound names the limit that ended a read with a timeout, so that the error of
// a stalled frame says which setting to look at.
func (r *fdReader) bound() string {
	switch {
	case r.ctx != nil && errors.Is(r.ctx.Err(), context.Canceled):
		return "the receive was canceled"
	case !r.frameBy.IsZero() && (r.deadline.IsZero() || r.frameBy.Before(r.deadline)):
		return fmt.Sprintf("the %v frame timeout", r.frameTimeout)
	}
	return "the receive's deadline"
}

// collect takes the file descriptors out of received control data.
func (r *fdReader) collect(oob []byte) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		r.err = err
		return
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_SOCKET || m.Header.Type != unix.SCM_RIGHTS {
			continue
		}
		fds, err := unix.ParseUnixRights(&m)
		if err != nil {
			r.err = err
			continue
		}
		r.fds = append(r.fds, fds...)
	}
}

func closeFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}
