package arena

import (
	"fmt"
	"log/slog"
	"path/filepath"
	"testing"
)

// BenchmarkFileCopy is the copy path on an arena file, where every call runs
// under the fault guard (fault.go): Reserve, a copy in, Commit, Acquire, a
// copy out and Release, round robin over 64 keys removed and written again,
// for a page-sized object and a 4 MiB one. Run it before and after a change
// to the guard and compare:
//
//	go test -run '^$' -bench 'FileCopy|WriteRead|Small' -count 10 ./node/arena
func BenchmarkFileCopy(b *testing.B) {
	for _, size := range []int{4 << 10, 4 << 20} {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			cfg := DefaultConfig(512 << 20)
			cfg.File = filepath.Join(shmDir(b), "a")
			cfg.Logger = slog.New(slog.DiscardHandler)
			a, err := New(cfg)
			if err != nil {
				b.Fatal(err)
			}
			defer a.Close()
			<-a.Ready()
			src, dst := make([]byte, size), make([]byte, size)
			for i := range src {
				src[i] = byte(i)
			}
			keys := make([]string, 64)
			for i := range keys {
				keys[i] = fmt.Sprintf("model/%d/page-%d/k", i%4, i)
			}
			b.SetBytes(int64(size))
			i := 0
			for b.Loop() {
				key := keys[i%len(keys)]
				i++
				a.Remove(key)
				p, err := a.Reserve(key, 1, int64(size))
				if err != nil {
					b.Fatal(err)
				}
				copy(p.Bytes(), src)
				if err := p.Commit(); err != nil {
					b.Fatal(err)
				}
				l, err := a.Acquire(key, 1)
				if err != nil {
					b.Fatal(err)
				}
				copy(dst, l.Bytes())
				l.Release()
			}
		})
	}
}
