package sim

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"

	"github.com/stratakv/strata/hostmem"
	"github.com/stratakv/strata/workload"
)

// minSpillBytes is the smallest spill the bench sizes from the free disk.
const minSpillBytes = 256 << 20

// Machine is what the bench sizes its defaults from.
type Machine struct {
	// AvailableMemory is the memory the bench can take; nil means
	// hostmem.AvailableBytes.
	AvailableMemory func() (int64, error)
	// FreeDisk is the space left under a directory; nil means statfs(2).
	FreeDisk func(dir string) (int64, error)
}

func (m *Machine) available() (int64, error) {
	if m.AvailableMemory != nil {
		return m.AvailableMemory()
	}
	return hostmem.AvailableBytes()
}

func (m *Machine) freeDisk(dir string) (int64, error) {
	if m.FreeDisk != nil {
		return m.FreeDisk(dir)
	}
	var st unix.Statfs_t
	if err := unix.Statfs(dir, &st); err != nil {
		return 0, fmt.Errorf("statfs %s: %w", dir, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), nil
}

// tokenBytes is one token's KV in every pool of the group.
func (c Config) tokenBytes() int64 {
	var n int64
	for _, s := range c.poolSpecs() {
		n += int64(s.Geometry.TokenBytes())
	}
	return n
}

// embeddedNode reports whether the strata run starts node services in this
// process.
func (c Config) embeddedNode(runs []string) bool {
	strata := len(runs) == 0
	for _, r := range runs {
		strata = strata || r == RunStrata
	}
	return strata && c.L3 == L3Node && c.NodeSocket == ""
}

// memoryNeed is the most memory a run of the bench holds at once: the strata
// run's L1 and L2 per engine, where an embedded node service maps each L2 host
// pool a second time (shared memory, counted in this process twice), and its
// arenas.
func (c Config) memoryNeed(runs []string) int64 {
	tb := c.tokenBytes()
	l1 := c.L1Tokens / int64(c.PageSize) * int64(c.PageSize) * tb
	l2 := int64(c.l2Pages()) * int64(c.PageSize) * tb
	need := l1 + l2
	if c.embeddedNode(runs) {
		need += l2 + int64(c.nodes())*c.NodeArenaBytes
	}
	return need * int64(c.engines())
}

// fitMachine lowers L1 (and L2 with it) until the bench fits in three quarters
// of the machine's available memory, but not below the longest request, and
// bounds the embedded node service's spill to half the temporary directory's
// free disk. It returns one note per change.
func (c *Config) fitMachine(trace workload.Trace, runs []string) ([]string, error) {
	var notes []string
	avail, err := c.Machine.available()
	if err != nil {
		return nil, fmt.Errorf("size the bench from the machine's memory: %w", err)
	}
	longest := int64(0)
	for _, r := range trace.Requests {
		longest = max(longest, int64(len(r.Prompt)+len(r.Output)))
	}
	ps := int64(c.PageSize)
	floor := max((longest+ps-1)/ps*ps, 16*ps)
	budget := avail / 4 * 3
	was, wasNeed := c.L1Tokens, c.memoryNeed(runs)
	for c.memoryNeed(runs) > budget && c.L1Tokens/2 >= floor {
		c.L1Tokens /= 2
	}
	if c.L1Tokens != was {
		notes = append(notes, fmt.Sprintf("L1 lowered from %d to %d tokens (L2 %gx with it) to fit this machine: the runs would take %s, %s is available (set --l1-tokens to choose)",
			was, c.L1Tokens, c.L2Ratio, formatBytes(wasNeed), formatBytes(avail)))
	}
	if c.embeddedNode(runs) && c.NodeSpillBytes == 0 {
		free, err := c.Machine.freeDisk(os.TempDir())
		if err != nil {
			return nil, fmt.Errorf("size the node service's spill from the free disk: %w", err)
		}
		// What the strata run writes at most: every distinct page, once per node.
		written := trace.DistinctPrefixTokens(c.PageSize) * c.tokenBytes() * int64(c.nodes())
		if spill := max(free/2, minSpillBytes); written > spill {
			c.NodeSpillBytes = spill / int64(c.nodes())
			notes = append(notes, fmt.Sprintf("node spill capped at %s per node, half the free disk of %s (%s free); the run would write up to %s, the oldest objects are dropped",
				formatBytes(c.NodeSpillBytes), os.TempDir(), formatBytes(free), formatBytes(written)))
		}
	}
	return notes, nil
}
