package server

import (
	"context"
	"fmt"
	"maps"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/resolve"
	"github.com/shardsrv/shardsrv/internal/store"
)

// prefetchParallel is how many runs of chunks one prefetch fills at once: enough to keep the owners'
// storage connections busy, few enough to leave the cache's fills to the clients too.
const prefetchParallel = 8

// PostPrefetch fills the cache with the chunks a shard request reads, or every chunk of a
// checkpoint's files when it names neither tensors nor a layout: each chunk on its owner, so every
// replica then gets it from the cluster, not storage. A chunk whose owner does not answer is
// filled here instead. It takes a stream slot like /v1/plan.
func (s *Server) PostPrefetch(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Cluster == nil {
		writeProblem(w, r, newProblem("prefetch-off",
			"this server runs without the cache (--cache-bytes 0): there is nothing to warm"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.RequestTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	req, releaseBody, p := s.decode(w, r)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	defer releaseBody()
	releaseSlot, ok := s.admit(w, r)
	if !ok {
		return
	}
	defer releaseSlot()
	start := time.Now()
	chunks, err := s.prefetchChunks(r, req)
	if err == nil {
		var resp *api.PrefetchResponse
		if resp, err = s.warm(ctx, chunks); err == nil {
			resp.Checkpoint, resp.Seconds = req.Checkpoint, time.Since(start).Seconds()
			writeJSON(w, resp)
			return
		}
	}
	s.cfg.Catalog.ReadFailed(req.Checkpoint, err)
	writeProblem(w, r, toProblem(err))
}

// prefetchChunks lists the cache chunks a request reads, file by file — those of its plan's reads,
// or every chunk of every file of the checkpoint — joined into runs of adjacent chunks within one
// stripe, so each owner is asked for a run in one request.
func (s *Server) prefetchChunks(r *http.Request, req *api.ShardRequest) ([]cluster.Chunk, error) {
	type file struct{ key, version string }
	reads := map[file][]store.Range{}
	if len(req.Tensors) == 0 && req.Layout == nil {
		ck, err := s.cfg.Catalog.Open(r.Context(), req.Checkpoint)
		if err != nil {
			return nil, err
		}
		for _, t := range ck.Tensors {
			reads[file{t.Key, t.Version}] = []store.Range{{Length: -1}} // the whole file, as long as Stat says
		}
	} else {
		res, err := s.resolver.Resolve(r.Context(), req, resolve.Stream)
		if err != nil {
			return nil, err
		}
		defer res.Release()
		s.metrics.planned(r.Context(), res.Plan, res.Planning)
		for _, it := range res.Plan.Items {
			for _, seg := range it.Segments {
				for _, rd := range slices.Concat(seg.Direct, seg.Spans) {
					f := file{rd.Key, rd.Version}
					reads[f] = append(reads[f], store.Range{Offset: rd.Offset, Length: rd.Length})
				}
			}
		}
	}
	files := slices.SortedFunc(maps.Keys(reads), func(a, b file) int { return strings.Compare(a.key, b.key) })
	size, stripe := s.cfg.Cluster.ChunkBytes, s.cfg.Cluster.Ring.Stripe()
	var out []cluster.Chunk
	for _, f := range files {
		info, err := s.cfg.Cluster.Cache.Stat(r.Context(), f.key)
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
				out = append(out, cluster.Chunk{Key: f.key, Version: f.version, Offset: off, Length: n})
			}
		}
	}
	return out, nil
}

// warm fills each run of chunks on its owner, prefetchParallel at a time.
func (s *Server) warm(ctx context.Context, runs []cluster.Chunk) (*api.PrefetchResponse, error) {
	ring, size := s.cfg.Cluster.Ring, s.cfg.Cluster.ChunkBytes
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
				if filled, err = s.touch(gctx, c); err != nil {
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
			resp.FilledBytes += filled
			resp.FilledChunks += chunks(filled)
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
