package storagebench

import (
	"context"
	"fmt"
	"time"
)

// contender is one of the things timed on each batch.
type contender struct {
	name  string
	times []time.Duration
	do    func(ctx context.Context, b int) (time.Duration, error)
}

// rotate runs the contenders on batch b in an order that shifts by one each batch.
func rotate(ctx context.Context, cs []*contender, b int) error {
	for i := range cs {
		c := cs[(b+i)%len(cs)]
		if err := ctx.Err(); err != nil {
			return err
		}
		d, err := c.do(ctx, b)
		if err != nil {
			return err
		}
		c.times = append(c.times, d)
	}
	return nil
}

// peerWrite times peer p storing engine e's batch b, under the backend's names
// when p keeps names.
func peerWrite(e *engine, p Peer) func(context.Context, int) (time.Duration, error) {
	return func(ctx context.Context, b int) (time.Duration, error) {
		src := e.chunks(e.srcPages(b))
		var d time.Duration
		var err error
		if np, ok := p.(NamedPeer); ok {
			d, err = np.WriteNamed(ctx, e.names(b), src)
		} else {
			d, err = p.Write(ctx, src)
		}
		if err != nil {
			return 0, fmt.Errorf("peer %s: batch %d: %w", p.Name(), b, err)
		}
		return d, nil
	}
}

// peerRead times peer p reading engine e's batch b back into dst, and adds the
// pages that came back wrong to *bad.
func peerRead(e *engine, p Peer, dst [][]byte, bad *int64) func(context.Context, int) (time.Duration, error) {
	return func(ctx context.Context, b int) (time.Duration, error) {
		clearAll(dst)
		var d time.Duration
		var err error
		if np, ok := p.(NamedPeer); ok {
			d, err = np.ReadNamed(ctx, e.names(b), dst)
		} else {
			d, err = p.Read(ctx, dst)
		}
		if err != nil {
			return 0, fmt.Errorf("peer %s: batch %d: %w", p.Name(), b, err)
		}
		*bad += e.verify(b, dst)
		return d, nil
	}
}

// batchError turns a batch's per-key results into one error naming how many pages
// failed and the first failure.
func batchError(op string, b int, errs []error) error {
	failed, first := 0, -1
	for i, err := range errs {
		if err != nil {
			failed++
			if first < 0 {
				first = i
			}
		}
	}
	if failed == 0 {
		return nil
	}
	return fmt.Errorf("%s batch %d: %d of %d pages failed; page %d: %w", op, b, failed, len(errs), first, errs[first])
}
