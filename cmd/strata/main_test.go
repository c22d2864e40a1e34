package main

import (
	"os"
	"testing"
)

// TestMain lets the test binary stand in for the strata binary: with
// STRATA_TEST_AS_MAIN set, it runs the command line instead of the tests. Tests
// use it to start real processes (a node service to kill, bench engines) without
// building the binary first.
func TestMain(m *testing.M) {
	if os.Getenv("STRATA_TEST_AS_MAIN") == "1" {
		// As main does: SIGINT and SIGTERM end the command (serve shuts down).
		ctx, stop := signalContext()
		code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
		stop()
		os.Exit(code)
	}
	os.Exit(m.Run())
}
