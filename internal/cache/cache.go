// Package cache is the shared-region cache: a store wrapper that keeps fixed-size, aligned chunks
// of each (file, version) in an LRU bounded in bytes, so a region many clients need is read from
// storage once. Concurrent misses of one chunk share one fetch, which no single client's cancel
// aborts; adjacent missing chunks are fetched by one read (a run); errors are never cached; a
// replaced file has a new version and so new chunks. Hits do not touch storage, so the version a
// read asks for is checked against storage at most every Revalidate: a file replaced under the
// cache fails reads of its old version (ErrChanged) within that time, and the catalog then
// resolves the new one.
//
// Chunks are reference-counted: the LRU holds one reference, and every reader (a ReadAt while it
// copies, a Section until it is closed) one more. Eviction drops the LRU's; the last reference
// recycles the chunk's memory for another fill, so a chunk a writer is still sending is never
// overwritten, and sections write chunks out without copying them.
package cache

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.opentelemetry.io/otel/metric"

	"github.com/shardsrv/shardsrv/internal/bytesize"
	"github.com/shardsrv/shardsrv/internal/store"
)

// Config sizes the cache.
type Config struct {
	Bytes int64 // capacity; zero: no cache
	// ChunkBytes is the unit of storage reads and of eviction (zero: DefaultChunkBytes); Chunk
	// says what is in effect.
	ChunkBytes int64
}

// DefaultChunkBytes is the chunk of a cache over a local directory.
const DefaultChunkBytes = 4 << 20

// DefaultConfig suits a local directory, which the OS page cache already caches: no cache.
func DefaultConfig() Config { return Config{ChunkBytes: DefaultChunkBytes} }

// ObjectStoreConfig suits object stores, where every read is a billed round trip: 512 MiB in
// 256 KiB chunks, so a read costs at most two small chunks more than it needs (a 6 MiB rank of a
// fused QKV, three regions, reads at most 7.5 MiB, not the 24 of 8 MiB chunks), while runs of
// missing chunks are read together, up to MaxRunBytes a request (or less where the store below
// splits them: the cluster's stripes), so small chunks cost no more requests.
func ObjectStoreConfig() Config { return Config{Bytes: 512 << 20, ChunkBytes: 256 << 10} }

// RegisterFlags registers the cache's flags on fs; the values c holds are the defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(bytesize.Value{P: &c.Bytes}, "cache-bytes",
		"shared-region cache `SIZE`, taken from --memory-bytes (0 disables it)")
	fs.Var(bytesize.Value{P: &c.ChunkBytes}, "cache-chunk-bytes",
		"the cache's chunk `SIZE`: reads are aligned to it and storage is read in chunks")
}

// Chunk is the chunk size in effect.
func (c *Config) Chunk() int64 {
	if c.ChunkBytes == 0 {
		return DefaultChunkBytes
	}
	return c.ChunkBytes
}

// Validate reports a cache that cannot hold a chunk.
func (c *Config) Validate() error {
	if c.ChunkBytes < 0 || c.Bytes < 0 || (c.Bytes > 0 && c.Bytes < c.Chunk()) {
		return errors.New("--cache-chunk-bytes must not be negative, --cache-bytes 0 or at least one chunk")
	}
	return nil
}

// Stats are the cache's counters since it started.
type Stats struct {
	Hits           int64 // chunk lookups served from memory
	Misses         int64 // chunk lookups that had to wait for storage
	BytesFromCache int64
	BytesFromStore int64
	Evictions      int64
	FillsInFlight  int64
}

// Store is a caching store.Store.
type Store struct {
	// Forwarder is the store below: Stat, List, Check and the capabilities pass to it; every read
	// the cache makes is a ReadAt of it, cut at its splits and widened to its alignment.
	store.Forwarder
	chunk  int64
	chunks *lru.Cache[chunkKey, *chunk]
	sizes  *lru.Cache[string, checked] // per key@version
	// Revalidate is how long a file version is trusted before storage is asked again.
	Revalidate time.Duration

	mu      sync.Mutex
	flights map[chunkKey]*flight // fills under way; under mu
	bufs    sync.Pool            // chunk buffers no reference holds any more, for the next fill

	hits, misses, fromCache, fromStore, evictions, inFlight atomic.Int64
}

// chunk is one chunk's bytes and the references that keep them from being recycled.
type chunk struct {
	data []byte
	refs atomic.Int32
}

