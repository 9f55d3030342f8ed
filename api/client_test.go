package api_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/api/layout"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// flakyStore fails the data reads it is told to, once each, after letting some through.
type flakyStore struct {
	store.Store
	skip atomic.Int64 // data reads to let through first
	fail atomic.Int64 // data reads to fail then
}

func (f *flakyStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if off > 0 && f.skip.Add(-1) < 0 && f.fail.Add(-1) >= 0 {
		return errors.New("connection reset by peer")
	}
	return f.Store.ReadAt(ctx, key, version, p, off)
}

// ckpt is the example checkpoint in a subfolder: a name with a '/', which routes escape.
const ckpt = "org/" + example.Name

// fixture is a live server over the example checkpoint: the client, the store it reads (which
// fails on demand), the requests it received, a request for the embedding, and the folder.
type fixture struct {
	c        *api.Client
	st       *flakyStore
	requests *atomic.Int64
	req      api.ShardRequest
	folder   string
}

func clientFixture(t *testing.T) *fixture {
	dir := filepath.Join(t.TempDir(), "checkpoints")
	if _, err := example.Generate(filepath.Join(dir, "org")); err != nil {
		t.Fatal(err)
	}
	local, _ := store.NewLocal(dir)
	st := &flakyStore{Store: local}
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 4096 // many segments: a failure lands after the headers
	opts.MaxGap = 0
	mem := budget.New(budget.Config{Bytes: 1 << 26, AdmitWait: time.Second})
	// Half the budget held keeps the executor from reading ahead past its one-segment window, so
	// the storage reads a test counts come one after another, in body order.
	if err := mem.Acquire(context.Background(), mem.Bytes()/2); err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{Catalog: checkpoint.New(st), Planner: opts,
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
		Executor: executor.New(st, mem, executor.Config{Window: 1}),
		Budget:   mem,
	})
	var requests atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		requests.Add(1)
		srv.Handler().ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	c := api.NewClient(ts.URL)
	c.Backoff = 10 * time.Millisecond
	c.Logger = slog.New(slog.DiscardHandler)
	list, err := c.Tensors(context.Background(), ckpt)
	if err != nil {
		t.Fatal(err)
	}
	emb, _ := layout.Replicated(layout.ShapesOf(list), "model.embed_tokens.weight", "e", api.BF16)
	return &fixture{
		c,
		st,
		&requests,
		api.ShardRequest{Checkpoint: ckpt, Tensors: []api.TensorRequest{emb}},
		filepath.Join(dir, ckpt),
	}
}

