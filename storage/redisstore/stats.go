package redisstore

import (
	"sync/atomic"

	"github.com/stratakv/strata/storage"
)

// Stats is a snapshot of a store's counters, for this process.
type Stats struct {
	// Mode is ModeCluster or ModeStandalone, as detected or configured.
	Mode string `json:"mode"`
	// Calls counts Exists, Get, Put and object API calls; Objects the objects they
	// named (one per page part for pools).
	Calls   int64 `json:"calls"`
	Objects int64 `json:"objects"`
	// Reads counts objects read and verified, ReadBytes their body bytes.
	Reads     int64 `json:"reads"`
	ReadBytes int64 `json:"readBytes"`
	// Writes counts objects written, WriteBytes their body bytes.
	Writes     int64 `json:"writes"`
	WriteBytes int64 `json:"writeBytes"`
	// Misses counts objects looked for by a get and not found (or of another format).
	Misses int64 `json:"misses"`
	// Partial counts objects found with a header but without all their chunks (Redis
	// evicted or expired a chunk, or a writer died); they are removed and miss.
	Partial int64 `json:"partial"`
	// CorruptRemoved counts objects that failed a check (header, chunk length,
	// checksum) and were removed.
	CorruptRemoved int64 `json:"corruptRemoved"`
	// WritesSkipped counts puts of objects already stored (write-once).
	WritesSkipped int64 `json:"writesSkipped"`
	// FormatConflicts counts puts that found the object's name held by an object of
	// another format; that object stays and this put is dropped.
	FormatConflicts int64 `json:"formatConflicts"`
	// Replans counts objects read with a chunk cut other than the reader's (written
	// with another ChunkBytes or by a pool of another layout of the same format):
	// they cost a second round trip.
	Replans int64 `json:"replans"`
	// Staged counts chunks moved through a staging buffer (they cross runs) rather
	// than straight between the socket and host memory.
	Staged int64 `json:"staged"`
	// Skipped counts objects failed fast because their shard was down.
	Skipped int64 `json:"skipped"`
	// Faults counts per-object errors by storage.FaultKind.
	Faults map[string]int64 `json:"faults"`
	// Shards is the state of every shard the store has talked to.
	Shards []ShardStats `json:"shards"`
}

type counters struct {
	calls, objects                 atomic.Int64
	reads, readBytes               atomic.Int64
	writes, writeBytes             atomic.Int64
	misses, partial, corrupt       atomic.Int64
	skippedWrites, conflicts       atomic.Int64
	replans, staged, skippedShards atomic.Int64
	faults                         storage.FaultCounts
}

// fault counts err by its kind; nil and misses are not faults.
func (c *counters) fault(err error) { c.faults.Add(err) }

// Stats returns the store's counters. It is safe to call at any time, also after Close.
func (s *Store) Stats() Stats {
	st := Stats{
		Mode:            s.mode,
		Calls:           s.stats.calls.Load(),
		Objects:         s.stats.objects.Load(),
		Reads:           s.stats.reads.Load(),
		ReadBytes:       s.stats.readBytes.Load(),
		Writes:          s.stats.writes.Load(),
		WriteBytes:      s.stats.writeBytes.Load(),
		Misses:          s.stats.misses.Load(),
		Partial:         s.stats.partial.Load(),
		CorruptRemoved:  s.stats.corrupt.Load(),
		WritesSkipped:   s.stats.skippedWrites.Load(),
		FormatConflicts: s.stats.conflicts.Load(),
		Replans:         s.stats.replans.Load(),
		Staged:          s.stats.staged.Load(),
		Skipped:         s.stats.skippedShards.Load(),
		Faults:          s.stats.faults.All(),
		Shards:          s.shards.stats(),
	}
	return st
}
