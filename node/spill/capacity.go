package spill

import (
	"math"

	"golang.org/x/sys/unix"
)

// deviceFree is the bytes an unprivileged writer may still use on the spill's
// device (statfs f_bavail); a device that cannot say is taken to have room.
func (s *Store) deviceFree() int64 {
	if s.freeBytes != nil {
		return s.freeBytes()
	}
	var st unix.Statfs_t
	if err := unix.Statfs(s.dir, &st); err != nil || st.Bsize <= 0 || st.Blocks == 0 {
		return math.MaxInt64 / 4
	}
	if st.Bavail > uint64(math.MaxInt64/4)/uint64(st.Bsize) {
		return math.MaxInt64 / 4
	}
	return int64(st.Bavail) * st.Bsize
}
