package file

import (
	"context"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"
	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/storage"
)

// The object API stores named byte objects with the same file format, checks,
// write-once semantics and capacity bound as pool pages, for callers that hold
// bytes rather than pool pages: the node service spills its DRAM arena here. An
// object's file is named by a 128-bit hash of its name, in the subdirectory named
// by the hash's first byte, so a directory must serve either pools or objects,
// not both. The name itself is in the file's header, where every read checks it:
// any name that fits the header can be stored (a space, a '/', a Hugging Face
// model id, 512 bytes), so the node service's spill takes every key its wire
// protocol accepts.

// objRel is where object name lives, relative to the store's directory.
func objRel(name string) string {
	h := xxh3.HashString128(name)
	const hexDigits = "0123456789abcdef"
	b := make([]byte, 0, 3+32)
	b = append(b, hexDigits[h.Hi>>60], hexDigits[(h.Hi>>56)&15], '/')
	for _, w := range [2]uint64{h.Hi, h.Lo} {
		for shift := 60; shift >= 0; shift -= 4 {
			b = append(b, hexDigits[(w>>uint(shift))&15])
		}
	}
	return string(b)
}

// MaxObjectName is the longest object name, in bytes: what the file header holds.
const MaxObjectName = maxHeaderName

func checkObjectName(name string) error {
	if name == "" || len(name) > MaxObjectName {
		return fmt.Errorf("file store: object name of %d bytes: want 1 to %d: %w", len(name), MaxObjectName, storage.ErrBatch)
	}
	return nil
}

func runsLen(runs [][]byte) int64 {
	var n int64
	for _, r := range runs {
		n += int64(len(r))
	}
	return n
}

// object runs fn with a scratch buffer whose body points at runs, after the
// checks every object call makes.
func (s *Store) object(ctx context.Context, op, name string, runs [][]byte, fn func(o objSpec, rel string, b *ioBuf) error, format storage.Format) error {
	if err := ctx.Err(); err != nil {
		return ctxError(op, err)
	}
	if err := checkObjectName(name); err != nil {
		return err
	}
	s.mu.RLock()
	closed := s.closed
	if !closed {
		s.inflight.Add(1)
	}
	s.mu.RUnlock()
	if closed {
		return fmt.Errorf("file store %s: %s %s: %w", s.dir, op, name, storage.ErrClosed)
	}
	defer s.inflight.Done()
	b := s.bufs.Get().(*ioBuf)
	defer s.bufs.Put(b)
	b.body.runs, b.body.starts, b.body.n = b.body.runs[:0], b.body.starts[:0], 0
	for _, r := range runs {
		if len(r) > 0 {
			b.body.add(r)
		}
	}
	err := fn(newObjSpec(format, runsLen(runs)), objRel(name), b)
	s.stats.fault(err)
	return err
}

// PutObject stores the concatenation of runs as object name in format, write-once:
// an object of that name already stored is a success and nothing is written (an
// object of another format under the name stays, and this put is dropped). The
// object is durable when PutObject returns if Config.Sync is set.
func (s *Store) PutObject(ctx context.Context, name string, format storage.Format, runs ...[]byte) error {
	if runsLen(runs) == 0 {
		return fmt.Errorf("file store: put object %s: no bytes: %w", name, storage.ErrBatch)
	}
	return s.object(ctx, "put object", name, runs, func(o objSpec, rel string, b *ioBuf) error {
		sub, err := s.writeObj(o, rel, name, b)
		if errors.Is(err, unix.ENOSPC) && s.evictForSpace(fileBytes(o.bodyLen)) {
			// The device filled up under the index's view: evict and try once more.
			sub, err = s.writeObj(o, rel, name, b)
		}
		if err == nil && sub != "" && s.cfg.Sync {
			if err := syncDir(sub); err != nil {
				return ioError("sync directory", sub, err)
			}
		}
		return err
	}, format)
}

// GetObject reads object name into runs, whose total length must be the object's
// (ObjectSize tells it), and verifies its checksum over the bytes now in runs. A
// missing object, or one of another format, is storage.ErrNotFound; one that fails
// a check is storage.ErrCorrupt and is removed. On error runs hold undefined bytes.
func (s *Store) GetObject(ctx context.Context, name string, format storage.Format, runs ...[]byte) error {
	return s.object(ctx, "get object", name, runs, func(o objSpec, rel string, b *ioBuf) error {
		return s.readObj(o, rel, name, b)
	}, format)
}

// ObjectSize returns the body length of object name in format: storage.ErrNotFound
// when there is none (or it is of another format); a corrupt file is removed and
// is not found either.
func (s *Store) ObjectSize(ctx context.Context, name string, format storage.Format) (int64, error) {
	var size int64
	err := s.object(ctx, "stat object", name, nil, func(_ objSpec, rel string, b *ioBuf) error {
		h, err := s.readHeader(rel)
		if err != nil {
			return err
		}
		if h.name != name {
			return fmt.Errorf("file store: object %s: %w", name, storage.ErrNotFound)
		}
		if h.format != format {
			return fmt.Errorf("file store: object %s is stored in format %#x, not %#x: %w (%w)", name, uint64(h.format), uint64(format), storage.ErrNotFound, ErrOtherFormat)
		}
		size = int64(h.bodyLen)
		return nil
	}, format)
	return size, err
}

// RemoveObject deletes object name and reports whether there was one; a missing
// one is no error.
func (s *Store) RemoveObject(ctx context.Context, name string) (bool, error) {
	var existed bool
	err := s.object(ctx, "remove object", name, nil, func(_ objSpec, rel string, _ *ioBuf) error {
		var err error
		existed, err = s.remove(rel)
		return err
	}, 0)
	return existed, err
}

// readHeader reads and checks the header of the file at rel; a file whose header
// is damaged, or whose length disagrees with it, is removed as corrupt.
func (s *Store) readHeader(rel string) (header, error) {
	path := s.path(rel)
	fd, err := vecio.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err == unix.ENOENT {
		s.idx.forget(rel)
		return header{}, fmt.Errorf("file store: object %s: %w", rel, storage.ErrNotFound)
	}
	if err != nil {
		return header{}, ioError("open", path, err)
	}
	defer unix.Close(fd)
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return header{}, ioError("stat", path, err)
	}
	buf := make([]byte, headerSize)
	n, err := preadAt(fd, buf, 0)
	if err != nil {
		return header{}, ioError("read", path, err)
	}
	h, err := decodeHeader(buf[:n])
	if err != nil {
		return header{}, s.corrupt(path, rel, &st, err.Error())
	}
	if st.Size != headerSize+int64(h.bodyLen) {
		return header{}, s.corrupt(path, rel, &st, fmt.Sprintf("file of %d bytes for a body of %d", st.Size, h.bodyLen))
	}
	return h, nil
}

// remove deletes the file at rel and forgets it.
func (s *Store) remove(rel string) (bool, error) {
	s.idx.forget(rel)
	err := unix.Unlink(s.path(rel))
	switch err {
	case nil:
		return true, nil
	case unix.ENOENT:
		return false, nil
	}
	return false, ioError("remove", s.path(rel), err)
}
