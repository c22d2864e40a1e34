package sim

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/stratakv/strata/node"
	"github.com/stratakv/strata/node/wire"
)

// childNode is a node service the bench runs as a child `strata serve`
// process, on an arena file, so that the restart experiment can kill it as a
// crash does and start it again on the same file (Config.Restart). The
// embedded service cannot be SIGKILLed without the bench.
type childNode struct {
	bin       string
	dir       string // socket and spill
	arenaDir  string // the arena file's directory: on tmpfs where there is one
	socket    string
	arenaFile string
	args      []string
	cleanup   *cleaner

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{} // closed when cmd has been waited for
	stderr *tailBuffer
}

// childStartTimeout bounds a child service's start (to its first answered
// Hello) and childStopTimeout its exit after a signal: a service that takes
// longer is a failure of the experiment, not a wait without end.
const (
	childStartTimeout = 60 * time.Second
	childStopTimeout  = 30 * time.Second
)

// startChildNode starts `strata serve` with the bench's arena size, spill
// bound and Redis, in fresh temporary directories, and waits until it answers.
func startChildNode(ctx context.Context, cfg Config) (c *childNode, err error) {
	bin := cfg.EngineBinary
	if bin == "" {
		if bin, err = os.Executable(); err != nil {
			return nil, fmt.Errorf("find the strata binary to start the node service with: %w", err)
		}
	}
	dir, err := os.MkdirTemp("", "strata-node-")
	if err != nil {
		return nil, fmt.Errorf("node service directory: %w", err)
	}
	// The arena file goes on tmpfs where there is one: it is memory that
	// outlives the process, which is what lets a killed service come back warm.
	arenaDir, err := os.MkdirTemp(shmDir(), "strata-arena-")
	if err != nil {
		_ = os.RemoveAll(dir)
		return nil, fmt.Errorf("arena file directory: %w", err)
	}
	c = &childNode{bin: bin, dir: dir, arenaDir: arenaDir, socket: filepath.Join(dir, "strata.sock"),
		arenaFile: filepath.Join(arenaDir, "strata.arena"), cleanup: cfg.cleanup}
	c.args = []string{"serve", "--socket", c.socket, "--admin", "", "--log-level", "warn",
		"--arena", strconv.FormatInt(cfg.NodeArenaBytes, 10), "--arena-file", c.arenaFile,
		"--spill-dir", filepath.Join(dir, "spill")}
	if cfg.NodeSpillBytes > 0 {
		c.args = append(c.args, "--spill-capacity", strconv.FormatInt(cfg.NodeSpillBytes, 10))
	}
	if len(cfg.Redis) > 0 {
		c.args = append(c.args, "--remote", strings.Join(cfg.Redis, ","))
	}
	if err := c.start(ctx); err != nil {
		return nil, errors.Join(err, c.close())
	}
	return c, nil
}

// shmDir is /dev/shm where it is a directory, else the temporary directory.
func shmDir() string {
	if fi, err := os.Stat("/dev/shm"); err == nil && fi.IsDir() {
		return "/dev/shm"
	}
	return os.TempDir()
}

