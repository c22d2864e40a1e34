package nodeclient

import (
	"context"
	"path/filepath"
	"testing"

	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/node/wire"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage"
)

// The client names a layer_first pool's parts by runs only on a connection
// whose HelloReply says revision 2: a service before revisions (no revision
// in its reply) gets ranges, as it always did.
func TestRunsOnlyWhereTheServiceTakesThem(t *testing.T) {
	for _, c := range []struct {
		name     string
		revision uint32
		runs     bool
	}{{"older service", 0, false}, {"revision 1", 1, false}, {"revision 2", wire.Revision, true}} {
		t.Run(c.name, func(t *testing.T) {
			socket := filepath.Join(socketDir(t), "s")
			f := startFake(t, socket)
			f.revision = c.revision
			f.serve()
			b := newClient(t, socket)
			defer b.Close()
			g := layerFirstGroup(t, b, 8)
			ctx := context.Background()
			spec := storage.SpecOf(g.Pools()[0], pagekey.Names{})
			if err := b.RegisterPool(ctx, spec); err != nil {
				t.Fatal(err)
			}
			ks := keys(2)
			pages := []pool.PageID{1, 5}
			for _, errs := range [][]error{b.Put(ctx, "kv", ks, pages), b.Get(ctx, "kv", ks, pages)} {
				for i, err := range errs {
					if err != nil {
						t.Fatalf("item %d: %v", i, err)
					}
				}
			}
			runs, ranges := f.forms(0)
			parts := 2 * 2 * len(ks) // K and V, a Put and a Get
			if c.runs && (runs != parts || ranges != 0) || !c.runs && (runs != 0 || ranges != parts) {
				t.Fatalf("%d items by runs, %d by ranges; want all %d by %s", runs, ranges, parts, map[bool]string{true: "runs", false: "ranges"}[c.runs])
			}
			if err := f.problems(); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// layerFirstGroup is testGroup's kv pool laid out layer_first: each part of
// a page is a range per layer.
func layerFirstGroup(t *testing.T, b storage.Backend, pages int) *pool.Group {
	return buildGroup(t, b, pool.GroupSpec{
		Pools:  []pool.PoolSpec{{Name: "kv", Geometry: kvlayout.Geometry{Layers: 4, KVHeads: 2, HeadDim: 32, DTypeBytes: 2}}},
		Layout: kvlayout.LayerFirst, PageSize: 8, Pages: pages,
	})
}
