package cache_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

func local(t *testing.T) (store.Store, func(string, []byte)) { return storetest.Local(t) }

func TestCacheConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: func(t *testing.T) (store.Store, func(string, []byte)) {
		inner, put := local(t)
		c, err := cache.New(inner, cache.Config{Bytes: 64 << 10, ChunkBytes: 4 << 10}, nil)
		if err != nil {
			t.Fatal(err)
		}
		c.Revalidate = 0 // every read checks its version, as the uncached stores do
		return c, put
	}})
}

func setup(t *testing.T, size int) (*cache.Store, *storetest.Counting, store.Info, []byte, func(string, []byte)) {
	inner, put := local(t)
	data := make([]byte, size)
	for i := range data {
		data[i] = byte(i * 13)
	}
	put("f", data)
	counting := storetest.NewCounting(inner)
	c, err := cache.New(counting, cache.Config{Bytes: 1 << 20, ChunkBytes: 4096}, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := inner.Stat(context.Background(), "f")
	return c, counting, info, data, put
}

func TestConcurrentMissesShareOneFetch(t *testing.T) {
	c, counting, info, data, _ := setup(t, 100_000)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			p := make([]byte, 50_000)
			if err := c.ReadAt(context.Background(), "f", info.Version, p, 10_000); err != nil ||
				!bytes.Equal(p, data[10_000:60_000]) {
				t.Errorf("read: %v", err)
			}
		})
	}
	wg.Wait()
	// [10000, 60000) touches chunks 2..14: 13 chunks of 4 KiB, each read once, all in one run.
	if counting.Bytes() != 13*4096 || counting.Reads() != 1 {
		t.Errorf("storage saw %d bytes in %d reads, want %d in 1", counting.Bytes(), counting.Reads(), 13*4096)
	}
	st := c.Stats()
	if st.BytesFromStore != 13*4096 || st.Hits+st.Misses != 32*13 || st.FillsInFlight != 0 {
		t.Errorf("stats %+v", st)
	}
}

// Adjacent missing chunks are filled by one read; a cached chunk splits the run.
func TestRunsOfMissingChunksAreReadTogether(t *testing.T) {
	c, counting, info, data, _ := setup(t, 100_000)
	ctx := context.Background()
	if err := c.ReadAt(ctx, "f", info.Version, make([]byte, 10), 5*4096); err != nil {
		t.Fatal(err)
	}
	p := make([]byte, 10*4096)
	if err := c.ReadAt(ctx, "f", info.Version, p, 0); err != nil || !bytes.Equal(p, data[:len(p)]) {
		t.Fatalf("read: %v", err)
	}
	if counting.Reads() != 3 || counting.Bytes() != 10*4096 {
		t.Errorf("storage saw %d bytes in %d reads; want chunk 5, then 0..4 and 6..9: 10 chunks in 3 reads",
			counting.Bytes(), counting.Reads())
	}
}

// slowStore blocks data reads until released.
type slowStore struct {
	store.Store
	release chan struct{}
}

func (s *slowStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	<-s.release
	return s.Store.ReadAt(ctx, key, version, p, off)
}

func TestOneClientsCancelDoesNotAbortAFillOthersWaitFor(t *testing.T) {
	inner, put := local(t)
	put("f", bytes.Repeat([]byte{7}, 8192))
	info, _ := inner.Stat(context.Background(), "f")
	slow := &slowStore{Store: inner, release: make(chan struct{})}
	c, _ := cache.New(slow, cache.Config{Bytes: 1 << 20, ChunkBytes: 4096}, nil)
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- c.ReadAt(ctx, "f", info.Version, make([]byte, 100), 0) }()
	second := make(chan error, 1)
	p := make([]byte, 100)
	go func() { second <- c.ReadAt(context.Background(), "f", info.Version, p, 0) }()
	for c.Stats().FillsInFlight == 0 {
		time.Sleep(time.Millisecond)
	}
	cancel()
	if err := <-first; !errors.Is(err, context.Canceled) {
		t.Errorf("the canceled reader got %v", err)
	}
	close(slow.release)
	if err := <-second; err != nil || p[0] != 7 {
		t.Errorf("the other reader got %v", err)
	}
}

