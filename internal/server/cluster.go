package server

import (
	"context"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/store"
)

// Cache is the chunk cache at the top of the store stack: it writes cached chunks out as sections.
type Cache interface {
	store.Store
	store.Sectioner
}

// Cluster is the chunk cache as the replicas share it (docs/cluster.md).
type Cluster struct {
	// Cache is the top of the store stack, over Ring: peers and prefetches read through it.
	Cache Cache
	// ChunkBytes is the cache's chunk: the unit of prefetch's counts.
	ChunkBytes int64
	// Ring sends each chunk the cache misses to its owner; with no peers it owns every chunk.
	Ring *cluster.Store
	// PeerTokens admit peers to the peer route, which is not served without them.
	PeerTokens *Tokens

	slotsOnce sync.Once
	slots     chan struct{} // pinSlots, taken by pin
}

// pinSlots bounds the ranges the peer route and prefetches pin at once, each a run of at most
// a stripe (Ring.Stripe). Their memory is the cache's, and more only for chunks evicted while pinned.
// It is not charged to the streams' budget: a stream waiting for a chunk from its owner must never
// wait behind the owner's streams, which may be waiting for chunks from it.
const pinSlots = 64

// routePeers mounts the peer route when the server has peers. It sits outside openapi.yaml: it is
// no client's, and ordinary client tokens do not open it (authenticate leaves it to peerAuth).
func (s *Server) routePeers(r chi.Router) {
	if c := s.cfg.Cluster; c != nil && c.PeerTokens != nil {
		r.With(s.peerAuth).Get(cluster.PeerPath, s.servePeer)
	}
}

// peerAuth admits requests bearing the secret the replicas share.
func (s *Server) peerAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok || !s.cfg.Cluster.PeerTokens.Valid(token) {
			writeProblem(w, r, newProblem("unauthorized-peer", "this route is for the server's replicas only"))
			return
		}
		next.ServeHTTP(w, r)
	})
}

// servePeer answers a peer's chunk from this replica's cache, filling it from storage when missed
// (never from another peer), or with warm only fills it. It is bounded like a stream: it pins its
// chunk in one of pinSlots, the request has --request-timeout and its write --write-timeout.
func (s *Server) servePeer(w http.ResponseWriter, r *http.Request) {
	c := s.cfg.Cluster
	chunk, warm, err := cluster.ParseQuery(r.URL.Query(), c.Ring.Stripe())
	if err != nil {
		writeProblem(w, r, newProblem("invalid-parameter", err.Error()))
		return
	}
	c.Ring.Heard(r.Header.Get(cluster.DownHeader))
	if !c.Ring.Owns(chunk) || c.Ring.Waits(chunk) {
		writeProblem(w, r, newProblem("not-owner", "the replicas' rings differ for a moment: read it from storage"))
		return
	}
	ctx, cancel := context.WithTimeout(cluster.FromPeer(r.Context()), s.cfg.Limits.RequestTimeout)
	defer cancel()
	if warm {
		filled, err := s.touch(ctx, chunk)
		if err != nil {
			writeProblem(w, r, toProblem(err))
			return
		}
		w.Header().Set(cluster.FilledHeader, strconv.FormatInt(filled, 10))
		w.WriteHeader(http.StatusNoContent)
		return
	}
	sec, release, err := s.pin(ctx, chunk)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(chunk.Length, 10))
	w.WriteHeader(http.StatusOK)
	http.NewResponseController(w).SetWriteDeadline(time.Now().Add(s.cfg.Limits.WriteTimeout))
	if _, err := sec.WriteTo(w); err != nil {
		panic(http.ErrAbortHandler) // a short body: the peer reads the chunk from storage instead
	}
}

// pin takes a slot and a chunk's section from the cache, filling what is missing; release closes
// it and gives the slot back.
func (s *Server) pin(ctx context.Context, c cluster.Chunk) (store.Section, func(), error) {
	cl := s.cfg.Cluster
	cl.slotsOnce.Do(func() { cl.slots = make(chan struct{}, pinSlots) })
	select {
	case cl.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	sec, err := cl.Cache.Section(ctx, c.Key, c.Version, []store.Range{{Offset: c.Offset, Length: c.Length}})
	if err != nil {
		<-cl.slots
		return nil, nil, err
	}
	return sec, func() { sec.Close(); <-cl.slots }, nil
}

// touch brings a chunk into this replica's cache without copying it anywhere, and returns the
// bytes this took from storage: 0 when it was cached, or another fill of it was under way.
func (s *Server) touch(ctx context.Context, c cluster.Chunk) (int64, error) {
	var filled atomic.Int64
	_, release, err := s.pin(cluster.CountFills(ctx, &filled), c)
	if err != nil {
		return 0, err
	}
	release()
	return filled.Load(), nil
}
