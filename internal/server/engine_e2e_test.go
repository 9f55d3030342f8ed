package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// These tests hold the server's vLLM "0.10" layouts to vllmref, an independent reference of what
// vLLM v0.10.2's ShardedStateLoader.save_model writes per rank. The request bodies are raw JSON, so
// the test does not depend on the generated request types.

var vrefMoE = map[string]bool{
	"mixtral":        true,
	"qwen2moe":       true,
	"qwen3moe":       true,
	"deepseekv3":     true,
	"deepseekv3-fp8": true,
}

// vrefPut writes a variant's config.json and model.safetensors into the harness's store.
func vrefPut(t *testing.T, h *harness, name, variant string) ([]byte, map[string]vllmref.Tensor) {
	t.Helper()
	cfg, tensors := vllmref.Checkpoint(variant, 42)
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	var data []safetensors.TensorData
	for _, n := range names {
		x := tensors[n]
		data = append(data, safetensors.TensorData{Name: n, DType: x.DType, Shape: x.Shape, Data: x.Data})
	}
	h.put(name+"/config.json", cfg)
	writeCheckpoint(t, h, name, data...)
	return cfg, tensors
}

func vrefLayout(p vllmref.Parallel) map[string]any {
	return map[string]any{
		"engine": "vllm", "engine_version": "0.10", "tensor_parallel_size": p.TP, "tp_rank": p.TPRank,
		"enable_expert_parallel": p.EnableEP, "data_parallel_size": p.DP, "dp_rank": p.DPRank,
	}
}

// vrefParallels is every configuration the matrix covers: TP 1, 2, 4, 8, EP off and on, and DP 2 for
// the MoE variants at TP <= 4; each with every (dp_rank, tp_rank).
func vrefParallels(variant string) []vllmref.Parallel {
	var out []vllmref.Parallel
	for _, tp := range []int{1, 2, 4, 8} {
		for _, ep := range []bool{false, true} {
			dps := []int{1}
			if vrefMoE[variant] && tp <= 4 {
				dps = append(dps, 2)
			}
			for _, dp := range dps {
				for d := 0; d < dp; d++ {
					for r := 0; r < tp; r++ {
						out = append(out, vllmref.Parallel{TP: tp, TPRank: r, DP: dp, DPRank: d, EnableEP: ep})
					}
				}
			}
		}
	}
	return out
}

// vrefDiff lists how got differs from want: names, dtypes, shapes, bytes.
func vrefDiff(got, want map[string]vllmref.Tensor) []string {
	var out []string
	for n, w := range want {
		g, ok := got[n]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("missing %s (%s %v)", n, w.DType, w.Shape))
		case g.DType != w.DType || !slices.Equal(g.Shape, w.Shape):
			out = append(out, fmt.Sprintf("%s: %s %v, want %s %v", n, g.DType, g.Shape, w.DType, w.Shape))
		case !bytes.Equal(g.Data, w.Data):
			out = append(out, fmt.Sprintf("%s: %s %v has other bytes", n, w.DType, w.Shape))
		}
	}
	for n, g := range got {
		if _, ok := want[n]; !ok {
			out = append(out, fmt.Sprintf("unexpected %s (%s %v)", n, g.DType, g.Shape))
		}
	}
	sort.Strings(out)
	return out
}

// vrefReport fails the test with the first differences, if any, and says whether there were none.
func vrefReport(t *testing.T, what string, diffs []string) bool {
	t.Helper()
	if len(diffs) == 0 {
		return true
	}
	shown := diffs[:min(len(diffs), 6)]
	t.Errorf("%s: %d differences from the reference:\n  %s", what, len(diffs), strings.Join(shown, "\n  "))
	return false
}

