package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/redisremote"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
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

func newServeSettings() *serveSettings {
	s := &serveSettings{cfg: node.DefaultConfig("/run/strata/strata.sock"), settings: map[string]*setting{}}
	c := &s.cfg
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
		}, func() string { return formatSize(*dst) })
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
	str("admin", "loopback address of the admin port (/healthz, /metrics, /stats); port 0 picks one; empty turns it off", &c.Admin)
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
	str("spill-dir", "SSD directory for evicted objects, created if missing and checked writable at start (empty: drop them)", &c.SpillDir)
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
	str("admin-stats", "what the admin port's /stats serves: full, counts (no client names, pids, uids or segments) or off", &c.AdminStats)
	integer("copy-workers", "goroutines that copy one batch's objects", &c.CopyWorkers)
	duration("request-timeout", "bound on one request, e.g. 30s", &c.RequestTimeout)
	add("log-level", "debug, info, warn or error", kindLevel, func(v string) error { return s.level.UnmarshalText([]byte(v)) },
		func() string { return strings.ToLower(s.level.String()) })
	return s
}

// formatSize writes n in the largest binary unit that holds it exactly, so that
// parseBytes reads back the same number.
func formatSize(n int64) string {
	for _, u := range []struct {
		name  string
		bytes int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.bytes == 0 {
			return strconv.FormatInt(n/u.bytes, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
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

// fromJSON turns a config file's value into the text the setting's flag takes.
// It accepts the types a person writes: a string for anything (as on the
// command line), numbers for numbers and sizes (bytes), booleans for switches,
// an array of addresses for --remote and an array of arrays of uids (or user
// names) for --tenant-groups.
func (st *setting) fromJSON(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		switch st.kind {
		case kindSize, kindInt, kindFloat, kindMode, kindString, kindGroups:
			return v.String(), nil
		case kindDuration:
			return "", fmt.Errorf("%s is a number; give a duration as a string with its unit, e.g. \"10s\"", v)
		}
	case bool:
		if st.kind == kindBool {
			return strconv.FormatBool(v), nil
		}
	case []any:
		switch st.kind {
		case kindList:
			items := make([]string, len(v))
			for i, e := range v {
				a, ok := e.(string)
				if !ok {
					return "", fmt.Errorf("item %d is %s; want an array of strings such as [\"10.0.0.1:6379\", \"10.0.0.2:6379\"]", i, jsonType(e))
				}
				if strings.Contains(a, ",") {
					return "", fmt.Errorf("item %q holds a comma; give one address per item", a)
				}
				items[i] = a
			}
			return strings.Join(items, ","), nil
		case kindGroups:
			groups := make([]string, len(v))
			for i, g := range v {
				members, ok := g.([]any)
				if !ok {
					members = []any{g}
				}
				ids := make([]string, len(members))
				for j, m := range members {
					switch m := m.(type) {
					case json.Number:
						ids[j] = m.String()
					case string:
						ids[j] = m
					default:
						return "", fmt.Errorf("group %d, member %d is %s; want uids or user names such as [[1000, 1001], [\"alice\"]]", i, j, jsonType(m))
					}
				}
				groups[i] = strings.Join(ids, ",")
			}
			return strings.Join(groups, ";"), nil
		}
	case nil:
		return "", fmt.Errorf("null; leave the key out to keep the default")
	}
	return "", fmt.Errorf("%s; want %s", jsonType(v), st.kind.jsonWant())
}

func jsonType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// jsonWant says what a config file may give a setting of kind k.
func (k settingKind) jsonWant() string {
	switch k {
	case kindSize:
		return "a size, a string such as \"4GiB\" or a number of bytes"
	case kindFloat:
		return "a number"
	case kindInt:
		return "an integer"
	case kindDuration:
		return "a duration, a string such as \"10s\""
	case kindBool:
		return "true or false"
	case kindMode:
		return "an octal mode, a string such as \"0600\""
	case kindList:
		return "an array of strings (or one comma-separated string)"
	case kindGroups:
		return "an array of arrays of uids or user names, e.g. [[1000, 1001], [2000]]"
	case kindLevel:
		return "a string: debug, info, warn or error"
	}
	return "a string"
}

// load applies the config file, the environment and the flags that were given.
func (s *serveSettings) load(fs *flag.FlagSet, given map[string]string) error {
	if s.config != "" {
		raw, err := os.ReadFile(s.config)
		if err != nil {
			return usagef("--config: %w", err)
		}
		var doc map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			return usagef("--config %s: %v (want a JSON object whose keys are the flags' names)", s.config, err)
		}
		keys := make([]string, 0, len(doc))
		for k := range doc {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			st, ok := s.settings[k]
			if !ok {
				return usagef("--config %s: unknown key %q (the keys are the flags' names: %s)", s.config, k, strings.Join(s.names(), ", "))
			}
			var v any
			vd := json.NewDecoder(bytes.NewReader(doc[k]))
			vd.UseNumber()
			if err := vd.Decode(&v); err != nil {
				return usagef("--config %s: %q: %v", s.config, k, err)
			}
			text, err := st.fromJSON(v)
			if err != nil {
				return usagef("--config %s: %q is %w", s.config, k, err)
			}
			if err := st.set(text); err != nil {
				return usagef("--config %s: %q: %w", s.config, k, err)
			}
		}
	}
	for _, name := range s.names() {
		if v, ok := os.LookupEnv(envName(name)); ok {
			if err := s.settings[name].set(v); err != nil {
				return usagef("%s: %w", envName(name), err)
			}
		}
	}
	for _, name := range s.names() {
		if v, ok := given[name]; ok {
			if err := s.settings[name].set(v); err != nil {
				return usagef("--%s: %w", name, err)
			}
		}
	}
	return nil
}

func (s *serveSettings) names() []string {
	out := make([]string, 0, len(s.settings))
	for n := range s.settings {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// settingFlag is a setting's command-line flag: it only records the text given,
// since the flag is applied after the config file and the environment.
type settingFlag struct {
	given map[string]string
	name  string
	def   string
	bool  bool
}

func (f *settingFlag) String() string {
	if f == nil {
		return ""
	}
	return f.def
}

func (f *settingFlag) Set(v string) error { f.given[f.name] = v; return nil }

// IsBoolFlag lets a switch be given alone (--remote-tls).
func (f *settingFlag) IsBoolFlag() bool { return f.bool }

// flags registers every setting as a flag and returns what was given. -h shows
// each flag's type and default.
func (s *serveSettings) flags(fs *flag.FlagSet) func() map[string]string {
	given := map[string]string{}
	for _, name := range s.names() {
		st := s.settings[name]
		fs.Var(&settingFlag{given: given, name: name, def: st.get(), bool: st.kind == kindBool}, name, st.usage)
	}
	fs.StringVar(&s.config, "config", "", "JSON config file; its keys are these flags' names (env STRATA_CONFIG)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage: strata serve [flags]")
		fmt.Fprintln(w, "Each flag can also be set by the environment (STRATA_ + its name in capitals, dashes as underscores) or a --config file; a flag wins over the environment, the environment over the file.")
		fs.VisitAll(func(f *flag.Flag) {
			kind := kindString
			if st, ok := s.settings[f.Name]; ok {
				kind = st.kind
			}
			fmt.Fprintf(w, "  --%s %s\n    \t%s %s", f.Name, kind, f.Usage, defaultText(f.DefValue))
			if f.Name != "config" {
				fmt.Fprintf(w, " (env %s)", envName(f.Name))
			}
			fmt.Fprintln(w)
		})
	}
	return func() map[string]string {
		out := make(map[string]string, len(given))
		for k, v := range given {
			out[k] = v
		}
		return out
	}
}

func runServe(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", stdout)
	s := newServeSettings()
	given := s.flags(fs)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	if s.config == "" {
		s.config = os.Getenv("STRATA_CONFIG")
	}
	if err := s.load(fs, given()); err != nil {
		return err
	}
	if !s.arenaFileSet {
		s.cfg.ArenaFile, s.cfg.ArenaFileFallback = defaultArenaFile(s.cfg.Socket), true
	}
	s.cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: s.level}))
	s.cfg.OpenRemote = redisremote.Open // the remote tier is Redis
	if err := s.cfg.Validate(); err != nil {
		return usageError{err}
	}
	// Like any daemon's runtime directory (/run/strata for the default socket),
	// the socket's directory is created when missing; only the service's own
	// socket goes in it, so others may list it but not write.
	if dir := filepath.Dir(s.cfg.Socket); dir != "" {
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return usagef("--socket %s: cannot create its directory: %v; create %s, or choose a socket path in a directory this user can write", s.cfg.Socket, err, dir)
		}
	}
	// An arena file named on purpose gets its directory, as the socket does
	// (only the service's user may list it: it holds the cache's contents).
	if s.arenaFileSet && s.cfg.ArenaFile != "" {
		if err := os.MkdirAll(filepath.Dir(s.cfg.ArenaFile), 0o700); err != nil {
			return usagef("--arena-file %s: cannot create its directory: %v; create it, or choose a path on a tmpfs this user can write", s.cfg.ArenaFile, err)
		}
	}
	raiseFDLimit(s.cfg.Logger)
	srv, err := node.New(s.cfg)
	if err != nil {
		if configError(err) {
			return usageError{err}
		}
		return err
	}
	st := srv.Stats().Start
	arenaNote := "anonymous arena: a restart starts it empty"
	switch {
	case st.Warm:
		arenaNote = fmt.Sprintf("arena file %s kept from the service before, recovering its objects", st.ArenaFile)
	case st.ArenaFile != "":
		arenaNote = fmt.Sprintf("arena file %s, empty (%s)", st.ArenaFile, st.ColdReason)
	}
	fmt.Fprintf(stdout, "strata serve: socket %s, admin %s, %s\n", srv.Socket(), srv.AdminAddr(), arenaNote)
	<-ctx.Done()
	s.cfg.Logger.Info("shutting down", "timeout", s.cfg.ShutdownTimeout)
	return srv.Close()
}

