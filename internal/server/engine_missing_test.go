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

// TestLayoutNamesMissingTensor: a parameter the engine's model builds unconditionally, missing
// from the checkpoint, is a 422 at /layout naming it on every route that expands a layout, on
// every engine and release line — not a layout that leaves the parameter out. Qwen2MoeSparseMoeBlock
// builds shared_expert_gate [1, hidden] in every sparse layer, shared expert or not;
// Qwen3Attention builds q_norm and k_norm whatever the config says (vLLM's and SGLang's qwen3.py).
func TestLayoutNamesMissingTensor(t *testing.T) {
	for _, c := range []struct {
		variant, drop, want string
		config              map[string]any
		layouts             []map[string]any
	}{
		{
			variant: "qwen2moe", drop: ".shared_expert", want: "model.layers.0.mlp.shared_expert_gate.weight",
			config:  map[string]any{"shared_expert_intermediate_size": 0}, // no shared expert: the gate is still built
			layouts: []map[string]any{{"engine": "vllm"}, {"engine": "vllm", "engine_version": "0.10"}},
		},
		{
			variant: "qwen3", drop: "self_attn.q_norm.", want: "model.layers.0.self_attn.q_norm.weight",
			layouts: []map[string]any{
				{"engine": "vllm"}, {"engine": "vllm", "engine_version": "0.10"},
				{"engine": "sglang", "tensor_parallel_size": 2, "tp_rank": 1},
			},
		},
		{
			variant: "qwen3moe", drop: "self_attn.k_norm.", want: "model.layers.0.self_attn.k_norm.weight",
			layouts: []map[string]any{{"engine": "vllm"}, {"engine": "vllm", "engine_version": "0.10"}},
		},
	} {
		t.Run(c.variant, func(t *testing.T) {
			dir := t.TempDir()
			st, err := store.NewLocal(dir)
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
			cfg, tensors := vllmref.Checkpoint(c.variant, 42)
			var m map[string]any
			if err := json.Unmarshal(cfg, &m); err != nil {
				t.Fatal(err)
			}
			for k, v := range c.config {
				m[k] = v
			}
			raw, _ := json.Marshal(m)
			var names []string
			for n := range tensors {
				if !strings.Contains(n, c.drop) {
					names = append(names, n)
				}
			}
			if len(names) == len(tensors) {
				t.Fatalf("the %s checkpoint has no tensor matching %q to drop", c.variant, c.drop)
			}
			sort.Strings(names)
			var data []safetensors.TensorData
			for _, n := range names {
				x := tensors[n]
				data = append(data, safetensors.TensorData{Name: n, DType: x.DType, Shape: x.Shape, Data: x.Data})
			}
			h.put("ckpt/config.json", raw)
			writeCheckpoint(t, h, "ckpt", data...)
			for _, layout := range c.layouts {
				for _, route := range layoutRoutes {
					res := h.do("POST", route, map[string]any{"checkpoint": "ckpt", "layout": layout})
					wantProblem(t, route, res, "/layout", `"`+c.want+`"`)
				}
			}
		})
	}
}