func TestFetchRetriesAnAbortedStream(t *testing.T) {
	f := clientFixture(t)
	c, st, req := f.c, f.st, f.req
	want, err := c.FetchBytes(context.Background(), &req)
	if err != nil || len(want) != 256*64*2 {
		t.Fatalf("%d bytes, %v", len(want), err)
	}
	// The first attempt's third storage read fails, after the headers and the first segments: the
	// client starts over into a reset writer.
	var resets int
	var buf bytes.Buffer
	first := true
	c.HTTP = &http.Client{Transport: roundTripOnce(func() { st.skip.Store(2); st.fail.Store(1) }, &first)}
	n, err := c.Fetch(context.Background(), &req, &buf, func() error { resets++; buf.Reset(); return nil }, nil)
	if err != nil || n != int64(len(want)) || !bytes.Equal(buf.Bytes(), want) || resets != 1 {
		t.Fatalf("n %d err %v resets %d equal %v", n, err, resets, bytes.Equal(buf.Bytes(), want))
	}
	// A writer that cannot start over is not retried into.
	st.fail.Store(0)
	first = true
	_, err = c.Fetch(context.Background(), &req, &bytes.Buffer{}, nil, nil)
	var short *api.ShortBodyError
	if !errors.Is(err, errors.ErrUnsupported) || !errors.As(err, &short) {
		t.Errorf("a retry without reset: %v", err)
	}
	// A failure before the first byte (a 502) needs no reset: it is retried.
	first = true
	c.HTTP = &http.Client{Transport: roundTripOnce(func() { st.skip.Store(0); st.fail.Store(1) }, &first)}
	buf.Reset()
	before := f.requests.Load()
	if n, err := c.Fetch(context.Background(), &req, &buf, nil, nil); err != nil || n != int64(len(want)) ||
		!bytes.Equal(buf.Bytes(), want) ||
		f.requests.Load()-before != 2 {
		t.Errorf("a 502 before the body, without reset: %d bytes in %d requests, %v", n, f.requests.Load()-before, err)
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
	f := clientFixture(t)
	c, requests, req := f.c, f.requests, f.req
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
	before = requests.Load()
	if _, err := c.Plan(context.Background(), &api.ShardRequest{Checkpoint: "nope", Tensors: req.Tensors}); !errors.As(
		err,
		&p,
	) ||
		p.Status != 404 {
		t.Errorf("unknown checkpoint: %v", err)
	}
	if n := requests.Load() - before; n != 1 {
		t.Errorf("a 404 was sent %d times", n)
	}
}

func TestLayoutIsItsTable(t *testing.T) {
	f := clientFixture(t)
	ctx := context.Background()
	tp, rank := int64(2), int64(1)
	l := api.EngineLayout{Engine: api.Vllm, TensorParallelSize: &tp, TpRank: &rank}
	table, err := f.c.Layout(ctx, ckpt, l)
	if err != nil {
		t.Fatal(err)
	}
	if table.Checkpoint != ckpt || len(table.Tensors) == 0 || table.Tensors[0].Name != "model.embed_tokens.weight" {
		t.Fatalf("%+v", table)
	}
	byLayout, err := f.c.FetchBytes(ctx, &api.ShardRequest{Checkpoint: ckpt, Layout: &l})
	if err != nil {
		t.Fatal(err)
	}
	byTable, err := f.c.FetchBytes(ctx, &api.ShardRequest{Checkpoint: ckpt, Tensors: table.Tensors})
	if err != nil || !bytes.Equal(byLayout, byTable) {
		t.Fatalf("a layout and the table it expands to serve different bytes (%v)", err)
	}
	// vLLM pads 256 rows to a multiple of 64 (256) and splits by 2: rank 1 holds rows [128, 256).
	whole, err := f.c.FetchBytes(ctx, &f.req)
	if err != nil || !bytes.Equal(byLayout[:128*64*2], whole[128*64*2:]) {
		t.Errorf("the embedding of TP rank 1 of 2 is not rows [128, 256) (%v)", err)
	}
	bad := int64(3)
	l.TensorParallelSize = &bad
	var p *api.ProblemError
	if _, err := f.c.Layout(ctx, ckpt, l); !errors.As(err, &p) || p.Status != 422 {
		t.Errorf("TP=3 of 4 heads: %v", err)
	}
}

func TestFiles(t *testing.T) {
	f := clientFixture(t)
	ctx := context.Background()
	list, err := f.c.Files(ctx, ckpt)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, fi := range list.Files {
		names = append(names, fi.Name)
		want, _ := os.ReadFile(filepath.Join(f.folder, fi.Name))
		var got bytes.Buffer
		n, err := f.c.File(ctx, ckpt, fi.Name, &got)
		if err != nil || n != fi.Size || !bytes.Equal(got.Bytes(), want) {
			t.Errorf("%s: %d bytes of %d, %v", fi.Name, n, fi.Size, err)
		}
	}
	if strings.Join(names, ",") != "config.json,generation_config.json,tokenizer.json,tokenizer_config.json" {
		t.Errorf("files %v", names)
	}
	var p *api.ProblemError
	// tokenizer.model is a file the route serves, which the example does not have.
	if _, err := f.c.File(ctx, ckpt, "tokenizer.model", io.Discard); !errors.As(err, &p) || p.Status != 404 {
		t.Errorf("a missing file: %v", err)
	}
}

// retries are the retry records a client logged.
type retries struct{ buf bytes.Buffer }

func (r *retries) logger() *slog.Logger { return slog.New(slog.NewJSONHandler(&r.buf, nil)) }

func (r *retries) records(t *testing.T) []map[string]any {
	var out []map[string]any
	for line := range strings.Lines(r.buf.String()) {
		var rec map[string]any
		if err := json.Unmarshal([]byte(line), &rec); err != nil {
			t.Fatal(err)
		}
		out = append(out, rec)
	}
	return out
}

// scripted answers each request with the next status of its script (200 with {} at the end).
func scripted(t *testing.T, retryAfter string, statuses ...int) (*httptest.Server, *atomic.Int64) {
	var n atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		i := n.Add(1) - 1
		if int(i) >= len(statuses) {
			w.Write([]byte(`{"checkpoints": ["x"]}`))
			return
		}
		if retryAfter != "" {
			w.Header().Set("Retry-After", retryAfter)
		}
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(statuses[i])
		fmt.Fprintf(w, `{"type": "about:blank", "title": "scripted", "status": %d}`, statuses[i])
	}))
	t.Cleanup(ts.Close)
	return ts, &n
}

