package main

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
)

// wireClient speaks the node protocol by hand to a service at socket, over
// one segment of size bytes, for tests that need operations nodeclient does
// not have (Remove).
type wireClient struct {
	t    *testing.T
	conn *wire.Conn
	id   uint64
	mem  []byte
	seg  uint32
}

func dialWire(t *testing.T, socket string, size int64) *wireClient {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := wire.Dial(ctx, socket)
	if err != nil {
		t.Fatal(err)
	}
	c := &wireClient{t: t, conn: conn}
	t.Cleanup(func() { conn.Close() })
	c.call(wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: t.Name()})
	a, _ := hostmem.New(hostmem.Config{Kind: hostmem.Shm})
	r, err := a.Allocate("test", size)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	c.mem = r.Bytes()
	c.seg = c.call(wire.TypeRegisterSegment, wire.RegisterSegment{Size: uint64(size), Name: "kv"}, r.Fd()).(*wire.RegisterSegmentReply).SegmentID
	return c
}

func (c *wireClient) call(typ wire.Type, msg wire.Message, fds ...int) wire.Message {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	c.id++
	if err := c.conn.Send(ctx, typ, c.id, msg, fds...); err != nil {
		c.t.Fatal(err)
	}
	_, m, _, err := c.conn.Recv(ctx)
	if err != nil {
		c.t.Fatal(err)
	}
	if e, ok := m.(*wire.Error); ok {
		c.t.Fatalf("%v: %v", typ, e.Err())
	}
	return m
}

// item names n bytes at off of the client's segment as key's object.
func (c *wireClient) item(key string, off, n uint64) wire.Item {
	return wire.Item{Key: key, Format: 7, Ranges: []wire.Range{{Segment: c.seg, Offset: off, Length: n}}}
}

// Removed objects stay removed after the node service is killed (SIGKILL) and
// restarted on the same spill: the tombstones are on disk before a Remove
// answers. Before, tombstones still in a write buffer were lost with the
// process, and removed keys read back after the restart.
func TestRemovesSurviveSIGKILL(t *testing.T) {
	const obj, n = 1 << 20, 96
	socket, spillDir := filepath.Join(shortDir(t), "s"), t.TempDir()
	args := []string{"serve", "--socket", socket, "--arena", "32MiB", "--admin", "", "--spill-dir", spillDir, "--log-level", "error"}
	serve := strataProcess(t, args...)
	waitStats(t, socket, "listening", func(statsView) bool { return true })
	c := dialWire(t, socket, 2*obj)
	key := func(i int) string { return fmt.Sprintf("object-%03d", i) }
	for i := range n {
		c.mem[0], c.mem[obj-1] = byte(i), byte(i>>8)
		if r := c.call(wire.TypePut, wire.Put{Items: []wire.Item{c.item(key(i), 0, obj)}}).(*wire.BatchReply).Results[0]; r.Status != wire.OK {
			t.Fatalf("put %d: %+v", i, r)
		}
	}
	// Every other key, most of them evicted to the spill by now.
	var removed []string
	for i := 0; i < n; i += 2 {
		removed = append(removed, key(i))
	}
	if got := c.call(wire.TypeRemove, wire.Remove{Keys: removed}).(*wire.RemoveReply).Removed; got != uint32(len(removed)) {
		t.Fatalf("removed %d of %d", got, len(removed))
	}
	if err := serve.Process.Signal(syscall.SIGKILL); err != nil {
		t.Fatal(err)
	}
	_ = serve.Wait()
	strataProcess(t, args...)
	waitStats(t, socket, "listening again", func(statsView) bool { return true })
	waitReady(t, socket) // the spill's objects are served once it has indexed them
	d := dialWire(t, socket, 2*obj)
	back := 0
	for _, k := range removed {
		if r := d.call(wire.TypeGet, wire.Get{Items: []wire.Item{d.item(k, obj, obj)}}).(*wire.BatchReply).Results[0]; r.Status == wire.OK {
			back++
		}
	}
	if back > 0 {
		t.Fatalf("%d of %d removed keys read back after SIGKILL and a restart", back, len(removed))
	}
	// The keys that were not removed and reached the spill are still there.
	kept := 0
	for i := 1; i < n; i += 2 {
		if r := d.call(wire.TypeGet, wire.Get{Items: []wire.Item{d.item(key(i), obj, obj)}}).(*wire.BatchReply).Results[0]; r.Status == wire.OK {
			if d.mem[obj] != byte(i) || d.mem[2*obj-1] != byte(i>>8) {
				t.Fatalf("%s read back another object's bytes", key(i))
			}
			kept++
		}
	}
	if kept == 0 {
		t.Fatal("no object survived the restart in the spill")
	}
}
