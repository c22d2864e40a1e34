package redisstore

import (
	"context"
	"fmt"
	"io"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/redis/rueidis"

	"github.com/stratakv/strata/internal/benchpeer"
	"github.com/stratakv/strata/internal/redistest"
	"github.com/stratakv/strata/kvlayout"
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/storage/storagetest"
)

// The benchmarks move batches of benchValues values of benchValueBytes: one
// batch of 128 pages whose parts are 4 MiB.
const (
	benchValues     = 128
	benchValueBytes = 4 << 20
)

func benchKeys(prefix string) []string {
	keys := make([]string, benchValues)
	for i := range keys {
		keys[i] = fmt.Sprintf("%s-%03d", prefix, i)
	}
	return keys
}

func benchBuffers(seed uint64) [][]byte {
	out := make([][]byte, benchValues)
	for i := range out {
		out[i] = randBytes(seed+uint64(i), benchValueBytes)
	}
	return out
}

// reportGBs reports the bytes of one batch per iteration as GB/s.
func reportGBs(b *testing.B) {
	b.ReportMetric(float64(benchValues*benchValueBytes)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GB/s")
}

// rawSet and rawGet are the raw go-redis pipelines the store is held against.
func rawSet(ctx context.Context, c redis.UniversalClient, keys []string, src [][]byte) error {
	pipe := c.Pipeline()
	for i, k := range keys {
		pipe.Set(ctx, k, src[i], 0)
	}
	_, err := pipe.Exec(ctx)
	return err
}

func rawGet(ctx context.Context, c redis.UniversalClient, keys []string, dst [][]byte) error {
	pipe := c.Pipeline()
	cmds := make([]*redis.ZeroCopyStringCmd, len(keys))
	for i, k := range keys {
		cmds[i] = pipe.GetToBuffer(ctx, k, dst[i])
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return err
	}
	for i, c := range cmds {
		if c.Val() != len(dst[i]) {
			return fmt.Errorf("GET %s: %d bytes, want %d", keys[i], c.Val(), len(dst[i]))
		}
	}
	return nil
}

// BenchmarkClients compares go-redis v9 and rueidis on one local redis-server:
// one pipeline of 128 SETs of 4 MiB values, and one of 128 GETs of them, the same
// bytes and depth for both. go-redis reads with GetToBuffer (straight into the
// caller's buffers); rueidis with DoMulti (a new string per value, copied into
// the caller's buffers, as the store would have to) and with DoMultiStream into
// the caller's buffers (io.ReaderFrom: straight from the socket).
func BenchmarkClients(b *testing.B) {
	srv := redistest.Start(b)
	ctx := context.Background()
	keys, src := benchKeys("bench"), benchBuffers(1)
	dst := make([][]byte, benchValues)
	for i := range dst {
		dst[i] = make([]byte, benchValueBytes)
		for j := range dst[i] {
			dst[i][j] = 1 // fault the pages in now, not in the first timed read
		}
	}
	check := func(b *testing.B) {
		for i := range dst {
			if string(dst[i]) != string(src[i]) {
				b.Fatalf("value %d read back wrong", i)
			}
			clear(dst[i])
		}
	}

	gr := redis.NewClient(clientOptions(DefaultConfig(srv.Addr()), srv.Addr()))
	b.Cleanup(func() { _ = gr.Close() })
	b.Run("go-redis/set", func(b *testing.B) {
		b.SetBytes(benchValues * benchValueBytes)
		for b.Loop() {
			if err := rawSet(ctx, gr, keys, src); err != nil {
				b.Fatal(err)
			}
		}
		reportGBs(b)
	})
	b.Run("go-redis/get", func(b *testing.B) {
		if err := rawSet(ctx, gr, keys, src); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchValues * benchValueBytes)
		for b.Loop() {
			if err := rawGet(ctx, gr, keys, dst); err != nil {
				b.Fatal(err)
			}
		}
		reportGBs(b)
		check(b)
	})
	// The store reads chunks with GETRANGE 0 n-1 (see readPass): the same through
	// the client, one more range check on the server.
	b.Run("go-redis/getrange", func(b *testing.B) {
		if err := rawSet(ctx, gr, keys, src); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchValues * benchValueBytes)
		for b.Loop() {
			pipe := gr.Pipeline()
			cmds := make([]*redis.ZeroCopyStringCmd, len(keys))
			for i, k := range keys {
				cmds[i] = redis.NewZeroCopyStringCmd(ctx, dst[i], "getrange", k, 0, benchValueBytes-1)
				_ = pipe.Process(ctx, cmds[i])
			}
			if _, err := pipe.Exec(ctx); err != nil {
				b.Fatal(err)
			}
		}
		reportGBs(b)
		check(b)
	})

	ru, err := rueidis.NewClient(rueidis.ClientOption{InitAddress: []string{srv.Addr()}, DisableCache: true})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(ru.Close)
	b.Run("rueidis/set", func(b *testing.B) {
		b.SetBytes(benchValues * benchValueBytes)
		for b.Loop() {
			cmds := make(rueidis.Commands, len(keys))
			for i, k := range keys {
				cmds[i] = ru.B().Set().Key(k).Value(rueidis.BinaryString(src[i])).Build()
			}
			for _, r := range ru.DoMulti(ctx, cmds...) {
				if err := r.Error(); err != nil {
					b.Fatal(err)
				}
			}
		}
		reportGBs(b)
	})
	b.Run("rueidis/get-domulti", func(b *testing.B) {
		if err := rawSet(ctx, gr, keys, src); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchValues * benchValueBytes)
		for b.Loop() {
			cmds := make(rueidis.Commands, len(keys))
			for i, k := range keys {
				cmds[i] = ru.B().Get().Key(k).Build()
			}
			for i, r := range ru.DoMulti(ctx, cmds...) {
				v, err := r.AsBytes()
				if err != nil {
					b.Fatal(err)
				}
				copy(dst[i], v)
			}
		}
		reportGBs(b)
		check(b)
	})
	b.Run("rueidis/get-stream", func(b *testing.B) {
		if err := rawSet(ctx, gr, keys, src); err != nil {
			b.Fatal(err)
		}
		b.SetBytes(benchValues * benchValueBytes)
		for b.Loop() {
			cmds := make(rueidis.Commands, len(keys))
			for i, k := range keys {
				cmds[i] = ru.B().Get().Key(k).Build()
			}
			s := ru.DoMultiStream(ctx, cmds...)
			for i := range keys {
				if n, err := s.WriteTo(&bufferWriter{buf: dst[i]}); err != nil || n != benchValueBytes {
					b.Fatalf("stream value %d: %d bytes, %v", i, n, err)
				}
			}
		}
		reportGBs(b)
		check(b)
	})
}

