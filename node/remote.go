package node

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

// RemoteStore is what the remote tier needs of the store it writes through to:
// batch calls on named objects, write-once as the arena's. storage/redisstore's
// Store is one; Config.OpenRemote opens it. The interface is node's, so that
// the service does not depend on the one store that implements it today.
type RemoteStore interface {
	// PutObjects stores each object, write-once; one error per object.
	PutObjects(ctx context.Context, objs []storage.Object) []error
	// GetObjects reads each object into its runs; one error per object, one
	// wrapping storage.ErrNotFound for a miss.
	GetObjects(ctx context.Context, objs []storage.Object) []error
	// ExistsObjects returns how many of names, from the first, exist in format.
	ExistsObjects(ctx context.Context, names []string, format storage.Format) (int, error)
	// RemoveObject removes name's object in every format, reporting whether
	// there was one.
	RemoveObject(ctx context.Context, name string) (bool, error)
	Close() error
}

// RemoteConfig is how to reach the remote store, as the service's Config
// says: the seed addresses and the credentials and TLS settings, the password
// read from its file.
type RemoteConfig struct {
	Addrs    []string
	Username string
	Password string
	TLS      *tls.Config // nil: no TLS
	Logger   *slog.Logger
}

// RemoteOpener opens the remote store. The service calls it until it
// succeeds, backing off while the store is unreachable, and gives up at once
// on an error wrapping storage.ErrConfig (refused credentials or TLS).
type RemoteOpener func(ctx context.Context, cfg RemoteConfig) (RemoteStore, error)

// remoteTier is the service's write-through to a Redis Cluster shared by every
// node: puts reach it asynchronously (bounded), and a get that misses the arena
// and the spill looks there and promotes what it finds into the arena. Objects
// keep their names, so two node services on one Redis Cluster find each other's
// pages.
type remoteTier struct {
	s     *Server
	cfg   RemoteConfig
	open  RemoteOpener
	store atomic.Pointer[remoteStore] // nil until connected

	mu          sync.Mutex
	cond        *sync.Cond
	queue       []remoteJob
	queuedBytes int64
	// writing counts, by key, the write-throughs taken off the queue and not
	// yet finished: a remove waits for them (remove) on writeDone.
	writing   map[string]int
	writeDone *sync.Cond
	closed    bool
	wg        sync.WaitGroup
	ctx       context.Context
	cancel    context.CancelFunc

	// reach logs Redis going away and coming back, once each (outage.go).
	reach *outage

	written, writeFailed, dropped, hits, misses, faults atomic.Int64
}

// remoteStore holds the connected store, for an atomic pointer to it.
type remoteStore struct{ RemoteStore }

type remoteJob struct {
	key    string
	format uint64
	size   int64
}

// remoteBatch is the most objects one write-through pipeline carries.
const remoteBatch = 64

func newRemoteTier(s *Server, cfg RemoteConfig, open RemoteOpener) *remoteTier {
	r := &remoteTier{s: s, cfg: cfg, open: open, writing: map[string]int{},
		reach: newOutage(s.log, "Redis", "serving without it (writes through are dropped, its objects are misses) and retrying")}
	r.cond = sync.NewCond(&r.mu)
	r.writeDone = sync.NewCond(&r.mu)
	r.ctx, r.cancel = context.WithCancel(context.Background())
	r.wg.Add(3)
	go r.connect()
	go r.writer()
	go r.writer()
	return r
}

