// Package redisproc runs real redis-server processes: standalone servers and
// small Redis Clusters on 127.0.0.1 and random free ports, each in a directory of
// its own with its log in a file there, and stops them by process group. Tests use
// it through internal/redistest; strata bench uses it to start a local Redis
// Cluster when none is given.
//
// A server started here also gets SIGKILL from the kernel when the process that
// started it dies without stopping it, so a crash leaves no redis-server behind.
package redisproc

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// ErrNotInstalled reports that redis-server or redis-cli is not on PATH.
var ErrNotInstalled = errors.New("not installed: apt-get install redis-server")

// Installed returns nil when redis-server and redis-cli are on PATH, and an error
// wrapping ErrNotInstalled that names the missing one otherwise.
func Installed() error {
	for _, bin := range []string{"redis-server", "redis-cli"} {
		if _, err := exec.LookPath(bin); err != nil {
			return fmt.Errorf("%s %w", bin, ErrNotInstalled)
		}
	}
	return nil
}

// startTimeout bounds how long a server may take to answer PING after it starts.
const startTimeout = 15 * time.Second

// Server is a redis-server process on 127.0.0.1 and a random free port. Its
// methods are safe for concurrent use.
type Server struct {
	port    int
	busPort int // cluster bus port; 0 for a standalone server
	dir     string
	logPath string
	args    []string // redis-server's arguments, the same for every (re)start

	mu      sync.Mutex
	cmd     *exec.Cmd
	exited  chan struct{} // closed when cmd has exited and been reaped
	stopped bool          // Stop was called: no more restarts
}

// Start starts a standalone redis-server with persistence off, working in dir
// (which must exist), and waits until it answers PING. args are extra
// configuration directives in redis-server's command-line form, such as
// "--maxmemory", "8mb", "--maxmemory-policy", "allkeys-lru"; they override the
// defaults. The caller stops it with Stop.
func Start(dir string, args ...string) (*Server, error) {
	return start(dir, false, args)
}

func start(dir string, cluster bool, extra []string) (*Server, error) {
	if err := Installed(); err != nil {
		return nil, err
	}
	var errs []error
	// A free port is free when asked and taken by redis-server a moment later;
	// another process may take it in between, so try again with fresh ports.
	for range 5 {
		s, err := newServer(dir, cluster, extra)
		if err == nil {
			err = s.launch()
		}
		if err == nil {
			return s, nil
		}
		errs = append(errs, err)
		if !errors.Is(err, errAddrInUse) {
			break
		}
	}
	return nil, fmt.Errorf("redisproc: start redis-server: %w", errors.Join(errs...))
}

func newServer(dir string, cluster bool, extra []string) (*Server, error) {
	port, err := freePort()
	if err != nil {
		return nil, err
	}
	s := &Server{port: port, dir: dir, logPath: filepath.Join(dir, "redis.log")}
	s.args = []string{
		"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--protected-mode", "yes",
		"--save", "", "--appendonly", "no", "--dir", dir, "--daemonize", "no", "--logfile", "",
	}
	if cluster {
		for s.busPort == 0 || s.busPort == port {
			if s.busPort, err = freePort(); err != nil {
				return nil, err
			}
		}
		s.args = append(s.args,
			"--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-port", strconv.Itoa(s.busPort),
			// A dead master is noticed in seconds, and the other masters keep
			// serving their slots meanwhile, as a cache cluster should be set up.
			"--cluster-node-timeout", "2000", "--cluster-require-full-coverage", "no")
	}
	s.args = append(s.args, extra...)
	return s, nil
}

// errAddrInUse reports that a server could not bind its port.
var errAddrInUse = errors.New("port already in use")

// launch starts the process and waits until it answers PING.
func (s *Server) launch() error {
	bin, err := exec.LookPath("redis-server")
	if err != nil {
		return err
	}
	logf, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o644)
	if err != nil {
		return err
	}
	defer logf.Close()
	fmt.Fprintf(logf, "### redisproc: %s %s\n", bin, strings.Join(s.args, " "))
	cmd := exec.Command(bin, s.args...)
	cmd.Dir = s.dir
	cmd.Stdout, cmd.Stderr = logf, logf
	// Its own process group, so that stopping it stops anything it forked; and
	// SIGKILL from the kernel if the test process dies without cleaning up.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", bin, err)
	}
	exited := make(chan struct{})
	go func() {
		_ = cmd.Wait()
		close(exited)
	}()
	s.mu.Lock()
	s.cmd, s.exited = cmd, exited
	s.mu.Unlock()
	return s.waitReady(exited)
}

// waitReady polls PING until the server answers, exits or startTimeout passes.
func (s *Server) waitReady(exited <-chan struct{}) error {
	deadline := time.Now().Add(startTimeout)
	for {
		reply, err := s.do(time.Second, "PING")
		var rerr ReplyError
		if err == nil && reply == "PONG" || errors.As(err, &rerr) {
			return nil // an error reply (NOAUTH: a password is set) is an answer too
		}
		select {
		case <-exited:
			tail := s.LogTail(5)
			if strings.Contains(tail, "Address already in use") {
				return fmt.Errorf("redis-server on %s: %w: %s", s.Addr(), errAddrInUse, lastLine(tail))
			}
			return fmt.Errorf("redis-server on %s exited at start: %s", s.Addr(), tail)
		case <-time.After(20 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			s.kill()
			return fmt.Errorf("redis-server on %s does not answer PING after %v (%v): %s", s.Addr(), startTimeout, err, s.LogTail(5))
		}
	}
}

// freePort asks the kernel for a free TCP port on loopback.
func freePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("redisproc: find a free port: %w", err)
	}
	port := ln.Addr().(*net.TCPAddr).Port
	return port, ln.Close()
}

