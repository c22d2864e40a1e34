package storagebench

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"
)

// ErrRedisNotInstalled reports that redis-server is not in PATH.
var ErrRedisNotInstalled = errors.New("redis-server is not installed (apt-get install redis-server)")

// redisBinary is the server StartRedis runs; tests replace it.
var redisBinary = "redis-server"

// redisTimeout bounds one socket read or write of the Redis client. A pipeline of
// 128 pages moves 512 MiB or more in one go; on a loaded machine that can take
// seconds, and a timeout in the middle would leave a batch half stored.
const redisTimeout = 5 * time.Minute

// redisBuffer is the client's read and write buffer. Values of megabytes bypass
// it (bufio reads and writes them straight to and from the socket); what it
// carries is the commands and reply headers between them.
const redisBuffer = 1 << 20

// RedisPeer is a Redis server on loopback doing the node service's job, the
// service an engine would otherwise use: every chunk a value under the object's
// name, stored with one pipeline of SETs per batch and read back with one
// pipeline of GETs whose replies go straight into the host pages
// (go-redis's GetToBuffer, the client's fastest read: no allocation, no copy
// after the socket's). StartRedis starts the server; Close stops it.
type RedisPeer struct {
	cmd     *exec.Cmd
	exited  chan struct{}
	log     *tailBuffer
	addr    string
	version string
	client  *redis.Client

	mu     sync.Mutex
	names  []string // what Write stored, for Read
	next   int
	closed bool
}

var _ NamedPeer = (*RedisPeer)(nil)

// StartRedis starts redis-server on 127.0.0.1 and a free port, with persistence
// off and no memory limit, working in dir, and waits until it answers PING. It
// returns ErrRedisNotInstalled when there is no redis-server in PATH.
func StartRedis(ctx context.Context, dir string) (*RedisPeer, error) {
	bin, err := exec.LookPath(redisBinary)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", ErrRedisNotInstalled, err)
	}
	// The port is free when asked and taken by the server a moment later; another
	// process may take it in between, so try a few.
	var errs []error
	for range 3 {
		p, err := startRedisOnce(ctx, bin, dir)
		if err == nil {
			return p, nil
		}
		errs = append(errs, err)
		if ctx.Err() != nil {
			break
		}
	}
	return nil, errors.Join(errs...)
}

func startRedisOnce(ctx context.Context, bin, dir string) (*RedisPeer, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	p := &RedisPeer{exited: make(chan struct{}), log: &tailBuffer{max: 8 << 10}, addr: net.JoinHostPort("127.0.0.1", strconv.Itoa(port))}
	p.cmd = exec.Command(bin, "--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
		"--protected-mode", "yes", "--maxmemory", "0", "--dir", dir, "--daemonize", "no")
	p.cmd.Dir = dir
	p.cmd.Stdout, p.cmd.Stderr = p.log, p.log
	// The server dies with the benchmark, even when the benchmark is killed (Linux
	// sends the signal when the thread that started it exits; Go keeps its threads
	// unless a goroutine locked to one ends).
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", bin, err)
	}
	go func() {
		_ = p.cmd.Wait()
		close(p.exited)
	}()
	p.client = redis.NewClient(&redis.Options{
		Addr:                     p.addr,
		DisableIdentity:          true,
		MaintNotificationsConfig: &maintnotifications.Config{Mode: maintnotifications.ModeDisabled},
		DialTimeout:              5 * time.Second,
		ReadTimeout:              redisTimeout,
		WriteTimeout:             redisTimeout,
		MaxRetries:               -1, // a retried pipeline would be timed twice; fail instead
		PoolSize:                 2,
		ReadBufferSize:           redisBuffer,
		WriteBufferSize:          redisBuffer,
		PipelineReadBufferSize:   redisBuffer,
		PipelineWriteBufferSize:  redisBuffer,
	})
	if err := p.waitReady(ctx); err != nil {
		_ = p.Close()
		return nil, err
	}
	return p, nil
}

// waitReady waits for PING to succeed and reads the server's version.
func (p *RedisPeer) waitReady(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	for {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		err := p.client.Ping(pctx).Err()
		pcancel()
		if err == nil {
			break
		}
		select {
		case <-p.exited:
			return fmt.Errorf("redis-server on %s exited at start: %s", p.addr, p.log.lastLine())
		case <-ctx.Done():
			return fmt.Errorf("redis-server on %s does not answer PING: %w (%s)", p.addr, err, p.log.lastLine())
		case <-time.After(20 * time.Millisecond):
		}
	}
	info, err := p.client.Info(ctx, "server").Result()
	if err != nil {
		return fmt.Errorf("redis-server on %s: INFO: %w", p.addr, err)
	}
	p.version = "?"
	sc := bufio.NewScanner(strings.NewReader(info))
	for sc.Scan() {
		if v, ok := strings.CutPrefix(strings.TrimSpace(sc.Text()), "redis_version:"); ok {
			p.version = v
		}
	}
	return nil
}

// freePort asks the kernel for a free TCP port on loopback.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port for redis-server: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}

// Addr is the server's address.
func (p *RedisPeer) Addr() string { return p.addr }

