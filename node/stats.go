package node

import (
	"encoding/json"
	"sort"
	"sync/atomic"
	"time"

	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/spill"
)

// counters are the service's totals.
type counters struct {
	puts, putObjects, putBytes, putSkipped          atomic.Int64
	gets, arenaHits, spillHits, misses, getBytes    atomic.Int64
	promotions, exists, removes                     atomic.Int64
	badRanges, noSpace, corrupt, refused, malformed atomic.Int64
	spillErrors, busy, pastDeadline                 atomic.Int64
	acceptErrors, rejected, timedOut, memoryBusy    atomic.Int64
}

// Stats is the service's state: what `strata inspect` prints and /stats serves.
type Stats struct {
	Version string        `json:"version"`
	Uptime  time.Duration `json:"uptime"`
	Socket  string        `json:"socket"`
	Admin   string        `json:"admin,omitempty"`
	// Scope says whose clients the document shows: "service" (every client:
	// the admin port, and clients running as the service's own user or as
	// root) or "tenant" (a client of another user asked over the socket: its
	// own tenant's clients and counts, beside the service's totals; see
	// Server.statsFor).
	Scope string `json:"scope"`
	// Clients lists the connected clients with their segments. In a document
	// too large for one frame, Abridged says the segment and refusal lists were
	// left out, and ClientsOmitted how many clients did not fit at all; the
	// admin port's counts view (--admin-stats=counts) leaves it out whole.
	Clients        []ClientStats `json:"clients"`
	Abridged       bool          `json:"abridged,omitempty"`
	ClientsOmitted int           `json:"clientsOmitted,omitempty"`
	// ClientCount, SegmentCount and RegisteredBytes total the clients (of the
	// scope).
	ClientCount     int   `json:"clientCount"`
	SegmentCount    int   `json:"segmentCount"`
	RegisteredBytes int64 `json:"registeredBytes"`
	// Accepting is false while the socket cannot accept new clients (out of
	// descriptors); AcceptError says why.
	Accepting   bool   `json:"accepting"`
	AcceptError string `json:"acceptError,omitempty"`
	// RequestMemory is the budget of request memory in flight.
	RequestMemory RequestMemoryStats `json:"requestMemory"`
	// Arena is the DRAM tier, Spill the SSD tier (nil without one).
	Arena arena.Stats  `json:"arena"`
	Spill *spill.Stats `json:"spill,omitempty"`
	// Remote is the write-through to Redis (nil without one).
	Remote *RemoteStats `json:"remote,omitempty"`
	// Ops counts requests and objects since the service started.
	Ops OpStats `json:"ops"`
	// Start is how the service's start went and whether it is ready yet
	// (start.go).
	Start StartStats `json:"start"`
}

// OpStats counts what the service did.
type OpStats struct {
	Puts        int64 `json:"puts"`
	PutObjects  int64 `json:"putObjects"`
	PutBytes    int64 `json:"putBytes"`
	PutSkipped  int64 `json:"putSkipped"`
	Gets        int64 `json:"gets"`
	ArenaHits   int64 `json:"arenaHits"`
	SpillHits   int64 `json:"spillHits"`
	Misses      int64 `json:"misses"`
	GetBytes    int64 `json:"getBytes"`
	Promotions  int64 `json:"promotions"`
	Exists      int64 `json:"exists"`
	Removes     int64 `json:"removes"`
	BadRanges   int64 `json:"badRanges"`
	NoSpace     int64 `json:"noSpace"`
	Corrupt     int64 `json:"corrupt"`
	Refused     int64 `json:"refusedRegistrations"`
	Malformed   int64 `json:"malformed"`
	SpillErrors int64 `json:"spillErrors"`
	// Busy counts put items answered Busy: another request was still writing
	// the object when the request timed out, so it is not stored yet.
	Busy int64 `json:"busy"`
	// PastDeadline counts items not copied (nor stored) because the client's
	// deadline had passed: the client had given up on them (window.go).
	PastDeadline int64 `json:"pastDeadline"`
	// AcceptErrors counts failed accepts on the socket (retried); Rejected,
	// connections refused for --max-clients or --max-clients-per-uid;
	// TimedOut, clients disconnected by the hello, frame or idle timeout;
	// MemoryBusy, requests answered busy because the request memory budget
	// (or their user's share of it, see RequestMemoryStats) stayed full.
	AcceptErrors int64   `json:"acceptErrors"`
	Rejected     int64   `json:"rejectedConnections"`
	TimedOut     int64   `json:"timedOut"`
	MemoryBusy   int64   `json:"memoryBusy"`
	HitRatio     float64 `json:"hitRatio"`
}

// ClientStats is one connected client.
type ClientStats struct {
	ID              uint64         `json:"id"`
	Name            string         `json:"name"`
	PID             int            `json:"pid"`
	UID             int            `json:"uid"`
	RegisteredBytes int64          `json:"registeredBytes"`
	SegmentCount    int            `json:"segmentCount"`
	Segments        []SegmentStats `json:"segments"`
	// Refused lists registrations the service refused, with the reason: those
	// pools run without L3. It keeps the first few; RefusedOmitted counts the
	// rest, so that a client looping through refusals costs no memory.
	Refused        []string `json:"refused,omitempty"`
	RefusedOmitted int64    `json:"refusedOmitted,omitempty"`
	Requests       int64    `json:"requests"`
	Objects        int64    `json:"objects"`
	BytesIn        int64    `json:"bytesIn"`
	BytesOut       int64    `json:"bytesOut"`
}

// SegmentStats is one registered segment (a host pool).
type SegmentStats struct {
	ID    uint32 `json:"id"`
	Name  string `json:"name"`
	Bytes int64  `json:"bytes"`
}

