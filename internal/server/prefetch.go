package server

import (
	"context"
	"net/http"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/resolve"
)

// PostPrefetch fills the cache with the chunks a shard request reads, or every chunk of a
// checkpoint's files when it names neither tensors nor a layout, each on its owner
// (cluster.Handler.Prefetch). It takes a stream slot like /v1/plan.
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
	ranges, err := s.prefetchRanges(r, req)
	if err == nil {
		var resp *api.PrefetchResponse
		if resp, err = s.cfg.Cluster.Prefetch(ctx, ranges); err == nil {
			resp.Checkpoint, resp.Seconds = req.Checkpoint, time.Since(start).Seconds()
			writeJSON(w, resp)
			return
		}
	}
	s.cfg.Catalog.ReadFailed(req.Checkpoint, err)
	writeProblem(w, r, toProblem(err))
}

// prefetchRanges lists the byte ranges a request reads: those of its plan's reads, or every file
// of the checkpoint whole.
func (s *Server) prefetchRanges(r *http.Request, req *api.ShardRequest) ([]cluster.Chunk, error) {
	var ranges []cluster.Chunk
	if len(req.Tensors) == 0 && req.Layout == nil {
		ck, err := s.cfg.Catalog.Open(r.Context(), req.Checkpoint)
		if err != nil {
			return nil, err
		}
		files := map[string]bool{}
		for _, t := range ck.Tensors {
			if !files[t.Key] {
				files[t.Key] = true
				ranges = append(ranges, cluster.Chunk{Key: t.Key, Version: t.Version, Length: -1})
			}
		}
		return ranges, nil
	}
	res, err := s.resolver.Resolve(r.Context(), req, resolve.Stream)
	if err != nil {
		return nil, err
	}
	defer res.Release()
	s.metrics.planned(r.Context(), res.Plan, res.Planning)
	for _, it := range res.Plan.Items {
		for _, rd := range it.Reads() {
			ranges = append(ranges, cluster.Chunk{Key: rd.Key, Version: rd.Version, Offset: rd.Offset, Length: rd.Length})
		}
	}
	return ranges, nil
}
