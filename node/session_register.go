package node

import (
	"fmt"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/node/wire"
)

// maxRefused is how many refusals a session keeps the reasons of, for Stats;
// beyond it they are only counted.
const maxRefused = 16

// noteRefusedLocked records why a registration was refused or a segment dropped;
// c.mu is held.
func (c *session) noteRefusedLocked(why string) {
	if len(c.refused) >= maxRefused {
		c.refusedOmitted++
		return
	}
	c.refused = append(c.refused, why)
}

func (c *session) handleHello(id uint64, m *wire.Hello) bool {
	if m.Version != wire.Version {
		c.reply(id, wire.TypeError, wire.Error{Code: wire.Unavailable,
			Message: fmt.Sprintf("protocol version %d is not served; this service speaks version %d: upgrade the client or the service", m.Version, wire.Version)})
		return false
	}
	c.name = m.ClientName
	if m.PID > 0 && c.pid == 0 {
		c.pid = int(m.PID)
	}
	c.hello.Store(true)
	c.srv.log.Info("client connected", "client", c.id, "name", c.name, "pid", c.pid)
	st := c.srv.startStats(c.srv.arena.Stats())
	c.reply(id, wire.TypeHelloReply, wire.HelloReply{ClientID: c.id, ServerVersion: serverVersion(), MaxBatch: MaxBatchObjects, ClockNS: monoNow(),
		InstanceID: st.InstanceID, ContentID: st.ContentID, Starting: st.State != StateReady, ReadyPercent: uint32(st.ReadyPercent), Warm: st.Warm,
		Revision: min(wire.RevisionOf(m.Revision), wire.Revision)})
	return true
}

func (c *session) handleRegister(id uint64, m *wire.RegisterSegment, fds []int) {
	fd := fds[0]
	if m.Fence {
		c.handleFence(id, m, fd)
		return
	}
	refuse := func(code wire.Status, why string) {
		_ = unix.Close(fd)
		c.mu.Lock()
		c.noteRefusedLocked(why)
		c.mu.Unlock()
		c.srv.st.refused.Add(1)
		c.srv.logs.warn("segment registration refused", "client", c.id, "name", c.name, "segment", m.Name, "reason", why)
		c.reply(id, wire.TypeError, wire.Error{Code: code, Message: wire.ClipMessage(why)})
	}
	c.mu.Lock()
	over := c.registered+int64(m.Size) > c.srv.cfg.ClientQuotaBytes
	have, segs := c.registered, len(c.segments)
	c.mu.Unlock()
	if segs >= c.srv.cfg.MaxSegmentsPerClient {
		// Each segment holds a descriptor and a mapping in the service: without
		// a bound, thousands of tiny segments run the service out of descriptors.
		refuse(wire.Quota, fmt.Sprintf("segment %q would be client %q's segment number %d, over the service's --max-segments-per-client of %d: "+
			"register fewer, larger host pools; this pool runs without L3", m.Name, c.name, segs+1, c.srv.cfg.MaxSegmentsPerClient))
		return
	}
	if over {
		refuse(wire.Quota, fmt.Sprintf("segment %q of %d bytes would bring client %q to %d bytes of registered memory, over its quota of %d: raise the service's --client-quota or shrink the host pool; this pool runs without L3",
			m.Name, m.Size, c.name, have+int64(m.Size), c.srv.cfg.ClientQuotaBytes))
		return
	}
	if why := c.srv.chargeRegistered(m.Name, int64(m.Size)); why != "" {
		refuse(wire.Quota, why)
		return
	}
	mem, err := mapSegment(fd, m.Size)
	if err != nil {
		c.srv.registeredBytes.Add(-int64(m.Size))
		refuse(wire.BadRange, fmt.Sprintf("segment %q: %v", m.Name, err))
		return
	}
	c.mu.Lock()
	c.nextSeg++
	seg := &segment{id: c.nextSeg, name: m.Name, fd: fd, mem: mem}
	c.segments[seg.id] = seg
	c.registered += int64(m.Size)
	c.mu.Unlock()
	c.reply(id, wire.TypeRegisterSegmentReply, wire.RegisterSegmentReply{SegmentID: seg.id})
}

// handleFence registers the connection's fence page (window.go). It is not a
// host pool: it counts against no quota (it is one page), and ranges never
// name it.
func (c *session) handleFence(id uint64, m *wire.RegisterSegment, fd int) {
	refuse := func(why string) {
		_ = unix.Close(fd)
		c.srv.logs.warn("fence page refused", "client", c.id, "name", c.name, "reason", why)
		c.reply(id, wire.TypeError, wire.Error{Code: wire.BadRange, Message: wire.ClipMessage(why)})
	}
	if c.fence.Load() != nil {
		refuse("this connection has a fence page already; one per connection")
		return
	}
	f, err := mapFence(fd, m.Size)
	if err != nil {
		refuse(fmt.Sprintf("fence page %q: %v", m.Name, err))
		return
	}
	c.fence.Store(f)
	c.mu.Lock()
	c.nextSeg++
	sid := c.nextSeg
	c.mu.Unlock()
	c.reply(id, wire.TypeRegisterSegmentReply, wire.RegisterSegmentReply{SegmentID: sid})
}

func (c *session) handleUnregister(id uint64, m *wire.UnregisterSegment) {
	c.mu.Lock()
	seg := c.segments[m.SegmentID]
	if seg != nil {
		delete(c.segments, m.SegmentID)
		c.registered -= int64(len(seg.mem))
		c.srv.registeredBytes.Add(-int64(len(seg.mem)))
	}
	c.mu.Unlock()
	if seg == nil {
		c.reply(id, wire.TypeError, wire.Error{Code: wire.BadRange, Message: fmt.Sprintf("segment %d is not registered by this client", m.SegmentID)})
		return
	}
	seg.release()
	c.reply(id, wire.TypeAck, nil)
}
