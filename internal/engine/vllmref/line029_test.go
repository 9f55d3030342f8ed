package vllmref

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func mustRankAt(t *testing.T, line, variant string, p Parallel) map[string]Tensor {
	t.Helper()
	cfg, hf := Checkpoint(variant, 7)
	out, err := RankAt(line, cfg, hf, p)
	if err != nil {
		t.Fatalf("%s on %s %+v: %v", variant, line, p, err)
	}
	return out
}

// runnerName is the name a v0.10.2 DeepSeek MoE tensor has under the MoERunner module tree.
func runnerName(old string) string {
	for _, r := range [][2]string{
		{".mlp.gate.weight", ".mlp.experts.gate.weight"},
		{".mlp.experts.e_score_correction_bias", ".mlp.experts.gate.e_score_correction_bias"},
		{".mlp.experts._shared_experts.", ".mlp.experts._shared_experts._layer."},
		{".mlp.experts.w", ".mlp.experts.routed_experts.w"},
	} {
		if strings.Contains(old, r[0]) {
			return strings.Replace(old, r[0], r[1], 1)
		}
	}
	return old
}

// Without sequence-parallel MoE, DeepSeek on "0.29" holds v0.10.2's tensors under the runner's
// names, plus the MLA attention's four scale buffers.
func TestLine029DeepSeekIsTheRunnerTree(t *testing.T) {
	for _, v := range []string{"deepseekv3", "deepseekv3-fp8"} {
		for _, p := range []Parallel{
			{TP: 1, DP: 1}, {TP: 2, TPRank: 1, DP: 1}, {TP: 4, TPRank: 2, DP: 1, EnableEP: true},
			{TP: 1, DP: 2, DPRank: 1, EnableEP: true}, {TP: 2, TPRank: 1, DP: 2, DPRank: 1},
		} {
			old, cur := mustRankAt(t, "0.10", v, p), mustRankAt(t, "0.29", v, p)
			for n, x := range old {
				if y, ok := cur[runnerName(n)]; !ok || !same(x, y) {
					t.Errorf("%s %+v: %s is not %s on 0.29 (present %v)", v, p, n, runnerName(n), ok)
				}
			}
			scales := 0
			for n := range cur {
				if strings.Contains(n, ".self_attn.mla_attn.mla_attn._") {
					scales++
				}
			}
			if len(cur) != len(old)+scales || scales != 2*4 {
				t.Errorf("%s %+v: %d tensors on 0.10, %d on 0.29, %d of them MLA scales", v, p, len(old), len(cur), scales)
			}
		}
	}
}

// With EP, TP > 1 and DP > 1 the shared experts are whole on every rank (disable_tp), while the
// routed experts still go whole over the TP x DP expert-parallel ranks.
func TestLine029SequenceParallelReplicatesSharedExperts(t *testing.T) {
	cfg, hf := Checkpoint("deepseekv3", 7)
	s := "model.layers.1.mlp.shared_experts."
	wantUp := CatRows(hf[s+"gate_proj.weight"], hf[s+"up_proj.weight"])
	for _, p := range []Parallel{
		{TP: 2, TPRank: 1, DP: 2, DPRank: 0, EnableEP: true}, {TP: 4, TPRank: 3, DP: 2, DPRank: 1, EnableEP: true},
	} {
		out, err := RankAt("0.29", cfg, hf, p)
		if err != nil {
			t.Fatal(err)
		}
		k := "model.layers.1.mlp.experts._shared_experts._layer."
		if !same(out[k+"gate_up_proj.weight"], wantUp) || !same(out[k+"down_proj.weight"], hf[s+"down_proj.weight"]) {
			t.Errorf("%+v: the shared experts are not whole", p)
		}
		if w := out["model.layers.1.mlp.experts.routed_experts.w13_weight"]; w.Shape[1] != 2*tinyMoE {
			t.Errorf("%+v: routed experts %v are split", p, w.Shape)
		}
	}
	out, err := RankAt("0.29", cfg, hf, Parallel{TP: 2, TPRank: 1, DP: 2, DPRank: 1})
	if err != nil {
		t.Fatal(err)
	}
	if w := out["model.layers.1.mlp.experts._shared_experts._layer.down_proj.weight"]; w.Shape[1] != tinyMoE/2 {
		t.Errorf("without EP the shared experts are TP-split: %v", w.Shape)
	}
}