// tryRef takes a reference unless the last one is gone (the chunk was evicted and recycled).
func (c *chunk) tryRef() bool {
	for {
		n := c.refs.Load()
		if n == 0 {
			return false
		}
		if c.refs.CompareAndSwap(n, n+1) {
			return true
		}
	}
}

// flight is one chunk being fetched; every caller waiting for it gets a reference when it lands.
type flight struct {
	index   int64 // the chunk's
	done    chan struct{}
	waiters int32 // under Store.mu until landed
	landed  bool  // under Store.mu
	c       *chunk
	err     error
}

// checked is a file version's size and when storage last confirmed the version is current.
type checked struct {
	size int64
	at   time.Time
}

type chunkKey struct {
	key, version string
	index        int64
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Sectioner = (*Store)(nil)
)

// New wraps inner with a cache of cfg.Bytes in chunks of cfg.Chunk(), or returns what Validate
// refuses; a Config of no cache (Bytes zero) builds none. Every chunk is counted as a whole chunk,
// so the bound holds even for the shorter last chunk of a file. Its counters are instruments of
// mp (nil: none).
func New(inner store.Store, cfg Config, mp metric.MeterProvider) (*Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("cache: %w", err)
	}
	if cfg.Bytes == 0 {
		return nil, errors.New("cache: --cache-bytes 0 is no cache: build none")
	}
	chunkSize := cfg.Chunk()
	s := &Store{Forwarder: store.Forwarder{Next: inner}, chunk: chunkSize, Revalidate: 5 * time.Second,
		flights: map[chunkKey]*flight{}}
	var err error
	s.chunks, err = lru.NewWithEvict[chunkKey, *chunk](
		int(cfg.Bytes/chunkSize),
		func(_ chunkKey, c *chunk) { s.evictions.Add(1); s.unref(c) },
	)
	if err != nil {
		return nil, err
	}
	s.sizes, _ = lru.New[string, checked](4096)
	s.observe(mp)
	return s, nil
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	return Stats{
		Hits:           s.hits.Load(),
		Misses:         s.misses.Load(),
		BytesFromCache: s.fromCache.Load(),
		BytesFromStore: s.fromStore.Load(),
		Evictions:      s.evictions.Load(),
		FillsInFlight:  s.inFlight.Load(),
	}
}

// size is the size of one version of a file; a file whose version moved on is ErrChanged.
func (s *Store) size(ctx context.Context, key, version string) (int64, error) {
	c, known := s.sizes.Get(key + "@" + version)
	if known && time.Since(c.at) < s.Revalidate {
		return c.size, nil
	}
	info, err := s.Next.Stat(ctx, key)
	if known && store.Unanswered(ctx, err) {
		// The store cannot say whether the file moved on: the version known stands, so what the
		// cache holds of it is served through an outage; the next check is a Revalidate away.
		s.sizes.Add(key+"@"+version, checked{size: c.size, at: time.Now()})
		return c.size, nil
	}
	if err != nil {
		return 0, err
	}
	if info.Version != version {
		s.sizes.Remove(key + "@" + version)
		return 0, fmt.Errorf("%s: %q: %w (version %s is now %s)", s.Next, key, store.ErrChanged, version, info.Version)
	}
	s.sizes.Add(key+"@"+version, checked{size: info.Size, at: time.Now()})
	return info.Size, nil
}

// checkRange validates a versioned read of [off, end) and returns the file's size.
func (s *Store) checkRange(ctx context.Context, key, version string, off, end int64) (int64, error) {
	size, err := s.size(ctx, key, version)
	if err != nil {
		return 0, err
	}
	if off < 0 || end < off || end > size {
		return 0, fmt.Errorf("%s: %q: %w: [%d, %d) of %d bytes", s.Next, key, store.ErrOutOfRange, off, end, size)
	}
	return size, nil
}

// ReadAt implements store.Store. Reads without a version cannot be cached safely and pass through.
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if version == "" || len(p) == 0 {
		return s.Next.ReadAt(ctx, key, version, p, off)
	}
	end := off + int64(len(p))
	size, err := s.checkRange(ctx, key, version, off, end)
	if err != nil {
		return err
	}
	cs, err := s.pin(ctx, key, version, size, off, end)
	if err != nil {
		return err
	}
	for _, b := range s.slices(cs, off, end) {
		p = p[copy(p, b):]
	}
	s.release(cs)
	return nil
}

