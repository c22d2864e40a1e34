// Package spill is the node service's SSD tier: objects evicted from the DRAM
// arena are appended to segment files, one after another, instead of each
// becoming a file of its own (creating and removing an inode per object cost a
// quarter of the service's CPU).
//
// A put copies the object, behind a header that names it (key, format, length,
// checksums), into one of two write buffers of mapped memory; a writer
// goroutine writes a full buffer to the end of the current segment with one
// O_DIRECT write while puts fill the other. An object too large for a buffer
// is written straight from the caller's memory, its header padded to 4 KiB so
// that its bytes keep their alignment. An index in memory maps a 128-bit hash
// of each key to its record (segment, offset, length, format), in records and
// a hash table mapped outside the Go heap (index.go: about 60 bytes an object,
// and nothing for the garbage collector to scan or sweep); a read checks
// the record's header, the key in it included, and the data's checksum, so it
// never serves another key's bytes or damaged ones. A record still in a write
// buffer is read from the buffer.
//
// The spill is a cache: when it reaches its capacity (or the device its free
// space) it drops its oldest segment whole, and the objects in it with it (the
// hot ones are in the arena anyway). A remove forgets the object and appends a
// tombstone, and returns once the tombstone is written, so that the object
// stays removed after a restart; a record that fails its checks on a read is
// dropped with a tombstone too. A segment whose live objects fall below
// Config.CompactBelow of it is compacted (compact.go): its live objects, and
// the tombstones that still shadow older records, are copied to the end of the
// spill and its file is deleted, at a bounded rate. New rebuilds the index by
// reading the record headers of every segment (or its hint file), oldest
// first, a later record of a key overriding an earlier one, stopping a segment
// at its first bad record (a write torn by a crash) and cutting it there; the
// data of the newest segment, the one a crash tears, is verified as well, and
// every read verifies the rest. That scan reads segments a window of MiBs at
// a time, and can run after New returns (Config.ScanInBackground), the
// earlier run's objects being misses until it is done (scan.go).
//
// The directory is private to the service's user (dir.go): it holds every
// tenant's objects and keys, so New refuses one that others can enter or
// write, and no file in it is opened through a symbolic link or trusted unless
// it is a regular file of that user.
//
// What the index says and what New would rebuild from the files agree for
// every key: the newest record of a key in file order (segment, offset) is its
// live object, or a tombstone when it has none. Puts, removes, drops of
// corrupt records and compaction's copies each place their record in the same
// critical section that checks and changes the key's index entry, so that
// file order is the order in which they change the index. A put is indexed
// (pending, invisible to reads) when it places its record: a remove while it
// copies its bytes in cancels it, with a tombstone after its record.
package spill
