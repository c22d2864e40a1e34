package storagebench

import (
	"context"
	"fmt"
	"os"

	"github.com/stratakv/strata/node/wire"
)

// removeFromNode removes objects from the node service at socket by name, in
// batches of the protocol's most items: the service a run was pointed at keeps
// its objects after the run, and the run must not leave gigabytes behind.
// nodeclient has no remove (engines never remove: objects are shared), so this
// speaks the protocol itself, as the client the objects belong to would (the
// service scopes names per user, so it finds them).
func removeFromNode(ctx context.Context, socket string, names []string) error {
	conn, err := wire.Dial(ctx, socket)
	if err != nil {
		return err
	}
	defer func() { _ = conn.Close() }()
	id := uint64(1)
	call := func(t wire.Type, msg wire.Message) (wire.Message, error) {
		if err := conn.Send(ctx, t, id, msg); err != nil {
			return nil, err
		}
		id++
		_, reply, _, err := conn.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if e, ok := reply.(*wire.Error); ok {
			return nil, fmt.Errorf("the node service refused: %s", e.Message)
		}
		return reply, nil
	}
	if _, err := call(wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: "strata-bench-tiers-cleanup", PID: int32(os.Getpid())}); err != nil {
		return err
	}
	for len(names) > 0 {
		n := min(len(names), wire.MaxItems)
		if _, err := call(wire.TypeRemove, wire.Remove{Keys: names[:n]}); err != nil {
			return err
		}
		names = names[n:]
	}
	return nil
}
