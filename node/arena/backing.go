package arena

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
)

// backing is an arena's memory.
type backing struct {
	path    string
	fd      int             // the locked arena file; -1 when anonymous
	mapping []byte          // the file's mapping, or the anonymous header
	region  *hostmem.Region // anonymous data
	data    []byte
	umap    []uint32
	log     []byte // the eviction log; nil when anonymous
	geo     geometry
	sb      superblock
	sbSlot  int // the copy written last
	// mapMu orders replacing the file's mapping (fault.go) against closing
	// it; replaced says it was.
	mapMu    sync.Mutex
	replaced bool
	// made is the arena file as this start created it, nil when it was
	// there before: a New that fails removes the one it made (removeMade).
	made *unix.Stat_t
}

// holds reports whether addr lies in the arena file's mapping.
func (b *backing) holds(addr uintptr) bool {
	lo := uintptr(unsafe.Pointer(unsafe.SliceData(b.mapping)))
	return b.fd >= 0 && addr >= lo && addr < lo+uintptr(len(b.mapping))
}

// writeSuperblock writes b.sb, one generation newer, over the older copy.
func (b *backing) writeSuperblock() {
	if b.fd < 0 {
		return
	}
	b.sb.gen++
	b.sbSlot = 1 - b.sbSlot
	b.sb.encode(b.mapping[b.sbSlot*sbCopy:])
}

// close writes the superblock (clean says whether the arena shut down with
// nothing in flight), unmaps the memory and unlocks the file. A file that was
// truncated under it (its mapping replaced, or a fault writing the
// superblock) is left empty, for the next start to format anew.
func (b *backing) close(clean bool, objects, bytes int64) error {
	var errs []error
	if b.fd >= 0 {
		b.mapMu.Lock()
		defer b.mapMu.Unlock()
		if clean {
			b.sb.state, b.sb.objects, b.sb.bytes, b.sb.closedNS = sbClean, objects, bytes, time.Now().UnixNano()
		}
		if !b.replaced && !faultless(b.mapping, b.writeSuperblock) {
			errs = append(errs, fmt.Errorf("close arena file %s: it was truncated while the arena ran; it is left empty, and the next start formats it anew: %w", b.path, ErrBroken))
			_ = unix.Ftruncate(b.fd, 0)
		}
		unmapBytes(b.mapping)
		if err := unix.Close(b.fd); err != nil {
			errs = append(errs, fmt.Errorf("close arena file %s: %w", b.path, err))
		}
		b.fd = -1
	} else {
		unmapBytes(b.mapping)
		if b.region != nil {
			if err := b.region.Close(); err != nil {
				errs = append(errs, fmt.Errorf("close arena: %w", err))
			}
		}
	}
	b.mapping, b.data, b.umap, b.log = nil, nil, nil, nil
	return errors.Join(errs...)
}

// populate makes the pages of b.data[off, off+n) resident and mapped
// (MADV_POPULATE_WRITE, Linux 5.14): on a warm restart the file's pages are
// there and only mapped; otherwise they are allocated and zeroed, and a full
// file system or huge page pool is an error here, not a SIGBUS later. Older
// kernels touch a word per page with an atomic add of 0, which leaves bytes
// that other goroutines write meanwhile as they are.
func (b *backing) populate(off, n int64) error {
	m := b.data[off : off+n : off+n]
	err := unix.Madvise(m, unix.MADV_POPULATE_WRITE)
	if err == nil || !errors.Is(err, unix.EINVAL) {
		return err
	}
	if b.fd >= 0 {
		// Without the advice a fault in a full file system would be fatal:
		// allocate the range first.
		if err := unix.Fallocate(b.fd, 0, b.geo.dataOff+off, n); err != nil {
			return err
		}
	}
	page := int64(os.Getpagesize())
	for i := int64(0); i+4 <= n; i += page {
		atomic.AddUint32((*uint32)(unsafe.Pointer(&m[i])), 0)
	}
	return nil
}

// unitsOf lists the allocated extents the unit map records, in offset order,
// clearing words that cannot be right (bad kind, past the end, a slab too
// short for one slot of its class); bad counts those.
func (b *backing) unitsOf(unit int64) (exts []umExtent, bad int64) {
	um := b.umap
	units := int64(len(um))
	for u := int64(0); u < units; {
		// Skip free units eight at a time.
		if u%8 == 0 && u+8 <= units && *(*[8]uint32)(um[u:]) == [8]uint32{} {
			u += 8
			continue
		}
		w := um[u]
		if w == 0 {
			u++
			continue
		}
		kind, n := umDecode(w)
		ok := n > 0 && u+n <= units
		class := -1
		switch {
		case kind == umLarge:
		case kind >= 1 && int(kind) <= len(classes):
			class = int(kind) - 1
			ok = ok && n*unit >= classes[class]
		default:
			ok = false
		}
		if !ok {
			um[u] = 0
			bad++
			u++
			continue
		}
		exts = append(exts, umExtent{u: u, n: n, class: class})
		// A healthy map is zero inside an extent; what damage left there
		// would outlive the extent's free (which clears its first word).
		for v := u + 1; v < u+n; v++ {
			if um[v] != 0 {
				um[v] = 0
				bad++
			}
		}
		u += n
	}
	return exts, bad
}

// umExtent is an allocated extent the unit map records: a slab of class, or
// a large object's bytes (class -1).
type umExtent struct {
	u, n  int64
	class int
}
