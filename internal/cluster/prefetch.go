package cluster

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"

	"golang.org/x/sync/errgroup"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/store"
)

// prefetchParallel is how many runs of chunks one prefetch fills at once: enough to keep the owners'
// storage connections busy, few enough to leave the cache's fills to the clients too.
const prefetchParallel = 8

// Prefetch fills the cache chunks that ranges touch, each on its owner, so every replica then
// gets it from the cluster, not storage; a chunk whose owner does not answer is filled here
// instead. A range of negative Length runs to its file's end. A file whose version is not the
// one named fails the prefetch with store.ErrChanged.
func (h *Handler) Prefetch(ctx context.Context, ranges []Chunk) (*api.PrefetchResponse, error) {
	runs, err := h.runs(ctx, ranges)
	if err != nil {
		return nil, err
	}
	return h.warm(ctx, runs)
}

// runs lists the cache chunks ranges touch, file by file, joined into runs of adjacent chunks
// within one stripe, so each owner is asked for a run in one request.
func (h *Handler) runs(ctx context.Context, ranges []Chunk) ([]Chunk, error) {
	type file struct{ key, version string }
	reads := map[file][]Chunk{}
	for _, rg := range ranges {
		f := file{rg.Key, rg.Version}
		reads[f] = append(reads[f], rg)
	}
	files := slices.SortedFunc(maps.Keys(reads), func(a, b file) int { return strings.Compare(a.key, b.key) })
	size, stripe := h.ring.opts.ChunkBytes, h.ring.Stripe()
	var out []Chunk
	for _, f := range files {
		info, err := h.cache.Stat(ctx, f.key)
		if err != nil {
			return nil, err
		}
		if info.Version != f.version {
			return nil, fmt.Errorf("%q: %w (version %s is now %s)", f.key, store.ErrChanged, f.version, info.Version)
		}
		seen := map[int64]bool{}
		for _, rg := range reads[f] {
			end := info.Size
			if rg.Length >= 0 {
				end = min(end, rg.Offset+rg.Length)
			}
			for c := rg.Offset / size; c*size < end; c++ {
				seen[c] = true
			}
		}
		for _, c := range slices.Sorted(maps.Keys(seen)) {
			off := c * size
			n := min(size, info.Size-off)
			if last := len(out) - 1; last >= 0 && out[last].Key == f.key && out[last].Offset+out[last].Length == off &&
				off%stripe != 0 {
				out[last].Length += n
			} else {
				out = append(out, Chunk{Key: f.key, Version: f.version, Offset: off, Length: n})
			}
		}
	}
	return out, nil
}

// warm fills each run of chunks on its owner, prefetchParallel at a time.
func (h *Handler) warm(ctx context.Context, runs []Chunk) (*api.PrefetchResponse, error) {
	ring, size := h.ring, h.ring.opts.ChunkBytes
	chunks := func(n int64) int64 { return (n + size - 1) / size } // the last chunk of a file may be short
	var mu sync.Mutex
	owners := map[string]*api.PrefetchOwner{}
	resp := &api.PrefetchResponse{Owners: []api.PrefetchOwner{}}
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(prefetchParallel)
	for _, c := range runs {
		g.Go(func() error {
			owner, self := ring.Owner(c)
			var filled int64
			var err error
			if !self {
				if filled, err = ring.Warm(gctx, owner, c); err != nil {
					owner, self = ring.Self(), true // the owner cannot take it now: hold it here
				}
			}
			if self {
				if filled, err = h.touch(gctx, c); err != nil {
					return err
				}
			}
			if owner == "" {
				owner = "self"
			}
			mu.Lock()
			defer mu.Unlock()
			o := owners[owner]
			if o == nil {
				o = &api.PrefetchOwner{Owner: owner}
				owners[owner] = o
			}
			o.Chunks += chunks(c.Length)
			o.Bytes += c.Length
			o.FilledBytes += filled
			resp.Chunks += chunks(c.Length)
			resp.Bytes += c.Length
			resp.FilledChunks += chunks(filled)
			resp.FilledBytes += filled
			return nil
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	for _, o := range owners {
		resp.Owners = append(resp.Owners, *o)
	}
	slices.SortFunc(resp.Owners, func(a, b api.PrefetchOwner) int { return strings.Compare(a.Owner, b.Owner) })
	return resp, nil
}
