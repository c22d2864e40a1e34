// Package storagebench measures an L3 backend on the user's own hardware: batch Put
// and Get of whole pages between a host pool and the backend, each set beside its
// physical limit measured in the same run (the same bytes moved by the same number
// of streams with no store on top), so that the figures are ratios that survive a
// different disk or a noisy machine. `strata bench tiers` runs it.
package storagebench

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/storage"
)

// ErrConfig reports a benchmark configuration that cannot run; the message says
// which setting to change.
var ErrConfig = errors.New("invalid storage benchmark configuration")

// ErrMemory reports a run larger than the host memory available; it wraps
// ErrConfig too. Fewer batches need less.
var ErrMemory = errors.New("not enough host memory for the run")

// ErrPutsSkipped reports a store that already holds objects the run would put:
// write-once puts of them would move nothing, so their figures would be false.
var ErrPutsSkipped = errors.New("the store already holds the run's objects")

// Shape is the page a run moves: a model's KV geometry on one rank and the page
// size in tokens. Pools are laid out page_first, so each part of a page's object
// is one contiguous run of host memory.
type Shape struct {
	// Name selects the shape on the command line.
	Name string `json:"name"`
	// Geometry is the model's KV geometry.
	Geometry kvlayout.Geometry `json:"geometry"`
	// PageSize is tokens per page.
	PageSize int `json:"pageSize"`
	// About says what the shape stands for.
	About string `json:"about"`
}

// PageBytes is one page across every layer and part.
func (s Shape) PageBytes() int64 { return int64(s.PageSize) * int64(s.Geometry.TokenBytes()) }

// PartBytes is one part (K, V or the MLA latent) of one page: one object.
func (s Shape) PartBytes() int64 {
	return int64(s.PageSize) * int64(s.Geometry.Layers) * int64(s.Geometry.TokenLayerBytes())
}

// Shape names.
const (
	// ShapeLlama3 is Llama-3-8B: 32 layers, 8 KV heads of 128, bf16, 64-token pages:
	// 4 MiB of K and 4 MiB of V per page. The file backend's default.
	ShapeLlama3 = "llama-3-8b"
	// ShapeLlama3P32 is Llama-3-8B with 32-token pages: 2 MiB of K and 2 MiB of V,
	// a 4 MiB page. The node backend's default: 128 such pages are 512 MiB a batch,
	// so the service's arena, the host pools and the peers of a run fit in the DRAM
	// of a small machine.
	ShapeLlama3P32 = "llama-3-8b-p32"
	// ShapeDeepSeekV3 is DeepSeek-V3 MLA: 61 layers, latent 512+64, bf16, 64-token
	// pages: one 4.3 MiB object per page.
	ShapeDeepSeekV3 = "deepseek-v3"
	// ShapeSmall is a toy page (32 KiB parts) for smoke tests that finish in seconds.
	// Small objects make the run about per-file costs (create, fsync) rather than
	// bandwidth; do not read its GB/s as the disk's.
	ShapeSmall = "small"
)

var shapes = []Shape{
	{Name: ShapeLlama3, Geometry: kvlayout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}, PageSize: 64,
		About: "Llama-3-8B, 32 layers, 8 KV heads x 128, bf16"},
	{Name: ShapeLlama3P32, Geometry: kvlayout.Geometry{Layers: 32, KVHeads: 8, HeadDim: 128, DTypeBytes: 2}, PageSize: 32,
		About: "Llama-3-8B, 32 layers, 8 KV heads x 128, bf16, 32-token pages"},
	{Name: ShapeDeepSeekV3, Geometry: kvlayout.Geometry{Layers: 61, MLA: true, LatentDim: 576, DTypeBytes: 2}, PageSize: 64,
		About: "DeepSeek-V3 MLA, 61 layers, latent 576, bf16"},
	{Name: ShapeSmall, Geometry: kvlayout.Geometry{Layers: 2, KVHeads: 2, HeadDim: 64, DTypeBytes: 2}, PageSize: 64,
		About: "toy page for smoke tests, 2 layers, 2 KV heads x 64, bf16"},
}

// shape is the page the run moves.
func (c Config) shape() Shape {
	if c.ObjectBytes != 0 {
		s, _ := ObjectShape(c.ObjectBytes)
		return s
	}
	name := c.Shape
	if name == "" {
		name = DefaultShape(c.Backend)
	}
	s, _ := ShapeByName(name)
	return s
}

