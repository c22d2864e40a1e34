// Package undo records the files and directories a start creates, so that a
// start that is refused removes exactly those, the newest first, and nothing
// that was there before: not an arena file that holds a warm cache, not a
// directory the operator made, not another service's lock file.
package undo

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"syscall"
)

// Log is the list of what a start created. The zero value is empty and ready;
// it is safe for concurrent use.
type Log struct {
	mu   sync.Mutex
	made []made
}

// made is one path created, and the file it was, so that a path another
// process replaced meanwhile is left alone.
type made struct {
	path     string
	dir      bool
	dev, ino uint64
}

// MkdirAll is os.MkdirAll that records each directory it creates. A directory
// that appears meanwhile (another process made it) is not recorded.
func (l *Log) MkdirAll(path string, perm os.FileMode) error {
	path = filepath.Clean(path)
	var missing []string
	for p := path; ; p = filepath.Dir(p) {
		if _, err := os.Lstat(p); !errors.Is(err, fs.ErrNotExist) {
			break // there (or not to be looked at): Mkdir below says why
		}
		missing = append(missing, p)
		if filepath.Dir(p) == p {
			break
		}
	}
	for i := len(missing) - 1; i >= 0; i-- {
		err := os.Mkdir(missing[i], perm)
		switch {
		case err == nil:
			l.Created(missing[i])
		case errors.Is(err, fs.ErrExist):
		default:
			return err
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return &fs.PathError{Op: "mkdir", Path: path, Err: syscall.ENOTDIR}
	}
	return nil
}

// Created records path, a file or directory just created by this start.
func (l *Log) Created(path string) {
	var st syscall.Stat_t
	if err := syscall.Lstat(path, &st); err != nil {
		return // gone already: nothing to undo
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.made = append(l.made, made{path: path, dir: st.Mode&syscall.S_IFMT == syscall.S_IFDIR, dev: uint64(st.Dev), ino: st.Ino})
}

// Append moves what other recorded to the end of l, as if l had recorded it.
func (l *Log) Append(other *Log) {
	other.mu.Lock()
	m := other.made
	other.made = nil
	other.mu.Unlock()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.made = append(l.made, m...)
}

// Paths lists what l holds, in the order it was created.
func (l *Log) Paths() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]string, len(l.made))
	for i, m := range l.made {
		out[i] = m.path
	}
	return out
}

// Undo removes what l recorded, the newest first, and empties l. A path that
// is gone or is another file now is left alone, and so is a directory that
// holds something (someone else put it there). It returns what could not be
// removed otherwise. Call it after closing what the start opened.
func (l *Log) Undo() error {
	l.mu.Lock()
	m := l.made
	l.made = nil
	l.mu.Unlock()
	var errs []error
	for i := len(m) - 1; i >= 0; i-- {
		var st syscall.Stat_t
		if err := syscall.Lstat(m[i].path, &st); err != nil || uint64(st.Dev) != m[i].dev || st.Ino != m[i].ino {
			continue
		}
		err := os.Remove(m[i].path)
		if err == nil || errors.Is(err, fs.ErrNotExist) || m[i].dir && (errors.Is(err, syscall.ENOTEMPTY) || errors.Is(err, syscall.EEXIST)) {
			continue
		}
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}
