package node

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stratakv/strata/node/spill"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// waitSpillReady waits until s's spill has indexed the objects of the run
// before (at most 20 s).
func waitSpillReady(t *testing.T, s *Server) {
	t.Helper()
	waitFor(t, "the spill to index the run before's objects", func() bool {
		done, _, _ := s.spill.ScanProgress()
		return done
	})
}

// The service listens, says Hello (starting) and serves while the spill's
// segments that a crash left without hint files are still being read, which
// took 29 s for 176k objects before it listened at all. Meanwhile the spill's
// objects of the run before are misses, never wrong bytes; puts work; and
// once the scan is done every object is served with its bytes. The scan is
// held by the spill's OnScan hook rather than made long with data.
func TestListensBeforeSpillIsIndexed(t *testing.T) {
	dir := t.TempDir()
	const n, size = 48, 64 << 10
	sc := spill.DefaultConfig(dir)
	sc.SegmentBytes, sc.Logger = 1<<20, quiet
	fs, err := spill.New(sc)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]byte, n*size)
	pattern(want, 5)
	for i := 0; i < n; i++ {
		if err := fs.PutObject(context.Background(), fmt.Sprintf("o%d", i), storage.Format(7), want[i*size:(i+1)*size]); err != nil {
			t.Fatal(err)
		}
	}
	if err := fs.Close(); err != nil {
		t.Fatal(err)
	}
	hints, _ := filepath.Glob(filepath.Join(dir, "*.hint"))
	for _, h := range hints { // as a SIGKILL leaves them
		if err := os.Remove(h); err != nil {
			t.Fatal(err)
		}
	}
	if len(hints) < 3 {
		t.Fatalf("%d segments; the test needs 3", len(hints))
	}

	reached, release := make(chan struct{}), make(chan struct{})
	var once sync.Once
	releaseOnce := sync.OnceFunc(func() { close(release) })
	scanned := func(scanned, total int64) {
		if scanned > 0 {
			once.Do(func() {
				close(reached)
				select {
				case <-release:
				case <-time.After(time.Minute): // never hang the test binary
				}
			})
		}
	}
	s := start(t, func(c *Config) { c.SpillDir, c.hooks = dir, &hooks{spillScanned: scanned} })
	t.Cleanup(releaseOnce) // before the service's Close, which stops the scan
	select {
	case <-reached:
	case <-time.After(20 * time.Second):
		t.Fatal("the spill's scan never started")
	}
	conn, err := wire.Dial(t.Context(), s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	m, err := send(conn, 1, wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: "early"})
	if err != nil {
		t.Fatal(err)
	}
	if h := m.(*wire.HelloReply); !h.Starting || h.ReadyPercent >= 100 {
		t.Fatalf("hello while the spill is indexed: %+v, want starting", h)
	}
	if st := s.Stats().Start; st.State != StateStarting || !strings.Contains(st.Message, "of the spill indexed") {
		t.Fatalf("start while the spill is indexed: %+v", st)
	}
	c := dial(t, s)
	r, seg := c.segment(2 * size)
	mem := r.Bytes()
	for i := 0; i < n; i += 7 {
		res := c.batch(wire.TypeGet, item(fmt.Sprintf("o%d", i), seg, 0, size))[0]
		if res.Status == wire.OK {
			t.Fatalf("o%d served while the spill is indexed (it may be removed in a segment not read yet)", i)
		}
		if res.Status != wire.NotFound {
			t.Fatalf("get o%d while the spill is indexed: %v %s, want a miss", i, res.Status, res.Message)
		}
	}
	copy(mem[size:], bytes.Repeat([]byte("new"), size/3))
	if res := c.batch(wire.TypePut, item("new", seg, size, size))[0]; res.Status != wire.OK {
		t.Fatalf("put while the spill is indexed: %v %s", res.Status, res.Message)
	}

	releaseOnce()
	waitFor(t, "the service to be ready", func() bool { return s.Stats().Start.State == StateReady })
	if st := s.Stats().Spill; st == nil || !st.Ready || st.Recovered != n {
		t.Fatalf("spill once ready: %+v, want the %d objects", st, n)
	}
	for i := 0; i < n; i++ {
		clear(mem[:size])
		if res := c.batch(wire.TypeGet, item(fmt.Sprintf("o%d", i), seg, 0, size))[0]; res.Status != wire.OK {
			t.Fatalf("get o%d once ready: %v %s", i, res.Status, res.Message)
		}
		if !bytes.Equal(mem[:size], want[i*size:(i+1)*size]) {
			t.Fatalf("o%d: wrong bytes", i)
		}
	}
}

// The service creates its spill directory private (0700), makes an earlier
// version's 0755 one private, and refuses, naming the chmod, one that the
// group or others may write, or read while it holds files not the spill's,
// before it maps the arena. Before, it created it 0755 and used any.
func TestSpillDirPrivate(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "var", "spill")
	s := start(t, func(c *Config) { c.SpillDir = dir })
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("spill directory: %v, mode %v; want 0700", err, fi.Mode())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	s = start(t, func(c *Config) { c.SpillDir = dir })
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("an earlier version's spill directory: %v, mode %v; want it made 0700", err, fi.Mode())
	}
	if err := s.Close(); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "notes.txt"), nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, mode := range []os.FileMode{0o755, 0o777, 0o750} {
		if err := os.Chmod(dir, mode); err != nil {
			t.Fatal(err)
		}
		cfg := DefaultConfig(socketPath(t))
		cfg.ArenaBytes, cfg.Logger, cfg.Admin, cfg.SpillDir = 16<<20, quiet, "", dir
		s, err := New(cfg)
		if err == nil {
			s.Close()
			t.Fatalf("a spill directory of mode %v: accepted", mode)
		}
		if !errors.Is(err, spill.ErrUnsafeDir) || !errors.Is(err, storage.ErrConfig) || !strings.Contains(err.Error(), "chmod 700 "+dir) ||
			!strings.Contains(err.Error(), "--spill-dir") {
			t.Fatalf("a spill directory of mode %v: %v", mode, err)
		}
	}
}
