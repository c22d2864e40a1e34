package hostmem

import "testing"

func TestFormatSizeAndFitSize(t *testing.T) {
	for _, c := range []struct {
		n    int64
		want string
	}{{0, "0"}, {1, "1"}, {1536, "1536"}, {4096, "4KiB"}, {448 << 20, "448MiB"}, {7 << 30, "7GiB"}, {2 << 40, "2TiB"}, {1<<30 + 1, "1073741825"}} {
		if got := FormatSize(c.n); got != c.want {
			t.Errorf("FormatSize(%d) = %q, want %q", c.n, got, c.want)
		}
	}
	for _, c := range []struct{ room, want int64 }{
		{0, 0}, {64<<20 - 1, 0}, {64 << 20, 64 << 20}, {1<<30 - 1, 960 << 20}, {1 << 30, 1 << 30}, {11<<30 + 400<<20, 11 << 30},
	} {
		if got := FitSize(c.room); got != c.want {
			t.Errorf("FitSize(%d) = %d, want %d", c.room, got, c.want)
		}
	}
}
