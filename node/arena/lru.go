package arena

// lruList is an intrusive doubly linked list of objects, most recent first.
type lruList struct {
	root object // sentinel: root.next is the front, root.prev the back
	n    int
}

func (l *lruList) init() {
	l.root.next, l.root.prev, l.n = &l.root, &l.root, 0
}

func (l *lruList) pushFront(o *object) {
	if o.inLRU {
		l.remove(o)
	}
	o.prev, o.next = &l.root, l.root.next
	l.root.next.prev = o
	l.root.next = o
	o.inLRU = true
	l.n++
}

func (l *lruList) remove(o *object) {
	if !o.inLRU {
		return
	}
	o.prev.next, o.next.prev = o.next, o.prev
	o.prev, o.next, o.inLRU = nil, nil, false
	l.n--
}

// back is the least recently used object, nil when the list is empty.
func (l *lruList) back() *object {
	if l.n == 0 {
		return nil
	}
	return l.root.prev
}
