package radix

type tier uint8

const (
	deviceTier tier = iota
	hostTier
)

// victimHeap is an indexed binary min-heap of eviction candidates of one tier: each
// node records its position, so a node whose priority or candidacy changes is fixed
// or removed in O(log n) instead of being searched for.
type victimHeap[E Elem] struct {
	tier   tier
	policy Policy
	nodes  []*Node[E]
}

func (h *victimHeap[E]) less(a, b *Node[E]) bool {
	if h.policy == LFU && a.hits != b.hits {
		return a.hits < b.hits
	}
	return a.lastAccess < b.lastAccess
}

func (h *victimHeap[E]) len() int { return len(h.nodes) }

func (h *victimHeap[E]) top() *Node[E] {
	if len(h.nodes) == 0 {
		return nil
	}
	return h.nodes[0]
}

// sync makes the heap hold n exactly when candidate is true, at the right place.
func (h *victimHeap[E]) sync(n *Node[E], candidate bool) {
	i := n.heapIdx[h.tier]
	switch {
	case candidate && i < 0:
		n.heapIdx[h.tier] = int32(len(h.nodes))
		h.nodes = append(h.nodes, n)
		h.up(len(h.nodes) - 1)
	case candidate:
		if !h.down(int(i)) {
			h.up(int(i))
		}
	case i >= 0:
		h.remove(int(i))
	}
}

func (h *victimHeap[E]) remove(i int) {
	last := len(h.nodes) - 1
	n := h.nodes[i]
	if i != last {
		h.swap(i, last)
	}
	h.nodes[last] = nil
	h.nodes = h.nodes[:last]
	n.heapIdx[h.tier] = -1
	if i != last {
		if !h.down(i) {
			h.up(i)
		}
	}
}

func (h *victimHeap[E]) swap(i, j int) {
	h.nodes[i], h.nodes[j] = h.nodes[j], h.nodes[i]
	h.nodes[i].heapIdx[h.tier] = int32(i)
	h.nodes[j].heapIdx[h.tier] = int32(j)
}

func (h *victimHeap[E]) up(j int) {
	for j > 0 {
		i := (j - 1) / 2
		if !h.less(h.nodes[j], h.nodes[i]) {
			break
		}
		h.swap(i, j)
		j = i
	}
}

func (h *victimHeap[E]) down(i0 int) bool {
	i := i0
	n := len(h.nodes)
	for {
		l := 2*i + 1
		if l >= n {
			break
		}
		j := l
		if r := l + 1; r < n && h.less(h.nodes[r], h.nodes[l]) {
			j = r
		}
		if !h.less(h.nodes[j], h.nodes[i]) {
			break
		}
		h.swap(i, j)
		i = j
	}
	return i > i0
}