// Addr is the server's address, host:port.
func (s *Server) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Dir is the server's working directory (its nodes.conf for a cluster node).
func (s *Server) Dir() string { return s.dir }

// PID is the process id of the server's current process (after Restart, the new one).
func (s *Server) PID() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.cmd == nil || s.cmd.Process == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// Running reports whether the server's process has not exited.
func (s *Server) Running() bool {
	s.mu.Lock()
	exited := s.exited
	s.mu.Unlock()
	if exited == nil {
		return false
	}
	select {
	case <-exited:
		return false
	default:
		return true
	}
}

// Kill stops the server at once with SIGKILL (nothing is saved, as in a crash) and
// waits for the process to exit. Restart starts it again.
func (s *Server) Kill() { s.kill() }

func (s *Server) kill() {
	s.mu.Lock()
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	signalGroup(cmd, syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
	}
}

// Restart starts the server again with the same port, directory and
// configuration, after killing it if it still runs, and waits until it answers
// PING. A killed cluster master comes back with its nodes.conf (its identity and
// slots) and rejoins the cluster; Cluster.WaitOK waits for that.
func (s *Server) Restart() error {
	s.kill()
	s.mu.Lock()
	stopped := s.stopped
	s.mu.Unlock()
	if stopped {
		return fmt.Errorf("redisproc: restart of redis-server %s after Stop", s.Addr())
	}
	// The port was ours a moment ago; another process may have taken it since,
	// or the kernel may still hold it for a moment. Try for a while.
	deadline := time.Now().Add(10 * time.Second)
	for {
		err := s.launch()
		if err == nil {
			return nil
		}
		if !errors.Is(err, errAddrInUse) || time.Now().After(deadline) {
			return fmt.Errorf("redisproc: restart redis-server: %w", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop ends the server for good: SIGTERM to its process group, SIGKILL when it
// has not exited 5 s later. It is safe to call more than once.
func (s *Server) Stop() {
	s.mu.Lock()
	s.stopped = true
	cmd, exited := s.cmd, s.exited
	s.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	signalGroup(cmd, syscall.SIGTERM)
	select {
	case <-exited:
		return
	case <-time.After(5 * time.Second):
	}
	signalGroup(cmd, syscall.SIGKILL)
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
	}
}

// signalGroup sends sig to the process group that cmd leads (and to cmd itself,
// should the group be gone).
func signalGroup(cmd *exec.Cmd, sig syscall.Signal) {
	pid := cmd.Process.Pid
	if err := syscall.Kill(-pid, sig); err != nil {
		_ = cmd.Process.Signal(sig)
	}
}

// LogTail returns the last n lines of the server's log (all its starts).
func (s *Server) LogTail(n int) string {
	b, err := os.ReadFile(s.logPath)
	if err != nil {
		return fmt.Sprintf("(no log: %v)", err)
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

func lastLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.LastIndexByte(s, '\n'); i >= 0 {
		return s[i+1:]
	}
	return s
}

// ReplyError is an error reply of the server, such as "ERR unknown command".
type ReplyError string

func (e ReplyError) Error() string { return "redis: " + string(e) }

// ErrNil is Do's error for a nil reply (a missing key).
var ErrNil = errors.New("redisproc: nil reply")

// Do sends one command to the server on a fresh connection and returns its reply
// as text: a status or bulk string as it is, an integer in decimal, an array as
// its elements' texts, one per line. An error reply is a ReplyError; a nil reply
// is ErrNil. It is meant for administration (CLUSTER INFO, CONFIG SET) and for
// tests that poke at a server's contents by hand, not for data.
func (s *Server) Do(args ...string) (string, error) { return s.do(10*time.Second, args...) }

func (s *Server) do(timeout time.Duration, args ...string) (string, error) {
	conn, err := net.DialTimeout("tcp", s.Addr(), timeout)
	if err != nil {
		return "", err
	}
	defer conn.Close()
	if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
		return "", err
	}
	var req bytes.Buffer
	fmt.Fprintf(&req, "*%d\r\n", len(args))
	for _, a := range args {
		fmt.Fprintf(&req, "$%d\r\n%s\r\n", len(a), a)
	}
	if _, err := conn.Write(req.Bytes()); err != nil {
		return "", err
	}
	return readReply(bufio.NewReader(conn))
}

// readReply reads one RESP2 reply.
func readReply(r *bufio.Reader) (string, error) {
	line, err := r.ReadString('\n')
	if err != nil {
		return "", err
	}
	line = strings.TrimSuffix(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("redisproc: empty reply line")
	}
	switch line[0] {
	case '+', ':':
		return line[1:], nil
	case '-':
		return "", ReplyError(line[1:])
	case '$':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("redisproc: bad bulk length %q", line)
		}
		if n < 0 {
			return "", ErrNil
		}
		b := make([]byte, n+2)
		if _, err := io.ReadFull(r, b); err != nil {
			return "", err
		}
		return string(b[:n]), nil
	case '*':
		n, err := strconv.Atoi(line[1:])
		if err != nil {
			return "", fmt.Errorf("redisproc: bad array length %q", line)
		}
		if n < 0 {
			return "", ErrNil
		}
		parts := make([]string, 0, n)
		for range n {
			p, err := readReply(r)
			if err != nil && !errors.Is(err, ErrNil) {
				return "", err
			}
			parts = append(parts, p)
		}
		return strings.Join(parts, "\n"), nil
	}
	return "", fmt.Errorf("redisproc: unexpected reply %q", line)
}
