package redisstore

import (
	"context"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/storage"
)

// The object API stores named byte objects with the same layout, checks and
// write-once semantics as pool pages, for callers that hold bytes rather than pool
// pages (the node service writing through to a cluster). Its semantics are
// storage/file's: an object of another format under the name is not served and
// not replaced; a corrupt or partial object is never served.

// Object is one object of a batch call: its name, its format, and its body as
// runs of memory (the source of a put, the destination of a get, whose total
// length must be the object's). It is storage.Object, so that callers (the node
// service's remote tier) can define the interface they need of the store.
type Object = storage.Object

// objectOps makes the ops of objs; an object that cannot be stored or read as
// asked is done with its error already.
func (s *Store) objectOps(what string, objs []Object) []*op {
	ops := make([]*op, len(objs))
	for i, obj := range objs {
		o := &op{name: obj.Name, format: obj.Format}
		ops[i] = o
		if err := checkName(obj.Name); err != nil {
			o.err, o.done = fmt.Errorf("%s: %w", what, err), true
			continue
		}
		for _, r := range obj.Runs {
			if len(r) > 0 {
				o.runs = append(o.runs, r)
			}
		}
		o.size = runsLen(o.runs)
		if o.size == 0 {
			o.err, o.done = fmt.Errorf("redis store: %s %s: no bytes: %w", what, obj.Name, storage.ErrBatch), true
			continue
		}
		plan, err := cutPlan(o.runs, s.cfg.ChunkBytes)
		if err != nil {
			o.err, o.done = err, true
			continue
		}
		o.plan = plan
	}
	return ops
}

func opErrors(ops []*op) []error {
	out := make([]error, len(ops))
	for i, o := range ops {
		out[i] = o.err
	}
	return out
}

// PutObjects stores each object, write-once (see PutObject), with one pipeline
// for the check and one for the writes; the result has one entry per object.
func (s *Store) PutObjects(ctx context.Context, objs []Object) []error {
	done, err := s.enter("put objects")
	if err != nil {
		return s.failAll(len(objs), err)
	}
	defer done()
	ops := s.objectOps("put object", objs)
	b := s.newBatch(ctx, "put object", ops)
	defer b.end()
	b.put()
	return opErrors(ops)
}

// GetObjects reads each object into its runs (see GetObject), with one pipeline
// (two when some object was cut otherwise); the result has one entry per object.
func (s *Store) GetObjects(ctx context.Context, objs []Object) []error {
	done, err := s.enter("get objects")
	if err != nil {
		return s.failAll(len(objs), err)
	}
	defer done()
	ops := s.objectOps("get object", objs)
	b := s.newBatch(ctx, "get object", ops)
	defer b.end()
	b.get()
	return opErrors(ops)
}

// ExistsObjects reports how many of names, from the start, are stored in format
// with all their chunks. It reads the headers with one pipeline and checks the
// chunks with a second. A fault before the first missing object is returned with
// the count up to it. Damaged and partial objects found are removed.
func (s *Store) ExistsObjects(ctx context.Context, names []string, format storage.Format) (int, error) {
	done, err := s.enter("exists objects")
	if err != nil {
		s.stats.fault(err)
		return 0, err
	}
	defer done()
	ops := make([]*op, len(names))
	for i, name := range names {
		ops[i] = &op{name: name, format: format}
		if err := checkName(name); err != nil {
			ops[i].err, ops[i].done = fmt.Errorf("exists objects: %w", err), true
		}
	}
	b := s.newBatch(ctx, "exists object", ops)
	defer b.end()
	b.exists()
	for i, o := range ops {
		if o.err != nil && !errors.Is(o.err, storage.ErrNotFound) {
			return i, o.err
		}
		if o.err != nil || o.state != present {
			return i, nil
		}
	}
	return len(names), nil
}

