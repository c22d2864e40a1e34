package sim

import (
	"fmt"

	"github.com/stratakv/strata/hostmem"
)

// checkNodeRoom refuses, before any run, node services the bench would start
// whose arenas leave the strata run's pools no room: the arenas are populated
// before the run (warmup.go), and its L1 and L2 pools are then allocated from
// what is left, past the reserve every allocator keeps free. Checked at the
// strata run, that failed after the runs before it. Only the arenas and
// pools of one bench are counted; what L1 and L2 size comes from the trace,
// so the check comes once they are sized.
func (c Config) checkNodeRoom(runs []string) error {
	if !c.embeddedNode(runs) {
		return nil
	}
	avail, err := c.Machine.available()
	if err != nil {
		return nil // the allocators' own checks still apply
	}
	tb := c.tokenBytes()
	pools := int64(c.engines()) * (c.L1Tokens/int64(c.PageSize)*int64(c.PageSize)*tb + int64(c.l2Pages())*int64(c.PageSize)*tb)
	arenas := int64(c.nodes()) * c.NodeArenaBytes
	reserve := hostmem.DefaultConfig(hostmem.Mmap).ReserveBytes
	room := avail - reserve
	if arenas+pools <= room {
		return nil
	}
	fix := "give a smaller --l1-tokens or --l2-ratio, or --l3 file"
	if fit := hostmem.FitSize((room - pools) / int64(c.nodes())); fit > 0 {
		fix = "give --node-arena " + hostmem.FormatSize(fit) + " or less, or a smaller --l1-tokens"
	}
	what := "the node service's arena"
	if c.nodes() > 1 {
		what = fmt.Sprintf("the arenas of %d node services", c.nodes())
	}
	return fmt.Errorf("--node-arena %s: %s and the strata run's L1 and L2 pools (%s) need %s, and this machine has %s available, %s of it kept free: %s: %w",
		hostmem.FormatSize(c.NodeArenaBytes), what, formatBytes(pools), formatBytes(arenas+pools), formatBytes(avail), formatBytes(reserve), fix, ErrConfig)
}
