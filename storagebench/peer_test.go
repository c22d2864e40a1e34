package storagebench

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"golang.org/x/sys/unix"
)

// alignedChunks maps n chunks of size bytes outside the Go heap, page aligned as a
// host pool is, filled with distinct bytes.
func alignedChunks(t *testing.T, n, size int) [][]byte {
	t.Helper()
	m, err := unix.Mmap(-1, 0, n*size, unix.PROT_READ|unix.PROT_WRITE, unix.MAP_PRIVATE|unix.MAP_ANONYMOUS)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = unix.Munmap(m) })
	out := make([][]byte, n)
	for i := range out {
		out[i] = m[i*size : (i+1)*size : (i+1)*size]
		fillChunk(out[i], uint64(i)+1)
	}
	return out
}

func blank(t *testing.T, like [][]byte) [][]byte {
	t.Helper()
	return alignedChunks(t, len(like), len(like[0]))
}

// roundTrip writes src in two Writes, reads it back in two Reads and compares.
func roundTrip(t *testing.T, p *DirectIOPeer, src, dst [][]byte) {
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

func TestDirectIOPeerRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name string
		peer func(dir string) *DirectIOPeer
		want string
	}{
		{"file per chunk", func(dir string) *DirectIOPeer { return &DirectIOPeer{Dir: dir, Workers: 3} }, "3 writers, file per chunk"},
		{"one stream", func(dir string) *DirectIOPeer { return &DirectIOPeer{Dir: dir, Workers: 1, OneFile: true} }, "1 stream, one file"},
		{"parallel one file", func(dir string) *DirectIOPeer { return &DirectIOPeer{Dir: dir, Workers: 2, OneFile: true} }, "2 streams, one file"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "peer")
			p := tc.peer(dir)
			src := alignedChunks(t, 6, 64<<10)
			roundTrip(t, p, src, blank(t, src))
			direct, err := directIOSupported(filepath.Dir(dir))
			if err != nil {
				t.Fatal(err)
			}
			name := p.Name()
			if !strings.HasSuffix(name, tc.want) || strings.HasPrefix(name, "o_direct") != direct {
				t.Errorf("name %q (O_DIRECT supported: %v)", name, direct)
			}
			if !direct && len(p.Notes()) == 0 {
				t.Error("fell back to buffered I/O without a note")
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := os.Stat(dir); !os.IsNotExist(err) {
				t.Errorf("Close left the peer's directory: %v", err)
			}
		})
	}
}

// TestDirectIOPeerFallsBack takes the buffered path twice: a filesystem that
// refuses O_DIRECT (simulated: tmpfs accepts it on recent kernels) and chunks that
// are not aligned.
func TestDirectIOPeerFallsBack(t *testing.T) {
	t.Run("filesystem refuses O_DIRECT", func(t *testing.T) {
		old := probeDirectIO
		probeDirectIO = func(string) (bool, error) { return false, nil }
		t.Cleanup(func() { probeDirectIO = old })
		for _, one := range []bool{false, true} {
			p := &DirectIOPeer{Dir: t.TempDir(), Workers: 2, OneFile: one}
			src := alignedChunks(t, 4, 16<<10)
			roundTrip(t, p, src, blank(t, src))
			if !strings.HasPrefix(p.Name(), "buffered+fsync") || !strings.Contains(strings.Join(p.Notes(), " "), "refuses O_DIRECT") {
				t.Errorf("name %q, notes %q", p.Name(), p.Notes())
			}
			if err := p.Close(); err != nil {
				t.Fatal(err)
			}
		}
	})
	t.Run("unaligned chunks", func(t *testing.T) {
		p := &DirectIOPeer{Dir: t.TempDir(), Workers: 2, NoSync: true}
		src := [][]byte{[]byte("first chunk"), []byte("second, longer chunk")}
		dst := [][]byte{make([]byte, len(src[0])), make([]byte, len(src[1]))}
		roundTrip(t, p, src, dst)
		if !strings.HasPrefix(p.Name(), "buffered,") {
			t.Errorf("name %q", p.Name())
		}
		if direct, _ := directIOSupported(p.Dir); direct && !strings.Contains(strings.Join(p.Notes(), " "), "not 4 KiB aligned") {
			t.Errorf("notes %q", p.Notes())
		}
		if err := p.Close(); err != nil {
			t.Fatal(err)
		}
	})
}

func TestDirectIOPeerWrongBufferSize(t *testing.T) {
	p := &DirectIOPeer{Dir: t.TempDir()}
	t.Cleanup(func() { _ = p.Close() })
	src := alignedChunks(t, 1, 8192)
	if _, err := p.Write(context.Background(), src); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Read(context.Background(), [][]byte{make([]byte, 4096)}); err == nil || !strings.Contains(err.Error(), "8192 bytes") {
		t.Fatalf("read into a short buffer = %v", err)
	}
}
