package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"reflect"
	"slices"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/engine/sglangref"
)

// SGLang's options reach the server as the layout's fields (the table printed is /v1/layouts' for
// the layout object written out here, and not the one without them), and fetch --layout sglang
// writes the directory SGLang's ShardedStateLoader loads: model-rank-R-part-0.safetensors for every
// TP rank, each holding exactly what sglangref says SGLang saves for it, and config.json.
func TestLayoutAndFetchSGLang(t *testing.T) {
	url, folder := live(t)
	const variant = "qwen3moe-sparse"
	cfg, hf := putCheckpoint(t, folder, variant)
	c := api.NewClient(url)
	tp, dp, ep, rank, yes := int64(4), int64(2), int64(2), int64(3), true
	var out, errs bytes.Buffer
	if err := layoutCmd([]string{"--server", url, "--checkpoint", variant, "--engine", "sglang", "--tp", "4",
		"--rank", "3", "--dp", "2", "--enable-dp-attention", "--ep-size", "2"}, &out, &errs); err != nil {
		t.Fatalf("%v %s", err, errs.String())
	}
	var req api.ShardRequest
	if err := json.Unmarshal(out.Bytes(), &req); err != nil {
		t.Fatal(err)
	}
	with := api.EngineLayout{Engine: api.Sglang, TensorParallelSize: &tp, TpRank: &rank, DataParallelSize: &dp,
		EnableDpAttention: &yes, ExpertParallelSize: &ep}
	want, err := c.Layout(context.Background(), variant, with)
	if err != nil {
		t.Fatal(err)
	}
	plain, err := c.Layout(context.Background(), variant,
		api.EngineLayout{Engine: api.Sglang, TensorParallelSize: &tp, TpRank: &rank})
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(req.Tensors, want.Tensors) || reflect.DeepEqual(req.Tensors, plain.Tensors) {
		t.Errorf("the table is not /v1/layouts' for the layout with SGLang's options")
	}

	dir := filepath.Join(t.TempDir(), "sglang")
	if err := fetch([]string{"--server", url, "--checkpoint", variant, "--layout", "sglang", "--tp", "2",
		"--rank", "all", "--ep-size", "2", "--out", dir}, &out, &errs); err != nil {
		t.Fatalf("%v %s", err, errs.String())
	}
	names := fileNames(t, dir)
	for _, f := range []string{"config.json", "model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors"} {
		if !slices.Contains(names, f) {
			t.Fatalf("%s has %v, no %s", dir, names, f)
		}
	}
	for r := range 2 {
		ref, err := sglangref.Rank(cfg, hf, sglangref.Parallel{TP: 2, TPRank: r, EP: 2})
		if err != nil {
			t.Fatal(err)
		}
		entries, data := readSafetensors(t, filepath.Join(dir, fmt.Sprintf("model-rank-%d-part-0.safetensors", r)))
		if len(entries) != len(ref) {
			t.Errorf("rank %d: %d tensors, SGLang saves %d", r, len(entries), len(ref))
		}
		for name, x := range ref {
			e, ok := entries[name]
			if !ok || e.DTypeName != x.DType || !slices.Equal(e.Shape, x.Shape) || !bytes.Equal(data[name], x.Data) {
				t.Errorf("rank %d: %s is not what SGLang saves (%s %v)", r, name, x.DType, x.Shape)
			}
		}
	}
}