// start runs the service and waits until it answers a Hello.
func (c *childNode) start(ctx context.Context) error {
	cmd := exec.Command(c.bin, c.args...)
	tail := &tailBuffer{max: 4096}
	cmd.Stdout, cmd.Stderr = nil, tail
	// The service dies with the bench, never outlives it holding the socket.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start the node service (%s serve): %w", c.bin, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); close(exited) }()
	c.mu.Lock()
	c.cmd, c.exited, c.stderr = cmd, exited, tail
	c.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, childStartTimeout)
	defer cancel()
	for {
		hctx, hcancel := context.WithTimeout(ctx, time.Second)
		_, err := nodeHello(hctx, c.socket)
		hcancel()
		if err == nil {
			return nil
		}
		select {
		case <-exited:
			return fmt.Errorf("the node service exited at start (%s): %s", cmd.ProcessState, tail.String())
		case <-ctx.Done():
			return fmt.Errorf("the node service did not answer within %v: %v: %s", childStartTimeout, err, tail.String())
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// stop sends sig and waits for the process to exit; one that outlasts
// childStopTimeout is killed and reported.
func (c *childNode) stop(sig syscall.Signal) error {
	c.mu.Lock()
	cmd, exited := c.cmd, c.exited
	c.mu.Unlock()
	if cmd == nil {
		return nil
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-exited:
		return nil
	case <-time.After(childStopTimeout):
		_ = cmd.Process.Kill()
		<-exited
		return fmt.Errorf("the node service did not exit within %v of %v: killed", childStopTimeout, sig)
	}
}

// close stops the service cleanly and removes its directories.
func (c *childNode) close() error {
	err := c.stop(syscall.SIGTERM)
	// The arena file is memory on tmpfs: removed now, not in the background.
	return errors.Join(err, os.RemoveAll(c.arenaDir), c.cleanup.remove(c.dir))
}

// stats fetches the service's stats document.
func (c *childNode) stats(ctx context.Context) (node.Stats, error) {
	var st node.Stats
	m, err := nodeCall(ctx, c.socket, wire.TypeStats, wire.Stats{})
	if err != nil {
		return st, err
	}
	reply, ok := m.(*wire.StatsReply)
	if !ok {
		return st, fmt.Errorf("node service answered %T to Stats", m)
	}
	return st, json.Unmarshal(reply.JSON, &st)
}

// statsFor is c.stats, through cfg.startStats when a test set it.
func (c *childNode) statsFor(cfg Config) func(context.Context) (node.Stats, error) {
	return func(ctx context.Context) (node.Stats, error) {
		st, err := c.stats(ctx)
		if err == nil && cfg.startStats != nil {
			st = cfg.startStats(st)
		}
		return st, err
	}
}

// waitReady polls the service's stats until its start is over (its arena
// file's objects recovered), within timeout.
func (c *childNode) waitReady(ctx context.Context, timeout time.Duration) (node.Stats, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		st, err := c.stats(ctx)
		if err == nil && st.Start.State == node.StateReady {
			return st, nil
		}
		select {
		case <-ctx.Done():
			return st, fmt.Errorf("the restarted node service was not ready within %v (%s): %v", timeout, st.Start.Message, err)
		case <-time.After(20 * time.Millisecond):
		}
	}
}

// nodeHello says Hello to the service at socket, the first answer a client gets.
func nodeHello(ctx context.Context, socket string) (*wire.HelloReply, error) {
	m, err := nodeCall(ctx, socket, 0, nil)
	if err != nil {
		return nil, err
	}
	return m.(*wire.HelloReply), nil
}

// nodeCall connects, says Hello, and with msg not nil sends it and returns
// its reply (else the HelloReply).
func nodeCall(ctx context.Context, socket string, t wire.Type, msg wire.Message) (wire.Message, error) {
	conn, err := wire.Dial(ctx, socket)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	call := func(id uint64, t wire.Type, msg wire.Message) (wire.Message, error) {
		if err := conn.Send(ctx, t, id, msg); err != nil {
			return nil, err
		}
		_, m, _, err := conn.Recv(ctx)
		if err != nil {
			return nil, err
		}
		if e, ok := m.(*wire.Error); ok {
			return nil, e.Err()
		}
		return m, nil
	}
	m, err := call(1, wire.TypeHello, wire.Hello{Version: wire.Version, ClientName: "strata-bench", PID: int32(os.Getpid())})
	if err != nil {
		return nil, fmt.Errorf("hello: %w", err)
	}
	if _, ok := m.(*wire.HelloReply); !ok {
		return nil, fmt.Errorf("node service answered %T to Hello", m)
	}
	if msg == nil {
		return m, nil
	}
	return call(2, t, msg)
}

// tailBuffer keeps the last max bytes written to it: a child's log, for the
// error that says why it failed.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
	max int
}

func (t *tailBuffer) Write(p []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, p...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = t.buf[over:]
	}
	return len(p), nil
}

func (t *tailBuffer) String() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	return string(bytes.TrimSpace(t.buf))
}