// Stats returns a snapshot of the service, every client included.
func (s *Server) Stats() Stats { return s.statsFor(nil) }

// Scopes of a Stats document.
const (
	ScopeService = "service"
	ScopeTenant  = "tenant"
)

// statsFor returns the snapshot that the client viewer may see; nil is the
// whole service. A client of another user than the service's (and not root)
// sees only the clients of its own tenant (its namespace: its uid, or its
// tenant group) in the client list and the client totals, and the service's
// totals (tiers, operations, request memory) that name no client: users who
// share the socket learn nothing of each other's processes, pools or activity.
// The service's own user and root can read the service's memory and spill
// anyway, so they see everything.
func (s *Server) statsFor(viewer *session) Stats {
	st := Stats{
		Version: serverVersion(),
		Scope:   ScopeService,
		Uptime:  time.Since(s.started).Round(time.Millisecond),
		Socket:  s.cfg.Socket,
		Admin:   s.AdminAddr(),
		Arena:   s.arena.Stats(),
	}
	st.Start = s.startStats(st.Arena)
	if s.spill != nil {
		fs := s.spill.Stats()
		st.Spill = &fs
	}
	if s.remote != nil {
		st.Remote = s.remote.stats()
	}
	c := &s.st
	st.Ops = OpStats{
		Puts: c.puts.Load(), PutObjects: c.putObjects.Load(), PutBytes: c.putBytes.Load(), PutSkipped: c.putSkipped.Load(),
		Gets: c.gets.Load(), ArenaHits: c.arenaHits.Load(), SpillHits: c.spillHits.Load(), Misses: c.misses.Load(),
		GetBytes: c.getBytes.Load(), Promotions: c.promotions.Load(), Exists: c.exists.Load(), Removes: c.removes.Load(),
		BadRanges: c.badRanges.Load(), NoSpace: c.noSpace.Load(), Corrupt: c.corrupt.Load(), Refused: c.refused.Load(),
		Malformed: c.malformed.Load(), SpillErrors: c.spillErrors.Load(), Busy: c.busy.Load(), PastDeadline: c.pastDeadline.Load(),
		AcceptErrors: c.acceptErrors.Load(), Rejected: c.rejected.Load(), TimedOut: c.timedOut.Load(), MemoryBusy: c.memoryBusy.Load(),
	}
	st.Accepting = true
	if err := s.health(); err != nil {
		st.Accepting, st.AcceptError = false, err.Error()
	}
	st.RequestMemory = s.mem.stats()
	if n := st.Ops.ArenaHits + st.Ops.SpillHits + st.Ops.Misses; n > 0 {
		st.Ops.HitRatio = float64(st.Ops.ArenaHits+st.Ops.SpillHits) / float64(n)
	}
	s.mu.Lock()
	sessions := make([]*session, 0, len(s.sessions))
	for _, c := range s.sessions {
		sessions = append(sessions, c)
	}
	s.mu.Unlock()
	tenant := viewer != nil && !s.seesEveryone(viewer)
	if tenant {
		st.Scope = ScopeTenant
	}
	for _, c := range sessions {
		if !c.hello.Load() || tenant && c.ns != viewer.ns {
			continue
		}
		cs := ClientStats{ID: c.id, Name: c.name, PID: c.pid, UID: c.uid,
			Requests: c.ops.Load(), Objects: c.objects.Load(), BytesIn: c.bytesIn.Load(), BytesOut: c.bytesOut.Load()}
		c.mu.Lock()
		cs.RegisteredBytes = c.registered
		cs.Refused = append([]string(nil), c.refused...)
		cs.RefusedOmitted = c.refusedOmitted
		for _, seg := range c.segments {
			cs.Segments = append(cs.Segments, SegmentStats{ID: seg.id, Name: seg.name, Bytes: int64(len(seg.mem))})
		}
		c.mu.Unlock()
		sort.Slice(cs.Segments, func(i, j int) bool { return cs.Segments[i].ID < cs.Segments[j].ID })
		cs.SegmentCount = len(cs.Segments)
		st.ClientCount++
		st.SegmentCount += cs.SegmentCount
		st.RegisteredBytes += cs.RegisteredBytes
		st.Clients = append(st.Clients, cs)
	}
	sort.Slice(st.Clients, func(i, j int) bool { return st.Clients[i].ID < st.Clients[j].ID })
	return st
}

// seesEveryone reports whether client c may see every client in Stats: it runs
// as the service's own user (or in its tenant group: the empty namespace) or
// as root.
func (s *Server) seesEveryone(c *session) bool {
	return c.ns == "" || c.uidKnown && c.uid == 0
}

// counts is st without the clients' details (names, pids, uids, segments): what
// the admin port serves with --admin-stats=counts.
func (st Stats) counts() Stats {
	st.Clients, st.Abridged, st.ClientsOmitted = nil, false, 0
	return st
}

// document encodes st as JSON of at most limit bytes, whatever the clients
// did: past the limit it drops the per-client segment and refusal lists, then
// clients from the end of the list (counted in ClientsOmitted). A document over
// the frame limit would get no reply at all, and `strata inspect` would hang.
func (st Stats) document(limit int) []byte {
	doc, _ := json.Marshal(st)
	if len(doc) <= limit {
		return doc
	}
	st.Abridged = true
	clients := make([]ClientStats, len(st.Clients))
	for i, c := range st.Clients {
		c.Segments, c.Refused = nil, nil
		clients[i] = c
	}
	st.Clients = clients
	for keep := len(clients); ; keep /= 2 {
		st.Clients, st.ClientsOmitted = clients[:keep], len(clients)-keep
		doc, _ = json.Marshal(st)
		if len(doc) <= limit || keep == 0 {
			return doc
		}
	}
}
