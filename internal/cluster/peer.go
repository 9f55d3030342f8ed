package cluster

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardsrv/shardsrv/internal/store"
)

// PeerPath is the route a replica serves chunks to its peers on (Handler, which internal/server
// mounts): GET with the chunk in the query (Chunk.Query) and the shared secret as a bearer token.
// It answers 200 with exactly the chunk's bytes, or for a warm request 204 once the chunk is in
// the cache, with FilledHeader.
const PeerPath = "/internal/cluster/v1/chunk"

// FilledHeader carries, on a warm answer, the bytes the owner read from storage for it.
const FilledHeader = "Cluster-Filled"

// DownHeader carries, on a request, the peers the asking replica found down: the owner leaves them
// out too (Heard), so the replicas' rings agree again at once, not each after its own failure.
const DownHeader = "Cluster-Down"

// Chunk is a byte range of one version of a file: what a replica asks its owner for.
type Chunk struct {
	Key, Version   string
	Offset, Length int64
}

// groupKey names the chunk in the group. Keys hold no ',' or NUL (the catalog and the peer route
// take only keys store.ValidateKey accepts), so the key ends at the NUL and the version is the
// rest, whatever it holds.
func (c Chunk) groupKey() string {
	return strconv.FormatInt(c.Offset, 10) + "," + strconv.FormatInt(c.Length, 10) + "," + c.Key + "\x00" + c.Version
}

func parseGroupKey(s string) (Chunk, error) {
	off, rest, _ := strings.Cut(s, ",")
	n, rest, _ := strings.Cut(rest, ",")
	key, version, ok := strings.Cut(rest, "\x00")
	c := Chunk{Key: key, Version: version}
	var err1, err2 error
	c.Offset, err1 = strconv.ParseInt(off, 10, 64)
	c.Length, err2 = strconv.ParseInt(n, 10, 64)
	if !ok || err1 != nil || err2 != nil {
		return Chunk{}, fmt.Errorf("cluster: %q names no chunk", s)
	}
	return c, nil
}

// Query is the chunk as the peer route's query; warm asks the owner to fill it without sending it.
func (c Chunk) Query(warm bool) url.Values {
	q := url.Values{"key": {c.Key}, "version": {c.Version}, "offset": {strconv.FormatInt(c.Offset, 10)},
		"length": {strconv.FormatInt(c.Length, 10)}}
	if warm {
		q.Set("warm", "1")
	}
	return q
}

// ParseQuery reads the peer route's query; chunks longer than most are refused, so a request
// holds a bounded part of the memory budget.
func ParseQuery(q url.Values, most int64) (c Chunk, warm bool, err error) {
	c = Chunk{Key: q.Get("key"), Version: q.Get("version")}
	var err1, err2 error
	c.Offset, err1 = strconv.ParseInt(q.Get("offset"), 10, 64)
	c.Length, err2 = strconv.ParseInt(q.Get("length"), 10, 64)
	if err := store.ValidateKey(c.Key); err != nil {
		return Chunk{}, false, err
	}
	switch {
	case c.Version == "":
		return Chunk{}, false, errors.New("version: a chunk names its file's version")
	case err1 != nil || err2 != nil || c.Offset < 0 || c.Length < 1 || c.Length > most:
		return Chunk{}, false, fmt.Errorf("offset and length: a range of 1 to %d bytes at offset 0 or more", most)
	}
	return c, q.Get("warm") == "1", nil
}

// fetch asks peer for chunk c: its bytes, or with warm the bytes the peer read from storage to fill
// it. A peer that does not answer in time, or at all, is marked down; one that answers with an
// error (a changed file, a time-out of its own) is not.
func (s *Store) fetch(ctx context.Context, peer string, c Chunk, warm bool) (body []byte, filled int64, err error) {
	start := time.Now()
	parent := ctx
	ctx, cancel := context.WithTimeout(ctx, s.opts.Timeout)
	defer cancel()
	ctx, span := s.tracer.Start(ctx, "cluster.peer.fetch", trace.WithAttributes(attribute.String("peer", peer),
		attribute.String("key", c.Key), attribute.Int64("offset", c.Offset), attribute.Int64("length", c.Length),
		attribute.Bool("warm", warm)))
	reason := ""
	defer func() {
		if err != nil {
			span.RecordError(err)
			span.SetStatus(codes.Error, reason)
		}
		span.End()
		s.m.fetched(parent, peer, int64(len(body)), time.Since(start), reason)
	}()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, peer+PeerPath+"?"+c.Query(warm).Encode(), nil)
	if err != nil {
		return nil, 0, err
	}
	req.Header.Set("Authorization", "Bearer "+s.opts.Token())
	if down := s.downPeers(); len(down) > 0 {
		req.Header.Set(DownHeader, strings.Join(down, ","))
	}
	res, err := s.client.Do(req)
	if err != nil {
		reason = s.unreachable(parent, peer, err)
		return nil, 0, err
	}
	defer res.Body.Close()
	switch {
	case warm && res.StatusCode == http.StatusNoContent:
		filled, err = strconv.ParseInt(res.Header.Get(FilledHeader), 10, 64)
		if err != nil {
			reason = "malformed"
		}
		return nil, filled, err
	case !warm && res.StatusCode == http.StatusOK && res.ContentLength == c.Length:
		body = make([]byte, c.Length)
		if _, err = io.ReadFull(res.Body, body); err != nil {
			reason = s.unreachable(parent, peer, err)
			return nil, 0, err
		}
		return body, 0, nil
	}
	reason = "status_" + strconv.Itoa(res.StatusCode)
	detail, _ := io.ReadAll(io.LimitReader(res.Body, 1024))
	return nil, 0, fmt.Errorf("cluster: peer %s answered %s for %s@%s [%d, +%d): %s", peer, res.Status, c.Key,
		c.Version, c.Offset, c.Length, detail)
}

// unreachable marks a peer down after a failure that was not the caller's leaving, and names the
// failure for the metrics. A connection that breaks counts: a killed peer's connections break
// before its address refuses new ones.
func (s *Store) unreachable(parent context.Context, peer string, err error) string {
	if parent.Err() != nil {
		return "canceled"
	}
	s.markDown(peer, err)
	if errors.Is(err, context.DeadlineExceeded) {
		return "timeout"
	}
	return "unreachable"
}
