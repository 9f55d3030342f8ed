package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/auth"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/telemetry"
)

// opsEnv is a server over a local store holding "m": a BF16 tensor "w" of 1024 x 4096 (8 MiB).
type opsEnv struct {
	srv  *server.Server
	mem  *budget.Budget
	url  string
	req  api.ShardRequest
	data []byte
}

func opsServer(t *testing.T, mutate func(*server.Config, store.Store)) *opsEnv {
	dir := t.TempDir()
	data := pattern(1024*4096*2, 5)
	writeCheckpoint(
		t,
		&harness{put: localPut(t, dir)},
		"m",
		safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{1024, 4096}, Data: data},
	)
	st, _ := store.NewLocal(dir)
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 256 << 10
	cfg := server.Config{Planner: opts, Limits: server.Limits{MaxBodyBytes: 1 << 20}}
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: 100 * time.Millisecond})
	cfg.Executor = executor.New(st, mem, executor.Config{Window: 2})
	cfg.Budget = mem
	cfg.Catalog = checkpoint.New(st)
	if mutate != nil {
		mutate(&cfg, st)
	}
	e := &opsEnv{srv: server.New(cfg), mem: cfg.Budget, data: data,
		req: shardReq(
			"m",
			api.TensorRequest{
				Name:   "w",
				Dtype:  api.BF16,
				Shape:  []int64{1024, 4096},
				Boxes:  whole(1024, 4096),
				Blocks: copyOf("w", 1024, 4096),
			},
		)}
	ts := httptest.NewServer(e.srv.Handler())
	t.Cleanup(ts.Close)
	e.url = ts.URL
	return e
}

func (e *opsEnv) post(t *testing.T, path string, body any, header ...string) (*http.Response, []byte) {
	raw, _ := json.Marshal(body)
	req, _ := http.NewRequest("POST", e.url+path, bytes.NewReader(raw))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	return res, b
}

func TestBearerTokens(t *testing.T) {
	file := filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(file, []byte("# fleet tokens\nalpha-token\n\nbeta-token # rotating out\n"), 0o600)
	tokens, err := auth.LoadTokens(file)
	if err != nil {
		t.Fatal(err)
	}
	e := opsServer(t, func(c *server.Config, st store.Store) { c.Tokens = tokens })
	for _, c := range []struct {
		header string
		status int
	}{
		{"", 401},
		{"Bearer wrong", 401},
		{"Basic alpha-token", 401},
		{"Bearer alpha-token", 200},
		{"Bearer beta-token", 200},
	} {
		res, body := e.post(t, "/v1/plan", e.req, "Authorization", c.header)
		if res.StatusCode != c.status {
			t.Errorf("%q: %d %s", c.header, res.StatusCode, body)
		}
		if c.status == 401 &&
			(res.Header.Get("WWW-Authenticate") == "" ||
				!strings.Contains(string(body), `"status":401`) ||
				strings.Contains(string(body), "alpha")) {
			t.Errorf("%q: a 401 problem with WWW-Authenticate and no token in it, got %s", c.header, body)
		}
	}
	for _, path := range []string{"/healthz", "/readyz", "/metrics"} {
		if res, err := http.Get(e.url + path); err != nil || res.StatusCode == 401 {
			t.Errorf("%s needs no token: %v %v", path, res.StatusCode, err)
		}
	}
	// Rotation: the file changes, the server follows without a restart.
	time.Sleep(1100 * time.Millisecond)
	os.WriteFile(file, []byte("gamma-token\n"), 0o600)
	time.Sleep(1100 * time.Millisecond)
	if res, _ := e.post(t, "/v1/plan", e.req, "Authorization", "Bearer alpha-token"); res.StatusCode != 401 {
		t.Errorf("a token removed from the file still works: %d", res.StatusCode)
	}
	if res, _ := e.post(t, "/v1/plan", e.req, "Authorization", "Bearer gamma-token"); res.StatusCode != 200 {
		t.Errorf("a token added to the file does not work: %d", res.StatusCode)
	}
}

