package main

import (
	"fmt"
	"strconv"
	"strings"
)

// parseBytes reads a size such as 4096, 64MiB, 4GiB, 1.5TB or 512k. Binary units
// (KiB, MiB, GiB, TiB) and their one-letter forms (K, M, G, T) are powers of 1024;
// decimal units (KB, MB, GB, TB) powers of 1000.
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := len(t)
	for i > 0 && (t[i-1] < '0' || t[i-1] > '9') && t[i-1] != '.' {
		i--
	}
	num, unit := t[:i], strings.ToLower(strings.TrimSpace(t[i:]))
	v, err := strconv.ParseFloat(num, 64)
	if err != nil || v < 0 {
		return 0, fmt.Errorf("size %q: want a non-negative number with an optional unit such as 4GiB", s)
	}
	mult := map[string]float64{
		"": 1, "b": 1,
		"k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
		"kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12,
	}[unit]
	if mult == 0 {
		return 0, fmt.Errorf("size %q: unknown unit %q (use B, KiB, MiB, GiB, TiB or KB, MB, GB, TB)", s, unit)
	}
	if v*mult > 1<<62 {
		return 0, fmt.Errorf("size %q is too large", s)
	}
	return int64(v * mult), nil
}
