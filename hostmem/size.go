package hostmem

import "strconv"

// FormatSize writes n as strata's size flags and settings read it back: in
// the largest binary unit it is a whole number of (4GiB, 448MiB, 3KiB), or in
// bytes. FormatBytes is for people; this is for a command line to copy.
func FormatSize(n int64) string {
	for _, u := range []struct {
		name  string
		bytes int64
	}{{"TiB", 1 << 40}, {"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}} {
		if n != 0 && n%u.bytes == 0 {
			return strconv.FormatInt(n/u.bytes, 10) + u.name
		}
	}
	return strconv.FormatInt(n, 10)
}

// FitSize is the size a fix line proposes for a region that must fit in room
// bytes (an arena on this machine): the largest whole number of GiB in it,
// or below 1 GiB of room the largest multiple of 64 MiB, or 0 below 64 MiB.
// One rule for every command that proposes a size (strata doctor, strata
// bench's --node-arena), so that they propose the same one.
func FitSize(room int64) int64 {
	switch {
	case room >= 1<<30:
		return room &^ (1<<30 - 1)
	case room >= 64<<20:
		return room &^ (64<<20 - 1)
	}
	return 0
}
