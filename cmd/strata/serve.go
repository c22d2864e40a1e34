package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/stratakv/strata/node"
)

// serveSettings binds every setting of `strata serve` to its flag, its environment
// variable (STRATA_ + the flag's name in capitals, dashes as underscores) and its
// key in the JSON config file: one name, three places. Precedence: flag, then
// environment, then file, then default.
type serveSettings struct {
	cfg    node.Config
	set    map[string]func(string) error
	usage  map[string]string
	level  slog.Level
	config string
}

func newServeSettings() *serveSettings {
	s := &serveSettings{cfg: node.DefaultConfig("/run/strata/strata.sock"), set: map[string]func(string) error{}, usage: map[string]string{}}
	c := &s.cfg
	str := func(dst *string) func(string) error { return func(v string) error { *dst = v; return nil } }
	size := func(dst *int64) func(string) error {
		return func(v string) error {
			n, err := parseBytes(v)
			*dst = n
			return err
		}
	}
	frac := func(dst *float64) func(string) error {
		return func(v string) error {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				return fmt.Errorf("%q is not a number", v)
			}
			*dst = f
			return nil
		}
	}
	duration := func(dst *time.Duration) func(string) error {
		return func(v string) error {
			d, err := time.ParseDuration(v)
			*dst = d
			return err
		}
	}
	integer := func(dst *int) func(string) error {
		return func(v string) error {
			n, err := strconv.Atoi(v)
			if err != nil {
				return fmt.Errorf("%q is not an integer", v)
			}
			*dst = n
			return nil
		}
	}
	add := func(name, usage string, set func(string) error) { s.set[name], s.usage[name] = set, usage }
	add("socket", "Unix socket engines connect to", str(&c.Socket))
	add("socket-mode", "socket permission bits, octal (0600: the service's user only; 0660 with --socket-group)", func(v string) error {
		m, err := strconv.ParseUint(v, 8, 32)
		if err != nil {
			return fmt.Errorf("%q is not an octal mode", v)
		}
		c.SocketMode = os.FileMode(m)
		return nil
	})
	add("socket-group", "group (name or id) the socket belongs to", str(&c.SocketGroup))
	add("admin", "loopback address of the admin port (/healthz, /metrics, /stats); port 0 picks one; empty turns it off", str(&c.Admin))
	add("arena", "DRAM arena size, e.g. 4GiB", size(&c.ArenaBytes))
	add("high-watermark", "arena fill that starts eviction", frac(&c.HighWatermark))
	add("low-watermark", "arena fill eviction stops at", frac(&c.LowWatermark))
	add("spill-dir", "SSD directory for evicted objects (empty: drop them)", str(&c.SpillDir))
	add("spill-capacity", "spill directory size bound, e.g. 500GiB", size(&c.SpillBytes))
	add("remote", "Redis Cluster (or server) addresses to write through to, comma-separated (empty: none)", func(v string) error {
		c.RemoteAddrs = nil
		for _, a := range strings.Split(v, ",") {
			if a = strings.TrimSpace(a); a != "" {
				c.RemoteAddrs = append(c.RemoteAddrs, a)
			}
		}
		return nil
	})
	add("remote-queue", "bytes waiting to be written through to Redis before writes are dropped, e.g. 1GiB", size(&c.RemoteQueueBytes))
	add("client-quota", "memory one client may register, e.g. 64GiB", size(&c.ClientQuotaBytes))
	add("max-registered", "memory all clients together may register, e.g. 512GiB (0: no node-wide bound)", size(&c.MaxRegisteredBytes))
	add("tenant-groups", "uids (or user names) that share one object namespace, groups separated by ';', e.g. \"1000,1001;2000,2001\"; every other uid has its own", func(v string) error {
		g, err := node.ParseTenantGroups(v)
		c.TenantGroups = g
		return err
	})
	add("remote-username", "Redis ACL user (empty: the default user)", str(&c.RemoteUsername))
	add("remote-password-file", "file holding the Redis password (empty: no AUTH)", str(&c.RemotePasswordFile))
	add("remote-tls", "talk TLS to Redis (true or false; implied by --remote-tls-ca and --remote-tls-server-name)", func(v string) error {
		b, err := strconv.ParseBool(v)
		if err != nil {
			return fmt.Errorf("%q is not true or false", v)
		}
		c.RemoteTLS = b
		return nil
	})
	add("remote-tls-ca", "PEM file of the CA that signed the Redis servers' certificates (empty: the system roots)", str(&c.RemoteTLSCAFile))
	add("remote-tls-server-name", "name the Redis servers' certificates are checked against (empty: each address's host)", str(&c.RemoteTLSServerName))
	add("max-clients", "most clients at once", integer(&c.MaxClients))
	add("max-clients-per-uid", "most connections of one Unix user (0: --max-clients)", integer(&c.MaxClientsPerUID))
	add("max-segments-per-client", "most segments (host pools) one client may register", integer(&c.MaxSegmentsPerClient))
	add("hello-timeout", "time a new connection has to send its Hello, e.g. 10s", duration(&c.HelloTimeout))
	add("frame-timeout", "time a started frame has to arrive whole, e.g. 10s", duration(&c.FrameTimeout))
	add("idle-timeout", "disconnect a client silent this long with no request in flight, e.g. 10m (0: never)", duration(&c.IdleTimeout))
	add("request-memory", "node-wide budget for the memory of requests in flight, e.g. 256MiB", size(&c.RequestMemoryBytes))
	add("admin-stats", "what the admin port's /stats serves: full, counts (no client names, pids, uids or segments) or off", str(&c.AdminStats))
	add("copy-workers", "goroutines that copy one batch's objects", integer(&c.CopyWorkers))
	add("request-timeout", "bound on one request, e.g. 30s", duration(&c.RequestTimeout))
	add("log-level", "debug, info, warn or error", func(v string) error { return s.level.UnmarshalText([]byte(v)) })
	return s
}