// Pid is the server's process id.
func (p *RedisPeer) Pid() int { return p.cmd.Process.Pid }

// Name describes the server and how it is driven.
func (p *RedisPeer) Name() string {
	return fmt.Sprintf("redis-server %s on %s: pipelined SET, pipelined GET into the pages (go-redis v9, one pipeline per batch)", p.version, p.addr)
}

// Write stores src's chunks under names of the peer's own, in order.
func (p *RedisPeer) Write(ctx context.Context, src [][]byte) (time.Duration, error) {
	p.mu.Lock()
	names := make([]string, len(src))
	for i := range names {
		names[i] = fmt.Sprintf("strata-bench-chunk-%08d", len(p.names)+i)
	}
	p.names = append(p.names, names...)
	p.mu.Unlock()
	return p.WriteNamed(ctx, names, src)
}

// Read reads the next len(dst) chunks Write stored (see the Peer interface).
func (p *RedisPeer) Read(ctx context.Context, dst [][]byte) (time.Duration, error) {
	p.mu.Lock()
	if p.next+len(dst) > len(p.names) {
		p.mu.Unlock()
		return 0, fmt.Errorf("redis peer read: %d chunks asked, %d written and not read yet", len(dst), len(p.names)-p.next)
	}
	names := p.names[p.next : p.next+len(dst)]
	p.next += len(dst)
	p.mu.Unlock()
	return p.ReadNamed(ctx, names, dst)
}

// WriteNamed stores src[i] under names[i] with one pipeline of SETs.
func (p *RedisPeer) WriteNamed(ctx context.Context, names []string, src [][]byte) (time.Duration, error) {
	if len(names) != len(src) {
		return 0, fmt.Errorf("redis peer write: %d names for %d chunks", len(names), len(src))
	}
	start := time.Now()
	pipe := p.client.Pipeline()
	for i, b := range src {
		pipe.Set(ctx, names[i], b, 0)
	}
	cmds, err := pipe.Exec(ctx)
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("redis peer: pipelined SET of %d values: %w", len(src), firstCmdError(cmds, err))
	}
	return d, nil
}

// ReadNamed reads names[i] into dst[i] with one pipeline of GETs.
func (p *RedisPeer) ReadNamed(ctx context.Context, names []string, dst [][]byte) (time.Duration, error) {
	if len(names) != len(dst) {
		return 0, fmt.Errorf("redis peer read: %d names for %d buffers", len(names), len(dst))
	}
	start := time.Now()
	pipe := p.client.Pipeline()
	gets := make([]*redis.ZeroCopyStringCmd, len(dst))
	for i, b := range dst {
		gets[i] = pipe.GetToBuffer(ctx, names[i], b)
	}
	cmds, err := pipe.Exec(ctx)
	d := time.Since(start)
	if err != nil {
		return 0, fmt.Errorf("redis peer: pipelined GET of %d values: %w", len(dst), firstCmdError(cmds, err))
	}
	for i, g := range gets {
		if n := g.Val(); n != len(dst[i]) {
			return 0, fmt.Errorf("redis peer: GET %s returned %d bytes, want %d", names[i], n, len(dst[i]))
		}
	}
	return d, nil
}

// firstCmdError names the first command of a pipeline that failed.
func firstCmdError(cmds []redis.Cmder, err error) error {
	for _, c := range cmds {
		if cerr := c.Err(); cerr != nil {
			args := c.Args()
			if len(args) > 1 {
				return fmt.Errorf("%v %v: %w", args[0], args[1], cerr)
			}
			return cerr
		}
	}
	return err
}

// Close closes the client and stops the server by its pid (SIGKILL: nothing is
// persisted), then waits for it. It may be called more than once.
func (p *RedisPeer) Close() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return nil
	}
	p.closed = true
	_ = p.client.Close()
	select {
	case <-p.exited:
		return nil
	default:
	}
	if err := p.cmd.Process.Kill(); err != nil && !errors.Is(err, syscall.ESRCH) && !errors.Is(err, os.ErrProcessDone) {
		return fmt.Errorf("stop redis-server (pid %d): %w", p.cmd.Process.Pid, err)
	}
	select {
	case <-p.exited:
		return nil
	case <-time.After(10 * time.Second):
		return fmt.Errorf("redis-server (pid %d) did not exit 10 s after SIGKILL", p.cmd.Process.Pid)
	}
}

// tailBuffer keeps the last max bytes written to it: a child's output.
type tailBuffer struct {
	mu  sync.Mutex
	max int
	buf []byte
}

func (t *tailBuffer) Write(b []byte) (int, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.buf = append(t.buf, b...)
	if over := len(t.buf) - t.max; over > 0 {
		t.buf = append(t.buf[:0], t.buf[over:]...)
	}
	return len(b), nil
}

// lastLine is the last non-blank line written, for error messages.
func (t *tailBuffer) lastLine() string {
	t.mu.Lock()
	defer t.mu.Unlock()
	lines := bytes.Split(bytes.TrimSpace(t.buf), []byte("\n"))
	if len(lines) == 0 || len(lines[len(lines)-1]) == 0 {
		return "no output"
	}
	return string(bytes.TrimSpace(lines[len(lines)-1]))
}
