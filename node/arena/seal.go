package arena

import (
	"runtime"
	"runtime/debug"
	"time"
)

// Seals. A large object's bytes are not in its check word (layout.go), so a
// restarted service could not tell a flipped bit in them from the bytes that
// were put, and would serve the damage (or evict it to the spill under a
// fresh checksum). So each large object of an arena file is sealed after its
// Commit by the sealers, goroutines of their own (sealWorkers): one hashes the
// bytes and stores the seal in the descriptor, one 8-byte store outside the
// check word. Hashing in Commit
// instead would halve put throughput (xxh3 runs at about memcpy speed); here
// it costs the put path nothing but a queue append, and the hash runs while
// the bytes are still in the caches of a machine that has a core to spare.
//
// Recovery (recover.go) hashes every large object again before it indexes it:
// one whose seal does not match was damaged while no service ran (or written
// by someone else) and one with no seal was committed in the moments before a
// kill, before the sealer reached it; neither can be told from damage, so
// both are dropped and counted, never served or spilled. Close seals what is
// left before the file is marked clean: a clean shutdown loses nothing, and a
// kill loses at most the objects the sealer had not reached (Stats().Unsealed
// says how many, at any moment). An anonymous arena has no restart and seals
// nothing.
//
// A sealer takes no pin on what it hashes: under the lock again it checks
// that the record is still the same committed object (its state, and the
// commit sequence in its trailer, unique per commit) before it stores the
// seal. An object removed or evicted meanwhile fails that check (its extent may
// hold another object's bytes by then) and its hash is thrown away; one that
// stayed committed kept its bytes, which are written once.

// sealBatch is how many objects a sealer takes from the queue under one lock.
const sealBatch = 64

// sealWorkers is how many goroutines seal: one per four CPUs, from one to
// four. One hashes at about one core's memcpy rate (xxh3), slower than
// several copy workers put; more of them on a machine with cores to spare
// keep the window a kill loses short.
func sealWorkers() int { return min(max(runtime.GOMAXPROCS(0)/4, 1), 4) }

// sealJob is a committed large object to seal: its record and commit sequence.
type sealJob struct {
	idx uint32
	seq uint64
}

// sealer is the queue of objects to seal and what sealing did; the arena's
// lock guards it.
type sealer struct {
	on    bool          // an arena file: large objects are sealed
	queue []sealJob     // committed and not sealed yet, in commit order
	wake  chan struct{} // a Commit queued an object: one token per sealer
	// abandon is set by tests to end the sealer as a kill would, with
	// objects left unsealed.
	abandon bool

	// hashing is how many objects a sealer took from the queue and has not
	// stored the seals of: still unsealed, for Stats, though not queued.
	hashing int

	sealed, sealedBytes, skipped int64
	took                         time.Duration
}

// queueSealLocked queues the large object idx, committed with seq, for the
// sealer.
func (a *Arena) queueSealLocked(idx uint32, seq uint64) {
	a.seal.queue = append(a.seal.queue, sealJob{idx, seq})
	select {
	case a.seal.wake <- struct{}{}:
	default:
	}
}

// sealLoop seals queued objects until the arena stops, and then what is left
// (Close marks the file clean only after that).
func (a *Arena) sealLoop() {
	defer a.done.Done()
	defer a.guard(debug.SetPanicOnFault(true), nil)
	for {
		select {
		case <-a.stop:
			a.sealQueued()
			return
		case <-a.seal.wake:
		}
		a.sealQueued()
	}
}

// sealSpan is a queued object taken to seal: where its seal and bytes lie.
type sealSpan struct {
	job      sealJob
	end, off int64
	size     int64
	seal     uint64
}

// sealQueued seals the queue empty, batch by batch. The lock is taken and
// released by deferred calls only: a fault in the arena's memory under it (a
// truncated file) unwinds to the goroutine's guard with the lock released,
// which breaking the arena needs.
func (a *Arena) sealQueued() {
	var spans []sealSpan
	for {
		var mem []byte
		var more bool
		spans, mem, more = a.takeSeals(spans[:0])
		if !more {
			return
		}
		start := time.Now()
		for i := range spans {
			s := &spans[i]
			s.seal = a.sealOf(s.off, mem[s.off:s.off+s.size:s.off+s.size])
		}
		took := time.Since(start)
		if h := a.cfg.sealHashed; h != nil {
			h()
		}
		a.storeSeals(spans, took)
	}
}

// takeSeals takes the next batch of the queue into spans (those still
// sealable) and the arena's memory; false when there is nothing to seal.
func (a *Arena) takeSeals(spans []sealSpan) ([]sealSpan, []byte, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.broken() || a.seal.abandon || len(a.seal.queue) == 0 {
		if len(a.seal.queue) == 0 {
			a.seal.queue = nil // what a burst grew goes
		}
		return spans, nil, false
	}
	n := min(len(a.seal.queue), sealBatch)
	for _, j := range a.seal.queue[:n] {
		if r := a.rec(j.idx); a.sealableLocked(r, j.seq) {
			spans = append(spans, sealSpan{job: j, end: a.slotEnd(r), off: a.bytesOff(r), size: r.size})
		} else {
			a.seal.skipped++
		}
	}
	a.seal.queue = a.seal.queue[n:]
	a.seal.hashing += len(spans)
	return spans, a.mem, true
}

// storeSeals stores the seals of spans whose objects are still the ones hashed.
func (a *Arena) storeSeals(spans []sealSpan, took time.Duration) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.seal.hashing -= len(spans)
	for _, s := range spans {
		if a.broken() || !a.sealableLocked(a.rec(s.job.idx), s.job.seq) {
			a.seal.skipped++
			continue
		}
		*a.sealWord(s.end) = s.seal
		a.seal.sealed++
		a.seal.sealedBytes += s.size
	}
	a.seal.took += took
}

// sealableLocked reports whether r is still the large object committed with
// seq: its bytes are the ones that were put.
func (a *Arena) sealableLocked(r *record, seq uint64) bool {
	return r.state == committed && r.flags&flagLarge != 0 && a.readTrailer(a.slotEnd(r)).seq == seq
}