func TestTooManyTensorsOrBlocks(t *testing.T) {
	e := opsServer(t, func(c *server.Config, st store.Store) { c.Limits.MaxTensors, c.Limits.MaxBlocks = 2, 2 })
	req := e.req
	req.Tensors = append(req.Tensors, req.Tensors[0], req.Tensors[0])
	if res, body := e.post(t, "/v1/shards", req); res.StatusCode != 413 ||
		!strings.Contains(string(body), "split the request") {
		t.Errorf("3 tensors over a limit of 2: %d %s", res.StatusCode, body)
	}
}

// stalledClient starts a shard request and never reads the body.
func stalledClient(t *testing.T, e *opsEnv) net.Conn {
	raw, _ := json.Marshal(e.req)
	conn, err := net.Dial("tcp", strings.TrimPrefix(e.url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		tcp.SetReadBuffer(4096)
	}
	io.WriteString(
		conn,
		"POST /v1/shards HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: "+itoa(
			len(raw),
		)+"\r\n\r\n",
	)
	conn.Write(raw)
	t.Cleanup(func() { conn.Close() })
	return conn
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

func waitFor(t *testing.T, what string, cond func() bool) {
	deadline := time.Now().Add(30 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func TestOverloadIsShedWith503(t *testing.T) {
	e := opsServer(t, func(c *server.Config, st store.Store) { c.Limits.MaxStreams = 1 })
	stalledClient(t, e)
	waitFor(t, "the stalled stream to hold memory", func() bool { return e.mem.Held() > 0 })
	res, body := e.post(t, "/v1/shards", e.req)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "streams") {
		t.Errorf("a second stream over --max-streams 1: %d %s", res.StatusCode, body)
	}
}

func TestMemoryBudgetShedsLoad(t *testing.T) {
	// Room for one 8 MiB segment, more than socket buffers take: a stalled stream holds it, the
	// next stream waits 100 ms for memory, then gets a 503. The segments are buffered, as an
	// object store's are: sent from the file, they would hold no memory.
	e := opsServer(t, func(c *server.Config, st store.Store) {
		c.Planner.SegmentBytes = 8 << 20
		c.Limits.WriteTimeout = 5 * time.Second
		mem := budget.New(budget.Config{Bytes: 9 << 20, AdmitWait: 100 * time.Millisecond})
		c.Executor = executor.New(struct{ store.Store }{st}, mem, executor.Config{Window: 2})
		c.Budget = mem
	})
	stalledClient(t, e)
	waitFor(t, "the stalled stream to hold memory", func() bool { return e.mem.Held() > 0 })
	res, body := e.post(t, "/v1/shards", e.req)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "memory") {
		t.Errorf("a stream the memory budget cannot take: %d %s", res.StatusCode, body)
	}
}

func TestStalledClientReleasesItsMemory(t *testing.T) {
	e := opsServer(t, func(c *server.Config, st store.Store) { c.Limits.WriteTimeout = 300 * time.Millisecond })
	stalledClient(t, e)
	waitFor(t, "the stream to hold memory", func() bool { return e.mem.Held() > 0 })
	waitFor(
		t,
		"the write deadline to cut the stalled client off and free its buffers",
		func() bool { return e.mem.Held() == 0 },
	)
	if res, body := e.post(t, "/v1/shards", e.req); res.StatusCode != 200 || !bytes.Equal(body, e.data) {
		t.Errorf("the server serves others after: %d", res.StatusCode)
	}
}

func TestSpansAndMetrics(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans))
	reader := sdkmetric.NewManualReader()
	mp := sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))
	e := opsServer(t, func(c *server.Config, local store.Store) {
		st := telemetry.InstrumentStore(local, tp, mp)
		c.Catalog = checkpoint.New(st)
		mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
		c.Executor = executor.New(st, mem, executor.Config{Window: 2, Tracer: tp.Tracer("executor")})
		c.Budget = mem
		c.Tracer, c.Meter = tp, mp
	})
	gather := e.req
	gather.Tensors = []api.TensorRequest{e.req.Tensors[0]}
	gather.Tensors[0].Dtype = api.F32
	if res, _ := e.post(t, "/v1/shards", gather); res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	// The request's span and metrics end after the last byte reaches the client: wait for them.
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(10 * time.Millisecond) {
		if slices.ContainsFunc(
			spans.Ended(),
			func(s sdktrace.ReadOnlySpan) bool { return s.Name() == "POST /v1/shards" },
		) {
			break
		}
	}
	names := map[string]int{}
	for _, s := range spans.Ended() {
		names[s.Name()]++
		if s.Name() == "store.read" && len(s.Attributes()) < 3 {
			t.Errorf("store.read carries key, offset and length: %v", s.Attributes())
		}
	}
	for _, want := range []string{"POST /v1/shards", "catalog.open", "plan", "store.read", "gather"} {
		if names[want] == 0 {
			t.Errorf("no %q span among %v", want, names)
		}
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	found := map[string]bool{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			found[m.Name] = true
			if m.Name == "shardsrv.requests" {
				sum := m.Data.(metricdata.Sum[int64])
				ok := false
				for _, dp := range sum.DataPoints {
					route, _ := dp.Attributes.Value("route")
					status, _ := dp.Attributes.Value("status")
					ok = ok || route.AsString() == "/v1/shards" && status.AsInt64() == 200 && dp.Value == 1
				}
				if !ok {
					t.Errorf("shardsrv.requests has no /v1/shards 200: %+v", sum.DataPoints)
				}
			}
		}
	}
	for _, want := range []string{
		"shardsrv.requests",
		"shardsrv.served",
		"shardsrv.plan.duration",
		"shardsrv.stream.duration",
		"shardsrv.read.amplification",
		"shardsrv.streams.active",
		"shardsrv.buffers.in_flight",
		"shardsrv.storage.read",
		"shardsrv.storage.requests",
		"http.server.request.duration",
	} {
		if !found[want] {
			t.Errorf("metric %s missing; have %v", want, found)
		}
	}
}