// vrefParseSafetensors reads a safetensors body into tensors by name, and its __metadata__.
func vrefParseSafetensors(t *testing.T, body []byte) (map[string]vllmref.Tensor, map[string]string) {
	t.Helper()
	n, err := safetensors.HeaderLen("body", body, int64(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	hdr, err := safetensors.Parse("body", body[8:8+n], int64(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]vllmref.Tensor{}
	for _, x := range hdr.Tensors {
		out[x.Name] = vllmref.Tensor{DType: x.DTypeName, Shape: x.Shape, Data: body[x.Begin:x.End]}
	}
	return out, hdr.Metadata
}

func vrefIsProblem(res response, status int) bool {
	return res.status == status && strings.HasPrefix(res.header.Get("Content-Type"), "application/problem+json") &&
		res.problem.Status == status
}

// vrefCheckRank holds one "0.10" rank to vllmref.Rank in both formats.
func vrefCheckRank(t *testing.T, h *harness, name string, cfg []byte, hf map[string]vllmref.Tensor, p vllmref.Parallel) gridTally {
	t.Helper()
	want, refErr := vllmref.Rank(cfg, hf, p)
	return gridCheck(t, h, gridRank{
		what: fmt.Sprintf("%s %+v", name, p), checkpoint: name, layout: vrefLayout(p),
		engine: "vllm", line: "0.10", want: want, refusal: refErr,
	})
}

// vrefCheckPlan checks that /v1/plan, given a rank's layout, plans exactly the bytes /v1/shards
// sends for it in the raw format, over the tensors of /v1/layouts' table.
func vrefCheckPlan(t *testing.T, h *harness, name string, p vllmref.Parallel) {
	t.Helper()
	what := fmt.Sprintf("plan %s %+v", name, p)
	lres := h.do("POST", "/v1/layouts", map[string]any{"checkpoint": name, "layout": vrefLayout(p)})
	sres := h.do("POST", "/v1/shards", map[string]any{"checkpoint": name, "format": "raw", "layout": vrefLayout(p)})
	pres := h.do("POST", "/v1/plan", map[string]any{"checkpoint": name, "layout": vrefLayout(p)})
	if lres.status != 200 || sres.status != 200 {
		t.Fatalf("%s: /v1/layouts %d %.200s; /v1/shards %d %.200s", what, lres.status, lres.body, sres.status, sres.body)
	}
	table := vrefLayoutTable(t, what, lres.body)
	var plan api.PlanResponse
	if err := json.Unmarshal(pres.body, &plan); err != nil || pres.status != 200 ||
		plan.Summary.OutputBytes != int64(len(sres.body)) || len(plan.Tensors) != len(table.Tensors) {
		t.Errorf("%s: /v1/plan %d %.200s, want %d output bytes over %d tensors",
			what, pres.status, pres.body, len(sres.body), len(table.Tensors))
	}
}

// vrefTable is /v1/layouts' answer: the table the raw format's body follows.
type vrefTable struct {
	Checkpoint    string `json:"checkpoint"`
	EngineVersion string `json:"engine_version"`
	Tensors       []struct {
		Name  string  `json:"name"`
		DType string  `json:"dtype"`
		Shape []int64 `json:"shape"`
		Boxes []struct {
			Offsets []int64 `json:"offsets"`
			Lengths []int64 `json:"lengths"`
		} `json:"boxes"`
	} `json:"tensors"`
}

func vrefLayoutTable(t *testing.T, what string, body []byte) vrefTable {
	t.Helper()
	var table vrefTable
	if err := json.Unmarshal(body, &table); err != nil {
		t.Fatalf("%s: layouts response: %v", what, err)
	}
	return table
}

// vrefSplitRaw cuts a raw body into the table's tensors in the table's order, after checking that
// the table asks for each tensor whole (one box over its shape), as an engine's rank does; it
// reports a body that ends inside a tensor or goes on after the last one.
func vrefSplitRaw(t *testing.T, what string, table vrefTable, body []byte) (map[string]vllmref.Tensor, bool) {
	t.Helper()
	got := map[string]vllmref.Tensor{}
	for _, x := range table.Tensors {
		if len(x.Boxes) != 1 || !slices.Equal(x.Boxes[0].Lengths, x.Shape) ||
			slices.ContainsFunc(x.Boxes[0].Offsets, func(o int64) bool { return o != 0 }) {
			t.Errorf("%s: %s has boxes %+v, want one box over its shape %v", what, x.Name, x.Boxes, x.Shape)
			return nil, false
		}
		size := vllmref.ElemSize(x.DType)
		for _, d := range x.Shape {
			size *= d
		}
		if size > int64(len(body)) {
			t.Errorf("%s: the raw body ends inside %s", what, x.Name)
			return nil, false
		}
		got[x.Name] = vllmref.Tensor{DType: x.DType, Shape: x.Shape, Data: body[:size]}
		body = body[size:]
	}
	if len(body) != 0 {
		t.Errorf("%s: %d raw bytes after the last tensor", what, len(body))
		return nil, false
	}
	return got, true
}

// TestVLLMLayoutsMatchReference runs every variant x TP {1,2,4,8} x EP {off,on} x DP {1, and 2 for
// MoE at TP <= 4} x every rank over the local store (one server and store per variant; the other
// stores read the same bytes and are covered by TestVLLMLayoutsOverEveryStore), in both formats,
// and /v1/plan for a subset; it logs how many points matched.
func TestVLLMLayoutsMatchReference(t *testing.T) {
	var tally gridTally
	for _, variant := range vllmref.Variants {
		t.Run(variant, func(t *testing.T) {
			dir := t.TempDir()
			st, err := store.NewLocal(dir)
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
			name := variant
			cfg, hf := vrefPut(t, h, name, variant)
			for _, p := range vrefParallels(variant) {
				tally.add(vrefCheckRank(t, h, name, cfg, hf, p))
			}
			planned := []vllmref.Parallel{{TP: 1, DP: 1}, {TP: 2, TPRank: 1, DP: 1}, {TP: 8, TPRank: 7, DP: 1}}
			if vrefMoE[variant] {
				planned = append(
					planned,
					vllmref.Parallel{TP: 2, TPRank: 0, DP: 2, DPRank: 1, EnableEP: true},
					vllmref.Parallel{TP: 4, TPRank: 3, DP: 2, DPRank: 1},
				)
			}
			for _, p := range planned {
				if _, err := vllmref.Rank(cfg, hf, p); err == nil { // gridCheck held the refusals
					vrefCheckPlan(t, h, name, p)
				}
			}
		})
	}
	t.Logf("vLLM line 0.10: %d points (checkpoint, setup, rank, format) served byte for byte, %d refused as vLLM refuses them",
		tally.served, tally.refused)
}

// TestVLLMLayoutsOverEveryStore checks a few ranks of the quantized DeepSeek variant, in both formats,
// over every store eachStore runs (local, with the chunk cache and with signatures, S3, GCS, Azure).
func TestVLLMLayoutsOverEveryStore(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		cfg, hf := vrefPut(t, h, "dsv3", "deepseekv3-fp8")
		for _, p := range []vllmref.Parallel{
			{TP: 2, TPRank: 1, DP: 1}, {TP: 4, TPRank: 2, DP: 2, DPRank: 1, EnableEP: true}, {TP: 8, TPRank: 0, DP: 1},
			{TP: 2, TPRank: 0, DP: 2, DPRank: 1, EnableEP: true},
		} {
			vrefCheckRank(t, h, "dsv3", cfg, hf, p)
		}
		vrefCheckPlan(t, h, "dsv3", vllmref.Parallel{TP: 2, TPRank: 0, DP: 2, DPRank: 1, EnableEP: true})
	})
}

// TestVLLMMoreExpertRanksThanExperts: 16 expert-parallel ranks over 10 experts leave ranks 10-15
// without an expert; vLLM's saved state then has no expert tensors for them.
func TestVLLMMoreExpertRanksThanExperts(t *testing.T) {
	dir := t.TempDir()
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	cfg, hf := vrefPut(t, h, "mixtral", "mixtral")
	for _, dpRank := range []int{0, 2, 3} {
		for _, tpRank := range []int{0, 3} {
			vrefCheckRank(
				t,
				h,
				"mixtral",
				cfg,
				hf,
				vllmref.Parallel{TP: 4, TPRank: tpRank, DP: 4, DPRank: dpRank, EnableEP: true},
			)
		}
	}
}
