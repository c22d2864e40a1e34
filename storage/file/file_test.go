package file

import (
	"bytes"
	"log/slog"
	"path/filepath"
	"sync"
	"testing"

	"go.uber.org/goleak"

	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/storagetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// logBuffer collects a store's log lines.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(p)
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func testConfig(dir string, logs *logBuffer) Config {
	cfg := DefaultConfig(dir)
	if logs != nil {
		cfg.Logger = slog.New(slog.NewTextHandler(logs, nil))
	} else {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	return cfg
}

func newStore(t testing.TB, cfg Config) *Store {
	t.Helper()
	s, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	return s
}

// conformance runs the suite over stores in directories under root.
func conformance(t *testing.T, root string, tweak func(*Config)) {
	storagetest.Run(t, func(t *testing.T, shared string) storage.Backend {
		cfg := testConfig(filepath.Join(root, shared), nil)
		if tweak != nil {
			tweak(&cfg)
		}
		s, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		return s
	})
}

func TestConformanceDirectIO(t *testing.T) {
	conformance(t, t.TempDir(), nil)
}

func TestConformanceBuffered(t *testing.T) {
	conformance(t, t.TempDir(), func(c *Config) { c.DirectIO = false; c.Sync = false })
}
