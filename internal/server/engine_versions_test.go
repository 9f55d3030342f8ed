package server_test

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/store"
)

// TestEngineVersionsThroughTheServer: a layout without engine_version follows the newest release
// line and says so, in /v1/layouts and in the safetensors __metadata__; an unknown line is a 422
// listing the known ones on every route. On "0.29" a dense model's rank is the "0.10" rank (held
// to vllmref above) plus each attention module's four F32 scale buffers of 1.0, at the TPs where
// lcm(64, TP) pads the test vocabulary as 64 does.
func TestEngineVersionsThroughTheServer(t *testing.T) {
	dir := t.TempDir()
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	cfg, _ := vrefPut(t, h, "qwen3", "qwen3")
	var c struct {
		Layers int `json:"num_hidden_layers"`
	}
	if err := json.Unmarshal(cfg, &c); err != nil || c.Layers == 0 {
		t.Fatalf("config.json: %v, %d layers", err, c.Layers)
	}
	for _, route := range layoutRoutes {
		res := h.do("POST", route, map[string]any{"checkpoint": "qwen3",
			"layout": map[string]any{"engine": "vllm", "engine_version": "0.30"}})
		wantProblem(t, route, res, "/layout/engine_version", `"0.10", "0.29"`)
		res = h.do("POST", route, map[string]any{"checkpoint": "qwen3",
			"layout": map[string]any{"engine": "vllm", "engine_version": strings.Repeat("9", 1<<16)}})
		if res.status/100 != 4 || len(res.body) > 4096 {
			t.Fatalf("%s: a 64 KiB engine_version: %d, %d bytes", route, res.status, len(res.body))
		}
	}
	for _, tp := range []int{1, 2, 4, 8} {
		for r := range tp {
			p := vllmref.Parallel{TP: tp, TPRank: r, DP: 1}
			old := vrefLayout(p)
			cur := vrefLayout(p)
			delete(cur, "engine_version")
			what := fmt.Sprintf("TP %d rank %d", tp, r)

			var table struct {
				EngineVersion string `json:"engine_version"`
			}
			res := h.do("POST", "/v1/layouts", map[string]any{"checkpoint": "qwen3", "layout": cur})
			if err := json.Unmarshal(res.body, &table); res.status != 200 || err != nil || table.EngineVersion != "0.29" {
				t.Fatalf("%s: /v1/layouts %d %.200s, want engine_version 0.29", what, res.status, res.body)
			}
			want := fetchSafetensors(t, h, old, "0.10", what)
			got := fetchSafetensors(t, h, cur, "0.29", what)
			one := binary.LittleEndian.AppendUint32(nil, math.Float32bits(1))
			scales := 0
			for name, x := range got {
				if !strings.Contains(name, "._") {
					continue
				}
				if !strings.HasSuffix(name[:strings.LastIndex(name, ".")], "self_attn.attn") ||
					x.DType != "F32" || len(x.Shape) != 0 || !bytes.Equal(x.Data, one) {
					t.Fatalf("%s: %s %s %v %x, want an F32 scalar 1.0 under self_attn.attn", what, name, x.DType, x.Shape, x.Data)
				}
				delete(got, name)
				scales++
			}
			if scales != 4*c.Layers {
				t.Fatalf("%s: %d scale buffers, want 4 for each of %d layers", what, scales, c.Layers)
			}
			if len(got) != len(want) {
				t.Fatalf("%s: %d tensors besides the scales, want %d", what, len(got), len(want))
			}
			vrefReport(t, what, vrefDiff(got, want))
		}
	}
}

// fetchSafetensors fetches a layout's rank as safetensors and checks the __metadata__ names the
// release line.
func fetchSafetensors(t *testing.T, h *harness, layout map[string]any, version, what string) map[string]vllmref.Tensor {
	t.Helper()
	res := h.do("POST", "/v1/shards", map[string]any{"checkpoint": "qwen3", "format": "safetensors", "layout": layout})
	if res.status != 200 {
		t.Fatalf("%s: %d %.300s", what, res.status, res.body)
	}
	got, md := vrefParseSafetensors(t, res.body)
	if md["shardsrv.engine"] != "vllm" || md["shardsrv.engine_version"] != version {
		t.Fatalf("%s: __metadata__ %v, want engine vllm %s", what, md, version)
	}
	return got
}

// TestMoELayoutFieldsThroughTheServer: the layout fields of vLLM's EPLB, expert placement and
// prefill-context parallelism reach the engine from every route, and what vLLM refuses is a 422 at
// the field to change.
func TestMoELayoutFieldsThroughTheServer(t *testing.T) {
	dir := t.TempDir()
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	vrefPut(t, h, "deepseekv3", "deepseekv3")
	for _, c := range []struct {
		layout        map[string]any
		pointer, want string
	}{
		{map[string]any{"tensor_parallel_size": 2, "enable_expert_parallel": true, "num_redundant_experts": 2},
			"/layout/num_redundant_experts", "enable_eplb"},
		{map[string]any{"num_redundant_experts": -1}, "/layout/num_redundant_experts", "must be in"},
		{map[string]any{"tensor_parallel_size": 2, "enable_eplb": true}, "/layout/enable_eplb", "enable_expert_parallel"},
		{map[string]any{"enable_expert_parallel": true, "enable_eplb": true}, "/layout/enable_eplb", "one rank"},
		{map[string]any{"expert_placement_strategy": "diagonal"}, "/layout/expert_placement_strategy", "round_robin"},
		{map[string]any{"prefill_context_parallel_size": 2, "data_parallel_size": 2},
			"/layout/prefill_context_parallel_size", "data_parallel_size"},
		{map[string]any{"prefill_context_parallel_size": 2, "pcp_rank": 2}, "/layout/pcp_rank", "not in [0, 2)"},
		{map[string]any{"engine_version": "0.10", "tensor_parallel_size": 2, "enable_expert_parallel": true,
			"enable_eplb": true}, "/layout/enable_eplb", `not laid out on vllm 0.10`},
	} {
		c.layout["engine"] = "vllm"
		for _, route := range layoutRoutes {
			res := h.do("POST", route, map[string]any{"checkpoint": "deepseekv3", "layout": c.layout})
			wantProblem(t, fmt.Sprintf("%s %v", route, c.layout), res, c.pointer, c.want)
		}
	}
}
