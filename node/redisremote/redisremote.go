// Package redisremote wires the Redis store (storage/redisstore) into the node
// service as its remote tier: node defines what it needs of a remote store
// (node.RemoteStore) and does not import the store, and the programs that
// start a service (strata serve, the bench's in-process services) set
// node.Config.OpenRemote to Open.
package redisremote

import (
	"context"

	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/storage/redisstore"
)

var _ node.RemoteStore = (*redisstore.Store)(nil)

// Open connects to the Redis Cluster (or server) cfg names, with its
// credentials and TLS settings and the store's defaults otherwise.
func Open(ctx context.Context, cfg node.RemoteConfig) (node.RemoteStore, error) {
	rc := redisstore.DefaultConfig(cfg.Addrs...)
	rc.Username, rc.Password, rc.TLS, rc.Logger = cfg.Username, cfg.Password, cfg.TLS, cfg.Logger
	st, err := redisstore.New(ctx, rc)
	if err != nil {
		return nil, err // not a nil *Store in a non-nil interface
	}
	return st, nil
}
