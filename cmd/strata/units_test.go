package main

import (
	"encoding/json"
	"errors"
	"math"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"pgregory.net/rapid"

	"github.com/stratakv/strata/hostmem"
)

func TestParseBytes(t *testing.T) {
	good := map[string]int64{
		"4096": 4096, "0": 0, "4GiB": 4 << 30, "4gib": 4 << 30, "4GIB": 4 << 30, "1.5KiB": 1536, "2 MiB": 2 << 20,
		"64MiB": 64 << 20, "1TiB": 1 << 40, "1PiB": 1 << 50, "1.5GiB": 3 << 29, "512B": 512, " 8MiB ": 8 << 20,
		"0.5KiB": 512, "8388607TiB": 8388607 << 40, "9223372036854775807": math.MaxInt64,
	}
	for in, want := range good {
		if got, err := parseBytes(in); err != nil || got != want {
			t.Errorf("parseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, c := range []struct {
		in, want string
		kind     error
	}{
		{"4GB", "4GB is ambiguous (4 GiB or 4 GB?): write 4GiB, or 4000000000 for 4 GB", errSizeUnit},
		{"4G", "4G is ambiguous (4 GiB or 4 GB?): write 4GiB, or 4000000000 for 4 GB", errSizeUnit},
		{"4gb", "4gb is ambiguous (4 GiB or 4 GB?): write 4GiB", errSizeUnit},
		{"4K", "4K is ambiguous (4 KiB or 4 kB?): write 4KiB, or 4000 for 4 kB", errSizeUnit},
		{"1.5TB", "write 1.5TiB, or 1500000000000 for 1.5 TB", errSizeUnit},
		{"512m", "512m is ambiguous (512 MiB or 512 MB?): write 512MiB", errSizeUnit},
		{"1.5", "1.5 is not a whole number of bytes (a size without a unit is bytes): give its unit, such as 1.5GiB", errSizeFraction},
		{"1.1KiB", "1.1KiB is 1126.4 bytes, not a whole number: write 1126 or 1127", errSizeFraction},
		{"0.1GiB", "0.1GiB is 107374182.4 bytes", errSizeFraction},
		{"8192PiB", "8192PiB is too large: at most", errSizeSyntax},
		{"4XB", `4XB: unknown unit "XB"`, errSizeSyntax},
		{"", `"" is not a size`, errSizeSyntax},
		{"GiB", `"GiB" is not a size`, errSizeSyntax},
		{"-1", `"-1" is not a size`, errSizeSyntax},
		{"+1", `"+1" is not a size`, errSizeSyntax},
		{"1e30", `1e30: unknown unit "e30"`, errSizeSyntax},
		{"1.", `"1." is not a size`, errSizeSyntax},
		{".5GiB", `".5GiB" is not a size`, errSizeSyntax},
		{"1.2.3", `"1.2.3" is not a size`, errSizeSyntax},
		{"four", `"four" is not a size`, errSizeSyntax},
	} {
		_, err := parseBytes(c.in)
		if err == nil || !strings.Contains(err.Error(), c.want) || !errors.Is(err, c.kind) {
			t.Errorf("parseBytes(%q): %v; want %q (%v)", c.in, err, c.want, c.kind)
		}
	}
}

// A config file's number is whole bytes; a fraction is refused with the
// string to write.
func TestSizeFromJSON(t *testing.T) {
	for in, want := range map[string]string{"4096": "4096", "4e9": "4000000000", "1.0": "1", "0": "0", "1e30": "1" + strings.Repeat("0", 30)} {
		if got, err := sizeFromJSON(json.Number(in)); err != nil || got != want {
			t.Errorf("sizeFromJSON(%s) = %q, %v; want %q", in, got, err, want)
		}
	}
	for in, want := range map[string]string{
		"1.5":  `1.5, not a whole number of bytes (a number in the config file is bytes): write "1536MiB" for 1.5 GiB, a string with its unit`,
		"0.3":  `write "307MiB" for about 0.3 GiB`,
		"1e-9": `write "4GiB" for about 0 GiB`,
	} {
		_, err := sizeFromJSON(json.Number(in))
		if err == nil || !strings.Contains(err.Error(), want) || !errors.Is(err, errSizeFraction) {
			t.Errorf("sizeFromJSON(%s): %v; want %q", in, err, want)
		}
	}
	// Too large for bytes: refused by the size's own parser, after.
	if _, err := parseBytes("1" + strings.Repeat("0", 30)); err == nil {
		t.Error("10^30 bytes accepted")
	}
}

// Every size strata can hold is written by formatSize in a form parseBytes
// reads back to the byte.
func TestFormatSizeRoundTrips(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.OneOf(rapid.Int64Min(0), rapid.Int64Range(0, 1<<20), rapid.Map(rapid.Int64Range(0, 1<<30), func(k int64) int64 { return k << 20 })).Draw(t, "n")
		got, err := parseBytes(hostmem.FormatSize(n))
		if err != nil || got != n {
			t.Fatalf("parseBytes(hostmem.FormatSize(%d) = %q) = %d, %v", n, hostmem.FormatSize(n), got, err)
		}
	})
}

