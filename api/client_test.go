package api_test

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/api/layout"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// flakyStore fails the data reads it is told to, once each.
type flakyStore struct {
	store.Store
	fail atomic.Int64 // data reads to fail from now on
}

func (f *flakyStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if off > 0 && f.fail.Add(-1) >= 0 {
		return errors.New("connection reset by peer")
	}
	return f.Store.ReadAt(ctx, key, version, p, off)
}

func clientFixture(t *testing.T) (*api.Client, *flakyStore, *atomic.Int64, api.ShardRequest) {
	dir := filepath.Join(t.TempDir(), "checkpoints")
	if _, err := example.Generate(dir); err != nil {
		t.Fatal(err)
	}
	local, _ := store.NewLocal(dir)
	st := &flakyStore{Store: local}
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 4096 // many segments: a failure lands after the headers
	opts.MaxGap = 0
	srv := server.New(server.Config{Catalog: checkpoint.New(st), Planner: opts, MaxBodyBytes: 1 << 20,
		Executor: executor.New(st, executor.Config{Window: 1, MaxRead: 1 << 20, MemoryBytes: 1 << 26, AdmitWait: time.Second})})
	var requests atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		srv.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	c := api.NewClient(ts.URL)
	c.Backoff = 10 * time.Millisecond
	list, err := c.Tensors(context.Background(), example.Name)
	if err != nil {
		t.Fatal(err)
	}
	emb, _ := layout.Replicated(layout.ShapesOf(list), "model.embed_tokens.weight", "e", api.BF16)
	return c, st, &requests, api.ShardRequest{Checkpoint: example.Name, Tensors: []api.TensorRequest{emb}}
}

func TestFetchRetriesAnAbortedStream(t *testing.T) {
	c, st, _, req := clientFixture(t)
	want, err := c.FetchBytes(context.Background(), &req)
	if err != nil || len(want) != 256*64*2 {
		t.Fatalf("%d bytes, %v", len(want), err)
	}
	// The first attempt's storage read fails; the client starts over into a reset writer.
	var resets int
	var buf bytes.Buffer
	first := true
	c.HTTP = &http.Client{Transport: roundTripOnce(func() { st.fail.Store(1) }, &first)}
	n, err := c.Fetch(context.Background(), &req, &buf, func() error { resets++; buf.Reset(); return nil }, nil)
	if err != nil || n != int64(len(want)) || !bytes.Equal(buf.Bytes(), want) || resets != 1 {
		t.Fatalf("n %d err %v resets %d equal %v", n, err, resets, bytes.Equal(buf.Bytes(), want))
	}
	// A writer that cannot start over is not retried into.
	st.fail.Store(0)
	first = true
	_, err = c.Fetch(context.Background(), &req, &bytes.Buffer{}, nil, nil)
	if !errors.Is(err, errors.ErrUnsupported) {
		t.Errorf("a retry without reset: %v", err)
	}
}

// roundTripOnce arms the store's failure when the first request goes out, after the catalog.
func roundTripOnce(arm func(), first *bool) http.RoundTripper {
	return rtFunc(func(r *http.Request) (*http.Response, error) {
		if *first && r.URL.Path == "/v1/shards" {
			*first = false
			arm()
		}
		return http.DefaultTransport.RoundTrip(r)
	})
}

type rtFunc func(*http.Request) (*http.Response, error)

func (f rtFunc) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

func TestProblemsAreTypedAndNotRetried(t *testing.T) {
	c, _, requests, req := clientFixture(t)
	(*req.Tensors[0].Blocks)[0].Source = "missing"
	before := requests.Load()
	_, err := c.FetchBytes(context.Background(), &req)
	var p *api.ProblemError
	if !errors.As(err, &p) || p.Status != 422 || (*p.Errors)[0].Pointer != "/tensors/0/blocks/0/source" {
		t.Fatalf("%v", err)
	}
	if n := requests.Load() - before; n != 1 {
		t.Errorf("a 422 was sent %d times; it is not worth retrying", n)
	}
	if _, err := c.Plan(context.Background(), &api.ShardRequest{Checkpoint: "nope", Tensors: req.Tensors}); !errors.As(err, &p) || p.Status != 404 {
		t.Errorf("unknown checkpoint: %v", err)
	}
}
