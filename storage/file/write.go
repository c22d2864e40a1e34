package file

import (
	"context"
	"os"
	"time"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/internal/vecio"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
)

// syncDirs makes the renames of a put durable: each subdirectory in dirty
// (that of a part written without error) is fsynced once, and the part's error
// becomes that sync's. The syncs run on the I/O workers at once: one at a time,
// a batch of 128 random keys syncs about 100 subdirectories in a row, each a
// journal commit, which cost a fifth of the put's time; at once, the file
// system commits them together.
func (s *Store) syncDirs(ctx context.Context, dirty []string, errs []error) {
	at := map[string]int{}
	var subs []string
	for i, sub := range dirty {
		if sub == "" || errs[i] != nil {
			continue
		}
		if _, ok := at[sub]; !ok {
			at[sub] = len(subs)
			subs = append(subs, sub)
		}
	}
	synced := s.parallel(ctx, "put", len(subs), func(i int, _ *ioBuf) error {
		if err := syncDir(subs[i]); err != nil {
			return ioError("sync directory", subs[i], err)
		}
		return nil
	})
	for i, sub := range dirty {
		if sub != "" && errs[i] == nil {
			errs[i] = synced[at[sub]]
		}
	}
}

// putPart writes one object part, unless it is already stored, and returns the
// subdirectory whose entry it renamed into place (to be synced before the put
// reports success), or "".
func (s *Store) putPart(ps *poolState, key pagekey.Key, page pool.PageID, part int, mem []byte, b *ioBuf) (string, error) {
	name := ps.names.Object(key, ps.spec.Name, part)
	b.body.setSpan(mem, ps.spec.Layout.PageBufferSpan(part, int(page)))
	return s.writeObj(ps.obj(), relPath(key, name), name, b)
}

// writeObj stores b.body (already pointing at its runs) as the object part at rel,
// write-once, and returns the subdirectory to sync, or "" when nothing was renamed.
func (s *Store) writeObj(o objSpec, rel, name string, b *ioBuf) (string, error) {
	switch have, err := s.probe(o, rel, name, b); {
	case err != nil:
		return "", err
	case have == stored:
		s.stats.skipped.Add(1)
		return "", nil
	case have == foreign:
		s.stats.conflicts.Add(1)
		return "", nil
	}
	size := fileBytes(o.bodyLen)
	if err := s.reserve(size); err != nil {
		return "", err
	}
	committed := false
	defer func() {
		if !committed {
			s.idx.release(size)
		}
	}()
	header{bodyLen: uint64(o.bodyLen), format: o.format, bodySum: b.body.sum(), name: name}.encode(b.hdr)

	path := s.path(rel)
	sub := s.path(rel[:2])
	tmp := sub + "/" + s.tempName(rel[3:]) // rel is "xx/<file name>"
	fd, direct, err := s.open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o666)
	if err == unix.ENOENT {
		if err = os.MkdirAll(sub, 0o777); err == nil {
			fd, direct, err = s.open(tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL, 0o666)
		}
	}
	if err != nil {
		return "", ioError("create", tmp, err)
	}
	renamed := false
	defer func() {
		if !renamed {
			_ = unix.Unlink(tmp)
		}
	}()
	err = writeFile(fd, b, direct)
	if direct && err == unix.EINVAL {
		s.directRefused(tmp, err)
		if err = clearDirect(fd); err == nil {
			if err = unix.Ftruncate(fd, 0); err == nil {
				err = writeFile(fd, b, false)
			}
		}
	}
	if err == nil && s.cfg.Sync {
		err = retryEINTR(func() error { return unix.Fdatasync(fd) })
	}
	if cerr := unix.Close(fd); err == nil {
		err = cerr
	}
	if err != nil {
		return "", ioError("write", tmp, err)
	}
	switch err := renameNoReplace(tmp, path); {
	case err == unix.EEXIST:
		// Another writer stored the part first; theirs stands.
		s.stats.skipped.Add(1)
		s.idx.commit(rel, size, time.Now().UnixNano())
		committed = true
		return "", nil
	case err != nil:
		return "", ioError("rename", tmp, err)
	}
	renamed = true
	s.idx.commit(rel, size, time.Now().UnixNano())
	committed = true
	s.stats.writes.Add(1)
	s.stats.writeBytes.Add(o.bodyLen)
	return sub, nil
}

// renameNoReplace moves from to to unless to exists (EEXIST). Filesystems without
// RENAME_NOREPLACE get the same guarantee from link, which never replaces.
func renameNoReplace(from, to string) error {
	err := retryEINTR(func() error { return unix.Renameat2(unix.AT_FDCWD, from, unix.AT_FDCWD, to, unix.RENAME_NOREPLACE) })
	if err != unix.EINVAL && err != unix.ENOSYS {
		return err
	}
	if err = unix.Link(from, to); err != nil {
		return err
	}
	_ = unix.Unlink(from)
	return nil
}

// syncDir flushes directory dir, so that a rename in it survives a crash.
func syncDir(dir string) error {
	fd, err := vecio.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return retryEINTR(func() error { return unix.Fsync(fd) })
}