// failOnce fails its first data read.
type failOnce struct {
	store.Store
	once sync.Once
}

func (f *failOnce) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	var err error
	f.once.Do(func() { err = errors.New("boom") })
	if err != nil {
		return err
	}
	return f.Store.ReadAt(ctx, key, version, p, off)
}

func TestErrorsAreNotCached(t *testing.T) {
	inner, put := local(t)
	put("f", bytes.Repeat([]byte{3}, 4096))
	info, _ := inner.Stat(context.Background(), "f")
	c, _ := cache.New(&failOnce{Store: inner}, cache.Config{Bytes: 1 << 20, ChunkBytes: 4096}, nil)
	p := make([]byte, 10)
	if err := c.ReadAt(context.Background(), "f", info.Version, p, 0); err == nil {
		t.Fatal("the first read should fail")
	}
	if err := c.ReadAt(context.Background(), "f", info.Version, p, 0); err != nil || p[0] != 3 {
		t.Errorf("the second read: %v", err)
	}
}

func TestCapacityIsBoundedInBytes(t *testing.T) {
	c, counting, info, _, _ := setup(t, 1<<21) // 2 MiB file, 1 MiB cache of 4 KiB chunks
	for range 2 {
		if err := c.ReadAt(context.Background(), "f", info.Version, make([]byte, 1<<21), 0); err != nil {
			t.Fatal(err)
		}
	}
	st := c.Stats()
	if resident := st.BytesFromStore/4096 - st.Evictions; resident > 256 || resident <= 0 {
		t.Errorf("stats %+v: %d chunks resident, the cache holds at most 256", st, resident)
	}
	if counting.Bytes() < 3<<20 {
		t.Errorf("storage bytes %d: a cache of half the file cannot serve a second pass from memory", counting.Bytes())
	}
}

func TestReplacedFileIsNeverServedFromStaleChunks(t *testing.T) {
	c, _, info, data, put := setup(t, 10_000)
	c.Revalidate = 0
	p := make([]byte, 100)
	if err := c.ReadAt(context.Background(), "f", info.Version, p, 0); err != nil || !bytes.Equal(p, data[:100]) {
		t.Fatal(err)
	}
	put("f", bytes.Repeat([]byte{9}, 10_001))
	if err := c.ReadAt(context.Background(), "f", info.Version, p, 0); !errors.Is(err, store.ErrChanged) {
		t.Errorf("reading the old version from a warm cache: %v, want ErrChanged", err)
	}
}

// slowWriter collects what is written, yielding between writes so other readers evict and refill
// chunks meanwhile.
type slowWriter struct{ bytes.Buffer }

func (w *slowWriter) Write(p []byte) (int, error) {
	written := len(p)
	for len(p) > 0 {
		n := min(len(p), 512)
		w.Buffer.Write(p[:n])
		p = p[n:]
		time.Sleep(10 * time.Microsecond)
	}
	return written, nil
}

// Sections and reads of many goroutines over a cache of four chunks, which every one of them
// evicts from under the others: a chunk a section still references is never recycled into
// another fill, so every section writes exactly its bytes.
func TestEvictionNeverRecyclesAChunkBeingWritten(t *testing.T) {
	inner, put := local(t)
	data := make([]byte, 256<<10)
	for i := range data {
		data[i] = byte(i*13 + i>>12) // no two chunks alike
	}
	put("f", data)
	info, _ := inner.Stat(context.Background(), "f")
	small, err := cache.New(inner, cache.Config{Bytes: 4 * 4096, ChunkBytes: 4096}, nil)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for g := range 16 {
		wg.Go(func() {
			for i := range 20 {
				off := int64((g*7919 + i*4099) % (len(data) - 20_000))
				ranges := []store.Range{{Offset: off, Length: 12_000}, {Offset: off + 15_000, Length: 3_000}}
				sec, err := small.Section(context.Background(), "f", info.Version, ranges)
				if err != nil {
					t.Error(err)
					return
				}
				var w slowWriter
				sec.WriteTo(&w)
				sec.Close()
				want := append(slices.Clone(data[off:off+12_000]), data[off+15_000:off+18_000]...)
				if !bytes.Equal(w.Bytes(), want) {
					t.Errorf("goroutine %d, section %d: other bytes than the file's", g, i)
				}
				p := make([]byte, 9_000)
				if err := small.ReadAt(context.Background(), "f", info.Version, p, off+1); err != nil ||
					!bytes.Equal(p, data[off+1:off+9_001]) {
					t.Errorf("goroutine %d, read %d: %v", g, i, err)
				}
			}
		})
	}
	wg.Wait()
	if st := small.Stats(); st.Evictions == 0 {
		t.Errorf("stats %+v: nothing was evicted, the test proves nothing", st)
	}
}

