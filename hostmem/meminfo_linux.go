package hostmem

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"strconv"
	"strings"
	"unsafe"
)

// AvailableBytes is the memory this process can still take without pushing the
// machine or its cgroup into reclaim: MemAvailable from /proc/meminfo, lowered to
// the cgroup v2 headroom (memory.max - memory.current) where a limit is set.
func AvailableBytes() (int64, error) {
	avail, err := memAvailable()
	if err != nil {
		return 0, err
	}
	if head, ok := cgroupHeadroom(); ok && head < avail {
		avail = head
	}
	return avail, nil
}

func memAvailable() (int64, error) {
	f, err := os.Open("/proc/meminfo")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := sc.Text()
		if !strings.HasPrefix(line, "MemAvailable:") {
			continue
		}
		fields := strings.Fields(line)
		if len(fields) < 2 {
			break
		}
		kb, err := strconv.ParseInt(fields[1], 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/meminfo MemAvailable %q: %w", fields[1], err)
		}
		return kb << 10, nil
	}
	return 0, fmt.Errorf("/proc/meminfo has no MemAvailable line")
}

func cgroupHeadroom() (int64, bool) {
	maxB, err := os.ReadFile("/sys/fs/cgroup/memory.max")
	if err != nil {
		return 0, false
	}
	maxS := string(bytes.TrimSpace(maxB))
	if maxS == "max" {
		return 0, false
	}
	limit, err := strconv.ParseInt(maxS, 10, 64)
	if err != nil {
		return 0, false
	}
	curB, err := os.ReadFile("/sys/fs/cgroup/memory.current")
	if err != nil {
		return 0, false
	}
	cur, err := strconv.ParseInt(string(bytes.TrimSpace(curB)), 10, 64)
	if err != nil {
		return 0, false
	}
	return limit - cur, true
}

func addrOf(b []byte) uint64 { return uint64(uintptr(unsafe.Pointer(unsafe.SliceData(b)))) }
