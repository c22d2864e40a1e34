package main

import (
	"fmt"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node"
)

// serveSettings binds every setting of `strata serve` to its flag, its environment
// variable (STRATA_ + the flag's name in capitals, dashes as underscores) and its
// key in the JSON config file: one name, three places. Precedence: flag, then
// environment, then file, then default.
type serveSettings struct {
	cfg      node.Config
	settings map[string]*setting
	level    slog.Level
	config   string
	// arenaFileSet: --arena-file was given (flag, environment or file);
	// otherwise the arena file goes beside the socket (defaultArenaFile).
	arenaFileSet bool
}

// setting is one setting of `strata serve`: how to read it from text (a flag, an
// environment variable) and what kind of value it takes, which decides the JSON
// types the config file may give it and the type -h shows.
type setting struct {
	usage string
	kind  settingKind
	set   func(string) error
	get   func() string // the current value as text, shown as the default
}

// settingKind is the type of a setting's value.
type settingKind string

const (
	kindString   settingKind = "string"
	kindSize     settingKind = "size"
	kindFloat    settingKind = "number"
	kindInt      settingKind = "int"
	kindDuration settingKind = "duration"
	kindBool     settingKind = "bool"
	kindMode     settingKind = "mode"
	kindList     settingKind = "list"
	kindGroups   settingKind = "groups"
	kindLevel    settingKind = "level"
)

// defaultAdmin is strata serve's admin port when --admin is not given.
const defaultAdmin = "127.0.0.1:9470"

