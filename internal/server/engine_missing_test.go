package server_test

import (
	"encoding/json"
	"sort"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// TestLayoutNamesMissingTensor: Qwen2MoeSparseMoeBlock builds shared_expert_gate [1, hidden] in
// every sparse layer, shared expert or not; a checkpoint without it is a 422 at /layout naming it
// on every route that expands a layout, not a layout that leaves the parameter out.
func TestLayoutNamesMissingTensor(t *testing.T) {
	dir := t.TempDir()
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	cfg, tensors := vllmref.Checkpoint("qwen2moe", 42)
	var c map[string]any
	if err := json.Unmarshal(cfg, &c); err != nil {
		t.Fatal(err)
	}
	c["shared_expert_intermediate_size"] = 0 // no shared expert: the gate is still built
	raw, _ := json.Marshal(c)
	var names []string
	for n := range tensors {
		if !strings.Contains(n, ".shared_expert") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var data []safetensors.TensorData
	for _, n := range names {
		x := tensors[n]
		data = append(data, safetensors.TensorData{Name: n, DType: x.DType, Shape: x.Shape, Data: x.Data})
	}
	h.put("moe/config.json", raw)
	writeCheckpoint(t, h, "moe", data...)
	for _, route := range layoutRoutes {
		res := h.do("POST", route, map[string]any{"checkpoint": "moe", "layout": map[string]any{"engine": "vllm"}})
		wantProblem(t, route, res, "/layout", `"model.layers.0.mlp.shared_expert_gate.weight"`)
	}
}
