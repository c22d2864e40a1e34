package sim

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/redisremote"
)

// startEmbeddedNode runs a node service in this process, on a socket and with an
// SSD spill directory in a fresh temporary directory, writing through to
// cfg.Redis when it is set.
func startEmbeddedNode(cfg Config, log *slog.Logger) (*node.Server, string, error) {
	dir, err := os.MkdirTemp("", "strata-node-")
	if err != nil {
		return nil, "", fmt.Errorf("node service directory: %w", err)
	}
	nc := node.DefaultConfig(filepath.Join(dir, "strata.sock"))
	nc.Admin = ""
	nc.ArenaBytes = cfg.NodeArenaBytes
	nc.SpillDir = filepath.Join(dir, "spill")
	if cfg.NodeSpillBytes > 0 {
		nc.SpillBytes = cfg.NodeSpillBytes
	}
	nc.RemoteAddrs = cfg.Redis
	nc.OpenRemote = redisremote.Open
	nc.Logger = log
	srv, err := node.New(nc)
	if err != nil {
		return nil, "", errors.Join(err, os.RemoveAll(dir))
	}
	return srv, dir, nil
}

// awaitEmbedded waits until every embedded service of srvs, started at
// started, is ready, and reports their warm-up.
func (c Config) awaitEmbedded(ctx context.Context, started time.Time, srvs ...*node.Server) (*Warmup, error) {
	sts := make([]node.Stats, 0, len(srvs))
	for _, srv := range srvs {
		st, err := awaitReady(ctx, "the node service at "+srv.Socket(), c.embeddedStats(srv))
		if err != nil {
			return nil, err
		}
		sts = append(sts, st)
	}
	return warmupOf(started, sts...), nil
}