func TestGLM4MoENamesAndDTypes(t *testing.T) {
	out := mustRankAt(t, "0.29", "glm4moe", Parallel{TP: 2, TPRank: 1, DP: 1})
	for n, dt := range map[string]string{
		"model.layers.0.mlp.gate_up_proj.weight":                                "BF16",
		"model.layers.0.self_attn.qkv_proj.bias":                                "BF16",
		"model.layers.0.self_attn.q_norm.weight":                                "BF16",
		"model.layers.0.self_attn.attn._prob_scale":                             "F32",
		"model.layers.1.mlp.gate.weight":                                        "F32",
		"model.layers.1.mlp.experts.routed_experts.e_score_correction_bias":     "F32",
		"model.layers.1.mlp.experts.routed_experts.w13_weight":                  "BF16",
		"model.layers.2.mlp.experts._shared_experts._layer.gate_up_proj.weight": "BF16",
		"model.layers.2.mlp.experts._shared_experts._layer.down_proj.weight":    "BF16",
		"lm_head.weight": "BF16",
	} {
		if x, ok := out[n]; !ok || x.DType != dt {
			t.Errorf("%s: %v %s, want %s", n, ok, x.DType, dt)
		}
	}
	for n := range out {
		if strings.Contains(n, "mlp.shared_experts.") || strings.Contains(n, "mlp.gate.e_score") ||
			strings.Contains(n, "o_proj.bias") {
			t.Errorf("%s should not be there", n)
		}
	}
	// The BF16 router becomes F32 exactly.
	cfg, hf := Checkpoint("glm4moe", 7)
	g, gate := hf["model.layers.1.mlp.gate.weight"], out["model.layers.1.mlp.gate.weight"]
	for i := 0; i < len(g.Data)/2; i++ {
		if uint32(binary.LittleEndian.Uint16(g.Data[2*i:]))<<16 != binary.LittleEndian.Uint32(gate.Data[4*i:]) {
			t.Fatalf("router element %d", i)
		}
	}
	// 24 query heads over TP 6: 4 a rank; 2 KV heads replicated 3 times.
	a := "model.layers.2.self_attn."
	var qs []Tensor
	for r := 0; r < 6; r++ {
		o, err := RankAt("0.29", cfg, hf, Parallel{TP: 6, TPRank: r, DP: 1})
		if err != nil {
			t.Fatal(err)
		}
		qkv := o[a+"qkv_proj.weight"]
		qs = append(qs, NarrowRows(qkv, 0, 4*newHeadDim, "q"))
		head := int64(r / 3)
		if !same(NarrowRows(qkv, 5*newHeadDim, newHeadDim, "v"),
			NarrowRows(hf[a+"v_proj.weight"], head*newHeadDim, newHeadDim, "v")) {
			t.Errorf("TP 6 rank %d: not V head %d", r, head)
		}
	}
	if !same(CatRows(qs...), hf[a+"q_proj.weight"]) {
		t.Error("TP 6: q rows do not reassemble")
	}
}

func TestGLM4MoEFP8ScalesFollowTheirBlocks(t *testing.T) {
	cfg, hf := Checkpoint("glm4moe-fp8", 7)
	a := "model.layers.1.self_attn."
	for _, tp := range []int{2, 4, 8} {
		var qScale []Tensor
		for r := 0; r < tp; r++ {
			out, err := RankAt("0.29", cfg, hf, Parallel{TP: tp, TPRank: r, DP: 1, EnableEP: true})
			if err != nil {
				t.Fatalf("TP %d: %v", tp, err)
			}
			w, s := out[a+"qkv_proj.weight"], out[a+"qkv_proj.weight_scale_inv"]
			qRows := int64(glmHeads / tp * newHeadDim)
			if w.DType != "F8_E4M3" || s.Shape[0] != (qRows+2*newHeadDim)/8 || s.Shape[1] != newHidden/8 {
				t.Fatalf("TP %d: qkv %s %v, scale %v", tp, w.DType, w.Shape, s.Shape)
			}
			qScale = append(qScale, NarrowRows(s, 0, qRows/8, "q"))
			head := int64(r / (tp / glmKV))
			if !same(NarrowRows(s, qRows/8, 1, "k"), NarrowRows(hf[a+"k_proj.weight_scale_inv"], head, 1, "k")) {
				t.Errorf("TP %d rank %d: k scale is not KV head %d's", tp, r, head)
			}
			if out["model.layers.1.mlp.gate.weight"].DType != "F32" {
				t.Error("the router is quantized")
			}
		}
		if !same(CatRows(qScale...), hf[a+"q_proj.weight_scale_inv"]) {
			t.Errorf("TP %d: q scales do not reassemble", tp)
		}
	}
	// Expert intermediate 96 over 8 MoE ranks is 12, not a multiple of the 8-row block.
	if _, err := RankAt("0.29", cfg, hf, Parallel{TP: 8, DP: 1}); err == nil || !strings.Contains(err.Error(), "block_n") {
		t.Errorf("TP 8 without EP: %v, want a block_n refusal", err)
	}
}

