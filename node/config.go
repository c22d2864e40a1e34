package node

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/stratakv/strata/hostmem"
)

// Config shapes a node service. Start from DefaultConfig; `strata serve` fills it
// from flags, environment variables (STRATA_<FLAG>, dashes as underscores) and a
// JSON config file with the flags' names as keys.
type Config struct {
	// Socket is the Unix socket engines connect to.
	Socket string `json:"socket"`
	// SocketMode is the socket file's permission bits: 0600 lets only the
	// service's user connect; 0660 with SocketGroup lets a group of engine users.
	SocketMode os.FileMode `json:"socket-mode"`
	// SocketGroup, when set, is the group (name or numeric id) the socket belongs to.
	SocketGroup string `json:"socket-group"`
	// Admin is the loopback address of the HTTP admin port (/healthz, /metrics,
	// /stats); port 0 picks a free port (logged); "" turns it off.
	Admin string `json:"admin"`
	// ArenaBytes is the DRAM arena, the service's own memory for objects. Size it to
	// the host memory the node can spare beyond the engines' own host pools.
	ArenaBytes int64 `json:"arena"`
	// HighWatermark and LowWatermark bound the arena: past the high one, the least
	// recently used objects are evicted (to the spill directory when there is one)
	// until the low one.
	HighWatermark float64 `json:"high-watermark"`
	LowWatermark  float64 `json:"low-watermark"`
	// SpillDir is the SSD directory evicted objects go to (and are promoted back
	// from on a hit); "" means evicted objects are dropped.
	SpillDir string `json:"spill-dir"`
	// SpillBytes bounds the spill directory.
	SpillBytes int64 `json:"spill-capacity"`
	// RemoteAddrs are the seed addresses of a Redis Cluster (or one Redis server)
	// that the service writes through to: puts are copied there asynchronously, and
	// a get that misses the arena and the spill looks there, so node services that
	// share the cluster find each other's pages. Empty: no remote tier.
	RemoteAddrs []string `json:"remote"`
	// RemoteQueueBytes bounds the bytes waiting to be written through; beyond it
	// writes are dropped (and counted) rather than queued.
	RemoteQueueBytes int64 `json:"remote-queue"`
	// ClientQuotaBytes bounds the memory one client may register (its host pools);
	// a registration over it is refused, and that pool runs without L3.
	ClientQuotaBytes int64 `json:"client-quota"`
	// MaxClients bounds concurrent clients.
	MaxClients int `json:"max-clients"`
	// CopyWorkers is how many goroutines copy the objects of one batch at once; one
	// core copies at about half the machine's memory bandwidth.
	CopyWorkers int `json:"copy-workers"`
	// RequestTimeout bounds one request's handling (a stuck spill device fails
	// the request instead of holding the client).
	RequestTimeout time.Duration `json:"request-timeout"`
	// Allocator overrides the arena's memory (tests); nil is mmap, prefaulted.
	Allocator *hostmem.Allocator `json:"-"`
	// Logger receives the service's log; nil means slog.Default().
	Logger *slog.Logger `json:"-"`

	// hooks let this package's tests act inside a request, where a race would
	// otherwise be won by chance; nil outside tests.
	hooks *hooks
}

// hooks are called, when set, at points inside request handling.
type hooks struct {
	// reserved runs when a put or a promotion has reserved key in the arena,
	// before it writes the object: until it returns, the write is pending.
	reserved func(key string)
	// awaiting runs when a request finds key's object not readable and is about
	// to wait for a write of it that may be pending.
	awaiting func(key string)
	// beforeRemoteGet runs when a get asks Redis for the objects the local tiers
	// missed.
	beforeRemoteGet func()
}

func (s *Server) hookReserved(key string) {
	if h := s.cfg.hooks; h != nil && h.reserved != nil {
		h.reserved(key)
	}
}

func (s *Server) hookAwaiting(key string) {
	if h := s.cfg.hooks; h != nil && h.awaiting != nil {
		h.awaiting(key)
	}
}

// DefaultConfig returns a service on socket with a 4 GiB arena, watermarks 0.90
// and 0.85, no spill, a 64 GiB per-client quota and an admin port on a free
// loopback port.
func DefaultConfig(socket string) Config {
	return Config{
		Socket:           socket,
		SocketMode:       0o600,
		Admin:            "127.0.0.1:0",
		ArenaBytes:       4 << 30,
		HighWatermark:    0.90,
		LowWatermark:     0.85,
		SpillBytes:       64 << 30,
		ClientQuotaBytes: 64 << 30,
		RemoteQueueBytes: 1 << 30,
		MaxClients:       256,
		CopyWorkers:      2,
		RequestTimeout:   30 * time.Second,
	}
}

// Validate reports whether c can run.
func (c Config) Validate() error {
	switch {
	case c.Socket == "":
		return fmt.Errorf("no socket path: %w", ErrConfig)
	case len(c.Socket) > 107:
		return fmt.Errorf("socket path %q is %d bytes; Unix socket paths hold at most 107: %w", c.Socket, len(c.Socket), ErrConfig)
	case c.SocketMode&^0o777 != 0 || c.SocketMode&0o600 != 0o600:
		return fmt.Errorf("socket mode %#o: want permission bits that include 0600: %w", c.SocketMode, ErrConfig)
	case c.ArenaBytes < 1<<20:
		return fmt.Errorf("arena of %d bytes: want at least 1 MiB: %w", c.ArenaBytes, ErrConfig)
	case !(c.LowWatermark > 0 && c.LowWatermark < c.HighWatermark && c.HighWatermark <= 1):
		return fmt.Errorf("watermarks low %v, high %v: want 0 < low < high <= 1: %w", c.LowWatermark, c.HighWatermark, ErrConfig)
	case c.SpillDir != "" && c.SpillBytes <= 0:
		return fmt.Errorf("spill capacity %d bytes: want positive: %w", c.SpillBytes, ErrConfig)
	case len(c.RemoteAddrs) > 0 && c.RemoteQueueBytes <= 0:
		return fmt.Errorf("remote queue of %d bytes: want positive: %w", c.RemoteQueueBytes, ErrConfig)
	case c.ClientQuotaBytes <= 0:
		return fmt.Errorf("client quota %d bytes: want positive: %w", c.ClientQuotaBytes, ErrConfig)
	case c.MaxClients < 1:
		return fmt.Errorf("max clients %d: want at least 1: %w", c.MaxClients, ErrConfig)
	case c.CopyWorkers < 1 || c.CopyWorkers > 64:
		return fmt.Errorf("copy workers %d: want 1 to 64: %w", c.CopyWorkers, ErrConfig)
	case c.RequestTimeout <= 0:
		return fmt.Errorf("request timeout %v: want positive: %w", c.RequestTimeout, ErrConfig)
	}
	return nil
}