func newServeSettings() *serveSettings {
	s := &serveSettings{cfg: node.DefaultConfig("/run/strata/strata.sock"), settings: map[string]*setting{}}
	c := &s.cfg
	// A service an operator runs keeps its metrics where Prometheus looks
	// (deploy/prometheus/strata.yml) across restarts; a service embedded in
	// a bench or a test keeps node's default, a port of its own.
	c.Admin = defaultAdmin
	add := func(name, usage string, kind settingKind, set func(string) error, get func() string) {
		s.settings[name] = &setting{usage: usage, kind: kind, set: set, get: get}
	}
	str := func(name, usage string, dst *string) {
		add(name, usage, kindString, func(v string) error { *dst = v; return nil }, func() string { return *dst })
	}
	size := func(name, usage string, dst *int64) {
		add(name, usage, kindSize, func(v string) error {
			n, err := parseBytes(v)
			*dst = n
			return err
		}, func() string { return hostmem.FormatSize(*dst) })
	}
	frac := func(name, usage string, dst *float64) {
		add(name, usage, kindFloat, func(v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("%q is not a number", v)
			}
			*dst = f
			return nil
		}, func() string { return strconv.FormatFloat(*dst, 'g', -1, 64) })
	}
	duration := func(name, usage string, dst *time.Duration) {
		add(name, usage, kindDuration, func(v string) error {
			d, err := time.ParseDuration(v)
			if err != nil {
				return fmt.Errorf("%q is not a duration such as 10s or 5m", v)
			}
			*dst = d
			return nil
		}, func() string { return dst.String() })
	}
	integer := func(name, usage string, dst *int) {
		add(name, usage, kindInt, func(v string) error {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%q is not an integer", v)
			}
			*dst = n
			return nil
		}, func() string { return strconv.Itoa(*dst) })
	}
	str("socket", "Unix socket engines connect to; its directory is created (0755) if missing", &c.Socket)
	add("socket-mode", "socket permission bits, octal (0600: the service's user only; 0660 with --socket-group)", kindMode, func(v string) error {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			return fmt.Errorf("%q is not an octal mode such as 0600", v)
		}
		c.SocketMode = os.FileMode(m)
		return nil
	}, func() string { return fmt.Sprintf("%#o", c.SocketMode) })
	str("socket-group", "group (name or id) the socket belongs to", &c.SocketGroup)
	str("admin", "loopback address of the admin port (/healthz, /metrics, /stats), where deploy/prometheus/strata.yml scrapes; refused when taken; port 0 picks one; empty turns it off", &c.Admin)
	size("arena", "DRAM arena size, e.g. 4GiB", &c.ArenaBytes)
	add("arena-file", "the arena's memory as a file on tmpfs or hugetlbfs, so that a restarted service (after a kill, a crash, an upgrade) finds its objects again; its tmpfs must hold --arena; one service per file; '' for anonymous memory, empty at every start. "+
		"By default beside the socket (/run/strata/strata.sock: /run/strata/strata.arena), falling back to anonymous memory with a warning when that is no tmpfs large enough",
		kindString, func(v string) error { c.ArenaFile, s.arenaFileSet = v, true; return nil },
		func() string {
			if s.arenaFileSet {
				return c.ArenaFile
			}
			return defaultArenaFile(c.Socket)
		})
	duration("shutdown-timeout", "on SIGTERM, time requests in flight get to finish before they are failed, e.g. 10s", &c.ShutdownTimeout)
	frac("high-watermark", "arena fill that starts eviction", &c.HighWatermark)
	frac("low-watermark", "arena fill eviction stops at", &c.LowWatermark)
	str("spill-dir", "SSD directory for evicted objects, created 0700 if missing; it must be the service user's own and closed to others (checked at start) (empty: drop them)", &c.SpillDir)
	size("spill-capacity", "spill directory size bound, e.g. 500GiB; past it (or the device's free space) the oldest segment file goes", &c.SpillBytes)
	size("spill-segment", "size of the spill's append-only segment files, the unit dropped when full (a spill under eight segments uses an eighth of its capacity)", &c.SpillSegmentBytes)
	frac("spill-compact-below", "a spill segment less live than this is compacted (its live objects copied forward, its file deleted) so removed objects' space comes back; 0 is off, at most 0.9", &c.SpillCompactBelow)
	size("spill-compact-rate", "bytes per second compaction may read and write, e.g. 64MiB (0: no bound)", &c.SpillCompactRate)
	add("remote", "Redis Cluster (or server) addresses to write through to, comma-separated (a JSON array in --config) (empty: none)", kindList, func(v string) error {
		c.RemoteAddrs = nil
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				c.RemoteAddrs = append(c.RemoteAddrs, a)
			}
		}
		return nil
	}, func() string { return strings.Join(c.RemoteAddrs, ",") })
	size("remote-queue", "bytes waiting to be written through to Redis before writes are dropped, e.g. 1GiB", &c.RemoteQueueBytes)
	size("client-quota", "memory one client may register, e.g. 64GiB", &c.ClientQuotaBytes)
	size("max-registered", "memory all clients together may register, e.g. 512GiB (0: no node-wide bound)", &c.MaxRegisteredBytes)
	add("tenant-groups", "uids (or user names) that share one object namespace, groups separated by ';', e.g. \"1000,1001;2000,2001\" (an array of arrays in --config); every other uid has its own", kindGroups, func(v string) error {
		g, err := node.ParseTenantGroups(v)
		c.TenantGroups = g
		return err
	}, func() string { return formatGroups(c.TenantGroups) })
	str("remote-username", "Redis ACL user (empty: the default user)", &c.RemoteUsername)
	str("remote-password-file", "file holding the Redis password (empty: no AUTH)", &c.RemotePasswordFile)
	add("remote-tls", "talk TLS to Redis (implied by --remote-tls-ca and --remote-tls-server-name)", kindBool, func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		c.RemoteTLS = b
		return nil
	}, func() string { return strconv.FormatBool(c.RemoteTLS) })
	str("remote-tls-ca", "PEM file of the CA that signed the Redis servers' certificates (empty: the system roots)", &c.RemoteTLSCAFile)
	str("remote-tls-server-name", "name the Redis servers' certificates are checked against (empty: each address's host)", &c.RemoteTLSServerName)
	integer("max-clients", "most clients at once", &c.MaxClients)
	integer("max-clients-per-uid", "most connections of one Unix user (0: --max-clients)", &c.MaxClientsPerUID)
	integer("max-segments-per-client", "most segments (host pools) one client may register", &c.MaxSegmentsPerClient)
	duration("hello-timeout", "time a new connection has to send its Hello, e.g. 10s", &c.HelloTimeout)
	duration("frame-timeout", "time a started frame has to arrive whole, e.g. 10s", &c.FrameTimeout)
	duration("idle-timeout", "disconnect a client silent this long with no request in flight, e.g. 10m (0: never)", &c.IdleTimeout)
	size("request-memory", "node-wide budget for the memory of requests in flight, e.g. 256MiB", &c.RequestMemoryBytes)
	str("admin-stats", "what the admin port's /stats serves: full (every client to the service's user and root, its own tenant to any other user), counts (no client names, pids, uids or segments) or off", &c.AdminStats)
	integer("copy-workers", "goroutines that copy one batch's objects", &c.CopyWorkers)
	duration("request-timeout", "bound on one request, e.g. 30s", &c.RequestTimeout)
	add("log-level", "debug, info, warn or error", kindLevel, func(v string) error { return s.level.UnmarshalText([]byte(v)) },
		func() string { return strings.ToLower(s.level.String()) })
	return s
}

func formatGroups(groups [][]int) string {
	out := make([]string, len(groups))
	for i, g := range groups {
		ids := make([]string, len(g))
		for j, id := range g {
			ids[j] = strconv.Itoa(id)
		}
		out[i] = strings.Join(ids, ",")
	}
	return strings.Join(out, ";")
}

func envName(flag string) string {
	return "STRATA_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
}

func (s *serveSettings) names() []string {
	out := make([]string, 0, len(s.settings))
	for n := range s.settings {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