func TestRetriesOnlyWhatMaySucceedAndSaysSo(t *testing.T) {
	ctx := context.Background()
	for _, status := range []int{400, 401, 404, 413, 422} {
		ts, n := scripted(t, "", status)
		c := api.NewClient(ts.URL)
		var log retries
		c.Logger = log.logger()
		var p *api.ProblemError
		if _, err := c.Checkpoints(ctx); !errors.As(err, &p) || p.Status != status || n.Load() != 1 ||
			log.buf.Len() != 0 {
			t.Errorf("%d: sent %d times, %v", status, n.Load(), err)
		}
	}

	ts, n := scripted(t, "", 429, 502, 503, 504)
	c := api.NewClient(ts.URL)
	c.Backoff = 10 * time.Millisecond
	var log retries
	c.Logger = log.logger()
	if got, err := c.Checkpoints(ctx); err != nil || len(got) != 1 || n.Load() != 5 {
		t.Fatalf("%v %v after %d requests", got, err, n.Load())
	}
	recs := log.records(t)
	if len(recs) != 4 {
		t.Fatalf("%d retries logged, want 4", len(recs))
	}
	waits := map[float64]bool{}
	for i, rec := range recs {
		bound := float64(10*time.Millisecond) * float64(int(1)<<i)
		wait := rec["in"].(float64)
		waits[wait] = true
		if rec["request"] != "GET /v1/checkpoints" || rec["attempt"] != float64(i+2) ||
			!strings.Contains(rec["error"].(string), "scripted") ||
			wait < 0 ||
			wait > bound {
			t.Errorf("retry %d: %v (wait at most %v)", i, rec, time.Duration(bound))
		}
	}
	if len(waits) == 1 {
		t.Errorf("waits %v are not jittered", waits)
	}
}

func TestRetryAfterIsABaseForJitter(t *testing.T) {
	ts, n := scripted(t, "1", 503)
	c := api.NewClient(ts.URL)
	c.Backoff = time.Millisecond
	var log retries
	c.Logger = log.logger()
	start := time.Now()
	if _, err := c.Checkpoints(context.Background()); err != nil || n.Load() != 2 {
		t.Fatal(err)
	}
	recs := log.records(t)
	if len(recs) != 1 || time.Since(start) < time.Second {
		t.Fatalf("%v after %v", recs, time.Since(start))
	}
	if wait := time.Duration(recs[0]["in"].(float64)); wait < time.Second || wait > time.Second+time.Millisecond {
		t.Errorf("waited %v; Retry-After 1 s plus at most 1 ms of jitter", wait)
	}
}

