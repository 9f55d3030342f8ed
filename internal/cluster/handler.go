package cluster

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/store"
)

// pinSlots bounds the ranges the peer route and prefetches pin at once, each a run of at most
// a stripe (Store.Stripe). Their memory is the cache's, and more only for chunks evicted while
// pinned. It is not charged to the streams' budget: a stream waiting for a chunk from its owner
// must never wait behind the owner's streams, which may be waiting for chunks from it.
const pinSlots = 64

// ErrNotOwner is a peer's request for a chunk this replica does not own, or waits for a peer to
// give: the replicas' rings differ for a moment, and the asker reads the chunk from storage.
var ErrNotOwner = errors.New("the replicas' rings differ for a moment: read it from storage")

// QueryError is a peer route query that names no chunk (ParseQuery's error).
type QueryError struct{ Err error }

func (e *QueryError) Error() string { return e.Err.Error() }

// Handler is the serving half of the peer protocol, beside the fetching half (Store.fetch) so a
// change to the protocol is made in one package: it answers the peer route from this replica's
// chunk cache, and warms chunks on their owners for prefetches. The server mounts it behind the
// peers' shared secret and writes its errors as problems.
type Handler struct {
	ring  *Store
	cache *cache.Store // over ring: what peers and prefetches read through
	slots chan struct{}
}

// NewHandler serves ring's chunks from c, the chunk cache over ring.
func NewHandler(ring *Store, c *cache.Store) *Handler {
	return &Handler{ring: ring, cache: c, slots: make(chan struct{}, pinSlots)}
}

// ServeChunk answers a peer's request on PeerPath from this replica's cache, filling the chunk
// from storage when it is missed (never from another peer), or with warm only fills it. It pins
// its chunk in one of pinSlots for as long as it is written, each write getting writeTimeout
// (0: none); the request's context bounds the rest. When it cannot answer it returns the error
// having written nothing (a *QueryError, ErrNotOwner, or the cache's); once the chunk's bytes
// are under way a failure aborts the response, and the peer reads the chunk from storage.
func (h *Handler) ServeChunk(w http.ResponseWriter, r *http.Request, writeTimeout time.Duration) error {
	chunk, warm, err := ParseQuery(r.URL.Query(), h.ring.Stripe())
	if err != nil {
		return &QueryError{err}
	}
	h.ring.Heard(r.Header.Get(DownHeader))
	if !h.ring.Owns(chunk) || h.ring.Waits(chunk) {
		return ErrNotOwner
	}
	ctx := forPeer(r.Context())
	if warm {
		filled, err := h.touch(ctx, chunk)
		if err != nil {
			return err
		}
		w.Header().Set(FilledHeader, strconv.FormatInt(filled, 10))
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	sec, release, err := h.pin(ctx, chunk)
	if err != nil {
		return err
	}
	defer release()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(chunk.Length, 10))
	w.WriteHeader(http.StatusOK)
	if writeTimeout > 0 {
		http.NewResponseController(w).SetWriteDeadline(time.Now().Add(writeTimeout))
	}
	if _, err := sec.WriteTo(w); err != nil {
		panic(http.ErrAbortHandler) // a short body: the peer reads the chunk from storage instead
	}
	return nil
}

// pin takes a slot and a chunk's section from the cache, filling what is missing; release closes
// it and gives the slot back.
func (h *Handler) pin(ctx context.Context, c Chunk) (store.Section, func(), error) {
	select {
	case h.slots <- struct{}{}:
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
	sec, err := h.cache.Section(ctx, c.Key, c.Version, []store.Range{{Offset: c.Offset, Length: c.Length}})
	if err != nil {
		<-h.slots
		return nil, nil, err
	}
	return sec, func() { sec.Close(); <-h.slots }, nil
}

// touch brings a chunk into this replica's cache without copying it anywhere, and returns the
// bytes this took from storage: 0 when it was cached, or another fill of it was under way.
func (h *Handler) touch(ctx context.Context, c Chunk) (int64, error) {
	var filled atomic.Int64
	_, release, err := h.pin(countFills(ctx, &filled), c)
	if err != nil {
		return 0, err
	}
	release()
	return filled.Load(), nil
}