// Section implements store.Sectioner: the ranges' chunks are fetched and referenced now, and
// written out from the cache by the Section. Only a file version's chunks are cached: a section
// needs one.
func (s *Store) Section(ctx context.Context, key, version string, ranges []store.Range) (store.Section, error) {
	if version == "" {
		return nil, fmt.Errorf("cache: a section of %q needs a file version", key)
	}
	sec := &chunkSection{s: s}
	for _, r := range ranges {
		size, err := s.checkRange(ctx, key, version, r.Offset, r.Offset+r.Length)
		if err == nil && r.Length > 0 {
			var cs []*chunk
			if cs, err = s.pin(ctx, key, version, size, r.Offset, r.Offset+r.Length); err == nil {
				sec.chunks = append(sec.chunks, cs...)
				sec.parts = append(sec.parts, s.slices(cs, r.Offset, r.Offset+r.Length)...)
			}
		}
		if err != nil {
			sec.Close()
			return nil, err
		}
	}
	return sec, nil
}

// SectionMemory implements store.Sectioner: about the bytes a section covers. The chunks it
// references are also the cache's, and cost more than its budget only once evicted.
func (s *Store) SectionMemory(n int64) int64 { return n }

// chunkSection is ranges as slices of referenced chunks.
type chunkSection struct {
	s      *Store
	chunks []*chunk
	parts  [][]byte
}

// WriteTo writes the chunks' bytes as they are, one write each: no copy on this side of w.
func (c *chunkSection) WriteTo(w io.Writer) (int64, error) {
	var n int64
	for _, b := range c.parts {
		m, err := w.Write(b)
		n += int64(m)
		if err != nil {
			return n, err
		}
	}
	return n, nil
}

func (c *chunkSection) Close() error {
	c.s.release(c.chunks)
	c.chunks, c.parts = nil, nil
	return nil
}

// slices are the bytes [off, end) in cs, the referenced chunks that hold them.
func (s *Store) slices(cs []*chunk, off, end int64) [][]byte {
	out := make([][]byte, len(cs))
	first := off / s.chunk
	for i, c := range cs {
		base := (first + int64(i)) * s.chunk
		out[i] = c.data[max(off, base)-base : min(end, base+int64(len(c.data)))-base]
	}
	return out
}

// MaxRunBytes bounds one fill's storage read: a longer run of missing chunks is cut, as
// parallel requests move more than one long one.
const MaxRunBytes = 8 << 20

// pin references every chunk of [off, end) (end > off) of one file version. Missing chunks no
// fill is under way for are filled in runs of adjacent chunks, one storage read a run, so a read
// of many small chunks costs one request, not one a chunk; when it fails it holds none. A run is
// widened to whole units of the store below (store.Aligner): the chunks it adds are filled for
// later readers, since the store would read them anyway.
func (s *Store) pin(ctx context.Context, key, version string, size, off, end int64) ([]*chunk, error) {
	first := off / s.chunk
	cs := make([]*chunk, (end-1)/s.chunk-first+1)
	missed := false
	for i := range cs {
		if c, ok := s.chunks.Get(chunkKey{key, version, first + int64(i)}); ok && c.tryRef() {
			s.hits.Add(1)
			s.fromCache.Add(int64(len(c.data)))
			cs[i] = c
		} else {
			missed = true
		}
	}
	if !missed {
		return cs, nil
	}
	unit := max(1, s.Forwarder.Alignment(ctx, key, version))
	lo := off / unit * unit / s.chunk                                 // the first chunk a fill may read
	hi := (min((end+unit-1)/unit*unit, size) + s.chunk - 1) / s.chunk // and the chunk after the last
	fs := make([]*flight, len(cs))
	var run []*flight // new flights of adjacent chunks, for one fill
	// A fill outlives the caller that started it: others may be waiting for it.
	detached := context.WithoutCancel(ctx)
	startRun := func() {
		if len(run) > 0 {
			go s.fill(detached, key, version, size, run)
			run = nil
		}
	}
	s.mu.Lock()
	for j := lo; j < hi; j++ {
		i := j - first
		asked := i >= 0 && i < int64(len(cs))
		if asked && cs[i] != nil {
			startRun()
			continue
		}
		k := chunkKey{key, version, j}
		f, ok := s.flights[k]
		switch {
		case ok:
			startRun()
		case asked && s.peekRef(k, &cs[i]): // filled while this caller looked: a hit after all
			s.hits.Add(1)
			s.fromCache.Add(int64(len(cs[i].data)))
			startRun()
			continue
		case !asked && s.chunks.Contains(k):
			startRun()
			continue
		default:
			// A long run is cut where a unit starts, or past one unit more than the longest.
			n := int64(len(run)+1) * s.chunk
			if n > max(MaxRunBytes, s.chunk) && (j*s.chunk%unit == 0 || n > MaxRunBytes+unit) ||
				s.Forwarder.Split(key, version, j*s.chunk) {
				startRun()
			}
			f = &flight{done: make(chan struct{}), index: j}
			s.flights[k] = f
			run = append(run, f)
		}
		if asked {
			s.misses.Add(1)
			f.waiters++
			fs[i] = f
		}
	}
	startRun()
	s.mu.Unlock()
	var err error
	for i, f := range fs {
		switch {
		case f == nil:
		case err == nil:
			cs[i], err = s.wait(ctx, f)
		default:
			s.leave(f)
		}
	}
	if err != nil {
		s.release(cs)
		return nil, err
	}
	return cs, nil
}

