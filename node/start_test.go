package node

import (
	"bytes"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/node/wire"
)

// A service whose arena is still warming up answers at once: Hello (saying it
// is starting, and how far), puts and gets of what fits in the memory that is
// ready, Stats, and the admin port: /healthz is 200 (it is alive) with the
// start in words, /readyz is 503 until it is ready. Never an error.
func TestStartingServiceServesAndSaysSo(t *testing.T) {
	const chunk = 32 << 20
	paused, resume := make(chan struct{}), make(chan struct{})
	s := start(t, func(c *Config) {
		c.ArenaBytes = 4 * chunk
		ac := hostmem.DefaultConfig(hostmem.Mmap)
		ac.Prefault, ac.ReserveBytes, ac.Logger = false, 0, quiet
		c.Allocator, _ = hostmem.New(ac)
		c.hooks = &hooks{warmed: func(ready, total int64) {
			if ready == chunk {
				close(paused)
				<-resume
			}
		}}
	})
	resumed := false
	defer func() {
		if !resumed {
			close(resume)
		}
	}()
	<-paused
	conn, err := wire.Dial(t.Context(), s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	hello, err := send(conn, 1, wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: "early"})
	if err != nil {
		t.Fatal(err)
	}
	h := hello.(*wire.HelloReply)
	if !h.Starting || h.ReadyPercent != 25 || h.InstanceID == 0 || h.ContentID == 0 || h.Warm {
		t.Fatalf("hello of a starting service: %+v", h)
	}
	c := dial(t, s)
	region, seg := c.segment(1 << 20)
	copy(region.Bytes(), bytes.Repeat([]byte("early"), 1000))
	if res := c.batch(wire.TypePut, item("k", seg, 0, 5000)); res[0].Status != wire.OK {
		t.Fatalf("put while starting: %+v", res[0])
	}
	if res := c.batch(wire.TypeGet, item("k", seg, 8192, 5000)); res[0].Status != wire.OK || !bytes.Equal(region.Bytes()[8192:8192+5000], region.Bytes()[:5000]) {
		t.Fatalf("get while starting: %+v", res[0])
	}
	st := s.Stats().Start
	const want = "starting (25% of the arena ready)"
	if st.State != StateStarting || st.Message != want || st.ReadyPercent != 25 {
		t.Fatalf("stats of a starting service: %+v", st)
	}
	get := func(path string) (int, string) {
		resp, err := http.Get("http://" + s.AdminAddr() + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, strings.TrimSpace(string(b))
	}
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok: "+want {
		t.Fatalf("/healthz while starting: %d %q", code, body)
	}
	if code, body := get("/readyz"); code != http.StatusServiceUnavailable || body != want {
		t.Fatalf("/readyz while starting: %d %q", code, body)
	}
	if v := metric(t, s, "strata_node_ready"); v != 0 {
		t.Fatalf("strata_node_ready %v while starting", v)
	}

	close(resume)
	resumed = true
	waitFor(t, "the service to be ready", func() bool { return s.Stats().Start.State == StateReady })
	if code, body := get("/readyz"); code != http.StatusOK || body != "ready" {
		t.Fatalf("/readyz once ready: %d %q", code, body)
	}
	if code, body := get("/healthz"); code != http.StatusOK || body != "ok" {
		t.Fatalf("/healthz once ready: %d %q", code, body)
	}
	late, err := wire.Dial(t.Context(), s.Socket())
	if err != nil {
		t.Fatal(err)
	}
	defer late.Close()
	hello, err = send(late, 1, wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: "late"})
	if err != nil {
		t.Fatal(err)
	}
	if h2 := hello.(*wire.HelloReply); h2.Starting || h2.ReadyPercent != 100 || h2.InstanceID != h.InstanceID || h2.ContentID != h.ContentID {
		t.Fatalf("hello once ready: %+v (first %+v)", h2, h)
	}
	if v := metric(t, s, "strata_node_ready"); v != 1 {
		t.Fatalf("strata_node_ready %v once ready", v)
	}
}
