package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"

	"github.com/stratakv/strata/sim"
)

// runBenchEngine is one engine process of `strata bench --engines N`: it reads its
// job as JSON on stdin and writes its report as JSON on stdout. It is started by
// the bench, not by people, so it is not listed in help.
func runBenchEngine(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) > 0 {
		return usagef("bench-engine takes its job as JSON on stdin, not arguments")
	}
	var job sim.EngineJob
	dec := json.NewDecoder(stdin)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&job); err != nil {
		return usagef("bench-engine job: %w", err)
	}
	res, err := sim.RunEngine(ctx, job, stderr)
	if err != nil {
		return fmt.Errorf("engine %d: %w", job.Engine, err)
	}
	return json.NewEncoder(stdout).Encode(res)
}