func TestNoRetryForAURLThatCannotWork(t *testing.T) {
	for _, u := range []string{"localhost:8080", "shardsrv:8080", "ftp://shardsrv", "http://"} {
		c := api.NewClient(u)
		c.Backoff = time.Hour // a retry would hang the test
		var log retries
		c.Logger = log.logger()
		if _, err := c.Checkpoints(context.Background()); err == nil || !strings.Contains(err.Error(), "not a URL") ||
			log.buf.Len() != 0 {
			t.Errorf("%q: %v %s", u, err, log.buf.String())
		}
	}
	// A refused connection may work on the next attempt: it is retried.
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	c := api.NewClient("http://" + addr)
	c.Attempts, c.Backoff = 3, time.Millisecond
	var log retries
	c.Logger = log.logger()
	if _, err := c.Checkpoints(context.Background()); err == nil || len(log.records(t)) != 2 {
		t.Errorf("a refused connection: %v, %d retries logged", err, len(log.records(t)))
	}
	// Zero attempts still sends one request.
	c.Attempts = 0
	ts, n := scripted(t, "")
	c.BaseURL = ts.URL
	if got, err := c.Checkpoints(context.Background()); err != nil || len(got) != 1 || n.Load() != 1 {
		t.Errorf("attempts 0: %v %v", got, err)
	}
}

func TestDefaultHTTPClientBoundsAllButTheBody(t *testing.T) {
	hc := api.NewHTTPClient()
	tr, ok := hc.Transport.(*http.Transport)
	if !ok || hc.Timeout != 0 || tr.DialContext == nil || tr.TLSHandshakeTimeout <= 0 || tr.ResponseHeaderTimeout <= 0 {
		t.Fatalf("%+v", hc)
	}
	// One's own client is used as given.
	var used atomic.Bool
	ts, _ := scripted(t, "")
	c := api.NewClient(ts.URL)
	c.HTTP = &http.Client{Transport: rtFunc(func(r *http.Request) (*http.Response, error) {
		used.Store(true)
		return http.DefaultTransport.RoundTrip(r)
	})}
	if _, err := c.Checkpoints(context.Background()); err != nil || !used.Load() {
		t.Errorf("%v, own client used: %v", err, used.Load())
	}
}

func TestTensorsFollowsPages(t *testing.T) {
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("page_token") {
		case "":
			w.Write(
				[]byte(
					`{"checkpoint": "c", "tensors": [{"name": "a", "dtype": "BF16", "shape": [1], "file": "f"}], ` +
						`"next_page_token": "b"}`,
				),
			)
		case "b":
			w.Write(
				[]byte(`{"checkpoint": "c", "tensors": [{"name": "b", "dtype": "BF16", "shape": [2], "file": "f"}]}`),
			)
		default:
			w.WriteHeader(http.StatusBadRequest)
		}
	}))
	defer ts.Close()
	list, err := api.NewClient(ts.URL).Tensors(context.Background(), "c")
	if err != nil || len(list.Tensors) != 2 || list.Tensors[1].Name != "b" || list.NextPageToken != nil {
		t.Errorf("%+v %v", list, err)
	}
}

// A server failure whose problem says "retryable": false (stored bytes that fail their signature)
// fails the same way every time: sent once.
func TestPermanentServerFailureIsNotRetried(t *testing.T) {
	var n atomic.Int64
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n.Add(1)
		w.Header().Set("Content-Type", "application/problem+json")
		w.WriteHeader(http.StatusBadGateway)
		w.Write([]byte(`{"type": "urn:shardsrv:problem:integrity-mismatch", "title": "t", "status": 502,
			"retryable": false}`))
	}))
	t.Cleanup(ts.Close)
	c := api.NewClient(ts.URL)
	c.Backoff = time.Minute // a retry would hang the test
	var p *api.ProblemError
	if _, err := c.Checkpoints(context.Background()); !errors.As(err, &p) || p.Status != 502 || n.Load() != 1 {
		t.Errorf("sent %d times: %v", n.Load(), err)
	}
}