func TestMetricsEndpointServesPrometheus(t *testing.T) {
	tel, err := telemetry.New(context.Background(), "shardsrv", "test")
	if err != nil {
		t.Fatal(err)
	}
	e := opsServer(t, func(c *server.Config, st store.Store) { c.Meter, c.Metrics = tel.Meter, tel.Metrics })
	e.post(t, "/v1/plan", e.req)
	res, err := http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(res.Body)
	if !strings.Contains(string(body), `shardsrv_requests_total{`) ||
		!strings.Contains(string(body), `route="/v1/plan"`) {
		t.Errorf("/metrics: %s", body)
	}
}

// The store stack as serve builds it — the cache over the instrumented store, each given the
// meter — shows its counters on /metrics under the names the README lists.
func TestMetricsEndpointServesTheStoreStack(t *testing.T) {
	tel, err := telemetry.New(context.Background(), "shardsrv", "test")
	if err != nil {
		t.Fatal(err)
	}
	e := opsServer(t, func(c *server.Config, st store.Store) {
		instrumented := telemetry.InstrumentStore(st, tel.Tracer, tel.Meter)
		cached, err := cache.New(instrumented, cache.Config{Bytes: 64 << 20, ChunkBytes: 1 << 20}, tel.Meter)
		if err != nil {
			t.Fatal(err)
		}
		c.Catalog, c.Executor = checkpoint.New(cached), executor.New(cached, c.Budget, executor.Config{Window: 2})
		c.Meter, c.Metrics = tel.Meter, tel.Metrics
	})
	for range 2 { // a miss, then a hit
		if res, body := e.post(t, "/v1/shards", e.req); res.StatusCode != 200 || !bytes.Equal(body, e.data) {
			t.Fatalf("status %d, %d bytes", res.StatusCode, len(body))
		}
	}
	res, err := http.Get(e.url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, _ := io.ReadAll(res.Body)
	for _, name := range []string{
		"shardsrv_cache_hits_total", "shardsrv_cache_misses_total", "shardsrv_cache_served_bytes_total",
		"shardsrv_cache_filled_bytes_total", "shardsrv_cache_evictions_total", "shardsrv_cache_fills_in_flight",
		"shardsrv_storage_read_bytes_total", "shardsrv_storage_requests_total",
	} {
		if !regexp.MustCompile(`(?m)^` + name + `\{`).Match(body) {
			t.Errorf("/metrics has no %s", name)
		}
	}
}
