// Package cache is the shared-region cache: a store wrapper that keeps fixed-size, aligned chunks
// of each (file, version) in an LRU bounded in bytes, so a region many clients need is read from
// storage once. Concurrent misses of one chunk share one fetch, which no single client's cancel
// aborts; errors are never cached; a replaced file has a new version and so new chunks. Hits do
// not touch storage, so the version a read asks for is checked against storage at most every
// Revalidate: a file replaced under the cache fails reads of its old version (ErrChanged) within
// that time, and the catalog then resolves the new one.
package cache

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"strconv"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/shardsrv/shardsrv/internal/bytesize"
	"github.com/shardsrv/shardsrv/internal/store"
)

// Config sizes the cache.
type Config struct {
	Bytes      int64 // capacity; 0 disables the cache
	ChunkBytes int64 // the unit of storage reads and of eviction
}

// DefaultConfig suits a local directory, which the OS page cache already caches: no cache.
func DefaultConfig() Config { return Config{ChunkBytes: 4 << 20} }

// ObjectStoreConfig suits object stores, where every read is a billed round trip: 512 MiB in
// 8 MiB chunks, one request's worth of transfer each.
func ObjectStoreConfig() Config { return Config{Bytes: 512 << 20, ChunkBytes: 8 << 20} }

// RegisterFlags registers the cache's flags on fs; the values c holds are the defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(bytesize.Value{P: &c.Bytes}, "cache-bytes",
		"shared-region cache `SIZE`, taken from --memory-bytes (0 disables it)")
	fs.Var(bytesize.Value{P: &c.ChunkBytes}, "cache-chunk-bytes",
		"the cache's chunk `SIZE`: reads are aligned to it and storage is read in chunks")
}

// Validate reports a cache that cannot hold a chunk.
func (c *Config) Validate() error {
	if c.ChunkBytes <= 0 || c.Bytes < 0 || (c.Bytes > 0 && c.Bytes < c.ChunkBytes) {
		return errors.New("--cache-chunk-bytes must be positive, --cache-bytes 0 or at least one chunk")
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
	inner  store.Store
	chunk  int64
	chunks *lru.Cache[chunkKey, []byte]
	sizes  *lru.Cache[string, checked] // per key@version
	group  singleflight.Group
	// Revalidate is how long a file version is trusted before storage is asked again.
	Revalidate time.Duration

	hits, misses, fromCache, fromStore, evictions, inFlight atomic.Int64
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

var _ store.Store = (*Store)(nil)

// New wraps inner with a cache of capacity bytes in chunks of chunkSize bytes. Every chunk is
// counted as chunkSize, so the bound holds even for the shorter last chunk of a file.
func New(inner store.Store, capacity, chunkSize int64) (*Store, error) {
	if capacity < chunkSize || chunkSize <= 0 {
		return nil, fmt.Errorf("cache: capacity %d must hold at least one chunk of %d bytes", capacity, chunkSize)
	}
	s := &Store{inner: inner, chunk: chunkSize, Revalidate: 5 * time.Second}
	var err error
	s.chunks, err = lru.NewWithEvict[chunkKey, []byte](
		int(capacity/chunkSize),
		func(chunkKey, []byte) { s.evictions.Add(1) },
	)
	if err != nil {
		return nil, err
	}
	s.sizes, _ = lru.New[string, checked](4096)
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

func (s *Store) String() string { return s.inner.String() }

// Stat implements store.Store.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	return s.inner.Stat(ctx, key)
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	return s.inner.List(ctx, prefix)
}

// Check implements store.Store.
func (s *Store) Check(ctx context.Context) error { return s.inner.Check(ctx) }

// size is the size of one version of a file; a file whose version moved on is ErrChanged.
func (s *Store) size(ctx context.Context, key, version string) (int64, error) {
	if c, ok := s.sizes.Get(key + "@" + version); ok && time.Since(c.at) < s.Revalidate {
		return c.size, nil
	}
	info, err := s.inner.Stat(ctx, key)
	if err != nil {
		return 0, err
	}
	if info.Version != version {
		s.sizes.Remove(key + "@" + version)
		return 0, fmt.Errorf("%s: %q: %w (version %s is now %s)", s.inner, key, store.ErrChanged, version, info.Version)
	}
	s.sizes.Add(key+"@"+version, checked{size: info.Size, at: time.Now()})
	return info.Size, nil
}

// ReadAt implements store.Store. Reads without a version cannot be cached safely and pass through.
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if version == "" || len(p) == 0 {
		return s.inner.ReadAt(ctx, key, version, p, off)
	}
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	size, err := s.size(ctx, key, version)
	if err != nil {
		return err
	}
	end := off + int64(len(p))
	if off < 0 || end > size {
		return fmt.Errorf("%s: %q: %w: [%d, %d) of %d bytes", s.inner, key, store.ErrOutOfRange, off, end, size)
	}
	g, gctx := errgroup.WithContext(ctx)
	for i := off / s.chunk; i*s.chunk < end; i++ {
		g.Go(func() error {
			data, err := s.get(gctx, chunkKey{key, version, i}, size)
			if err != nil {
				return err
			}
			lo, hi := max(off, i*s.chunk), min(end, (i+1)*s.chunk)
			copy(p[lo-off:hi-off], data[lo-i*s.chunk:hi-i*s.chunk])
			return nil
		})
	}
	return g.Wait()
}

// get returns one chunk, from memory or from one shared fetch.
func (s *Store) get(ctx context.Context, k chunkKey, size int64) ([]byte, error) {
	if data, ok := s.chunks.Get(k); ok {
		s.hits.Add(1)
		s.fromCache.Add(int64(len(data)))
		return data, nil
	}
	s.misses.Add(1)
	flight := s.group.DoChan(k.key+"@"+k.version+"#"+strconv.FormatInt(k.index, 10), func() (any, error) {
		if data, ok := s.chunks.Get(k); ok { // filled while this caller looked
			return data, nil
		}
		s.inFlight.Add(1)
		defer s.inFlight.Add(-1)
		data := make([]byte, min(s.chunk, size-k.index*s.chunk))
		// The fill outlives the caller that started it: others may be waiting for it.
		if err := s.inner.ReadAt(context.WithoutCancel(ctx), k.key, k.version, data, k.index*s.chunk); err != nil {
			return nil, err
		}
		s.fromStore.Add(int64(len(data)))
		s.chunks.Add(k, data)
		return data, nil
	})
	select {
	case r := <-flight:
		if r.Err != nil {
			return nil, r.Err
		}
		return r.Val.([]byte), nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}
