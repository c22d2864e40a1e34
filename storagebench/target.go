package storagebench

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/stratakv/strata/storage"
)

// Peer is the physical limit a backend is measured against: the same bytes moved
// the same way with no store on top (for the file backend, the disk written and
// read directly by as many streams as the store uses). A Peer measures its own
// time so that its setup and clean-up stay out of the figure.
type Peer interface {
	// Name says what the peer does, for the report ("o_direct, 4 writers, file per chunk").
	Name() string
	// Write stores every chunk of src and returns the time that took, durably if the
	// backend's puts are durable.
	Write(ctx context.Context, src [][]byte) (time.Duration, error)
	// Read reads back, into dst, the next len(dst) chunks in the order Write stored
	// them (continuing where the last Read stopped) and returns the time that took.
	// dst[i] must be as long as the chunk it receives.
	Read(ctx context.Context, dst [][]byte) (time.Duration, error)
	// Close removes what the peer stored.
	Close() error
}

// Target is a backend to measure and the peers it is measured against.
type Target struct {
	// Name is the backend's name in the report.
	Name string
	// New opens the backend. The run closes it.
	New func(ctx context.Context) (storage.Backend, error)
	// Peer is the limit the ratios are taken against: the same job, same streams.
	Peer Peer
	// Stream, when set, is a second peer reported beside the first: the medium with
	// one stream (for a disk, one file written and read sequentially), the figure a
	// user compares with dd or fio.
	Stream Peer
	// DropCache, when set, runs between the puts and the gets to evict what the
	// puts left in caches the gets would otherwise be served from (the kernel's page
	// cache over a file store written without O_DIRECT).
	DropCache func(ctx context.Context) error
	// Notes are things the report should say about how this target was measured.
	Notes []string
	// Describe is a short description of the backend's settings for the report
	// ("O_DIRECT, 4 I/O workers, fsync per object").
	Describe string
	// Redis, when set, is a Redis server storing the same objects under the same
	// names (a NamedPeer), timed on the same batches beside the backend and Peer:
	// the service an engine would otherwise use.
	Redis Peer
	// Pair, when set, adds a phase in which Scratch.Engines backends opened with
	// New run at once, each with its own host pool and keys, as the engines on a
	// node would; Pair is their limit: the same bytes of every engine moved at
	// once.
	Pair Peer
	// Warm makes each engine's host pool hold one batch of sources, refilled before
	// each batch as an engine reuses its pool, and one of destinations, and puts and
	// gets one untimed batch through it first, so that the figures are those of a
	// pool in use (a service that mapped the pool lazily would pay a fault per page
	// on first use). The cold batch's figures are reported apart. The
	// store must hold that batch too.
	Warm bool
	// PerBatch makes the run get each batch right after putting it, and then call
	// Forget, instead of putting every batch before the first get: the store holds
	// one batch at a time. It is for stores in DRAM (Redis), where a run that grows
	// the store by all its bytes would measure the server's page faults on fresh
	// memory, and reads of memory the machine has let go cold, more than the store.
	PerBatch bool
	// Forget, when set, removes a batch's objects (named as the backend and a
	// NamedPeer store them) from the backend and the peers, untimed.
	Forget func(ctx context.Context, names []string) error
	// Remove, when set, removes objects the run stored in a store that outlives
	// it (a running node service), by the names the backend stores them under;
	// the run calls it with every object it wrote, unless Keep, before Close.
	Remove func(ctx context.Context, names []string) error
	// Close, when set, releases what the target started (an embedded service). The
	// run calls it after closing the backends and peers.
	Close func() error
}

// NamedPeer is a Peer that stores each chunk under a name, as a key-value store
// does. The run gives it the object names the backend stores the same bytes under.
type NamedPeer interface {
	Peer
	// WriteNamed stores src[i] under names[i] and returns the time that took.
	WriteNamed(ctx context.Context, names []string, src [][]byte) (time.Duration, error)
	// ReadNamed reads names[i] into dst[i], which must be as long as the value,
	// and returns the time that took.
	ReadNamed(ctx context.Context, names []string, dst [][]byte) (time.Duration, error)
}

// Scratch is what a target is built from for one run.
type Scratch struct {
	// Dir is a fresh directory for the run. The target may fill it; the run removes
	// it afterwards unless the user asked to keep it.
	Dir string
	// Bytes is how many object bytes the run will put, to size the store.
	Bytes int64
	// BatchBytes is one batch's object bytes.
	BatchBytes int64
	// ObjectBytes is the size of one object (one part of a page): a store that
	// rounds each object up to a grain sizes itself by the count of objects too.
	ObjectBytes int64
	// Engines is how many engines the phase of engines at once runs (Config.Engines).
	Engines int
	// Socket is Config.Socket: a running node service, or "" to start one.
	Socket string
	// NoRedis is Config.NoRedis: do not measure a Redis server beside the backend.
	NoRedis bool
	// Redis and RedisCluster are Config.Redis and Config.RedisCluster.
	Redis        []string
	RedisCluster bool
	// Keep is Config.Keep: leave what the run stored in place.
	Keep bool
	// Available reports the host memory the run may take (Config.Available, or
	// hostmem.AvailableBytes).
	Available func() (int64, error)
	// Progress, when set, receives a line as a target starts something slow.
	Progress func(format string, args ...any)
}

// TargetFunc builds a Target for one run.
type TargetFunc func(s Scratch) (Target, error)

// Backend names.
const (
	// BackendFile is storage/file: objects as files in a directory on a local disk.
	BackendFile = "file"
	// BackendNode is storage/nodeclient: the node service (`strata serve`), an
	// embedded one unless Config.Socket names a running one.
	BackendNode = "node"
	// BackendRedis is storage/redisstore: a Redis Cluster or server, one started
	// for the run unless Config.Redis names one.
	BackendRedis = "redis"
)

var builtinTargets = map[string]TargetFunc{
	BackendFile:  FileTarget,
	BackendNode:  NodeTarget,
	BackendRedis: RedisTarget,
}

// Backends lists the backends a run can measure by name.
func Backends() []string {
	out := make([]string, 0, len(builtinTargets))
	for n := range builtinTargets {
		out = append(out, n)
	}
	slices.Sort(out)
	return out
}

func targetByName(name string) (TargetFunc, error) {
	if f, ok := builtinTargets[name]; ok {
		return f, nil
	}
	return nil, fmt.Errorf("backend %q: the storage benchmark can measure %s: %w", name, strings.Join(Backends(), ", "), ErrConfig)
}

// cleanups are the release functions of what a target started, run last first.
// A target's Close and its constructor's error path share one.
type cleanups struct{ fns []func() error }

func (c *cleanups) add(f func() error) { c.fns = append(c.fns, f) }

// run runs every function, last added first, and joins their errors.
func (c *cleanups) run() error {
	var errs []error
	for i := len(c.fns) - 1; i >= 0; i-- {
		errs = append(errs, c.fns[i]())
	}
	c.fns = nil
	return errors.Join(errs...)
}
