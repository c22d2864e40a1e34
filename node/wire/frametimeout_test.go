package wire

import (
	"context"
	"errors"
	"testing"
	"time"
)

// A frame timeout bounds a frame once it started, not the wait for it: a reader
// with no deadline waits for the next frame as long as it takes, but a peer
// that sends part of a frame and stalls fails the Recv.
func TestConnFrameTimeout(t *testing.T) {
	a, b := socketpair(t)
	b.SetFrameTimeout(20 * time.Millisecond)
	// Whole frames pass whatever the pause before them.
	if err := a.Send(context.Background(), TypePing, 1, &Ping{Nonce: 1}); err != nil {
		t.Fatal(err)
	}
	if h, _, _, err := b.Recv(context.Background()); err != nil || h.ID != 1 {
		t.Fatalf("whole frame: %+v %v", h, err)
	}
	// Part of a frame, then nothing: Recv has no deadline, the frame timeout ends it.
	if _, err := a.uc.Write(frame(t, 2, &Ping{Nonce: 2})[:10]); err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := b.Recv(context.Background()); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stalled frame: %v", err)
	}
	if _, _, _, err := b.Recv(context.Background()); !errors.Is(err, ErrClosed) {
		t.Fatalf("Recv after a stalled frame: %v", err)
	}
}