// PutObject stores the concatenation of runs as object name in format,
// write-once: an object of that name already stored is a success and nothing is
// written (an object of another format under the name stays, and this put is
// dropped; Stats counts it as a conflict).
func (s *Store) PutObject(ctx context.Context, name string, format storage.Format, runs ...[]byte) error {
	return s.PutObjects(ctx, []Object{{Name: name, Format: format, Runs: runs}})[0]
}

// GetObject reads object name into runs, whose total length must be the object's
// (ObjectSize tells it; another length is storage.ErrBatch), and verifies its
// checksum over the bytes now in runs. A missing object, one of another format, or
// one with a chunk missing is storage.ErrNotFound; one that fails a check is
// storage.ErrCorrupt and is removed. On error runs hold undefined bytes.
func (s *Store) GetObject(ctx context.Context, name string, format storage.Format, runs ...[]byte) error {
	return s.GetObjects(ctx, []Object{{Name: name, Format: format, Runs: runs}})[0]
}

// ObjectSize returns the body length of object name in format, from its header:
// storage.ErrNotFound when there is none or it is of another format; a damaged
// header is removed and is storage.ErrCorrupt.
func (s *Store) ObjectSize(ctx context.Context, name string, format storage.Format) (int64, error) {
	done, err := s.enter("object size")
	if err != nil {
		s.stats.fault(err)
		return 0, err
	}
	defer done()
	o := &op{name: name, format: format}
	if err := checkName(name); err != nil {
		o.err, o.done = fmt.Errorf("object size: %w", err), true
	}
	b := s.newBatch(ctx, "object size", []*op{o})
	defer b.end()
	if o.done {
		return 0, o.err
	}
	raw, err := s.rdb.GetRange(b.ctx, headerKey(name), 0, maxHeaderBytes-1).Result()
	if err != nil {
		b.fail(o, err)
		return 0, o.err
	}
	b.answered(o)
	if raw == "" {
		b.miss(o, "no such object")
		return 0, o.err
	}
	h, derr := decodeHeader([]byte(raw))
	switch {
	case derr != nil:
		b.corrupt(o, 0, "header: "+derr.Error())
		return 0, o.err
	case h.nameSum != xxh3.HashString(name):
		b.corrupt(o, len(h.plan), "its header belongs to another object")
		return 0, o.err
	case h.format != format:
		b.miss(o, "stored in another format")
		return 0, o.err
	}
	return h.bodyLen, nil
}

// RemoveObject deletes object name (its header and chunks, in any format) and
// reports whether there was one; a missing one is no error.
func (s *Store) RemoveObject(ctx context.Context, name string) (bool, error) {
	done, err := s.enter("remove object")
	if err != nil {
		s.stats.fault(err)
		return false, err
	}
	defer done()
	o := &op{name: name}
	if err := checkName(name); err != nil {
		o.err, o.done = fmt.Errorf("remove object: %w", err), true
	}
	b := s.newBatch(ctx, "remove object", []*op{o})
	defer b.end()
	if o.done {
		return false, o.err
	}
	raw, err := s.rdb.GetRange(b.ctx, headerKey(name), 0, maxHeaderBytes-1).Result()
	if err != nil {
		b.fail(o, err)
		return false, o.err
	}
	b.answered(o)
	if h, derr := decodeHeader([]byte(raw)); derr == nil {
		n, err := s.rdb.Del(b.ctx, objectKeys(name, len(h.plan))...).Result()
		if err != nil {
			b.fail(o, err)
			return false, o.err
		}
		return n > 0, nil
	}
	// No header, or a damaged one: the chunk count is unknown. Delete chunks in
	// runs until a run finds none.
	n, err := s.rdb.Del(b.ctx, headerKey(name)).Result()
	if err != nil {
		b.fail(o, err)
		return false, o.err
	}
	existed := n > 0
	const step = 64
	for from := 0; from < maxChunks; from += step {
		n, err := s.rdb.Del(b.ctx, chunkKeys(name, from, from+step)...).Result()
		if err != nil {
			b.fail(o, err)
			return existed, o.err
		}
		if n == 0 {
			break
		}
		existed = true
	}
	return existed, nil
}
