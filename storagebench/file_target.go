package storagebench

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"path/filepath"

	"github.com/stratakv/strata/storage"
	"github.com/stratakv/strata/storage/file"
)

// FileTarget measures storage/file in s.Dir against a DirectIOPeer with as many
// writers as the store's I/O workers, each chunk its own fsynced file, and a
// one-stream peer. The store uses O_DIRECT where the filesystem accepts it; where
// it does not, the store's files are evicted from the page cache between the puts
// and the gets, and the report says so.
func FileTarget(s Scratch) (Target, error) {
	free, err := freeBytes(s.Dir)
	if err != nil {
		return Target{}, err
	}
	// The store (objects plus 4 KiB headers), the peer and the one-stream figure
	// each hold every byte until the reads start.
	need := 3*s.Bytes + s.Bytes/16 + 256<<20
	if free < need {
		return Target{}, fmt.Errorf("the run needs %s free in %s and %s is: choose --dir on a disk with more room, or fewer --batches: %w",
			formatBytes(need), s.Dir, formatBytes(free), ErrConfig)
	}
	direct, err := probeDirectIO(s.Dir)
	if err != nil {
		return Target{}, err
	}
	cfg := file.DefaultConfig(filepath.Join(s.Dir, "store"))
	cfg.DirectIO = direct
	cfg.CapacityBytes = max(cfg.CapacityBytes, 2*s.Bytes)
	// The store logs its O_DIRECT fallback; the report says it instead.
	cfg.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	workers := cfg.IOWorkers
	if workers <= 0 {
		workers = 4 // file.Config's documented default
	}
	t := Target{
		Name: BackendFile,
		New: func(context.Context) (storage.Backend, error) {
			return file.New(cfg)
		},
		Peer:   &DirectIOPeer{Dir: filepath.Join(s.Dir, "peer"), Workers: workers, NoSync: !cfg.Sync},
		Stream: &DirectIOPeer{Dir: filepath.Join(s.Dir, "stream"), Workers: 1, OneFile: true, NoSync: !cfg.Sync},
	}
	mode := "O_DIRECT"
	if !direct {
		mode = "buffered"
	}
	sync := "fdatasync per object"
	if !cfg.Sync {
		sync = "no sync"
	}
	t.Describe = fmt.Sprintf("%s, %d I/O workers, %s", mode, workers, sync)
	if direct {
		t.Notes = append(t.Notes, "store and peers use O_DIRECT: reads come from the device, not the page cache")
	} else {
		store := cfg.Dir
		t.DropCache = func(ctx context.Context) error { return dropTreeCache(ctx, store) }
		t.Notes = append(t.Notes, "the filesystem refuses O_DIRECT: the store's files were evicted from the page cache (fadvise DONTNEED) "+
			"before the gets, but the kernel may keep some, so get figures may be high")
	}
	return t, nil
}
