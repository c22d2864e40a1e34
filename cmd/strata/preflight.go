package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/sim"
)

// preflightTimeout bounds each address and socket check before a bench.
const preflightTimeout = 3 * time.Second

// benchPreflight checks what a bench will use before its first run, so that a
// wrong path or address fails in a second, not after minutes of runs: the output
// files' directories, the node service's socket, the Redis addresses and the file
// L3's directory.
func benchPreflight(ctx context.Context, cfg sim.Config, jsonPath, plotPath string) error {
	for _, f := range []struct{ flag, path string }{{"--json", jsonPath}, {"--plot", plotPath}} {
		if f.path == "" {
			continue
		}
		if err := checkOutputFile(f.path); err != nil {
			return usagef("%s: %w", f.flag, err)
		}
	}
	strata := len(cfg.Runs) == 0
	for _, r := range cfg.Runs {
		strata = strata || r == sim.RunStrata
	}
	if !strata || cfg.L3 == sim.L3None {
		return nil
	}
	if cfg.L3 == sim.L3Node && cfg.NodeSocket != "" {
		if err := checkSocket(ctx, cfg.NodeSocket); err != nil {
			return usagef("--socket: %w", err)
		}
	}
	if cfg.L3 == sim.L3Node && cfg.Nodes > 1 || cfg.L3 == sim.L3Redis {
		if err := checkTCP(ctx, cfg.Redis); err != nil {
			return usagef("--redis: %w", err)
		}
	}
	if cfg.L3 == sim.L3File && cfg.L3Dir != "" {
		dir := cfg.L3Dir
		if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
			dir = filepath.Dir(dir) // the file backend creates it
		}
		if err := checkWritableDir(dir); err != nil {
			return usagef("--l3-dir: %w", err)
		}
	}
	return nil
}

// checkOutputFile reports whether path can be created: its directory exists and
// is writable, and path itself is not a directory.
func checkOutputFile(path string) error {
	st, err := os.Stat(path)
	if err == nil && st.IsDir() {
		return fmt.Errorf("%s is a directory; name a file", path)
	}
	if err := checkWritableDir(filepath.Dir(path)); err != nil {
		return err
	}
	// A directory can be writable by its mode and still refuse files (/proc,
	// /sys, a read-only mount): open the file for writing now, not after
	// the run, without changing an existing one.
	if err == nil {
		f, err := os.OpenFile(path, os.O_WRONLY, 0)
		if err != nil {
			return fmt.Errorf("%s cannot be written: %w", path, err)
		}
		return f.Close()
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return fmt.Errorf("%s cannot be created: %w", path, err)
	}
	_ = f.Close()
	return os.Remove(path)
}

// checkWritableDir reports whether dir is a directory this process can write.
func checkWritableDir(dir string) error {
	st, err := os.Stat(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("directory %s does not exist; create it first", dir)
		}
		return err
	}
	if !st.IsDir() {
		return fmt.Errorf("%s is not a directory", dir)
	}
	if err := unix.Access(dir, unix.W_OK|unix.X_OK); err != nil {
		return fmt.Errorf("directory %s is not writable: %w", dir, err)
	}
	return nil
}

// checkSocket connects to a node service's socket once.
func checkSocket(ctx context.Context, path string) error {
	if _, err := os.Stat(path); err != nil {
		return fmt.Errorf("no node service socket at %s (start one with strata serve --socket %s, or leave --socket out to start one in the bench): %w", path, path, err)
	}
	ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "unix", path)
	if err != nil {
		return fmt.Errorf("nothing answers at %s (is strata serve running?): %w", path, err)
	}
	return c.Close()
}

// checkTCP connects to every address once.
func checkTCP(ctx context.Context, addrs []string) error {
	for _, a := range addrs {
		ctx, cancel := context.WithTimeout(ctx, preflightTimeout)
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", a)
		cancel()
		if err != nil {
			return fmt.Errorf("nothing answers at %s: %w", a, err)
		}
		_ = c.Close()
	}
	return nil
}
