package main

import (
	"encoding/json"
	"fmt"
	"math"
	"math/big"
	"strings"

	"github.com/stratakv/strata/hostmem"
)

// Sizes. Every size strata reads (serve's flags, environment and config file,
// bench's flags) takes one form: a whole number of bytes, or a number with a
// binary unit, B, KiB, MiB, GiB, TiB or PiB (powers of 1024; the unit's case
// does not matter, since the "i" alone says binary). K, M, G, T, P and KB, MB,
// GB, TB, PB are refused, with the fix: the tools next to strata disagree on
// them (Redis and tmpfs read 4g and 4gb as 4 GiB, a disk's label reads 4 GB as
// 4,000,000,000 bytes), and a cache sized by a guess is off by 7% at G and 10%
// at T without a word. A fraction is taken when it comes to a whole number of
// bytes (1.5GiB), and refused otherwise rather than rounded (0.1GiB). A size
// strata writes (serve -h's defaults, formatSize) is read back to the byte.

// sizeUnitsDoc says what a size takes, for the configuration reference.
const sizeUnitsDoc = "Sizes are a whole number of bytes, or a number with a binary unit: B, KiB, MiB, GiB, TiB, PiB\n" +
	"(powers of 1024, in any case: `4GiB`, `1.5TiB`, `512kib`). K, M, G, T and KB, MB, GB, TB are refused as\n" +
	"ambiguous (1000 or 1024?), and so is a size that is no whole number of bytes (`0.1GiB`, or `1.5` in a\n" +
	"config file: write `\"1536MiB\"`)."

// binaryUnits are the units a size may have, by their lower-case names.
var binaryUnits = map[string]struct {
	name  string
	bytes int64
}{
	"": {"", 1}, "b": {"B", 1}, "kib": {"KiB", 1 << 10}, "mib": {"MiB", 1 << 20}, "gib": {"GiB", 1 << 30},
	"tib": {"TiB", 1 << 40}, "pib": {"PiB", 1 << 50},
}

// ambiguousUnits are the units refused, by their lower-case names, with the
// binary unit and the decimal one they could mean.
var ambiguousUnits = map[string]struct {
	binary, decimal string
	decimalBytes    int64
}{
	"k": {"KiB", "kB", 1e3}, "kb": {"KiB", "kB", 1e3}, "m": {"MiB", "MB", 1e6}, "mb": {"MiB", "MB", 1e6},
	"g": {"GiB", "GB", 1e9}, "gb": {"GiB", "GB", 1e9}, "t": {"TiB", "TB", 1e12}, "tb": {"TiB", "TB", 1e12},
	"p": {"PiB", "PB", 1e15}, "pb": {"PiB", "PB", 1e15},
}

// parseBytes reads a size such as 4096, 64MiB, 4GiB or 1.5TiB (see Sizes).
// Its errors say what to write instead; callers prefix the flag or key.
func parseBytes(s string) (int64, error) {
	t := strings.TrimSpace(s)
	i := 0
	for i < len(t) && (t[i] >= '0' && t[i] <= '9' || t[i] == '.') {
		i++
	}
	num, unit := t[:i], strings.TrimSpace(t[i:])
	v, ok := parseDecimal(num)
	if !ok {
		return 0, &sizeError{fmt.Sprintf("%q is not a size: write a whole number of bytes or a number with a binary unit, such as 4GiB or 512MiB", s), errSizeSyntax}
	}
	lower := strings.ToLower(unit)
	if a, ok := ambiguousUnits[lower]; ok {
		msg := fmt.Sprintf("%s is ambiguous (%s %s or %s %s?): write %s%s", t, num, a.binary, num, a.decimal, num, a.binary)
		if dec := new(big.Rat).Mul(v, big.NewRat(a.decimalBytes, 1)); dec.IsInt() && dec.Num().IsInt64() {
			msg += fmt.Sprintf(", or %s for %s %s", dec.Num(), num, a.decimal)
		}
		return 0, &sizeError{msg, errSizeUnit}
	}
	u, ok := binaryUnits[lower]
	if !ok {
		return 0, &sizeError{fmt.Sprintf("%s: unknown unit %q; the units are B, KiB, MiB, GiB, TiB and PiB (such as 4GiB)", t, unit), errSizeSyntax}
	}
	n := new(big.Rat).Mul(v, big.NewRat(u.bytes, 1))
	if !n.IsInt() {
		if u.bytes == 1 {
			return 0, &sizeError{fmt.Sprintf("%s is not a whole number of bytes (a size without a unit is bytes): give its unit, such as %sGiB", t, num), errSizeFraction}
		}
		lo := new(big.Int).Quo(n.Num(), n.Denom())
		return 0, &sizeError{fmt.Sprintf("%s is %s bytes, not a whole number: write %s or %s", t, trimRat(n), lo, new(big.Int).Add(lo, big.NewInt(1))), errSizeFraction}
	}
	if !n.Num().IsInt64() {
		return 0, &sizeError{fmt.Sprintf("%s is too large: at most %s", t, hostmem.FormatSize(math.MaxInt64)), errSizeSyntax}
	}
	return n.Num().Int64(), nil
}

// parseDecimal reads digits with at most one '.' between digits, exactly.
func parseDecimal(num string) (*big.Rat, bool) {
	whole, frac, dot := strings.Cut(num, ".")
	if whole == "" || dot && frac == "" || strings.Contains(frac, ".") {
		return nil, false
	}
	return new(big.Rat).SetString(num)
}

// trimRat writes r in decimals, at most three of them, without trailing zeros.
func trimRat(r *big.Rat) string {
	s := r.FloatString(3)
	return strings.TrimSuffix(strings.TrimRight(s, "0"), ".")
}

// sizeFromJSON turns a config file's number into the text of a size: a whole
// number is bytes (4096, 4e9); any other is refused with the string to write
// instead, since a number without a unit that is not whole bytes was meant in
// some unit the file does not say ("arena": 1.5 once gave an arena of 1 byte).
func sizeFromJSON(v json.Number) (string, error) {
	if _, err := v.Int64(); err == nil {
		return v.String(), nil
	}
	r, ok := new(big.Rat).SetString(v.String())
	if !ok {
		return "", &sizeError{fmt.Sprintf("%s, not a number of bytes", v), errSizeSyntax}
	}
	if r.IsInt() {
		return r.Num().String(), nil
	}
	// The likeliest meaning of a small fraction is GiB: suggest it, to the MiB.
	mib := new(big.Rat).Mul(r, big.NewRat(1<<10, 1))
	whole := new(big.Int).Quo(new(big.Int).Add(mib.Num(), new(big.Int).Quo(mib.Denom(), big.NewInt(2))), mib.Denom())
	about := ""
	if !mib.IsInt() {
		about = "about "
	}
	suggest := "4GiB"
	if whole.IsInt64() && whole.Int64() > 0 && whole.Int64() <= math.MaxInt64>>20 {
		suggest = hostmem.FormatSize(whole.Int64() << 20)
	}
	return "", &sizeError{fmt.Sprintf("%s, not a whole number of bytes (a number in the config file is bytes): write \"%s\" for %s%s GiB, a string with its unit",
		v, suggest, about, trimRat(r)), errSizeFraction}
}