func TestGptOssNames(t *testing.T) {
	cfg, hf := Checkpoint("gptoss", 7)
	out, err := RankAt("0.29", cfg, hf, Parallel{TP: 4, TPRank: 3, DP: 1})
	if err != nil {
		t.Fatal(err)
	}
	a, m := "model.layers.1.attn.", "model.layers.1.mlp."
	if !same(out[a+"o_proj.bias"], hf["model.layers.1.self_attn.o_proj.bias"]) {
		t.Error("the o_proj bias is not whole")
	}
	if !same(out[a+"sinks"], NarrowRows(hf["model.layers.1.self_attn.sinks"], 36, 12, "sinks")) {
		t.Error("rank 3 of TP 4 does not hold sinks 36..47")
	}
	for _, n := range []string{
		"model.embedding.weight", a + "qkv_proj.weight", a + "qkv_proj.bias", a + "o_proj.weight", a + "attn._v_scale",
		m + "router.weight", m + "router.bias", m + "experts.routed_experts.w2_bias", "lm_head.weight",
	} {
		if _, ok := out[n]; !ok {
			t.Errorf("no %s", n)
		}
	}
	// Intermediate 96 is three MXFP4 blocks: TP 4 gives ranks 0-2 one block each and rank 3 none.
	for _, n := range []string{"w13_weight", "w13_weight_scale", "w13_bias", "w2_weight", "w2_weight_scale"} {
		if _, ok := out[m+"experts.routed_experts."+n]; ok {
			t.Errorf("rank 3 of 4 holds %s, but no intermediate block is left for it", n)
		}
	}
}

func TestDecodeMXFP4FollowsTransformersPacking(t *testing.T) {
	// Byte 0x2F: low nibble 0xF (-6) first, high nibble 0x2 (+1) second; scale 128 is 2^1.
	blocks := Tensor{DType: "U8", Shape: []int64{16}, Data: append([]byte{0x2F, 0x90}, make([]byte, 14)...)}
	got, err := DecodeMXFP4(blocks, Tensor{DType: "U8", Shape: []int64{1}, Data: []byte{128}})
	if err != nil {
		t.Fatal(err)
	}
	if got[0] != -12 || got[1] != 2 || got[2] != 0 || math.Signbit(got[2]) || got[3] != -1 {
		t.Errorf("decoded %v", got[:4])
	}
	if _, err := DecodeMXFP4(blocks, Tensor{DType: "U8", Data: []byte{1, 2}}); err == nil {
		t.Error("16 bytes with two scales decoded")
	}
}

// Decoded element by element, the ranks' MXFP4 experts reassemble the checkpoint's, and w2_bias is
// whole on the first MoE rank and zero on the others without EP.
func TestGptOssMXFP4ReassemblesByDecoding(t *testing.T) {
	cfg, hf := Checkpoint("gptoss", 7)
	for _, pd := range [][2]int{{1, 1}, {2, 1}, {4, 1}, {6, 1}, {8, 1}, {6, 2}, {8, 2}} {
		tp, dp := pd[0], pd[1]
		for _, ep := range []bool{false, true} {
			what := fmt.Sprintf("TP %d DP %d EP %v", tp, dp, ep)
			var ranks []map[string]Tensor
			for d := 0; d < dp; d++ {
				for r := 0; r < tp; r++ {
					out, err := RankAt("0.29", cfg, hf, Parallel{TP: tp, TPRank: r, DP: dp, DPRank: d, EnableEP: ep})
					if err != nil {
						t.Fatalf("%s: %v", what, err)
					}
					bias := out["model.layers.0.mlp.experts.routed_experts.w2_bias"]
					zero := bytes.Equal(bias.Data, make([]byte, len(bias.Data)))
					if first := d == 0 && r == 0; !ep && zero == first {
						t.Errorf("%s rank %d/%d: w2_bias zero %v", what, d, r, zero)
					}
					ranks = append(ranks, out)
				}
			}
			if err := GptOssExpertsReassemble(hf, "model.layers.0.mlp.experts.", ranks, ep); err != nil {
				t.Errorf("%s: %v", what, err)
			}
		}
	}
	// A rank's w13 rows swapped with another's no longer reassemble.
	ranks := make([]map[string]Tensor, 2)
	for r := range ranks {
		ranks[r], _ = RankAt("0.29", cfg, hf, Parallel{TP: 2, TPRank: r, DP: 1})
	}
	ranks[0], ranks[1] = ranks[1], ranks[0]
	if GptOssExpertsReassemble(hf, "model.layers.0.mlp.experts.", ranks, false) == nil {
		t.Error("swapped ranks reassemble")
	}
}

