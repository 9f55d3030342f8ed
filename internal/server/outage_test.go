package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
	"github.com/shardsrv/shardsrv/internal/telemetry"
)

// An S3 outage (versitygw stopped: every connection refused) with the cache on, past the store
// grace: the replica stays ready, serves what its cache holds byte for byte, fails the rest with a
// retryable problem, and says the store is unreachable on /readyz?verbose and in
// shardsrv_store_reachable. The catalog and the cache revalidate on every request (Revalidate 0),
// so every request meets the outage.
func TestAnOutageWithTheCacheServesWhatItHolds(t *testing.T) {
	g := s3test.Start(t)
	g.CreateBucket(t, "outage")
	const rows, cols = 256, 512 // BF16: 1 KiB a row, 256 KiB in all, four cache chunks and a bit
	data := pattern(rows*cols*2, 7)
	var file bytes.Buffer
	if err := safetensors.Write(&file, []safetensors.TensorData{{Name: "w", DType: "BF16", Shape: []int64{rows, cols},
		Data: data}}, nil); err != nil {
		t.Fatal(err)
	}
	g.Put(t, "outage", "m/model.safetensors", file.Bytes())
	st, err := s3reader.New(context.Background(), s3reader.Config{Bucket: "outage", Endpoint: g.Endpoint,
		Tunables: objstore.Tunables{ReadTimeout: 2 * time.Second, RetryBudget: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	const chunk = 64 << 10
	ring, err := cluster.New(st, cluster.Options{ChunkBytes: chunk, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cached, err := cache.New(ring, cache.Config{Bytes: 16 << 20, ChunkBytes: chunk}, nil)
	if err != nil {
		t.Fatal(err)
	}
	cached.Revalidate = 0
	tel, err := telemetry.New(context.Background(), "shardsrv", "test")
	if err != nil {
		t.Fatal(err)
	}
	opts := planner.ObjectStoreOptions()
	opts.Align = chunk
	mem := budget.New(budget.Config{Bytes: 1 << 28, AdmitWait: time.Second})
	srv := server.New(server.Config{Catalog: checkpoint.New(cached), Planner: opts,
		Executor: executor.New(cached, mem, executor.Config{Window: 2}),
		Budget:   mem,
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
		Meter:    tel.Meter,
		Metrics:  tel.Metrics,
		Cluster:  cluster.NewHandler(ring, cached),
		// No grace at all: only the cache keeps the replica ready.
		StoreGrace: 0,
	})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	rowsOf := func(lo, n int64) api.ShardRequest {
		return shardReq("m", api.TensorRequest{Name: "w", Dtype: "BF16", Shape: []int64{rows, cols},
			Boxes:  []api.Box{{Offsets: []int64{lo, 0}, Lengths: []int64{n, cols}}},
			Blocks: &[]api.Block{rowsBlock("w", 0, rows, cols, 0)}})
	}
	post := func(req api.ShardRequest) (*http.Response, []byte) {
		t.Helper()
		raw, _ := json.Marshal(req)
		res, err := http.Post(ts.URL+"/v1/shards", "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, err := io.ReadAll(res.Body)
		if err != nil {
			t.Fatal(err)
		}
		return res, body
	}
	readyz := func() (int, api.Health) {
		t.Helper()
		res, err := http.Get(ts.URL + "/readyz?verbose")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var h api.Health
		if err := json.NewDecoder(res.Body).Decode(&h); err != nil {
			t.Fatal(err)
		}
		return res.StatusCode, h
	}
	metric := func() string {
		t.Helper()
		res, err := http.Get(ts.URL + "/metrics")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, _ := io.ReadAll(res.Body)
		for _, line := range strings.Split(string(body), "\n") {
			if strings.HasPrefix(line, "shardsrv_store_reachable") {
				return line[strings.LastIndexByte(line, ' ')+1:]
			}
		}
		t.Fatalf("no shardsrv_store_reachable in /metrics:\n%s", body)
		return ""
	}

	head := rowsOf(0, 32) // the first 32 KiB of data: within the first two chunks
	tail := rowsOf(rows-32, 32)
	if res, body := post(head); res.StatusCode != 200 || !bytes.Equal(body, data[:32*cols*2]) {
		t.Fatalf("with the store up: %d, %d bytes", res.StatusCode, len(body))
	}
	if status, h := readyz(); status != 200 || !h.Store.Reachable || metric() != "1" {
		t.Fatalf("with the store up: %d %+v, reachable %s", status, h.Store, metric())
	}

	g.Stop()
	status, h := readyz()
	if status != 200 || h.Store == nil || h.Store.Reachable || !h.Store.Cache || h.Store.Error == nil {
		t.Errorf("the store down, the cache on: %d %+v, want ready, the store unreachable", status, h.Store)
	}
	if got := metric(); got != "0" {
		t.Errorf("shardsrv_store_reachable %s with the store down, want 0", got)
	}
	for range 2 {
		res, body := post(head)
		if res.StatusCode != 200 || !bytes.Equal(body, data[:32*cols*2]) {
			t.Errorf("cached rows with the store down: %d %s, want them byte for byte", res.StatusCode, body)
		}
	}
	res, body := post(tail)
	var p api.Problem
	json.Unmarshal(body, &p)
	if res.StatusCode < 500 || p.Retryable == nil || !*p.Retryable {
		t.Errorf("rows the cache does not hold, the store down: %d %s, want a retryable problem", res.StatusCode, body)
	}
}
