package storagebench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"syscall"
	"testing"
)

func TestRedisPeerRoundTrip(t *testing.T) {
	if !redisInstalled(t) {
		t.Skip("redis-server is not installed (apt-get install redis-server)")
	}
	ctx := context.Background()
	p, err := StartRedis(ctx, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = p.Close() })
	if !strings.HasPrefix(p.Name(), "redis-server ") || !strings.Contains(p.Name(), p.Addr()) || !strings.HasPrefix(p.Addr(), "127.0.0.1:") {
		t.Errorf("name %q, address %q", p.Name(), p.Addr())
	}
	src := alignedChunks(t, 6, 64<<10)
	peerRoundTrip(t, p, src, blank(t, src))

	// Named: the names are the keys, as the run gives the backend's object names.
	names := make([]string, len(src))
	for i := range names {
		names[i] = fmt.Sprintf("strata:test:%d-k", i)
	}
	if _, err := p.WriteNamed(ctx, names, src); err != nil {
		t.Fatal(err)
	}
	if got, err := p.client.Get(ctx, names[3]).Bytes(); err != nil || string(got) != string(src[3]) {
		t.Fatalf("GET %s: %d bytes, %v", names[3], len(got), err)
	}
	dst := blank(t, src)
	if _, err := p.ReadNamed(ctx, names, dst); err != nil {
		t.Fatal(err)
	}
	for i := range src {
		if string(src[i]) != string(dst[i]) {
			t.Fatalf("value %s read back different bytes", names[i])
		}
	}
	if _, err := p.ReadNamed(ctx, []string{"strata:test:missing"}, dst[:1]); err == nil {
		t.Fatal("reading a missing key succeeded")
	}
	if _, err := p.ReadNamed(ctx, names[:1], [][]byte{make([]byte, 100)}); err == nil {
		t.Fatal("reading a value into a short buffer succeeded")
	}

	pid := p.Pid()
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Kill(pid, 0); !errors.Is(err, syscall.ESRCH) {
		t.Errorf("redis-server (pid %d) still runs after Close: %v", pid, err)
	}
	if err := p.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

func TestStartRedisNotInstalled(t *testing.T) {
	t.Setenv("PATH", t.TempDir())
	if _, err := StartRedis(context.Background(), t.TempDir()); !errors.Is(err, ErrRedisNotInstalled) {
		t.Fatalf("StartRedis without the binary = %v", err)
	}
}