// peekRef references the chunk the LRU holds for k, if any, into *c.
func (s *Store) peekRef(k chunkKey, c **chunk) bool {
	got, ok := s.chunks.Peek(k)
	if ok && got.tryRef() {
		*c = got
		return true
	}
	return false
}

func (s *Store) release(cs []*chunk) {
	for _, c := range cs {
		if c != nil {
			s.unref(c)
		}
	}
}

// unref drops a reference; the last one recycles the chunk's memory.
func (s *Store) unref(c *chunk) {
	if c.refs.Add(-1) == 0 {
		b := c.data[:cap(c.data)]
		s.bufs.Put(&b)
	}
}

// wait returns the chunk f fetches, referenced, or gives up the wait when ctx ends first.
func (s *Store) wait(ctx context.Context, f *flight) (*chunk, error) {
	select {
	case <-f.done:
		return f.c, f.err
	case <-ctx.Done():
		s.leave(f)
		return nil, ctx.Err()
	}
}

// leave gives up a wait on f: before it lands by not being counted, after by dropping the
// reference it was handed.
func (s *Store) leave(f *flight) {
	s.mu.Lock()
	landed := f.landed
	if !landed {
		f.waiters--
	}
	s.mu.Unlock()
	if landed && f.c != nil {
		s.unref(f.c)
	}
}

// fill reads a run of adjacent chunks from storage in one read and hands a reference to each
// waiter. Its own references keep the chunks alive between entering the LRU, which may evict them
// at once, and the handing out. A run of several chunks is read into one buffer that they slice,
// each with a chunk's capacity, so each is recycled on its own like a pooled one.
func (s *Store) fill(ctx context.Context, key, version string, size int64, run []*flight) {
	s.inFlight.Add(int64(len(run)))
	defer s.inFlight.Add(-int64(len(run)))
	off := run[0].index * s.chunk
	n := min(int64(len(run))*s.chunk, size-off)
	var buf []byte
	if pooled, ok := s.bufs.Get().(*[]byte); ok && len(run) == 1 {
		buf = *pooled
	} else if ok {
		s.bufs.Put(pooled)
	}
	if buf == nil {
		buf = make([]byte, int64(len(run))*s.chunk)
	}
	err := s.Next.ReadAt(ctx, key, version, buf[:n], off)
	cs := make([]*chunk, len(run))
	if err == nil {
		s.fromStore.Add(n)
		for i, f := range run {
			lo := int64(i) * s.chunk
			cs[i] = &chunk{data: buf[lo:min(lo+s.chunk, n):min(lo+s.chunk, int64(len(buf)))]}
			cs[i].refs.Store(2) // the LRU's and the fill's own
			s.chunks.Add(chunkKey{key, version, f.index}, cs[i])
		}
	} else if len(run) == 1 {
		s.bufs.Put(&buf)
	}
	s.mu.Lock()
	for i, f := range run {
		f.landed = true
		delete(s.flights, chunkKey{key, version, f.index})
		if err == nil {
			cs[i].refs.Add(f.waiters)
			f.c = cs[i]
		}
		f.err = err
	}
	s.mu.Unlock()
	for i, f := range run {
		close(f.done)
		if err == nil {
			s.unref(cs[i])
		}
	}
}
