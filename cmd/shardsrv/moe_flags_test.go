package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// moeCheckpoint is a DeepSeek-V3 checkpoint whose experts vLLM balances (EPLB) and groups (the
// round-robin placement applies).
const moeCheckpoint = "deepseekv3-wide"

// putCheckpoint writes vllmref's checkpoint variant beside the example checkpoint in the live
// server's store, under the variant's name, and returns its config and tensors.
func putCheckpoint(t *testing.T, folder, variant string) ([]byte, map[string]vllmref.Tensor) {
	t.Helper()
	cfg, tensors := vllmref.Checkpoint(variant, 7)
	dir := filepath.Join(filepath.Dir(folder), variant)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
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
	var body bytes.Buffer
	if err := safetensors.Write(&body, data, nil); err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"config.json": cfg, "model.safetensors": body.Bytes()} {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	return cfg, tensors
}

// TestLayoutPassesVLLMsMoEOptions: each of vLLM's MoE flags reaches the server as the layout field
// of the same name, unchanged — the table printed is /v1/layouts' for the layout object written out
// here, and differs from the one without the option — and what the server refuses comes back as its
// 422, pointing at the field the flag set.
func TestLayoutPassesVLLMsMoEOptions(t *testing.T) {
	url, folder := live(t)
	putCheckpoint(t, folder, moeCheckpoint)
	c := api.NewClient(url)
	i64 := func(v int64) *int64 { return &v }
	yes := true
	rr := api.EngineLayoutExpertPlacementStrategy("round_robin")
	layoutOf := func(tp, rank int64, set func(*api.EngineLayout)) api.EngineLayout {
		l := api.EngineLayout{Engine: api.Vllm, TensorParallelSize: &tp, TpRank: &rank, EnableExpertParallel: &yes}
		if set != nil {
			set(&l)
		}
		return l
	}
	for _, tc := range []struct {
		args     []string
		tp, rank int64
		set      func(*api.EngineLayout)
	}{
		{[]string{"--tp", "2", "--rank", "1", "--enable-eplb", "--num-redundant-experts", "4"}, 2, 1,
			func(l *api.EngineLayout) { l.EnableEplb, l.NumRedundantExperts = &yes, i64(4) }},
		{[]string{"--tp", "4", "--rank", "1", "--expert-placement-strategy", "round_robin"}, 4, 1,
			func(l *api.EngineLayout) { l.ExpertPlacementStrategy = &rr }},
		{[]string{"--tp", "2", "--rank", "1", "--prefill-context-parallel-size", "2", "--pcp-rank", "1"}, 2, 1,
			func(l *api.EngineLayout) { l.PrefillContextParallelSize, l.PcpRank = i64(2), i64(1) }},
		{[]string{"--tp", "2", "--rank", "0", "--engine-version", "0.29", "--enable-eplb",
			"--num-redundant-experts", "4", "--prefill-context-parallel-size", "2", "--pcp-rank", "1"}, 2, 0,
			func(l *api.EngineLayout) {
				v := "0.29"
				l.EngineVersion, l.EnableEplb, l.NumRedundantExperts = &v, &yes, i64(4)
				l.PrefillContextParallelSize, l.PcpRank = i64(2), i64(1)
			}},
	} {
		var out, errs bytes.Buffer
		args := append([]string{"--server", url, "--checkpoint", moeCheckpoint, "--ep"}, tc.args...)
		if err := layoutCmd(args, &out, &errs); err != nil {
			t.Fatalf("%v: %v %s", tc.args, err, errs.String())
		}
		var req api.ShardRequest
		if err := json.Unmarshal(out.Bytes(), &req); err != nil {
			t.Fatal(err)
		}
		want, err := c.Layout(context.Background(), moeCheckpoint, layoutOf(tc.tp, tc.rank, tc.set))
		if err != nil {
			t.Fatal(err)
		}
		plain, err := c.Layout(context.Background(), moeCheckpoint, layoutOf(tc.tp, tc.rank, nil))
		if err != nil {
			t.Fatal(err)
		}
		if !reflect.DeepEqual(req.Tensors, want.Tensors) {
			t.Errorf("%v: the table is not /v1/layouts' for the layout with the options", tc.args)
		}
		if reflect.DeepEqual(req.Tensors, plain.Tensors) {
			t.Errorf("%v: the table is the one without the options: they did not reach the server", tc.args)
		}
	}

	for _, tc := range []struct {
		ckpt    string
		args    []string
		pointer string
	}{
		{example.Name, []string{"--tp", "2", "--ep", "--enable-eplb"}, "/layout/enable_eplb"}, // Qwen2-MoE is not balanced
		{moeCheckpoint, []string{"--tp", "2", "--ep", "--num-redundant-experts", "2"}, "/layout/num_redundant_experts"},
		{moeCheckpoint, []string{"--tp", "2", "--ep", "--expert-placement-strategy", "zigzag"},
			"/layout/expert_placement_strategy"},
		{moeCheckpoint, []string{"--tp", "2", "--dp", "2", "--prefill-context-parallel-size", "2"},
			"/layout/prefill_context_parallel_size"},
		{moeCheckpoint, []string{"--tp", "2", "--prefill-context-parallel-size", "2", "--pcp-rank", "2"},
			"/layout/pcp_rank"},
	} {
		var out, errs bytes.Buffer
		err := layoutCmd(append([]string{"--server", url, "--checkpoint", tc.ckpt}, tc.args...), &out, &errs)
		var p *api.ProblemError
		if !errors.As(err, &p) || p.Status != 422 || p.Errors == nil ||
			!slices.ContainsFunc(*p.Errors, func(e api.FieldError) bool { return e.Pointer == tc.pointer }) {
			t.Errorf("%s %v: %v, want the server's 422 at %s", tc.ckpt, tc.args, err, tc.pointer)
		}
	}
	if err := layoutCmd([]string{"--server", url, "--checkpoint", moeCheckpoint, "--enable-eplb=maybe"},
		&bytes.Buffer{}, &bytes.Buffer{}); err == nil {
		t.Error("--enable-eplb=maybe was accepted")
	}
}