// defaultArenaFile is the arena file of a service on socket when
// --arena-file is not given: beside the socket, in the service's runtime
// directory, named after it (/run/strata/strata.sock: /run/strata/strata.arena).
func defaultArenaFile(socket string) string {
	return strings.TrimSuffix(socket, filepath.Ext(socket)) + ".arena"
}

// raiseFDLimit raises the soft limit on open descriptors to the hard limit:
// every client holds a socket and a descriptor per registered segment, and the
// usual soft limit of 1024 runs out long before --max-clients does. (Go's
// runtime does the same at start since 1.19; doing it here says so in the log
// and does not depend on it.)
func raiseFDLimit(log *slog.Logger) {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the descriptor limit", "err", err)
		return
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			log.Warn("cannot raise the descriptor limit to its hard limit", "limit", lim.Cur, "err", err)
			return
		}
	}
	log.Info("descriptor limit", "open_files", lim.Cur)
}

// configError reports whether err, from starting the node service, means the
// configuration cannot work here (exit 2, see exitUsage): a bad value, a path
// or socket that cannot be used or that another service holds, an arena this
// machine's memory cannot give.
func configError(err error) bool {
	for _, target := range []error{node.ErrConfig, storage.ErrConfig, wire.ErrInUse, arena.ErrConfig, arena.ErrFile, arena.ErrLocked, hostmem.ErrNoMemory} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