// connect opens the Redis store, retrying while it is unreachable: the service
// serves its own tiers meanwhile.
func (r *remoteTier) connect() {
	defer r.wg.Done()
	backoff := 100 * time.Millisecond
	for {
		ctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
		st, err := r.open(ctx, r.cfg)
		cancel()
		if errors.Is(err, storage.ErrConfig) {
			// Refused credentials or TLS: retrying cannot help, and a WARN every
			// few seconds forever hides it. Said once, loudly; the service serves
			// its own tiers.
			r.s.log.Error("node service: Redis refused the connection's configuration; not writing through: fix --remote-username, --remote-password-file or the --remote-tls settings and restart",
				"addrs", r.s.cfg.RemoteAddrs, "err", err)
			return
		}
		if err == nil {
			r.store.Store(&remoteStore{st})
			r.reach.ok("addrs", r.s.cfg.RemoteAddrs)
			r.s.log.Info("node service: writing through to Redis", "addrs", r.s.cfg.RemoteAddrs)
			return
		}
		r.reach.fail(err, "addrs", r.s.cfg.RemoteAddrs)
		select {
		case <-r.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

func (r *remoteTier) close() {
	r.cancel()
	r.mu.Lock()
	r.closed = true
	r.cond.Broadcast()
	r.writeDone.Broadcast()
	r.mu.Unlock()
	r.wg.Wait()
	if st := r.store.Load(); st != nil {
		_ = st.Close()
	}
}

// enqueue queues an object just committed to the arena for write-through; beyond
// the queue bound it is dropped (counted): Redis is a shared cache, not a log.
func (r *remoteTier) enqueue(key string, format uint64, size int64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed || r.queuedBytes+size > r.s.cfg.RemoteQueueBytes {
		r.dropped.Add(1)
		return
	}
	r.queue = append(r.queue, remoteJob{key, format, size})
	r.queuedBytes += size
	r.cond.Signal()
}

func (r *remoteTier) writer() {
	defer r.wg.Done()
	for {
		r.mu.Lock()
		for len(r.queue) == 0 && !r.closed {
			r.cond.Wait()
		}
		if r.closed {
			r.mu.Unlock()
			return
		}
		n := min(len(r.queue), remoteBatch)
		jobs := append([]remoteJob(nil), r.queue[:n]...)
		r.queue = r.queue[n:]
		for _, j := range jobs {
			r.queuedBytes -= j.size
			r.writing[j.key]++
		}
		r.mu.Unlock()
		r.write(jobs)
		r.mu.Lock()
		for _, j := range jobs {
			if r.writing[j.key]--; r.writing[j.key] == 0 {
				delete(r.writing, j.key)
			}
		}
		r.writeDone.Broadcast()
		r.mu.Unlock()
	}
}

// remove removes key's object from Redis once no write-through of it is in
// flight: one that read the object from the arena before the remove took it
// out would otherwise store it in Redis again after the remove. A write
// queued but not started finds the arena without the object and is dropped.
// The service's remove holds the key out of the arena (arena.BeginRemove)
// meanwhile, so no new write of it can start.
func (r *remoteTier) remove(ctx context.Context, key string) (bool, error) {
	r.mu.Lock()
	for r.writing[key] > 0 && !r.closed {
		r.writeDone.Wait() // a write is bounded by the request timeout
	}
	r.mu.Unlock()
	st := r.store.Load()
	if st == nil {
		return false, nil
	}
	return st.RemoveObject(ctx, key)
}

// write sends jobs to Redis from the arena, leasing each object for the copy.
func (r *remoteTier) write(jobs []remoteJob) {
	st := r.store.Load()
	if st == nil {
		r.dropped.Add(int64(len(jobs)))
		return
	}
	var objs []storage.Object
	var leases []*arena.Lease
	for _, j := range jobs {
		l, err := r.s.arena.Acquire(j.key, j.format)
		if err != nil {
			r.dropped.Add(1) // evicted before it could be written: the spill has it
			continue
		}
		leases = append(leases, l)
		objs = append(objs, storage.Object{Name: j.key, Format: storage.Format(j.format), Runs: [][]byte{l.Bytes()}})
	}
	if len(objs) == 0 {
		return
	}
	if h := r.s.cfg.hooks; h != nil && h.writingThrough != nil {
		keys := make([]string, len(objs))
		for i, o := range objs {
			keys[i] = o.Name
		}
		h.writingThrough(keys)
	}
	ctx, cancel := context.WithTimeout(r.ctx, r.s.cfg.RequestTimeout)
	errs := st.PutObjects(ctx, objs)
	cancel()
	for _, l := range leases {
		l.Release()
	}
	r.noteErrs(errs)
	for _, err := range errs {
		if err != nil {
			r.s.log.Debug("write-through to Redis failed", "err", err)
			r.writeFailed.Add(1)
			if storage.FaultKind(err) != "" {
				r.faults.Add(1)
			}
			continue
		}
		r.written.Add(1)
	}
}

// noteErrs tells the outage tracker how a batch went: a fault that says Redis
// did not answer (unavailable, a timeout) is a failure, any answer (a miss
// included) is an answer.
func (r *remoteTier) noteErrs(errs []error) {
	var fault error
	answered := false
	for _, err := range errs {
		switch storage.FaultKind(err) {
		case "unavailable", "timeout":
			fault = err
		default:
			answered = true
		}
	}
	switch {
	case answered:
		r.reach.ok("addrs", r.s.cfg.RemoteAddrs)
	case fault != nil:
		r.reach.fail(fault, "addrs", r.s.cfg.RemoteAddrs)
	}
}

// exists returns how many of keys, from the start, Redis has.
func (r *remoteTier) exists(ctx context.Context, keys []string, format uint64) int {
	st := r.store.Load()
	if st == nil || len(keys) == 0 {
		return 0
	}
	n, err := st.ExistsObjects(ctx, keys, storage.Format(format))
	if err != nil {
		r.faults.Add(1)
		return 0
	}
	return n
}

// fetchRemote fills the missed items of a get from Redis: each into a fresh
// arena extent (promoted) when there is room, else into a buffer of the
// service's own, and from there into the client's ranges under the fault guard.
// results[i] is updated for every item it finds.
func (c *session) fetchRemote(ctx context.Context, items []wire.Item, w *window, missed []int, results []wire.Result) {
	r := c.srv.remote
	st := r.store.Load()
	if st == nil || len(missed) == 0 {
		return
	}
	type pending struct {
		i   int
		res resolved
		p   *arena.Pending // nil: no room in the arena, fetched into buf
		buf []byte
	}
	var objs []storage.Object
	var ps []pending
	// Items another request is writing into the arena meanwhile are read from it
	// once this request holds no pending write of its own: waiting for them while
	// holding ours could wait on a request that waits on us.
	var later []int
	defer func() {
		for _, i := range later {
			results[i] = c.getItem(ctx, items[i], w)
		}
	}()
	for _, i := range missed {
		it := items[i]
		res, err := c.resolve(it, w)
		if err != nil {
			continue
		}
		p, err := c.srv.arena.Reserve(it.Key, it.Format, res.size)
		var buf []byte
		switch {
		case err == nil:
			buf = p.Bytes()
		case errors.Is(err, arena.ErrExists):
			// Promoted or put by another request meanwhile: read it from the arena.
			res.done()
			later = append(later, i)
			continue
		default:
			// No room: not promoted, and fetched into a buffer of the service's own,
			// never straight into the client's memory (see bounce).
			p, buf = nil, bounce(res.size)
		}
		ps = append(ps, pending{i, res, p, buf})
		objs = append(objs, storage.Object{Name: it.Key, Format: storage.Format(it.Format), Runs: [][]byte{buf}})
	}
	if len(objs) == 0 {
		return
	}
	if h := c.srv.cfg.hooks; h != nil && h.beforeRemoteGet != nil {
		h.beforeRemoteGet() // tests: look at the counters mid-request
	}
	errs := st.GetObjects(ctx, objs)
	r.noteErrs(errs)
	for k, pd := range ps {
		err := errs[k]
		switch {
		case err == nil:
			cerr := pd.res.win.copyOut(pd.res.runs, pd.buf)
			// The arena's copy is whole even when the client's memory faulted:
			// promote it for the next reader.
			if pd.p != nil && pd.p.Commit() == nil {
				c.srv.st.promotions.Add(1)
			}
			if cerr != nil {
				results[pd.i] = c.copyFailed(items[pd.i], pd.res, cerr)
				break
			}
			results[pd.i] = wire.Result{}
			r.hits.Add(1)
			c.objects.Add(1)
			c.bytesOut.Add(pd.res.size)
			c.srv.st.getBytes.Add(pd.res.size)
		default:
			if pd.p != nil {
				pd.p.Abort()
			}
			r.misses.Add(1)
			if storage.FaultKind(err) != "" {
				r.faults.Add(1)
			}
		}
		pd.res.done()
	}
}

// RemoteStats is the write-through tier's activity, in objects.
type RemoteStats struct {
	// Addrs are the configured Redis seed addresses.
	Addrs []string `json:"addrs"`
	// Connected is false until the service has reached Redis once.
	Connected bool `json:"connected"`
	// QueuedBytes are waiting to be written through.
	QueuedBytes int64 `json:"queuedBytes"`
	// Written reached Redis; WriteFailed were refused or hit a fault; Dropped were
	// never sent (queue full, Redis not connected, or evicted from the arena first).
	Written     int64 `json:"written"`
	WriteFailed int64 `json:"writeFailed"`
	Dropped     int64 `json:"dropped"`
	// Hits are local misses Redis served (promoted into the arena when it had
	// room); Misses are local misses Redis did not have either.
	Hits   int64 `json:"hits"`
	Misses int64 `json:"misses"`
	// Faults counts Redis errors other than a miss.
	Faults int64 `json:"faults"`
}

func (r *remoteTier) stats() *RemoteStats {
	r.mu.Lock()
	q := r.queuedBytes
	r.mu.Unlock()
	return &RemoteStats{Addrs: r.s.cfg.RemoteAddrs, Connected: r.store.Load() != nil, QueuedBytes: q,
		Written: r.written.Load(), WriteFailed: r.writeFailed.Load(), Dropped: r.dropped.Load(),
		Hits: r.hits.Load(), Misses: r.misses.Load(), Faults: r.faults.Load()}
}

// remoteConfig is the remote store configuration of cfg's remote tier: its
// addresses, its credentials (the password read from RemotePasswordFile) and
// its TLS settings. A file it cannot read is a configuration error, reported
// at start rather than as a Redis that never answers.
func remoteConfig(cfg Config, log *slog.Logger) (RemoteConfig, error) {
	rc := RemoteConfig{Addrs: cfg.RemoteAddrs, Username: cfg.RemoteUsername, Logger: log}
	if cfg.RemotePasswordFile != "" {
		raw, err := os.ReadFile(cfg.RemotePasswordFile)
		if err != nil {
			return rc, fmt.Errorf("--remote-password-file: %v: %w", err, ErrConfig)
		}
		rc.Password = strings.TrimRight(string(raw), "\r\n")
		if rc.Password == "" {
			return rc, fmt.Errorf("--remote-password-file %s is empty: put the Redis password in it: %w", cfg.RemotePasswordFile, ErrConfig)
		}
	}
	if cfg.RemoteTLS || cfg.RemoteTLSCAFile != "" || cfg.RemoteTLSServerName != "" {
		tc := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: cfg.RemoteTLSServerName}
		if cfg.RemoteTLSCAFile != "" {
			pem, err := os.ReadFile(cfg.RemoteTLSCAFile)
			if err != nil {
				return rc, fmt.Errorf("--remote-tls-ca: %v: %w", err, ErrConfig)
			}
			tc.RootCAs = x509.NewCertPool()
			if !tc.RootCAs.AppendCertsFromPEM(pem) {
				return rc, fmt.Errorf("--remote-tls-ca %s holds no PEM certificate: give the CA that signed the Redis servers' certificates: %w", cfg.RemoteTLSCAFile, ErrConfig)
			}
		}
		rc.TLS = tc
	}
	return rc, nil
}