// TestFetchSendsVLLMsMoEOptions: fetch --out sends the MoE flags in every rank's layout (as each
// rank file's record keeps the request), and each rank file holds that layout's tensors.
func TestFetchSendsVLLMsMoEOptions(t *testing.T) {
	url, folder := live(t)
	putCheckpoint(t, folder, moeCheckpoint)
	dir := filepath.Join(t.TempDir(), "out")
	var errs bytes.Buffer
	if err := fetch([]string{"--server", url, "--checkpoint", moeCheckpoint, "--layout", "vllm", "--tp", "2",
		"--rank", "all", "--ep", "--enable-eplb", "--num-redundant-experts", "2", "--out", dir},
		&bytes.Buffer{}, &errs); err != nil {
		t.Fatalf("%v %s", err, errs.String())
	}
	for r := range int64(2) {
		name := "model-rank-" + string(rune('0'+r)) + "-part-0.safetensors"
		raw, err := os.ReadFile(filepath.Join(dir, recordName(name)))
		if err != nil {
			t.Fatal(err)
		}
		var rec struct {
			Request struct {
				Layout map[string]any `json:"layout"`
			} `json:"request"`
		}
		if err := json.Unmarshal(raw, &rec); err != nil {
			t.Fatal(err)
		}
		want := map[string]any{"engine": "vllm", "tensor_parallel_size": 2.0, "tp_rank": float64(r),
			"data_parallel_size": 1.0, "dp_rank": 0.0, "enable_expert_parallel": true, "enable_eplb": true,
			"num_redundant_experts": 2.0}
		if !reflect.DeepEqual(rec.Request.Layout, want) {
			t.Errorf("rank %d was fetched with layout %v, want %v", r, rec.Request.Layout, want)
		}
		tp, yes, two := int64(2), true, int64(2)
		table, err := api.NewClient(url).Layout(context.Background(), moeCheckpoint, api.EngineLayout{
			Engine: api.Vllm, TensorParallelSize: &tp, TpRank: &r, EnableExpertParallel: &yes, EnableEplb: &yes,
			NumRedundantExperts: &two})
		if err != nil {
			t.Fatal(err)
		}
		stored, _ := readSafetensors(t, filepath.Join(dir, name))
		for _, tr := range table.Tensors {
			if e, ok := stored[tr.Name]; !ok || !slices.Equal(e.Shape, tr.Shape) {
				t.Errorf("rank %d: %s %v is not in the file as the layout has it", r, tr.Name, tr.Shape)
			}
		}
		if len(stored) != len(table.Tensors) {
			t.Errorf("rank %d: the file holds %d tensors, the layout %d", r, len(stored), len(table.Tensors))
		}
	}
}