func envName(flag string) string {
	return "STRATA_" + strings.ToUpper(strings.ReplaceAll(flag, "-", "_"))
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
			set, ok := s.set[k]
			if !ok || k == "config" {
				return usagef("--config %s: unknown key %q (the keys are the flags' names: %s)", s.config, k, strings.Join(s.names(), ", "))
			}
			var v any
			if err := json.Unmarshal(doc[k], &v); err != nil {
				return usagef("--config %s: %s: %v", s.config, k, err)
			}
			if err := set(fmt.Sprint(v)); err != nil {
				return usagef("--config %s: %s: %w", s.config, k, err)
			}
		}
	}
	for _, name := range s.names() {
		if v, ok := os.LookupEnv(envName(name)); ok {
			if err := s.set[name](v); err != nil {
				return usagef("%s: %w", envName(name), err)
			}
		}
	}
	for _, name := range s.names() {
		if v, ok := given[name]; ok {
			if err := s.set[name](v); err != nil {
				return usagef("--%s: %w", name, err)
			}
		}
	}
	return nil
}

func (s *serveSettings) names() []string {
	out := make([]string, 0, len(s.set))
	for n := range s.set {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}

// flags registers every setting as a string flag and returns what was given.
func (s *serveSettings) flags(fs *flag.FlagSet) func() map[string]string {
	vals := map[string]*string{}
	for _, name := range s.names() {
		vals[name] = fs.String(name, "", s.usage[name]+" (env "+envName(name)+")")
	}
	fs.StringVar(&s.config, "config", "", "JSON config file; its keys are these flags' names (env STRATA_CONFIG)")
	return func() map[string]string {
		given := map[string]string{}
		fs.Visit(func(f *flag.Flag) {
			if v, ok := vals[f.Name]; ok {
				given[f.Name] = *v
			}
		})
		return given
	}
}

func runServe(ctx context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("serve", stderr)
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
	s.cfg.Logger = slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: s.level}))
	raiseFDLimit(s.cfg.Logger)
	srv, err := node.New(s.cfg)
	if err != nil {
		if errorsIs(err, node.ErrConfig) {
			return usageError{err}
		}
		return err
	}
	fmt.Fprintf(stdout, "strata serve: socket %s, admin %s\n", srv.Socket(), srv.AdminAddr())
	<-ctx.Done()
	s.cfg.Logger.Info("shutting down")
	return srv.Close()
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
