package radix

import "fmt"

// Lock takes a lock reference on n and every ancestor: none of them is evicted from
// any tier until Unlock. A running request locks the last node of its prefix.
func (t *Tree[E]) Lock(n *Node[E]) error {
	if n.removed {
		return fmt.Errorf("lock a node that left the tree: %w", ErrNode)
	}
	for x := n; x.parent != nil; x = x.parent {
		x.lockRef++
		if x.lockRef == 1 {
			t.refresh(x)
		}
	}
	return nil
}

// Unlock releases a reference taken by Lock on the same node.
func (t *Tree[E]) Unlock(n *Node[E]) error {
	for x := n; x.parent != nil; x = x.parent {
		if x.lockRef <= 0 {
			return fmt.Errorf("unlock a node that is not locked: %w", ErrLocked)
		}
	}
	for x := n; x.parent != nil; {
		p := x.parent // refresh may forget an emptied namespace root
		x.lockRef--
		if x.lockRef == 0 {
			t.refresh(x)
		}
		x = p
	}
	return nil
}

// HostRef takes a host reference on n and every ancestor: their host pages are not
// freed until HostUnref. Take one for every copy in flight that reads or writes
// the node's host pages (backup to L2, backup to L3, load into L1).
func (t *Tree[E]) HostRef(n *Node[E]) error {
	if n.removed {
		return fmt.Errorf("reference a node that left the tree: %w", ErrNode)
	}
	for x := n; x.parent != nil; x = x.parent {
		x.hostRef++
		if x.hostRef == 1 {
			t.refresh(x)
		}
	}
	return nil
}

// HostUnref releases a reference taken by HostRef on the same node.
func (t *Tree[E]) HostUnref(n *Node[E]) error {
	for x := n; x.parent != nil; x = x.parent {
		if x.hostRef <= 0 {
			return fmt.Errorf("release a host reference that is not held: %w", ErrLocked)
		}
	}
	for x := n; x.parent != nil; {
		p := x.parent
		x.hostRef--
		if x.hostRef == 0 {
			t.refresh(x)
		}
		x = p
	}
	return nil
}