// DefaultShape is the page shape a run of backend uses when Config.Shape is "":
// llama-3-8b-p32 (4 MiB pages) for the node service, llama-3-8b (8 MiB pages)
// otherwise.
func DefaultShape(backend string) string {
	if backend == BackendNode {
		return ShapeLlama3P32
	}
	return ShapeLlama3
}

// Shapes lists the page shapes a run can use, file default first.
func Shapes() []Shape { return slices.Clone(shapes) }

// ShapeNames lists the shapes' names, file default first.
func ShapeNames() []string {
	out := make([]string, len(shapes))
	for i, s := range shapes {
		out[i] = s.Name
	}
	return out
}

// ShapeByName returns the shape called name.
func ShapeByName(name string) (Shape, error) {
	for _, s := range shapes {
		if s.Name == name {
			return s, nil
		}
	}
	return Shape{}, fmt.Errorf("page shape %q: want one of %s: %w", name, strings.Join(ShapeNames(), ", "), ErrConfig)
}

// Object sizes a run of small objects may ask for (Config.ObjectBytes): a
// multiple of objectTokens up to a head of the largest dimension a geometry
// allows.
const (
	objectTokens   = 16
	MinObjectBytes = objectTokens
	MaxObjectBytes = objectTokens << 16
)

// ObjectShape is a page of two objects (K and V) of n bytes each: one layer,
// one KV head of n/16 one-byte elements, 16-token pages. It is the shape of a
// run about per-object costs (small values, as a cache of small items would
// hold) rather than bandwidth; n must be a multiple of 16 from MinObjectBytes
// to MaxObjectBytes.
func ObjectShape(n int64) (Shape, error) {
	if n < MinObjectBytes || n > MaxObjectBytes || n%objectTokens != 0 {
		return Shape{}, fmt.Errorf("object size of %d bytes: want a multiple of %d from %d to %d: %w",
			n, objectTokens, MinObjectBytes, MaxObjectBytes, ErrConfig)
	}
	return Shape{
		Name:     fmt.Sprintf("objects-%d", n),
		Geometry: kvlayout.Geometry{Layers: 1, KVHeads: 1, HeadDim: int(n / objectTokens), DTypeBytes: 1},
		PageSize: objectTokens,
		About:    fmt.Sprintf("two %d-byte objects a page, for per-object costs", n),
	}, nil
}

// Config describes one benchmark run. The zero value is not valid; start from
// DefaultConfig.
type Config struct {
	// Backend names the backend to measure: one of Backends(). Ignored when
	// NewTarget is set.
	Backend string `json:"backend"`
	// NewTarget builds the target instead of Backend's built-in one: for tests and
	// for backends that need settings of their own (an address, credentials).
	NewTarget TargetFunc `json:"-"`
	// Dir is where the run's scratch directory is made; "" means os.TempDir(). For
	// the file backend this picks the disk that is measured. The run needs about
	// three times the bytes it writes free there (the store, its peer, the
	// one-stream figure).
	Dir string `json:"dir"`
	// Keep leaves the scratch directory and the store's objects in place.
	Keep bool `json:"keep"`
	// Shape is the page moved: one of ShapeNames(); "" means DefaultShape(Backend).
	Shape string `json:"shape"`
	// ObjectBytes, when positive, replaces Shape with ObjectShape(ObjectBytes):
	// pages of two objects of that many bytes, to measure per-object costs.
	ObjectBytes int64 `json:"objectBytes,omitempty"`
	// PagesPerBatch is the pages of one Put or Get call, at most storage.MaxBatch.
	PagesPerBatch int `json:"pagesPerBatch"`
	// Batches is the number of Put (then Get) calls. Each batch has distinct keys,
	// so Batches × PagesPerBatch pages are written.
	Batches int `json:"batches"`
	// Engines is how many engines (clients with host pools of their own) put and
	// get at once in the phase after the one-engine phases, for targets with a
	// Pair peer (the node service); 0 means DefaultEngines.
	Engines int `json:"engines"`
	// ExistsCalls is how many Exists calls (each of one batch's keys) time the
	// lookup latency.
	ExistsCalls int `json:"existsCalls"`
	// Seed makes the tokens, hence the keys, and the page contents.
	Seed uint64 `json:"seed"`
	// Namespace prefixes the names of every object the run stores; empty means a
	// fresh one per run, so that a run against a running service never finds the
	// objects of an earlier one (whose puts would be skipped, write-once, and
	// measure nothing). A run refuses to measure puts of objects that exist.
	Namespace string `json:"namespace,omitempty"`
	// Progress, when set, receives a line as each phase starts.
	Progress io.Writer `json:"-"`
	// Socket, for the node backend, is the socket of a running node service to
	// measure; "" starts one in the process, sized for the run.
	Socket string `json:"socket,omitempty"`
	// NoRedis skips the Redis server the node backend is measured against.
	NoRedis bool `json:"noRedis,omitempty"`
	// Redis, for the redis backend, are the addresses of a Redis Cluster node or
	// standalone server to measure; empty starts a redis-server for the run (a
	// cluster of 3 masters with RedisCluster). On a Redis of the user's, the
	// store's objects expire an hour after the run unless Keep.
	Redis []string `json:"redis,omitempty"`
	// RedisCluster makes the redis backend's own Redis a cluster of 3 masters.
	RedisCluster bool `json:"redisCluster,omitempty"`
	// Available reports the host memory the run may take; nil means
	// hostmem.AvailableBytes. The host pool holds every batch when that fits in half
	// of it, else one batch whose pages are refilled for each.
	Available func() (int64, error) `json:"-"`
}

