package main

import (
	"bytes"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

func TestPrefetchCommand(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "checkpoints")
	if _, err := example.Generate(dir); err != nil {
		t.Fatal(err)
	}
	local, _ := store.NewLocal(dir)
	counting := storetest.NewCounting(local)
	const chunk = 4 << 10
	ring, err := cluster.New(counting, cluster.Options{ChunkBytes: chunk, StripeBytes: chunk, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	cached, _ := cache.New(ring, cache.Config{Bytes: 16 << 20, ChunkBytes: chunk}, nil)
	opts := planner.DefaultOptions()
	opts.Align = chunk
	mem := budget.New(budget.Config{Bytes: 1 << 26})
	srv := server.New(server.Config{Catalog: checkpoint.New(cached), Planner: opts,
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
		Executor: executor.New(cached, mem, executor.Config{Window: 2}),
		Budget:   mem,
		Cluster:  cluster.NewHandler(ring, cached)})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)

	var out, errs bytes.Buffer
	if err := prefetchCmd([]string{"--server", ts.URL, "--checkpoint", example.Name}, &out, &errs); err != nil {
		t.Fatalf("%v %s", err, errs.String())
	}
	if !strings.Contains(out.String(), "prefetched "+example.Name) || !strings.Contains(out.String(), "self:") ||
		counting.Bytes() == 0 {
		t.Errorf("prefetch of the whole checkpoint printed %q and read %d bytes", out.String(), counting.Bytes())
	}
	out.Reset()
	if err := prefetchCmd([]string{"--server", ts.URL, "--checkpoint", example.Name, "--layout", "vllm", "--tp", "2",
		"--rank", "all"}, &out, &errs); err != nil {
		t.Fatalf("%v %s", err, errs.String())
	}
	if !strings.Contains(out.String(), "0 B filled from storage in 0 chunks") {
		t.Errorf("the ranks of a warm checkpoint filled something: %q", out.String())
	}
	if err := prefetchCmd([]string{"--server", ts.URL}, &out, &errs); err == nil {
		t.Error("prefetch without --checkpoint or --request must be refused")
	}
}
