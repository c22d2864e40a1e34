package redisremote

import (
	"bytes"
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/storage"
)

// Open gives the node service a working store on a real Redis: what one call
// puts, another reads back, and a remove takes it out.
func TestOpenServesTheRemoteTiersCalls(t *testing.T) {
	redis := redistest.Start(t)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	st, err := Open(ctx, node.RemoteConfig{Addrs: []string{redis.Addr()}})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	body := bytes.Repeat([]byte("kv"), 3000)
	if errs := st.PutObjects(ctx, []storage.Object{{Name: "a", Format: 7, Runs: [][]byte{body[:1000], body[1000:]}}}); errs[0] != nil {
		t.Fatal(errs[0])
	}
	if n, err := st.ExistsObjects(ctx, []string{"a", "b"}, 7); n != 1 || err != nil {
		t.Fatalf("exists = %d, %v; want 1", n, err)
	}
	got := make([]byte, len(body))
	if errs := st.GetObjects(ctx, []storage.Object{{Name: "a", Format: 7, Runs: [][]byte{got}}}); errs[0] != nil || !bytes.Equal(got, body) {
		t.Fatalf("get: %v, same bytes %v", errs[0], bytes.Equal(got, body))
	}
	if ok, err := st.RemoveObject(ctx, "a"); !ok || err != nil {
		t.Fatalf("remove = %v, %v", ok, err)
	}
	if errs := st.GetObjects(ctx, []storage.Object{{Name: "a", Format: 7, Runs: [][]byte{got}}}); !errors.Is(errs[0], storage.ErrNotFound) {
		t.Fatalf("get after remove: %v, want ErrNotFound", errs[0])
	}
}

// A Redis that does not answer is an error and no store: the service's
// connect loop retries on it, and must not take a nil store for a connected one.
func TestOpenOfAnUnreachableRedisIsNoStore(t *testing.T) {
	redis := redistest.Start(t)
	redis.Kill()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	st, err := Open(ctx, node.RemoteConfig{Addrs: []string{redis.Addr()}})
	if err == nil || st != nil {
		t.Fatalf("Open = %v, %v; want no store and an error", st, err)
	}
}
