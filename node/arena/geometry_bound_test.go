package arena

import "testing"

// strata doctor and strata bench (cmd/strata/doctor.go's arenaFileOverhead)
// and the Python doctor propose arenas whose file fits a tmpfs by the bound
// size/1024 + 10 MiB + 8 KiB on what the file holds beyond the arena: the
// layout must stay within it, or a proposed arena would be refused by the
// start's own check of the file's room.
func TestArenaFileOverheadWithinTheDoctorsBound(t *testing.T) {
	for _, size := range []int64{4096, 64 << 20, 1<<30 - 4096, 1 << 30, 1<<30 + 7*4096, 11 << 30, 64 << 30, 1 << 40} {
		g := newGeometry(4096, size, 64<<10, 4096, true)
		if over, bound := g.fileSize-size, size/1024+10<<20+8<<10; over > bound {
			t.Errorf("an arena of %d bytes: its file holds %d bytes more, over the bound %d", size, over, bound)
		}
	}
}
