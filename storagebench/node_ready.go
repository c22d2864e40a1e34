package storagebench

import (
	"context"
	"fmt"
	"os"
	"time"

	"github.com/stratakv/strata/node/wire"
)

// socketReadyLimit bounds the wait for a running service that is still
// warming its arena: 10 minutes populate 60 GiB at the slowest page-fault rate
// measured here (0.1 GB/s), so a service that is not ready by then is stuck.
const socketReadyLimit = 10 * time.Minute

// awaitSocketReady waits until the node service at socket no longer says it
// is starting (HelloReply.starting), and returns how long it waited (0 when
// it was ready at once) and the readiness it first saw. A run against a service started just before it
// otherwise times the service's arena warm-up (its memory populated on the
// cores the copies need) as if it were the copies: a profile of such a run
// had 70% of the service's CPU in the warm-up's page faults.
func awaitSocketReady(ctx context.Context, socket string, progress func(string, ...any)) (time.Duration, uint32, error) {
	start := time.Now()
	first := uint32(100)
	for n := 0; ; n++ {
		starting, pct, err := helloStarting(ctx, socket)
		if err != nil {
			return 0, 0, err
		}
		if n == 0 {
			first = pct
		}
		if !starting && n == 0 {
			return 0, first, nil // ready at once: no wait
		}
		if !starting {
			return time.Since(start), first, nil
		}
		if time.Since(start) > socketReadyLimit {
			return 0, 0, fmt.Errorf("the node service at %s still says it is starting (%d%% of its arena ready) after %s; see its log", socket, pct, socketReadyLimit)
		}
		if progress != nil && n%25 == 0 {
			progress("the node service at %s is starting (%d%% of its arena ready): waiting for it before the first batch", socket, pct)
		}
		select {
		case <-ctx.Done():
			return 0, 0, ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// helloStarting opens a connection, says Hello, and reports what the reply
// says of the service's start.
func helloStarting(ctx context.Context, socket string) (bool, uint32, error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	conn, err := wire.Dial(cctx, socket)
	if err != nil {
		return false, 0, err
	}
	defer func() { _ = conn.Close() }()
	if err := conn.Send(cctx, wire.TypeHello, 1, wire.Hello{Version: wire.Version, ClientName: "strata-bench-tiers-ready", PID: int32(os.Getpid())}); err != nil {
		return false, 0, err
	}
	_, reply, _, err := conn.Recv(cctx)
	if err != nil {
		return false, 0, err
	}
	switch r := reply.(type) {
	case *wire.HelloReply:
		return r.Starting, r.ReadyPercent, nil
	case *wire.Error:
		return false, 0, fmt.Errorf("the node service at %s refused Hello: %s", socket, r.Message)
	default:
		return false, 0, fmt.Errorf("the node service at %s answered Hello with %T", socket, reply)
	}
}
