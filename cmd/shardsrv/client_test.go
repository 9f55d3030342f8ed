package main

import (
	"bytes"
	"encoding/json"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

func TestLayoutPlanAndFetchCommands(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "checkpoints")
	if _, err := example.Generate(dir); err != nil {
		t.Fatal(err)
	}
	st, _ := store.NewLocal(dir)
	srv := server.New(server.Config{Catalog: checkpoint.New(st), Planner: planner.DefaultOptions(), MaxBodyBytes: 1 << 20,
		Executor: executor.New(st, executor.Config{Window: 2, MaxRead: 1 << 20, MemoryBytes: 1 << 26, AdmitWait: time.Second})})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	var out, errs bytes.Buffer
	err := layoutCmd([]string{"qwen-moe", "--server", ts.URL, "--checkpoint", example.Name, "--tp", "2", "--ep", "2", "--rank", "1", "--head-dim", "16"}, &out, &errs)
	if err != nil {
		t.Fatalf("layout: %v %s", err, errs.String())
	}
	var req api.ShardRequest
	if err := json.Unmarshal(out.Bytes(), &req); err != nil || req.Checkpoint != example.Name || len(req.Tensors) < 10 {
		t.Fatalf("layout printed %d tensors: %v", len(req.Tensors), err)
	}
	reqFile := filepath.Join(t.TempDir(), "rank1.json")
	os.WriteFile(reqFile, out.Bytes(), 0o644)

	out.Reset()
	if err := planCmd([]string{"--server", ts.URL, "--request", reqFile}, &out, &errs); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "model.layers.1.mlp.experts.w13_weight") || !strings.Contains(out.String(), "amplification") {
		t.Errorf("plan table:\n%s", out.String())
	}

	errs.Reset()
	shard := filepath.Join(t.TempDir(), "rank1.bin")
	if err := fetch([]string{"--server", ts.URL, "--request", reqFile, "-o", shard}, &out, &errs); err != nil {
		t.Fatal(err)
	}
	fi, _ := os.Stat(shard)
	if fi == nil || fi.Size() == 0 || !strings.Contains(errs.String(), "fetched") {
		t.Errorf("fetch wrote %v; said %q", fi, errs.String())
	}
	if err := layoutCmd([]string{"gpt", "--checkpoint", "x"}, &out, &errs); err == nil {
		t.Error("an unknown preset is refused")
	}
}
