package file

import (
	"sync/atomic"

	"github.com/stratakv/strata/storage"
)

// Stats is a snapshot of a store's counters. Files and bytes are this process's
// view of the directory: exact for its own writes, refreshed from disk by scans.
type Stats struct {
	// Bytes and Files are what the directory holds, in whole 4 KiB blocks.
	Bytes int64 `json:"bytes"`
	Files int64 `json:"files"`
	// CapacityBytes is the configured bound on Bytes.
	CapacityBytes int64 `json:"capacityBytes"`
	// Reads counts object parts read and verified, ReadBytes their body bytes.
	Reads     int64 `json:"reads"`
	ReadBytes int64 `json:"readBytes"`
	// Misses counts object parts looked for and not found.
	Misses int64 `json:"misses"`
	// Writes counts object parts written, WriteBytes their body bytes.
	Writes     int64 `json:"writes"`
	WriteBytes int64 `json:"writeBytes"`
	// WritesSkipped counts object parts a put found already stored (write-once).
	WritesSkipped int64 `json:"writesSkipped"`
	// FormatConflicts counts puts that found their object's name held by an object
	// of another format (another engine with another layout or page size and the
	// same model prefix); the other object stays, and this pool's key stays a miss.
	FormatConflicts int64 `json:"formatConflicts"`
	// CorruptRemoved counts files that failed their checks and were removed.
	CorruptRemoved int64 `json:"corruptRemoved"`
	// Evictions counts files removed to stay under the capacity.
	Evictions int64 `json:"evictions"`
	// Rescans counts directory scans after New's.
	Rescans int64 `json:"rescans"`
	// StaleTempsRemoved counts temporary files of crashed writers removed by scans.
	StaleTempsRemoved int64 `json:"staleTempsRemoved"`
	// DirectIO reports whether O_DIRECT is in use (false after a fallback).
	DirectIO bool `json:"directIO"`
	// Faults counts per-key errors of Exists, Get and Put by storage.FaultKind.
	Faults map[string]int64 `json:"faults"`
}

type counters struct {
	reads, readBytes, misses                atomic.Int64
	writes, writeBytes, skipped, conflicts  atomic.Int64
	corrupt, evictions, rescans, staleTemps atomic.Int64
	faults                                  storage.FaultCounts
}

// fault counts err by its kind; nil and misses are not faults.
func (c *counters) fault(err error) { c.faults.Add(err) }

func (c *counters) faultAll(errs []error) { c.faults.AddAll(errs) }

// Stats returns the store's counters. It is safe to call at any time, also after Close.
func (s *Store) Stats() Stats {
	bytes, files := s.idx.usage()
	st := Stats{
		Bytes:             bytes,
		Files:             files,
		CapacityBytes:     s.cfg.CapacityBytes,
		Reads:             s.stats.reads.Load(),
		ReadBytes:         s.stats.readBytes.Load(),
		Misses:            s.stats.misses.Load(),
		Writes:            s.stats.writes.Load(),
		WriteBytes:        s.stats.writeBytes.Load(),
		WritesSkipped:     s.stats.skipped.Load(),
		FormatConflicts:   s.stats.conflicts.Load(),
		CorruptRemoved:    s.stats.corrupt.Load(),
		Evictions:         s.stats.evictions.Load(),
		Rescans:           s.stats.rescans.Load(),
		StaleTempsRemoved: s.stats.staleTemps.Load(),
		DirectIO:          s.direct.Load(),
		Faults:            s.stats.faults.All(),
	}
	return st
}