func TestLine010LeavesGLMAndGptOssUnmodelled(t *testing.T) {
	for _, variant := range []string{"glm4moe", "glm4moe-fp8", "gptoss"} {
		cfg, hf := Checkpoint(variant, 7)
		_, err := RankAt("0.10", cfg, hf, Parallel{TP: 1, DP: 1})
		var u Unmodelled
		if !errors.As(err, &u) {
			t.Errorf("%s on 0.10: %v, want Unmodelled", variant, err)
		}
	}
}

// runnerNameOf is the name a v0.10.2 tensor of a Mixtral, Qwen2-MoE or Qwen3-MoE variant has under
// the MoERunner module tree: the experts under routed_experts, Qwen3-MoE's router (passed as gate=)
// under the runner, Qwen2-MoE's shared expert and its gate under the runner's SharedExperts.
func runnerNameOf(arch, old string) string {
	renames := [][2]string{
		{".block_sparse_moe.experts.w", ".block_sparse_moe.experts.routed_experts.w"},
		{".mlp.experts.w", ".mlp.experts.routed_experts.w"},
	}
	switch strings.TrimSuffix(arch, "-wide") {
	case "qwen3moe":
		renames = append(renames, [2]string{".mlp.gate.weight", ".mlp.experts.gate.weight"})
	case "qwen2moe":
		renames = append(renames,
			[2]string{".mlp.shared_expert_gate.", ".mlp.experts._shared_experts._layer.expert_gate."},
			[2]string{".mlp.shared_expert.", ".mlp.experts._shared_experts._layer."})
	}
	for _, r := range renames {
		if strings.Contains(old, r[0]) {
			return strings.Replace(old, r[0], r[1], 1)
		}
	}
	return old
}

// Mixtral, Qwen2-MoE and Qwen3-MoE on "0.29" hold v0.10.2's tensors under the runner's names, and
// the four attention scale buffers of each layer; sequence-parallel MoE (EP, TP 2, DP 2) changes
// nothing for them.
func TestLine029QwenAndMixtralAreTheRunnerTree(t *testing.T) {
	for _, v := range []string{"mixtral", "qwen2moe", "qwen3moe", "mixtral-wide", "qwen2moe-wide", "qwen3moe-wide"} {
		cfg, _ := Checkpoint(v, 7)
		layers := ParseConfig(cfg).Int("num_hidden_layers")
		for _, p := range []Parallel{
			{TP: 1, DP: 1}, {TP: 2, TPRank: 1, DP: 1}, {TP: 4, TPRank: 2, DP: 1, EnableEP: true},
			{TP: 1, DP: 2, DPRank: 1, EnableEP: true}, {TP: 2, TPRank: 1, DP: 2, DPRank: 1, EnableEP: true},
		} {
			old, cur := mustRankAt(t, "0.10", v, p), mustRankAt(t, "0.29", v, p)
			for n, x := range old {
				if y, ok := cur[runnerNameOf(v, n)]; !ok || !same(x, y) {
					t.Errorf("%s %+v: %s is not %s on 0.29 (present %v)", v, p, n, runnerNameOf(v, n), ok)
				}
			}
			scales := 0
			for n := range cur {
				if strings.Contains(n, ".self_attn.attn._") {
					scales++
				}
			}
			if len(cur) != len(old)+scales || scales != int(layers)*4 {
				t.Errorf("%s %+v: %d tensors on 0.10, %d on 0.29, %d of them scales", v, p, len(old), len(cur), scales)
			}
		}
	}
}