// DefaultEngines is the engines of the phase of engines at once by default.
const DefaultEngines = 2

// MaxEngines bounds Config.Engines: each engine is a client and two host pool
// batches of its own.
const MaxEngines = 64

// engines is Config.Engines with its default.
func (c Config) engines() int {
	if c.Engines == 0 {
		return DefaultEngines
	}
	return c.Engines
}

// DefaultConfig is the full run: the file backend in the system temp directory,
// 4 batches of 128 pages of the backend's default shape (for the file backend
// Llama-3-8B's 8 MiB pages, 4 GiB written and read back; for the node service
// 4 MiB pages, 2 GiB) and 200 Exists calls.
func DefaultConfig() Config {
	return Config{
		Backend:       BackendFile,
		PagesPerBatch: storage.MaxBatch,
		Batches:       4,
		Engines:       DefaultEngines,
		ExistsCalls:   200,
		Seed:          1,
	}
}

// Validate reports whether c can run.
func (c Config) Validate() error {
	if c.NewTarget == nil {
		if _, err := targetByName(c.Backend); err != nil {
			return err
		}
	}
	if (len(c.Redis) > 0 || c.RedisCluster) && c.NewTarget == nil && c.Backend != BackendRedis {
		return fmt.Errorf("redis settings are for the %s backend, not %s: %w", BackendRedis, c.Backend, ErrConfig)
	}
	if len(c.Redis) > 0 && c.RedisCluster {
		return fmt.Errorf("redis addresses and a local redis cluster: give one: %w", ErrConfig)
	}
	if c.Shape != "" {
		if _, err := ShapeByName(c.Shape); err != nil {
			return err
		}
	}
	if c.ObjectBytes != 0 {
		if c.Shape != "" {
			return fmt.Errorf("an object size and page shape %q: give one: %w", c.Shape, ErrConfig)
		}
		if _, err := ObjectShape(c.ObjectBytes); err != nil {
			return err
		}
	}
	if c.PagesPerBatch < 1 || c.PagesPerBatch > storage.MaxBatch {
		return fmt.Errorf("%d pages per batch: want 1 to %d: %w", c.PagesPerBatch, storage.MaxBatch, ErrConfig)
	}
	if c.Batches < 1 || c.Batches > 1<<16 {
		return fmt.Errorf("%d batches: want 1 to %d: %w", c.Batches, 1<<16, ErrConfig)
	}
	if c.Engines < 0 || c.Engines == 1 || c.Engines > MaxEngines {
		return fmt.Errorf("%d engines at once: want 2 to %d: %w", c.Engines, MaxEngines, ErrConfig)
	}
	if c.ExistsCalls < 0 || c.ExistsCalls > 1<<20 {
		return fmt.Errorf("%d exists calls: want 0 to %d: %w", c.ExistsCalls, 1<<20, ErrConfig)
	}
	return nil
}
