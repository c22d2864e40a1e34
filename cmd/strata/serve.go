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
	add("max-clients", "most clients at once", integer(&c.MaxClients))
	add("copy-workers", "goroutines that copy one batch's objects", integer(&c.CopyWorkers))
	add("request-timeout", "bound on one request, e.g. 30s", func(v string) error {
		d, err := time.ParseDuration(v)
		c.RequestTimeout = d
		return err
	})
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