// parseBytes never panics; what it accepts is a non-negative size that
// formatSize writes back in a form it reads as the same number; what it
// refuses it says how to fix.
func FuzzParseBytes(f *testing.F) {
	for _, s := range []string{"4096", "0", "4GiB", "4gib", "1.5GiB", "1.1KiB", "4G", "4GB", "4gb", "1.5", "0.1GiB", " 2 MiB ", "1PiB",
		"8192PiB", "9223372036854775807", "9223372036854775808", "1e30", "-1", "", ".", "1.", ".5", "GiB", "4XB", "1.2.3", "00012KiB"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		n, err := parseBytes(s)
		if err != nil {
			var se *sizeError
			if !errors.As(err, &se) || !(errors.Is(err, errSizeSyntax) || errors.Is(err, errSizeUnit) || errors.Is(err, errSizeFraction)) {
				t.Fatalf("parseBytes(%q): %v is no sizeError of a known kind", s, err)
			}
			return
		}
		if n < 0 {
			t.Fatalf("parseBytes(%q) = %d", s, n)
		}
		back, err := parseBytes(hostmem.FormatSize(n))
		if err != nil || back != n {
			t.Fatalf("parseBytes(%q) = %d, but parseBytes(hostmem.FormatSize(%d) = %q) = %d, %v", s, n, n, hostmem.FormatSize(n), back, err)
		}
	})
}

// Every place a size is given refuses the ambiguous and the fractional with
// the fix, naming the flag, variable or key: serve's flags, its environment
// and its config file, and bench's flags.
func TestSizesRefusedWhereverGiven(t *testing.T) {
	sock := filepath.Join(shortDir(t), "s.sock")
	for _, c := range []struct {
		env  string
		args []string
		want string
	}{
		{"", []string{"serve", "--socket", sock, "--admin", "", "--arena", "4GB"}, "--arena: 4GB is ambiguous (4 GiB or 4 GB?): write 4GiB, or 4000000000 for 4 GB"},
		{"", []string{"serve", "--socket", sock, "--admin", "", "--spill-capacity", "500G"}, "--spill-capacity: 500G is ambiguous (500 GiB or 500 GB?): write 500GiB"},
		{"", []string{"serve", "--socket", sock, "--admin", "", "--arena", "1.5"}, "--arena: 1.5 is not a whole number of bytes"},
		{"STRATA_ARENA=4g", []string{"serve", "--socket", sock, "--admin", ""}, "STRATA_ARENA: 4g is ambiguous (4 GiB or 4 GB?): write 4GiB"},
		{"", []string{"bench", "--node-arena", "1G"}, "--node-arena: 1G is ambiguous (1 GiB or 1 GB?): write 1GiB"},
		{"", []string{"bench", "--l3", "file", "--l3-capacity", "64GB"}, "--l3-capacity: 64GB is ambiguous"},
	} {
		if k, v, ok := strings.Cut(c.env, "="); ok {
			t.Setenv(k, v)
		}
		code, _, errs := runCLI(t, "", c.args...)
		if code != 2 || !strings.Contains(errs, c.want) {
			t.Errorf("%s strata %s: exit %d, stderr %q; want 2 and %q", c.env, strings.Join(c.args, " "), code, errs, c.want)
		}
		if k, _, ok := strings.Cut(c.env, "="); ok {
			os.Unsetenv(k)
		}
	}
	for doc, want := range map[string]string{
		`{"arena": 1.5}`:      `"arena" is 1.5, not a whole number of bytes (a number in the config file is bytes): write "1536MiB" for 1.5 GiB, a string with its unit`,
		`{"arena": "4GB"}`:    `"arena": 4GB is ambiguous (4 GiB or 4 GB?): write 4GiB`,
		`{"arena": "1.1KiB"}`: `"arena": 1.1KiB is 1126.4 bytes, not a whole number: write 1126 or 1127`,
	} {
		if _, err := loadConfigFile(t, doc); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("config %s: %v; want %q", doc, err, want)
		}
	}
	c, err := loadConfigFile(t, `{"arena": 8388608, "spill-capacity": 4e9, "request-memory": "1.5GiB"}`)
	if err != nil || c.ArenaBytes != 8<<20 || c.SpillBytes != 4e9 || c.RequestMemoryBytes != 3<<29 {
		t.Errorf("whole sizes in a config: %v, arena %d, spill capacity %d, request memory %d", err, c.ArenaBytes, c.SpillBytes, c.RequestMemoryBytes)
	}
}
