package radix

import (
	"fmt"

	"github.com/stratakv/strata/pageid"
)

// deviceCandidate: in L1, no child in L1, not locked, and either backed up in L2 or
// free of host references (removing it would free host pages of its subtree).
func (t *Tree[E]) deviceCandidate(n *Node[E]) bool {
	return !n.IsRoot() && n.device != nil && n.deviceChildren == 0 && n.lockRef == 0 &&
		(n.host != nil || n.hostRef == 0)
}

// hostCandidate: in L2 only, a leaf, with no lock or host reference.
func (t *Tree[E]) hostCandidate(n *Node[E]) bool {
	return !n.IsRoot() && n.device == nil && n.host != nil && len(n.children) == 0 &&
		n.hostRef == 0 && n.lockRef == 0
}

// refresh re-files n in both victim heaps after anything that decides its candidacy
// or priority changed.
func (t *Tree[E]) refresh(n *Node[E]) {
	if n.removed {
		return
	}
	if n.IsRoot() {
		t.dropNamespace(n)
		return
	}
	t.deviceHeap.sync(n, t.deviceCandidate(n))
	t.hostHeap.sync(n, t.hostCandidate(n))
}

// DeviceVictim is the next node to evict from L1 under the policy: an unlocked node
// whose pages are in L1 and whose children are not. Nil when there is none.
func (t *Tree[E]) DeviceVictim() *Node[E] { return t.deviceHeap.top() }

// HostVictim is the next node to evict from L2: an unreferenced L2-only leaf.
func (t *Tree[E]) HostVictim() *Node[E] { return t.hostHeap.top() }

// DeviceVictims and HostVictims are the numbers of eviction candidates.
func (t *Tree[E]) DeviceVictims() int { return t.deviceHeap.len() }

// HostVictims is the number of L2 eviction candidates.
func (t *Tree[E]) HostVictims() int { return t.hostHeap.len() }

// DropDevice takes n out of L1, keeping it cached in L2, and returns its device
// pages for the caller to free. n must be a device victim with host pages.
func (t *Tree[E]) DropDevice(n *Node[E]) ([]pageid.ID, error) {
	if n.removed || n.IsRoot() || n.device == nil || n.host == nil || n.lockRef > 0 || n.deviceChildren > 0 {
		return nil, fmt.Errorf("drop device pages of a node that is not an L1 victim backed up in L2: %w", ErrNode)
	}
	pages := n.device
	n.device = nil
	n.parent.deviceChildren--
	t.devicePages -= len(pages)
	t.refresh(n)
	t.refresh(n.parent)
	return pages, nil
}

// DropHost takes n out of L2, keeping it in L1, and returns its host pages for the
// caller to free: the undo of a backup that failed, or room made for another node.
func (t *Tree[E]) DropHost(n *Node[E]) ([]pageid.ID, error) {
	if n.removed || n.IsRoot() || n.host == nil || n.device == nil || n.hostRef > 0 {
		return nil, fmt.Errorf("drop host pages of a node that is not in both tiers and unreferenced: %w", ErrNode)
	}
	pages := n.host
	n.host = nil
	t.hostPages -= len(pages)
	t.refresh(n)
	return pages, nil
}

// SetHost records that n's pages are (being) backed up in the given host pages.
func (t *Tree[E]) SetHost(n *Node[E], host []pageid.ID) error {
	if n.removed || n.IsRoot() || n.host != nil {
		return fmt.Errorf("set host pages of a node that left the tree, the root, or one already in L2: %w", ErrNode)
	}
	if len(host) != len(n.keys) {
		return fmt.Errorf("%d host pages for a node of %d pages: %w", len(host), len(n.keys), ErrPages)
	}
	n.host = append([]pageid.ID(nil), host...)
	t.hostPages += len(host)
	t.refresh(n)
	return nil
}

