package vecio

import (
	"bytes"
	"os"
	"path/filepath"
	"testing"
	"unsafe"

	"pgregory.net/rapid"
)

// Advance drops exactly n bytes, whatever the runs' lengths.
func TestAdvanceDropsExactlyN(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		lens := rapid.SliceOfN(rapid.IntRange(0, 9), 0, 6).Draw(t, "lens")
		var iovs [][]byte
		var all []byte
		for i, l := range lens {
			run := bytes.Repeat([]byte{byte('a' + i)}, l)
			iovs = append(iovs, run)
			all = append(all, run...)
		}
		n := rapid.IntRange(0, len(all)).Draw(t, "n")
		rest := Advance(iovs, n)
		if got := bytes.Join(rest, nil); !bytes.Equal(got, all[n:]) {
			t.Fatalf("after dropping %d of %q: %q", n, all, got)
		}
		if len(rest) > 0 && len(rest[0]) == 0 {
			t.Fatalf("an empty run leads what is left: %q", rest)
		}
	})
}

// What Pwritev writes from several runs, Preadv reads back into others.
func TestPwritevPreadvRoundTrip(t *testing.T) {
	path := filepath.Join(t.TempDir(), "f")
	fd, err := Open(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = os.NewFile(uintptr(fd), path).Close() }()
	want := []byte("0123456789abcdefghij")
	n, err := Pwritev(fd, [][]byte{want[:3], want[3:11], want[11:]}, 100)
	if err != nil || n != len(want) {
		t.Fatalf("pwritev: %d, %v", n, err)
	}
	got := make([]byte, len(want))
	n, err = Preadv(fd, [][]byte{got[:7], got[7:]}, 100)
	if err != nil || n != len(want) || !bytes.Equal(got, want) {
		t.Fatalf("preadv: %d, %v, %q", n, err, got)
	}
}

func TestAlignedBytes(t *testing.T) {
	for _, align := range []int{512, 4096} {
		for _, n := range []int{0, 1, 4095, 4096, 1 << 20} {
			b := AlignedBytes(n, align)
			if len(b) != n || cap(b) != n {
				t.Fatalf("AlignedBytes(%d, %d): len %d cap %d", n, align, len(b), cap(b))
			}
			if n > 0 && uintptr(unsafe.Pointer(&b[0]))%uintptr(align) != 0 {
				t.Fatalf("AlignedBytes(%d, %d) starts at %p", n, align, &b[0])
			}
		}
	}
}
