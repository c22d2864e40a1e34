package storagebench

import (
	"bytes"
	"context"
	"errors"
	"strings"
	"testing"
)

// peerRoundTrip writes src in two Writes, reads it back in two Reads, compares,
// and checks that reading past what was written fails.
func peerRoundTrip(t *testing.T, p Peer, src, dst [][]byte) {
	t.Helper()
	ctx := context.Background()
	half := len(src) / 2
	for _, part := range [][][]byte{src[:half], src[half:]} {
		if d, err := p.Write(ctx, part); err != nil || d <= 0 {
			t.Fatalf("%s: write = %v, %v", p.Name(), d, err)
		}
	}
	for _, part := range [][][]byte{dst[:half], dst[half:]} {
		if d, err := p.Read(ctx, part); err != nil || d <= 0 {
			t.Fatalf("%s: read = %v, %v", p.Name(), d, err)
		}
	}
	for i := range src {
		if !bytes.Equal(src[i], dst[i]) {
			t.Fatalf("%s: chunk %d read back different bytes", p.Name(), i)
		}
	}
	if _, err := p.Read(ctx, dst[:1]); err == nil {
		t.Fatalf("%s: reading past what was written succeeded", p.Name())
	}
}

func TestMemcpyPeerRoundTrip(t *testing.T) {
	src := alignedChunks(t, 6, 64<<10)
	// A chunk that is not a multiple of 4 KiB: the next one still starts aligned.
	src[2] = src[2][:5000]
	dst := blank(t, src)
	dst[2] = dst[2][:5000]
	p := &MemcpyPeer{Workers: 3, Capacity: 6 * 64 << 10}
	peerRoundTrip(t, p, src, dst)
	if p.Name() != "memcpy, 3 goroutines, copy() between two host regions" {
		t.Errorf("name %q", p.Name())
	}
	for i, c := range p.chunks {
		if c.off%memcpyAlign != 0 {
			t.Errorf("chunk %d at offset %d", i, c.off)
		}
	}
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestMemcpyPeerRefusesWhatDoesNotFit(t *testing.T) {
	p := &MemcpyPeer{Workers: 2, Capacity: 64 << 10}
	t.Cleanup(func() { _ = p.Close() })
	src := alignedChunks(t, 2, 64<<10)
	if _, err := p.Write(context.Background(), src); !errors.Is(err, ErrConfig) || !strings.Contains(err.Error(), "do not fit") {
		t.Fatalf("write over capacity = %v", err)
	}
	if len(p.chunks) != 0 {
		t.Fatalf("a refused write left %d chunks", len(p.chunks))
	}
	if _, err := p.Write(context.Background(), src[:1]); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Read(context.Background(), [][]byte{make([]byte, 4096)}); err == nil || !strings.Contains(err.Error(), "65536 bytes") {
		t.Fatalf("read into a short buffer = %v", err)
	}
}
