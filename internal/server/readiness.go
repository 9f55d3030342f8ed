package server

import (
	"context"
	"net/http"
	"time"

	"github.com/shardsrv/shardsrv/api"
)

// DefaultStoreGrace is how long the store may be unreachable before /readyz says not ready: longer
// than the blips object stores have (a throttled or restarting endpoint), so that one blip does not
// take every replica out of its Service, and its peer ring, at once.
const DefaultStoreGrace = 30 * time.Second

// Readyz answers 200 unless the server drains or cannot serve: its store has been unreachable for
// longer than StoreGrace and no cache holds chunks to serve from (with a cache the replica stays
// ready, and in its peers' ring, through an outage: what is cached is served, the rest fails with
// retryable problems). ?verbose adds the store's state.
func (s *Server) Readyz(w http.ResponseWriter, r *http.Request, params api.ReadyzParams) {
	if s.draining.Load() {
		writeProblem(w, r, newProblem("draining", "this instance takes no new requests"))
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	down, err := s.cfg.Catalog.Check(ctx)
	if err != nil && down >= s.cfg.StoreGrace && s.cfg.Cluster == nil {
		writeProblem(w, r, newProblem("not-ready",
			"for "+down.Round(time.Second).String()+" (no cache to serve from): "+err.Error()))
		return
	}
	health := api.Health{Status: "ready"}
	if params.Verbose != nil {
		st := api.StoreHealth{Reachable: err == nil, Cache: s.cfg.Cluster != nil}
		if err != nil {
			detail, secs := err.Error(), down.Seconds()
			st.Error, st.UnreachableSeconds = &detail, &secs
		}
		health.Store = &st
	}
	writeJSON(w, health)
}