// EPLB's redundant experts: Mixtral and Qwen3-MoE take them, Qwen2-MoE (no MixtureOfExperts) not.
func TestLine029EPLBForMixtralAndQwen3MoE(t *testing.T) {
	// 10 experts and 2 redundant over EP 4: 3 slots a rank; slots 10 and 11 hold experts 0 and 1.
	want := [][]int64{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 0, 1}}
	for _, c := range []struct{ variant, layer, proj string }{
		{"qwen3moe", "model.layers.1.", "mlp"}, {"mixtral", "model.layers.0.", "block_sparse_moe"},
	} {
		cfg, hf := Checkpoint(c.variant, 7)
		for r := 0; r < 4; r++ {
			out, err := RankAt("0.29", cfg, hf, Parallel{TP: 4, TPRank: r, DP: 1, EnableEP: true, RedundantExperts: 2})
			if err != nil {
				t.Fatalf("%s: %v", c.variant, err)
			}
			w13 := out[c.layer+c.proj+".experts.routed_experts.w13_weight"]
			var held []int64
			for j := int64(0); j < w13.Shape[0]; j++ {
				for e := int64(0); e < 10; e++ {
					x := fmt.Sprintf("%s%s.experts.%d.", c.layer, c.proj, e)
					g, u := hf[x+"gate_proj.weight"], hf[x+"up_proj.weight"]
					if c.variant == "mixtral" {
						g, u = hf[x+"w1.weight"], hf[x+"w3.weight"]
					}
					if same(expert(w13, j), CatRows(g, u)) {
						held = append(held, e)
					}
				}
			}
			if !slices.Equal(held, want[r]) {
				t.Errorf("%s rank %d holds experts %v, want %v", c.variant, r, held, want[r])
			}
		}
	}
	cfg, hf := Checkpoint("qwen2moe", 7)
	if _, err := RankAt("0.29", cfg, hf, Parallel{TP: 4, DP: 1, EnableEP: true, RedundantExperts: 2}); err == nil {
		t.Error("Qwen2-MoE took redundant experts")
	}
}

// withConfig is a variant's checkpoint with config.json keys changed.
func withConfig(t *testing.T, variant string, set map[string]any) ([]byte, map[string]Tensor) {
	t.Helper()
	cfg, hf := Checkpoint(variant, 7)
	var m map[string]any
	if err := json.Unmarshal(cfg, &m); err != nil {
		t.Fatal(err)
	}
	for k, v := range set {
		m[k] = v
	}
	cfg, err := json.Marshal(m)
	if err != nil {
		t.Fatal(err)
	}
	return cfg, hf
}

// heldExperts lists which logical expert each local slot of a rank's w13 holds, by comparing the
// bytes with every checkpoint expert's [gate; up] (-1 for none).
func heldExperts(t *testing.T, out, hf map[string]Tensor, layer string) []int64 {
	t.Helper()
	w13, ok := out[layer+"mlp.experts.routed_experts.w13_weight"]
	if !ok {
		return nil
	}
	var held []int64
	for j := int64(0); j < w13.Shape[0]; j++ {
		who := int64(-1)
		for e := int64(0); ; e++ {
			x := fmt.Sprintf("%smlp.experts.%d.", layer, e)
			if _, ok := hf[x+"gate_proj.weight"]; !ok {
				break
			}
			if same(expert(w13, j), CatRows(hf[x+"gate_proj.weight"], hf[x+"up_proj.weight"])) {
				who = e
			}
		}
		held = append(held, who)
	}
	return held
}

func TestLine029RedundantExpertsTakeTheLastSlots(t *testing.T) {
	cfg, hf := Checkpoint("deepseekv3", 7)
	l := "model.layers.1."
	// 10 experts and 2 redundant over EP 4: 3 slots a rank; slots 10 and 11 hold experts 0 and 1.
	want := [][]int64{{0, 1, 2}, {3, 4, 5}, {6, 7, 8}, {9, 0, 1}}
	for r := 0; r < 4; r++ {
		out, err := RankAt("0.29", cfg, hf, Parallel{TP: 4, TPRank: r, DP: 1, EnableEP: true, RedundantExperts: 2})
		if err != nil {
			t.Fatal(err)
		}
		if got := heldExperts(t, out, hf, l); !slices.Equal(got, want[r]) {
			t.Errorf("rank %d holds experts %v, want %v", r, got, want[r])
		}
	}
	for _, c := range []struct {
		p    Parallel
		want string
	}{
		{Parallel{TP: 4, DP: 1, EnableEP: true, RedundantExperts: 1}, "even distribution"},
		{Parallel{TP: 2, DP: 1, RedundantExperts: 2}, "requires expert parallelism"},
	} {
		if _, err := RankAt("0.29", cfg, hf, c.p); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.p, err, c.want)
		}
	}
	gcfg, ghf := Checkpoint("gptoss", 7)
	if _, err := RankAt("0.29", gcfg, ghf, Parallel{TP: 2, DP: 1, EnableEP: true, RedundantExperts: 2}); err == nil {
		t.Error("gpt-oss took redundant experts")
	}
	if _, err := RankAt("0.10", cfg, hf, Parallel{TP: 4, DP: 1, EnableEP: true, RedundantExperts: 2}); err == nil {
		t.Error("0.10 models EPLB")
	}
}

