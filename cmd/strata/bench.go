package main

import (
	"context"
	"fmt"
	"io"
)

func runBench(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("bench", stderr)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintln(stdout, "strata bench: the workload simulator is not built yet")
	return nil
}
