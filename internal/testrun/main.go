// Command testrun is the project's test command (`go run ./internal/testrun`):
// it runs `go test -race ./...` and prints what go test prints without -v, then
// ends with what was skipped and why. Plain `go test` shows a skip's reason only
// with -v, so a suite that skipped whole modules (no redis-server, no
// python3-torch) looked the same as one that ran them; here every skip is listed
// with its reason, and the last line counts passed, failed and skipped tests.
//
// With arguments, they replace the default `-race ./...` and go to go test as
// given (`go run ./internal/testrun -run Arena ./node/...`); -json is added.
// The exit status is go test's.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// defaultArgs is what the README's test command runs.
var defaultArgs = []string{"-race", "./..."}

func run(args []string, stdout, stderr io.Writer) int {
	if len(args) == 0 {
		args = defaultArgs
	}
	// go test stops its children on SIGINT itself; this process only has to
	// outlive it to print the summary of what finished.
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM)
	defer stop()
	signal.Ignore(syscall.SIGINT)

	cmd := exec.CommandContext(ctx, "go", append([]string{"test", "-json"}, args...)...)
	cmd.Stderr = stderr
	pipe, err := cmd.StdoutPipe()
	if err != nil {
		fmt.Fprintf(stderr, "testrun: %v\n", err)
		return 2
	}
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "testrun: go test: %v (is the go command on PATH?)\n", err)
		return 2
	}
	sum, serr := summarize(pipe, stdout)
	// Read to the end so go test never blocks on a full pipe.
	_, _ = io.Copy(io.Discard, pipe)
	werr := cmd.Wait()
	if serr != nil {
		fmt.Fprintf(stderr, "testrun: reading go test -json: %v\n", serr)
	}
	sum.print(stdout)

	var exit *exec.ExitError
	switch {
	case errors.As(werr, &exit) && exit.ExitCode() < 0:
		return 130 // go test was stopped by a signal (Ctrl-C)
	case errors.As(werr, &exit):
		return exit.ExitCode()
	case werr != nil:
		fmt.Fprintf(stderr, "testrun: go test: %v\n", werr)
		return 1
	case serr != nil || sum.failed > 0:
		return 1
	}
	return 0
}