func TestLine029RoundRobinOnlyWhereVLLMAllowsIt(t *testing.T) {
	grouped, hf := withConfig(t, "deepseekv3", map[string]any{"n_group": 2, "topk_group": 1})
	plain, _ := Checkpoint("deepseekv3", 7)
	l := "model.layers.1."
	for _, c := range []struct {
		cfg  []byte
		p    Parallel
		want []int64
	}{
		{grouped, Parallel{TP: 4, TPRank: 1, DP: 1, EnableEP: true, RoundRobin: true}, []int64{1, 5, 9}},
		{grouped, Parallel{TP: 4, TPRank: 3, DP: 1, EnableEP: true, RoundRobin: true}, []int64{3, 7}},
		// Linear again: DP > 1 (all2all kernels on the default backend), one expert group, EPLB.
		{grouped, Parallel{TP: 2, TPRank: 1, DP: 2, EnableEP: true, RoundRobin: true}, []int64{3, 4, 5}},
		{plain, Parallel{TP: 4, TPRank: 1, DP: 1, EnableEP: true, RoundRobin: true}, []int64{3, 4, 5}},
		{grouped, Parallel{TP: 4, TPRank: 1, DP: 1, EnableEP: true, RoundRobin: true, RedundantExperts: 2},
			[]int64{3, 4, 5}},
	} {
		out, err := RankAt("0.29", c.cfg, hf, c.p)
		if err != nil {
			t.Fatal(err)
		}
		if got := heldExperts(t, out, hf, l); !slices.Equal(got, c.want) {
			t.Errorf("%+v: experts %v, want %v", c.p, got, c.want)
		}
	}
}

// Prefill-context parallelism splits the experts over DP x PCP x TP and leaves attention to TP.
func TestLine029PrefillContextParallelism(t *testing.T) {
	cfg, hf := Checkpoint("deepseekv3", 7)
	tp2, err := RankAt("0.29", cfg, hf, Parallel{TP: 2, TPRank: 1, DP: 1})
	if err != nil {
		t.Fatal(err)
	}
	var w2s []Tensor
	for pr := 0; pr < 2; pr++ {
		for r := 0; r < 2; r++ {
			out, err := RankAt("0.29", cfg, hf, Parallel{TP: 2, TPRank: r, DP: 1, PCP: 2, PCPRank: pr})
			if err != nil {
				t.Fatal(err)
			}
			w2s = append(w2s, expert(out["model.layers.1.mlp.experts.routed_experts.w2_weight"], 3))
			a := "model.layers.1.self_attn.mla_attn.o_proj.weight"
			if r == 1 && !same(out[a], tp2[a]) {
				t.Errorf("PCP rank %d: attention differs from TP 2 rank 1", pr)
			}
		}
	}
	if !same(catCols(w2s...), hf["model.layers.1.mlp.experts.3.down_proj.weight"]) {
		t.Error("the pcp_rank * TP + tp_rank slabs do not reassemble expert 3")
	}
	if _, err := RankAt("0.10", cfg, hf, Parallel{TP: 2, DP: 1, PCP: 2}); err == nil {
		t.Error("0.10 models PCP")
	}
}

func TestWideDeepSeekAllowsTP6(t *testing.T) {
	cfg, hf := Checkpoint("deepseekv3-wide", 7)
	var qs []Tensor
	for r := 0; r < 6; r++ {
		out, err := RankAt("0.29", cfg, hf, Parallel{TP: 6, TPRank: r, DP: 2, DPRank: 1, EnableEP: true})
		if err != nil {
			t.Fatal(err)
		}
		qs = append(qs, out["model.layers.1.self_attn.mla_attn.q_proj.weight"])
		// EP 12 over 12 experts: one each, rank 6 + r of the flattened group.
		if got := heldExperts(t, out, hf, "model.layers.1."); !slices.Equal(got, []int64{int64(6 + r)}) {
			t.Errorf("rank %d holds %v", r, got)
		}
	}
	if !same(CatRows(qs...), hf["model.layers.1.self_attn.q_proj.weight"]) {
		t.Error("q_proj rows do not reassemble at TP 6")
	}
}