// SetDevice records that n's pages are (being) loaded into the given device pages.
// n must be in L2 only and its parent in L1 (load a matched path from the top).
func (t *Tree[E]) SetDevice(n *Node[E], device []pageid.ID) error {
	if n.removed || n.IsRoot() || n.device != nil {
		return fmt.Errorf("set device pages of a node that left the tree, the root, or one already in L1: %w", ErrNode)
	}
	if !n.parent.IsRoot() && n.parent.device == nil {
		return fmt.Errorf("set device pages below a node that is not in L1 (load from the top of the path): %w", ErrNode)
	}
	if len(device) != len(n.keys) {
		return fmt.Errorf("%d device pages for a node of %d pages: %w", len(device), len(n.keys), ErrPages)
	}
	n.device = append([]pageid.ID(nil), device...)
	n.parent.deviceChildren++
	t.devicePages += len(device)
	t.refresh(n)
	t.refresh(n.parent)
	return nil
}

// Remove takes n and its whole subtree out of the tree and returns their device and
// host pages for the caller to free. Nothing in the subtree may be locked or have a
// host reference.
func (t *Tree[E]) Remove(n *Node[E]) (device, host []pageid.ID, err error) {
	if n.removed || n.IsRoot() {
		return nil, nil, fmt.Errorf("remove the root or a node that left the tree: %w", ErrNode)
	}
	if n.lockRef > 0 || n.hostRef > 0 {
		return nil, nil, fmt.Errorf("remove a node that is locked (%d) or has host references (%d): %w", n.lockRef, n.hostRef, ErrNode)
	}
	parent := n.parent
	t.removeChild(parent, n)
	if n.device != nil {
		parent.deviceChildren--
	}
	stack := []*Node[E]{n}
	for len(stack) > 0 {
		x := stack[len(stack)-1]
		stack = stack[:len(stack)-1]
		stack = append(stack, x.children...)
		device = append(device, x.device...)
		host = append(host, x.host...)
		t.devicePages -= len(x.device)
		t.hostPages -= len(x.host)
		t.tokens.release(x.keys)
		t.deviceHeap.sync(x, false)
		t.hostHeap.sync(x, false)
		x.removed = true
		x.children, x.index, x.parent = nil, nil, nil
		t.nodes--
	}
	t.refresh(parent)
	return device, host, nil
}

// EvictDevice frees at least n device pages if it can, victim by victim in policy
// order: a victim backed up in L2 stays cached there; one that is not is removed
// with its subtree (whose host pages are returned too). A victim the device heap
// offers that cannot be dropped is the tree's own invariant broken: it panics
// (see the package comment) rather than offer the same victim forever.
func (t *Tree[E]) EvictDevice(n int) (device, host []pageid.ID) {
	for len(device) < n {
		v := t.DeviceVictim()
		if v == nil {
			break
		}
		if v.host != nil {
			d, err := t.DropDevice(v)
			if err != nil {
				t.victimBroken("EvictDevice", "drop from L1", v, err)
			}
			device = append(device, d...)
			continue
		}
		d, h, err := t.Remove(v)
		if err != nil {
			t.victimBroken("EvictDevice", "remove", v, err)
		}
		device = append(device, d...)
		host = append(host, h...)
	}
	return device, host
}

// EvictHost frees at least n host pages if it can by removing L2-only leaves in
// policy order. Like EvictDevice, it panics on a victim it cannot remove.
func (t *Tree[E]) EvictHost(n int) (host []pageid.ID) {
	for len(host) < n {
		v := t.HostVictim()
		if v == nil {
			break
		}
		_, h, err := t.Remove(v)
		if err != nil {
			t.victimBroken("EvictHost", "remove", v, err)
		}
		host = append(host, h...)
	}
	return host
}

// victimBroken panics for a victim that a victim heap offered but that cannot go:
// the heap's view of the node and the method's disagree (a stale heap entry, or
// the rules out of step), which only a bug in the tree can cause.
func (t *Tree[E]) victimBroken(op, what string, v *Node[E], err error) {
	panic(fmt.Sprintf("radix: %s: cannot %s the victim its heap offered (%d pages at depth %d, in L1 %v, in L2 %v, "+
		"lock count %d, host references %d, children %d of which %d in L1, removed %v): %v; "+
		"a bug in the tree: its victim heaps and its methods disagree about this node",
		op, what, v.Pages(), v.Depth(), v.device != nil, v.host != nil, v.lockRef, v.hostRef,
		len(v.children), v.deviceChildren, v.removed, err))
}
