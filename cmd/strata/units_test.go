package main

import "testing"

func TestParseBytes(t *testing.T) {
	good := map[string]int64{"4096": 4096, "4GiB": 4 << 30, "4g": 4 << 30, "1.5KiB": 1536, "2 MB": 2e6, "0": 0, "64MiB": 64 << 20, "1TB": 1e12}
	for in, want := range good {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "GiB", "-1", "4XB", "1e30", "four"} {
		if _, err := parseBytes(in); err == nil {
			t.Errorf("parseBytes(%q) accepted", in)
		}
	}
}