// aligned is a store whose reads cost whole units, as the verifying store's do.
type aligned struct {
	*storetest.Counting
	unit int64
	bad  atomic.Int64 // reads that did not start and end on a unit (or the file's end)
	size int64
}

func (a *aligned) Alignment(context.Context, string, string) int64 { return a.unit }

func (a *aligned) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if end := off + int64(len(p)); off%a.unit != 0 || end%a.unit != 0 && end != a.size ||
		int64(len(p)) > cache.MaxRunBytes+a.unit {
		a.bad.Add(1)
	}
	return a.Counting.ReadAt(ctx, key, version, p, off)
}

// Property: under a store that reads whole units, reads in any order fill whole units, each once,
// in runs of at most MaxRunBytes and a unit.
func TestFillsReadWholeUnitsOnce(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	inner, put := local(t)
	ctx := context.Background()
	for iter := range 100 {
		chunk := int64(1+r.IntN(8)) * 512
		unit := chunk * int64(1+r.IntN(4))
		size := 1 + r.Int64N(40*unit)
		if iter%25 == 0 { // files longer than a run
			chunk, unit = 64<<10, 1<<20
			size = 2*cache.MaxRunBytes + r.Int64N(4*unit)
		}
		data := make([]byte, size)
		for i := range data {
			data[i] = byte(i*7) ^ byte(iter)
		}
		key := fmt.Sprint("f", iter)
		put(key, data)
		info, _ := inner.Stat(ctx, key)
		a := &aligned{Counting: storetest.NewCounting(inner), unit: unit, size: size}
		c, err := cache.New(a, cache.Config{Bytes: 64*size + chunk, ChunkBytes: chunk}, nil)
		if err != nil {
			t.Fatal(err)
		}
		for range 20 {
			off := r.Int64N(size)
			p := make([]byte, 1+r.Int64N(size-off))
			if err := c.ReadAt(ctx, key, info.Version, p, off); err != nil || !bytes.Equal(p, data[off:off+int64(len(p))]) {
				t.Fatalf("chunk %d, unit %d, size %d: read [%d, +%d): %v", chunk, unit, size, off, len(p), err)
			}
		}
		if a.bad.Load() != 0 || a.Bytes() > size {
			t.Fatalf("chunk %d, unit %d, size %d: %d reads off the units, %d bytes read", chunk, unit, size,
				a.bad.Load(), a.Bytes())
		}
	}
}

// New builds what Config says, by the rule its fields state: a zero chunk is DefaultChunkBytes, a
// zero size no cache, and what Validate refuses is refused.
func TestNewTakesTheConfigsZeroValues(t *testing.T) {
	inner, put := local(t)
	put("f", make([]byte, 2*cache.DefaultChunkBytes))
	for _, cfg := range []cache.Config{{}, {Bytes: cache.DefaultChunkBytes - 1}, {Bytes: 1 << 20, ChunkBytes: -1}} {
		if _, err := cache.New(inner, cfg, nil); err == nil {
			t.Errorf("New(%+v) built a cache", cfg)
		}
	}
	counting := storetest.NewCounting(inner)
	c, err := cache.New(counting, cache.Config{Bytes: cache.DefaultChunkBytes}, nil)
	if err != nil {
		t.Fatal(err)
	}
	info, _ := inner.Stat(context.Background(), "f")
	if err := c.ReadAt(context.Background(), "f", info.Version, make([]byte, 1), 0); err != nil {
		t.Fatal(err)
	}
	if got := counting.Bytes(); got != cache.DefaultChunkBytes {
		t.Errorf("a byte read %d bytes from storage, want the default chunk of %d", got, cache.DefaultChunkBytes)
	}
}
