package node

import (
	"context"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"

	"github.com/stratakv/strata/node/wire"
)

func (s *Server) accept() {
	defer s.wg.Done()
	var backoff time.Duration
	for {
		uc, err := s.ln.AcceptUnix()
		if err != nil {
			select {
			case <-s.done:
				return
			default:
			}
			if !temporaryAccept(err) {
				s.acceptErr.Store(&acceptFailure{err: err, at: time.Now(), fatal: true})
				s.log.Error("accept on the node socket failed; no new clients", "err", err)
				return
			}
			// Out of descriptors or memory: the clients already connected keep
			// working, and new ones are accepted again once some are freed.
			// Stopping here would lock every new client out for good.
			s.acceptErr.Store(&acceptFailure{err: err, at: time.Now()})
			s.st.acceptErrors.Add(1)
			backoff = min(max(2*backoff, 5*time.Millisecond), time.Second)
			s.logs.warn("accept on the node socket failed; retrying (raise the descriptor limit, ulimit -n, or lower --max-clients and --max-segments-per-client)",
				"err", err, "retry_in", backoff)
			t := time.NewTimer(backoff)
			select {
			case <-t.C:
			case <-s.done:
				t.Stop()
				return
			}
			continue
		}
		backoff = 0
		s.acceptErr.Store(nil)
		s.admit(uc)
	}
}

// temporaryAccept reports whether an accept error passes: the service ran out
// of descriptors or memory, or the connection went away before it was accepted.
func temporaryAccept(err error) bool {
	var errno syscall.Errno
	if !errors.As(err, &errno) {
		return false
	}
	switch errno {
	case syscall.EMFILE, syscall.ENFILE, syscall.ENOBUFS, syscall.ENOMEM, syscall.ECONNABORTED, syscall.EINTR, syscall.EPROTO, syscall.EPERM:
		return true
	}
	return false
}

// admit starts a session for a new connection, or answers busy and closes it
// when the service or the peer's user has all the connections it may have.
func (s *Server) admit(uc *net.UnixConn) {
	c := &session{srv: s, conn: wire.NewConn(uc), segments: map[uint32]*segment{}, uid: -1}
	if pid, uid, _, err := c.conn.PeerCred(); err == nil {
		c.pid, c.uid = pid, uid
	}
	perUID := s.cfg.MaxClientsPerUID
	if perUID == 0 {
		perUID = s.cfg.MaxClients
	}
	s.mu.Lock()
	var why string
	switch {
	case s.closed:
	case len(s.sessions) >= s.cfg.MaxClients:
		why = fmt.Sprintf("the node service has its %d clients; raise --max-clients", s.cfg.MaxClients)
	case s.perUID[c.uid] >= perUID:
		why = fmt.Sprintf("user %d has its %d connections to the node service; close idle ones or raise --max-clients-per-uid", c.uid, perUID)
	}
	if s.closed || why != "" {
		s.mu.Unlock()
		if why != "" {
			s.st.rejected.Add(1)
			s.logs.warn("connection refused", "uid", c.uid, "pid", c.pid, "reason", why)
			// A short bound: the accept loop must not wait on a client that does
			// not read.
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			_ = c.conn.Send(ctx, wire.TypeError, 0, wire.Error{Code: wire.Busy, Message: why})
			cancel()
		}
		_ = c.conn.Close()
		return
	}
	c.id = s.nextID.Add(1)
	s.sessions[c.id] = c
	s.perUID[c.uid]++
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		c.serve()
		s.mu.Lock()
		delete(s.sessions, c.id)
		if s.perUID[c.uid]--; s.perUID[c.uid] <= 0 {
			delete(s.perUID, c.uid)
		}
		s.mu.Unlock()
	}()
}

// acceptFailure is a failed accept on the socket.
type acceptFailure struct {
	err   error
	at    time.Time
	fatal bool // the accept loop stopped
}

// acceptFailureFresh is how long a failed accept makes the service unhealthy.
// While descriptors stay exhausted and a client waits, accept fails again at
// least every second (the backoff's bound); a failure older than this was for
// a client that went away, and the next client may well be accepted.
const acceptFailureFresh = 5 * time.Second

// health reports why the service is not healthy, or nil.
func (s *Server) health() error {
	if f := s.acceptErr.Load(); f != nil && (f.fatal || time.Since(f.at) < acceptFailureFresh) {
		return fmt.Errorf("the node socket cannot accept new clients: %w", f.err)
	}
	return nil
}
