// Command strata is the hierarchical KV cache's command line: the node service
// (serve), the workload simulator and storage benchmarks (bench), a node inspector
// (inspect), the page-key calculator (keys) and version.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"

	"github.com/redis/go-redis/v9"

	"github.com/stratakv/strata/storage/redisstore"
)

// Exit statuses, one rule for every command: 2 when what the caller asked for
// cannot work as given (a bad flag or value, bad input on stdin, a path or
// socket that cannot be used or that another service holds, a size this
// machine cannot give): change the command line or the configuration; 1 when
// it was run and failed (a tier failing under load, requests that failed, a
// bench that found corrupt pages); 130 when interrupted.
//
// exitUsage is the status for a command line or configuration that cannot work.
const exitUsage = 2

// exitInterrupted is the status after SIGINT (and after SIGTERM for a command
// that was not done), as shells report 128+SIGINT; strata serve stopped by
// SIGTERM, its service manager's normal stop, exits 0.
const exitInterrupted = 130

// usageError marks an error in the caller's input (flags, stdin), not a failure of
// strata: it exits with status 2. Its message is the wrapped error's.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usagef builds a usageError from a format, wrapping %w as fmt.Errorf does.
func usagef(format string, args ...any) error { return usageError{fmt.Errorf(format, args...)} }

// command is one subcommand.
type command struct {
	summary string
	run     func(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error
}

func commands() map[string]command {
	return map[string]command{
		"keys":    {"print the page keys of token ids read from stdin", runKeys},
		"serve":   {"run the node service: shared-memory L3 for the engines of a node", runServe},
		"inspect": {"print a running node service's clients, segments, tiers and hit rates", runInspect},
		"doctor":  {"check that SGLang and vLLM can use a node service, and print the flags that load their plugins", runDoctor},
		"bench":   {"run the workload simulator or a storage benchmark", runBench},
		"version": {"print the version", runVersion},
	}
}

func main() {
	ctx, stop := signalContext()
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// stoppedBy is the cause of main's context: the signal that stopped the
// command, so that run can tell Ctrl-C (130) from a service manager's stop.
type stoppedBy struct{ sig os.Signal }

func (s stoppedBy) Error() string { return "stopped by " + s.sig.String() }

// signalContext is canceled, with a stoppedBy cause, at the first SIGINT or
// SIGTERM; a second one kills the process as the default handler would.
func signalContext() (context.Context, func()) {
	ctx, cancel := context.WithCancelCause(context.Background())
	ch := make(chan os.Signal, 1)
	signal.Notify(ch, os.Interrupt, syscall.SIGTERM)
	done := make(chan struct{})
	go func() {
		select {
		case sig := <-ch:
			cancel(stoppedBy{sig})
			signal.Stop(ch)
		case <-done:
		}
	}()
	return ctx, func() {
		signal.Stop(ch)
		close(done)
		cancel(nil)
	}
}

// interrupted reports whether ctx was stopped by Ctrl-C (SIGINT).
func interrupted(ctx context.Context) bool {
	var s stoppedBy
	return errors.As(context.Cause(ctx), &s) && s.sig == os.Interrupt
}

// commandName is the command args run, with its subcommand when it has one
// (bench tiers, bench matrix): what the command's messages are prefixed with.
func commandName(args []string) string {
	if len(args) > 1 && args[0] == "bench" && (args[1] == "tiers" || args[1] == "matrix") {
		return args[0] + " " + args[1]
	}
	return args[0]
}

func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	// go-redis logs through one process-wide logger; route it into slog.
	redis.SetLogger(redisstore.ClientLogger{})
	cmds := commands()
	if len(args) == 0 || args[0] == "-h" || args[0] == "--help" || args[0] == "help" {
		usage(stderr, cmds)
		if len(args) == 0 {
			return exitUsage
		}
		return 0
	}
	c, ok := cmds[args[0]]
	if args[0] == "bench-engine" {
		c, ok = command{run: runBenchEngine}, true
	}
	if !ok {
		fmt.Fprintf(stderr, "strata: unknown command %q (run strata help)\n", args[0])
		return exitUsage
	}
	if err := c.run(ctx, args[1:], stdin, stdout, stderr); err != nil {
		if errors.Is(err, errHelp) {
			return 0
		}
		if ctx.Err() != nil {
			// The user stopped it: what failed after that (a run canceled, an engine
			// process killed) is the interruption, not an error of its own.
			fmt.Fprintf(stderr, "strata %s: interrupted\n", commandName(args))
			return exitInterrupted
		}
		fmt.Fprintf(stderr, "strata %s: %v\n", commandName(args), oneLine(err))
		if u := (usageError{}); errors.As(err, &u) {
			return exitUsage
		}
		return 1
	}
	if interrupted(ctx) {
		// A command that runs until stopped (serve) and stopped cleanly:
		// Ctrl-C is an interruption as for every command; a service
		// manager's SIGTERM is the normal end of a service (0).
		return exitInterrupted
	}
	return 0
}

func usage(w io.Writer, cmds map[string]command) {
	fmt.Fprintln(w, "usage: strata <command> [flags]")
	fmt.Fprintln(w)
	names := make([]string, 0, len(cmds))
	for n := range cmds {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-8s %s\n", n, cmds[n].summary)
	}
	fmt.Fprintln(w, "\nrun strata <command> -h for its flags")
}

// oneLine keeps an error message on one line so scripts can parse stderr.
func oneLine(err error) string {
	b := []byte(err.Error())
	for i, c := range b {
		if c == '\n' || c == '\r' {
			b[i] = ' '
		}
	}
	return string(b)
}

func errorsIs(err, target error) bool { return errors.Is(err, target) }