// bufferWriter fills buf; its ReadFrom reads straight into it, so that rueidis's
// stream copies from the socket into the caller's buffer without a copy between.
type bufferWriter struct {
	buf []byte
	n   int
}

func (w *bufferWriter) Write(p []byte) (int, error) {
	if len(p) > len(w.buf)-w.n {
		return 0, io.ErrShortBuffer
	}
	w.n += copy(w.buf[w.n:], p)
	return len(p), nil
}

func (w *bufferWriter) ReadFrom(r io.Reader) (int64, error) {
	n, err := io.ReadFull(r, w.buf[w.n:])
	w.n += n
	if err == io.ErrUnexpectedEOF || err == io.EOF {
		err = nil
	}
	return int64(n), err
}

// BenchmarkStorePutGet128 puts a batch of 128 fresh pages of one 4 MiB part (an
// MLA pool) and gets them back into other pages, and reports its speed as a
// fraction of raw pipelined SET and GET of the same 128 values of 4 MiB over the
// same client and server in the same run ("x-of-raw"; 1 is as fast as raw).
func BenchmarkStorePutGet128(b *testing.B) {
	srv := redistest.Start(b)
	cfg := DefaultConfig(srv.Addr())
	cfg.CallTimeout = time.Minute // a batch of 512 MiB may take more than 2 s on a loaded machine
	s := newStore(b, cfg)
	geo := kvlayout.Geometry{Layers: 64, MLA: true, LatentDim: 512, DTypeBytes: 2} // 1 KiB per token and layer
	g := storagetest.NewGroupPages(b, s, kvlayout.PageFirst, 64, 2*benchValues, []pool.PoolSpec{{Name: kv, Geometry: geo}})
	storagetest.Register(b, s, g)
	spec := g.Spec(kv)
	if spec.Layout.PageBufferBytes() != benchValueBytes {
		b.Fatalf("page part of %d bytes, want %d", spec.Layout.PageBufferBytes(), benchValueBytes)
	}
	src, dst := make([]pool.PageID, benchValues), make([]pool.PageID, benchValues)
	for i := range src {
		src[i], dst[i] = pool.PageID(i), pool.PageID(benchValues+i)
		storagetest.Fill(spec, src[i], i, 0)
	}
	ctx := context.Background()
	flush := func() {
		if err := s.rdb.FlushAllAsync(ctx).Err(); err != nil {
			b.Fatal(err)
		}
	}
	// The same bytes, moved raw: the page memory itself, SET then GET. rawDst is the
	// memory of the destination pages, which receive the same bytes either way.
	mem := spec.Region.Bytes()
	raw := make([][]byte, benchValues)
	rawDst := make([][]byte, benchValues)
	for i := range raw {
		raw[i] = mem[int64(i)*benchValueBytes : int64(i+1)*benchValueBytes]
		rawDst[i] = mem[int64(benchValues+i)*benchValueBytes : int64(benchValues+i+1)*benchValueBytes]
	}
	rawKeys := benchKeys("raw")
	b.SetBytes(2 * benchValues * benchValueBytes)
	var keys []pagekey.Key
	var putTime, getTime, rawPutTime, rawGetTime time.Duration
	// Each side starts on an empty server; the flush and the keys are not timed.
	setup := func(i int, peer bool) {
		flush()
		if !peer {
			keys = storagetest.Keys(b, uint64(i)+1000, benchValues)
		}
	}
	benchpeer.Compare(b, "x-of-raw", func(int) {
		t0 := time.Now()
		for j, err := range s.Put(ctx, kv, keys, src) {
			if err != nil {
				b.Fatalf("put %d: %v", j, err)
			}
		}
		t1 := time.Now()
		for j, err := range s.Get(ctx, kv, keys, dst) {
			if err != nil {
				b.Fatalf("get %d: %v", j, err)
			}
		}
		putTime += t1.Sub(t0)
		getTime += time.Since(t1)
	}, func(i int) {
		t0 := time.Now()
		if err := rawSet(ctx, s.rdb, rawKeys, raw); err != nil {
			b.Fatal(err)
		}
		t1 := time.Now()
		if err := rawGet(ctx, s.rdb, rawKeys, rawDst); err != nil {
			b.Fatal(err)
		}
		if i >= 0 { // not the warm-up
			rawPutTime += t1.Sub(t0)
			rawGetTime += time.Since(t1)
		}
	}, benchpeer.Options{Setup: setup})
	batch := float64(benchValues*benchValueBytes) * float64(b.N)
	b.ReportMetric(batch/putTime.Seconds()/1e9, "put-GB/s")
	b.ReportMetric(batch/getTime.Seconds()/1e9, "get-GB/s")
	b.ReportMetric(batch/rawPutTime.Seconds()/1e9, "raw-put-GB/s")
	b.ReportMetric(batch/rawGetTime.Seconds()/1e9, "raw-get-GB/s")
	for j := range dst {
		if err := storagetest.Check(spec, dst[j], j, 0); err != nil {
			b.Fatalf("after %d rounds: %v", b.N, err)
		}
	}
}
