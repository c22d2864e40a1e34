package node

import (
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
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
	// ArenaFile, when set, is the arena's memory as a file on tmpfs or
	// hugetlbfs that outlives the process: a service restarted on it (after a
	// kill, a crash, an upgrade) serves every object that was committed in it.
	// One service per file. Its tmpfs must hold ArenaBytes plus 1/1024 for the
	// file's header; a reboot empties it (the spill directory survives). ""
	// is anonymous memory, empty at every start.
	ArenaFile string `json:"arena-file"`
	// ArenaFileFallback runs the service on anonymous memory, with one
	// warning, when ArenaFile cannot be used (not on tmpfs, or its tmpfs too
	// small) instead of refusing to start: for a default location the
	// operator did not choose (strata serve's, beside the socket).
	ArenaFileFallback bool `json:"-"`
	// ShutdownTimeout bounds Close: requests in flight get this long to
	// finish; then they are failed (their contexts canceled) and their
	// connections closed.
	ShutdownTimeout time.Duration `json:"shutdown-timeout"`
	// HighWatermark and LowWatermark bound the arena: past the high one, the least
	// recently used objects are evicted (to the spill directory when there is one)
	// until the low one.
	HighWatermark float64 `json:"high-watermark"`
	LowWatermark  float64 `json:"low-watermark"`
	// SpillDir is the SSD directory evicted objects go to (and are promoted back
	// from on a hit); "" means evicted objects are dropped.
	SpillDir string `json:"spill-dir"`
	// SpillBytes bounds the spill directory (the device's free space bounds it
	// too); past it the oldest segment file is dropped whole.
	SpillBytes int64 `json:"spill-capacity"`
	// SpillSegmentBytes is the size of the spill's segment files, the unit it
	// drops when full; 0 means 256 MiB. A spill smaller than eight segments
	// uses an eighth of its capacity.
	SpillSegmentBytes int64 `json:"spill-segment"`
	// SpillCompactBelow is the share of a finished spill segment that must
	// still be live for it to be left alone: below it, its live objects are
	// copied forward and its file deleted, so that removed objects' bytes come
	// back. 0.5 writes at most a byte per byte freed; lower writes less and
	// keeps more dead bytes, higher (up to 0.9) frees space sooner; 0 is off.
	SpillCompactBelow float64 `json:"spill-compact-below"`
	// SpillCompactRate bounds compaction's reads and writes in bytes per
	// second, so that it never takes the device from serving: 64 MiB/s is a
	// few percent of an NVMe drive; raise it where removes outpace it (the
	// spill's deadBytes keep growing). 0 means no bound.
	SpillCompactRate int64 `json:"spill-compact-rate"`
	// RemoteAddrs are the seed addresses of a Redis Cluster (or one Redis server)
	// that the service writes through to: puts are copied there asynchronously, and
	// a get that misses the arena and the spill looks there, so node services that
	// share the cluster find each other's pages. Empty: no remote tier.
	RemoteAddrs []string `json:"remote"`
	// OpenRemote opens the store at RemoteAddrs; required with them. The
	// service defines what it needs of the store (RemoteStore) and the caller
	// wires one in: strata serve, Redis (storage/redisstore).
	OpenRemote RemoteOpener `json:"-"`
	// RemoteQueueBytes bounds the bytes waiting to be written through; beyond it
	// writes are dropped (and counted) rather than queued.
	RemoteQueueBytes int64 `json:"remote-queue"`
	// RemoteUsername and RemotePasswordFile authenticate with Redis (AUTH): an ACL
	// user, or the default user's requirepass when RemoteUsername is empty. The
	// password is read from the file (trailing newline trimmed), never from a flag,
	// so that it stays out of ps and the environment.
	RemoteUsername     string `json:"remote-username"`
	RemotePasswordFile string `json:"remote-password-file"`
	// RemoteTLS talks TLS to Redis, verifying the servers against RemoteTLSCAFile
	// (PEM; "" means the system roots) and the name RemoteTLSServerName ("" means
	// the host of each address). Setting either of those implies RemoteTLS.
	RemoteTLS           bool   `json:"remote-tls"`
	RemoteTLSCAFile     string `json:"remote-tls-ca"`
	RemoteTLSServerName string `json:"remote-tls-server-name"`
	// TenantGroups lists groups of uids that share one object namespace (every
	// engine of a deployment); every other uid has a namespace of its own, so
	// users sharing the socket cannot read, remove or poison each other's
	// objects. Clients running as the service's own user, and any group that
	// includes it, share the unprefixed namespace.
	TenantGroups [][]int `json:"tenant-groups"`
	// MaxRegisteredBytes bounds the memory all clients together may register
	// (mapped into the service); a registration over it is refused. 0: no bound
	// beyond each client's quota.
	MaxRegisteredBytes int64 `json:"max-registered"`
	// ClientQuotaBytes bounds the memory one client may register (its host pools);
	// a registration over it is refused, and that pool runs without L3.
	ClientQuotaBytes int64 `json:"client-quota"`
	// MaxClients bounds concurrent clients.
	MaxClients int `json:"max-clients"`
	// MaxClientsPerUID bounds the connections of one Unix user (SO_PEERCRED), so
	// that one user's idle or runaway connections cannot take every slot from the
	// others (a deployment whose engines all run as one user and open more
	// connections raises it); 0 means MaxClients.
	MaxClientsPerUID int `json:"max-clients-per-uid"`
	// MaxSegmentsPerClient bounds the segments one client may register: each
	// holds a descriptor and a mapping in the service, and the quota counts bytes,
	// so many small segments could otherwise run the service out of descriptors.
	MaxSegmentsPerClient int `json:"max-segments-per-client"`
	// HelloTimeout bounds the wait for a new connection's Hello: a connection
	// that never introduces itself is closed and its slot freed.
	HelloTimeout time.Duration `json:"hello-timeout"`
	// FrameTimeout bounds the rest of a frame once its first byte arrived: a
	// client that sends part of a request and stalls is disconnected.
	FrameTimeout time.Duration `json:"frame-timeout"`
	// IdleTimeout, when positive, disconnects a client that sent nothing for that
	// long and has no request in flight (a well-behaved client reconnects on its
	// own); 0 keeps idle clients connected.
	IdleTimeout time.Duration `json:"idle-timeout"`
	// RequestMemoryBytes is a node-wide budget for the memory of requests in
	// flight (received frames, decoded items, replies). A request beyond it waits
	// up to RequestTimeout for memory to free up, then is answered busy. Users
	// (uids) share it: while others want some, one may hold only its share, and
	// an eighth more is kept for users holding little (budget.go).
	RequestMemoryBytes int64 `json:"request-memory"`
	// AdminStats is what the admin port's /stats serves: "full" (every client
	// with its name, pid, uid and segments to the service's own user and root,
	// as the kernel names the caller; another user sees its own tenant, as over
	// the socket), "counts" (totals only) or "off".
	AdminStats string `json:"admin-stats"`
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

// What the admin port's /stats serves (Config.AdminStats).
const (
	AdminStatsFull   = "full"
	AdminStatsCounts = "counts"
	AdminStatsOff    = "off"
)

// hooks are called, when set, at points inside request handling.
type hooks struct {
	// reserved runs when a put or a promotion has reserved key in the arena,
	// before it writes the object: until it returns, the write is pending.
	reserved func(key string)
	// awaiting runs when a request finds key's object not readable and is about
	// to wait for a write of it that may be pending.
	awaiting func(key string)
	// statsLimit, when positive, replaces the frame limit the Stats document
	// is kept under.
	statsLimit int
	// admitted runs when a batch request was admitted under the request memory
	// budget, on the goroutine that handles it, before it is handled.
	admitted func(t wire.Type)
	// beforeRemoteGet runs when a get asks Redis for the objects the local tiers
	// missed.
	beforeRemoteGet func()
	// promoting runs when a get has read key's object from the spill into the
	// arena and is about to commit it there.
	promoting func(key string)
	// writingThrough runs when the write-through to Redis has leased the
	// objects of keys from the arena, before it sends them.
	writingThrough func(keys []string)
	// copying runs when a get is about to copy an object into the client's
	// memory, its fence counter raised and its deadline checked.
	copying func()
	// spilling runs when the arena evicts key, before the spill stores it:
	// until it returns, the eviction is in flight.
	spilling func(key string)
	// warmed runs each time the arena's warm-up has given out a chunk of
	// memory (arena.Config.OnWarmup): ready of total bytes. It may block.
	warmed func(ready, total int64)
	// spillScanned runs as the spill's background index rebuild goes
	// (spill.Config.OnScan): scanned of total bytes. It may block, holding the scan.
	spillScanned func(scanned, total int64)
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

// DefaultConfig returns a service on socket with a 4 GiB anonymous arena,
// watermarks 0.90 and 0.85, no spill (64 GiB of 256 MiB segments when one is given), a 64 GiB
// per-client quota, 64 segments per client, 128 connections per user, 10 s
// Hello and frame timeouts, no idle timeout, 256 MiB of request memory, a 10 s
// shutdown and an admin port on a free loopback port serving full stats.
func DefaultConfig(socket string) Config {
	return Config{
		Socket:               socket,
		SocketMode:           0o600,
		Admin:                "127.0.0.1:0",
		ArenaBytes:           4 << 30,
		HighWatermark:        0.90,
		LowWatermark:         0.85,
		SpillBytes:           64 << 30,
		SpillSegmentBytes:    256 << 20,
		SpillCompactBelow:    0.5,
		SpillCompactRate:     64 << 20,
		ClientQuotaBytes:     64 << 30,
		RemoteQueueBytes:     1 << 30,
		MaxClients:           256,
		MaxClientsPerUID:     128,
		MaxSegmentsPerClient: 64,
		HelloTimeout:         10 * time.Second,
		FrameTimeout:         10 * time.Second,
		RequestMemoryBytes:   256 << 20,
		AdminStats:           AdminStatsFull,
		CopyWorkers:          2,
		RequestTimeout:       30 * time.Second,
		ShutdownTimeout:      10 * time.Second,
	}
}

// Validate reports whether c can run.
func (c Config) Validate() error {
	switch {
	case c.Socket == "":
		return fmt.Errorf("no socket path (--socket): %w", ErrConfig)
	case len(c.Socket) > 107:
		return fmt.Errorf("socket path %q (--socket) is %d bytes; Unix socket paths hold at most 107: %w", c.Socket, len(c.Socket), ErrConfig)
	case c.SocketMode&^0o777 != 0 || c.SocketMode&0o600 != 0o600:
		return fmt.Errorf("socket mode %#o (--socket-mode): want permission bits that include 0600: %w", c.SocketMode, ErrConfig)
	case c.ArenaBytes < 1<<20:
		return fmt.Errorf("arena of %d bytes (--arena): want at least 1 MiB: %w", c.ArenaBytes, ErrConfig)
	case !(c.LowWatermark > 0 && c.LowWatermark < c.HighWatermark && c.HighWatermark <= 1):
		return fmt.Errorf("watermarks low %v, high %v (--low-watermark, --high-watermark): want 0 < low < high <= 1: %w", c.LowWatermark, c.HighWatermark, ErrConfig)
	case c.SpillDir != "" && c.SpillBytes <= 0:
		return fmt.Errorf("spill capacity %d bytes (--spill-capacity): want positive: %w", c.SpillBytes, ErrConfig)
	case !(c.SpillCompactBelow >= 0 && c.SpillCompactBelow <= 0.9):
		return fmt.Errorf("spill compaction below %v live (--spill-compact-below): want 0 (off) to 0.9: %w", c.SpillCompactBelow, ErrConfig)
	case c.SpillCompactRate < 0:
		return fmt.Errorf("spill compaction rate %d bytes/s (--spill-compact-rate): want 0 (no bound) or more: %w", c.SpillCompactRate, ErrConfig)
	case c.SpillSegmentBytes != 0 && (c.SpillSegmentBytes < 1<<20 || c.SpillSegmentBytes > 64<<30):
		return fmt.Errorf("spill segments of %d bytes (--spill-segment): want 1 MiB to 64 GiB, or 0 for 256 MiB: %w", c.SpillSegmentBytes, ErrConfig)
	case len(c.RemoteAddrs) > 0 && c.RemoteQueueBytes <= 0:
		return fmt.Errorf("remote queue of %d bytes (--remote-queue): want positive: %w", c.RemoteQueueBytes, ErrConfig)
	case len(c.RemoteAddrs) > 0 && c.OpenRemote == nil:
		return fmt.Errorf("remote addresses %v without OpenRemote: wire in the store that serves them (storage/redisstore for Redis): %w", c.RemoteAddrs, ErrConfig)
	case c.MaxRegisteredBytes < 0:
		return fmt.Errorf("max registered %d bytes (--max-registered): want 0 (no node-wide bound) or more: %w", c.MaxRegisteredBytes, ErrConfig)
	case c.ClientQuotaBytes <= 0:
		return fmt.Errorf("client quota %d bytes (--client-quota): want positive: %w", c.ClientQuotaBytes, ErrConfig)
	case c.MaxClients < 1:
		return fmt.Errorf("max clients %d (--max-clients): want at least 1: %w", c.MaxClients, ErrConfig)
	case c.CopyWorkers < 1 || c.CopyWorkers > 64:
		return fmt.Errorf("copy workers %d (--copy-workers): want 1 to 64: %w", c.CopyWorkers, ErrConfig)
	case c.RequestTimeout <= 0:
		return fmt.Errorf("request timeout %v (--request-timeout): want positive: %w", c.RequestTimeout, ErrConfig)
	case c.ShutdownTimeout < 0:
		return fmt.Errorf("shutdown timeout %v (--shutdown-timeout): want 0 (fail requests in flight at once) or more: %w", c.ShutdownTimeout, ErrConfig)
	case c.MaxClientsPerUID < 0:
		return fmt.Errorf("max clients per uid %d (--max-clients-per-uid): want 0 (max clients) or more: %w", c.MaxClientsPerUID, ErrConfig)
	case c.MaxSegmentsPerClient < 1:
		return fmt.Errorf("max segments per client %d (--max-segments-per-client): want at least 1: %w", c.MaxSegmentsPerClient, ErrConfig)
	case c.HelloTimeout <= 0 || c.FrameTimeout <= 0 || c.IdleTimeout < 0:
		return fmt.Errorf("hello timeout %v, frame timeout %v, idle timeout %v (--hello-timeout, --frame-timeout, --idle-timeout): want positive (idle: 0 for none): %w", c.HelloTimeout, c.FrameTimeout, c.IdleTimeout, ErrConfig)
	case c.RequestMemoryBytes < wire.MaxBody:
		return fmt.Errorf("request memory %d bytes (--request-memory): want at least one largest frame, %d bytes: %w", c.RequestMemoryBytes, wire.MaxBody, ErrConfig)
	case c.AdminStats != AdminStatsFull && c.AdminStats != AdminStatsCounts && c.AdminStats != AdminStatsOff:
		return fmt.Errorf("admin stats %q (--admin-stats): want %q, %q or %q: %w", c.AdminStats, AdminStatsFull, AdminStatsCounts, AdminStatsOff, ErrConfig)
	}
	return nil
}
