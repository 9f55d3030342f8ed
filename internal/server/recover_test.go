package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// TestPanicIsA500Problem: a handler's panic is answered with a 500 problem carrying the request
// id, logged with that id, and counted; a panic after the body began aborts the connection.
func TestPanicIsA500Problem(t *testing.T) {
	logs := &syncBuffer{}
	reader := sdkmetric.NewManualReader()
	st, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	srv := server.New(server.Config{
		Catalog:  checkpoint.New(st), // its store's reachability is a gauge of every collection
		Executor: executor.New(st, budget.New(budget.Config{}), executor.Config{}),
		Logger:   slog.New(slog.NewJSONHandler(logs, nil)),
		Meter:    sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)),
	})
	ts := httptest.NewServer(srv.HandlerPanickingAt("/boom", "index out of range", ""))
	t.Cleanup(ts.Close)
	req, _ := http.NewRequest("GET", ts.URL+"/boom", nil)
	req.Header.Set("X-Request-Id", "hostile-1")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("the connection was dropped: %v", err)
	}
	body, _ := io.ReadAll(res.Body)
	res.Body.Close()
	var p api.Problem
	json.Unmarshal(body, &p)
	if res.StatusCode != 500 || p.Type != "urn:shardsrv:problem:internal-error" || p.Detail == nil ||
		!strings.Contains(*p.Detail, "hostile-1") || res.Header.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("%d %s %s", res.StatusCode, res.Header.Get("Content-Type"), body)
	}
	var sawPanic, sawAccess bool
	for line := range strings.SplitSeq(logs.String(), "\n") {
		var rec map[string]any
		if json.Unmarshal([]byte(line), &rec) != nil || rec["request_id"] != "hostile-1" {
			continue
		}
		switch rec["msg"] {
		case "handler panicked":
			sawPanic = rec["panic"] == "index out of range" && strings.Contains(rec["stack"].(string), "recover")
		case "request":
			sawAccess = rec["status"] == float64(500) && rec["aborted"] == false
		}
	}
	if !sawPanic || !sawAccess {
		t.Fatalf("want the panic with its stack and a 500 access line under the request id:\n%s", logs)
	}
	if n := panicsCounted(t, reader); n != 1 {
		t.Fatalf("shardsrv.panics = %d, want 1", n)
	}

	// Once the body has begun, the connection is cut: the client sees an error, not a short 200.
	ts2 := httptest.NewServer(srv.HandlerPanickingAt("/late", errors.New("late"), "partial"))
	t.Cleanup(ts2.Close)
	res, err = http.Get(ts2.URL + "/late")
	if err == nil {
		_, err = io.ReadAll(res.Body)
		res.Body.Close()
	}
	if err == nil {
		t.Fatal("a panic after the body began ended the response cleanly")
	}
	if n := panicsCounted(t, reader); n != 2 {
		t.Fatalf("shardsrv.panics = %d, want 2", n)
	}
}

func panicsCounted(t *testing.T, reader sdkmetric.Reader) int64 {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	var n int64
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok && m.Name == "shardsrv.panics" {
				for _, dp := range sum.DataPoints {
					n += dp.Value
				}
			}
		}
	}
	return n
}
