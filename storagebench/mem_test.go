package storagebench

import (
	"context"
	"fmt"
	"sync"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// memBackend is a minimal storage.Backend over a map, for testing the harness
// without a real store. corrupt, when set, flips a byte of the first part of every
// page it returns whose index in the batch is corruptPage.
type memBackend struct {
	mu          sync.Mutex
	pools       map[string]storage.PoolSpec
	objects     map[string][]byte
	closed      bool
	corrupt     bool
	corruptPage int
	putErr      error
}

var _ storage.Backend = (*memBackend)(nil)

func newMemBackend() *memBackend {
	return &memBackend{pools: map[string]storage.PoolSpec{}, objects: map[string][]byte{}}
}

func (m *memBackend) Name() string            { return "mem" }
func (m *memBackend) Allocator() hostmem.Kind { return "" }

func (m *memBackend) RegisterPool(_ context.Context, spec storage.PoolSpec) error {
	if err := spec.Validate(); err != nil {
		return err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	m.pools[spec.Name] = spec
	return nil
}

func (m *memBackend) spec(name string) (storage.PoolSpec, error) {
	if m.closed {
		return storage.PoolSpec{}, storage.ErrClosed
	}
	s, ok := m.pools[name]
	if !ok {
		return s, fmt.Errorf("pool %q: %w", name, storage.ErrNotRegistered)
	}
	return s, nil
}

func (m *memBackend) Exists(_ context.Context, pool string, keys []pagekey.Key) (int, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	spec, err := m.spec(pool)
	if err != nil {
		return 0, err
	}
	for i, k := range keys {
		for _, name := range storage.ObjectNames(spec, k) {
			if _, ok := m.objects[name]; !ok {
				return i, nil
			}
		}
	}
	return len(keys), nil
}

func (m *memBackend) Get(_ context.Context, pool string, keys []pagekey.Key, pages []pool.PageID) []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	spec, err := m.spec(pool)
	if err == nil {
		err = storage.CheckBatch(spec, keys, pages)
	}
	if err != nil {
		return storage.FailAll(len(keys), err)
	}
	out := make([]error, len(keys))
	mem := spec.Region.Bytes()
	for i, k := range keys {
		for part, name := range storage.ObjectNames(spec, k) {
			obj, ok := m.objects[name]
			if !ok {
				out[i] = storage.ErrNotFound
				break
			}
			s := spec.Layout.PageBufferSpan(part, int(pages[i]))
			copy(mem[s.Offset:s.Offset+s.Bytes()], obj)
			if m.corrupt && i == m.corruptPage && part == 0 {
				mem[s.Offset+7] ^= 0x40
			}
		}
	}
	return out
}

func (m *memBackend) Put(_ context.Context, pool string, keys []pagekey.Key, pages []pool.PageID) []error {
	m.mu.Lock()
	defer m.mu.Unlock()
	spec, err := m.spec(pool)
	if err == nil {
		err = storage.CheckBatch(spec, keys, pages)
	}
	if err == nil {
		err = m.putErr
	}
	if err != nil {
		return storage.FailAll(len(keys), err)
	}
	mem := spec.Region.Bytes()
	for i, k := range keys {
		for part, name := range storage.ObjectNames(spec, k) {
			if _, ok := m.objects[name]; ok {
				continue
			}
			s := spec.Layout.PageBufferSpan(part, int(pages[i]))
			m.objects[name] = append([]byte(nil), mem[s.Offset:s.Offset+s.Bytes()]...)
		}
	}
	return make([]error, len(keys))
}

func (m *memBackend) Close() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.closed = true
	return nil
}

// memTarget measures b against DirectIOPeers in the scratch directory.
func memTarget(b *memBackend) TargetFunc {
	return func(s Scratch) (Target, error) {
		return Target{
			Name:   "mem",
			New:    func(context.Context) (storage.Backend, error) { return b, nil },
			Peer:   &DirectIOPeer{Dir: s.Dir + "/peer", Workers: 2},
			Stream: &DirectIOPeer{Dir: s.Dir + "/stream", Workers: 1, OneFile: true},
		}, nil
	}
}
