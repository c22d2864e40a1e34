package arena

// The LRU list links committed objects that can be evicted, most recent first,
// through their records' prev and next fields; record 0 is the sentinel (its next
// is the front, its prev the back). Off the list, prev holds the lease count
// (leasesOf).

func (a *Arena) lruPushFront(i uint32) {
	r := a.rec(i)
	if r.flags&flagInLRU != 0 {
		a.lruRemove(i)
	}
	root := a.rec(0)
	r.prev, r.next = 0, root.next
	a.rec(root.next).prev = i
	root.next = i
	r.flags |= flagInLRU
	r.flags &^= flagRecovered // used since recovery: its recency is its own now
	a.lruN++
}

// lruPushBack puts i at the back, the least recently used end: where
// recovery puts the objects it finds (recover.go).
func (a *Arena) lruPushBack(i uint32) {
	r := a.rec(i)
	if r.flags&flagInLRU != 0 {
		a.lruRemove(i)
	}
	root := a.rec(0)
	r.next, r.prev = 0, root.prev
	a.rec(root.prev).next = i
	root.prev = i
	r.flags |= flagInLRU
	a.lruN++
}

// lruRemove takes i off the list, leaving it with no leases counted.
func (a *Arena) lruRemove(i uint32) {
	r := a.rec(i)
	if r.flags&flagInLRU == 0 {
		return
	}
	a.rec(r.prev).next = r.next
	a.rec(r.next).prev = r.prev
	r.prev, r.next = 0, 0
	r.flags &^= flagInLRU
	a.lruN--
}

// lruBack is the least recently used object, 0 when the list is empty.
func (a *Arena) lruBack() uint32 {
	if a.lruN == 0 {
		return 0
	}
	return a.rec(0).prev
}
