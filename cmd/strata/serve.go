package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/arena"
	"github.com/stratakv/strata/node/redisremote"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/storage"
)

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
	// node.New creates the socket's directory (and the arena file's), and
	// a refused start removes what it created.
	fdLimit := raiseFDLimit(s.cfg.Logger)
	srv, err := node.New(s.cfg)
	if err != nil {
		if configError(err) {
			return usageError{err}
		}
		return err
	}
	// Said once the service started, so that a refused start prints its
	// one line of error and nothing else.
	if fdLimit > 0 {
		s.cfg.Logger.Info("descriptor limit", "open_files", fdLimit)
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
// and does not depend on it.) It returns the limit now in force, 0 when it
// could not be read or raised (which it logs).
func raiseFDLimit(log *slog.Logger) uint64 {
	var lim syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
		log.Warn("cannot read the descriptor limit", "err", err)
		return 0
	}
	if lim.Cur < lim.Max {
		lim.Cur = lim.Max
		if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil {
			log.Warn("cannot raise the descriptor limit to its hard limit", "limit", lim.Cur, "err", err)
			return 0
		}
	}
	return lim.Cur
}

// configError reports whether err, from starting the node service, means the
// configuration cannot work here (exit 2, see exitUsage): a bad value, a path
// or socket that cannot be used or that another service holds, an arena this
// machine's memory cannot give.
func configError(err error) bool {
	for _, target := range []error{node.ErrConfig, storage.ErrConfig, wire.ErrInUse, wire.ErrSocketPath, arena.ErrConfig, arena.ErrFile, arena.ErrLocked, hostmem.ErrNoMemory} {
		if errors.Is(err, target) {
			return true
		}
	}
	return false
}
