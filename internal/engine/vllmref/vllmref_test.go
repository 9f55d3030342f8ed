package vllmref

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
	"testing"
)

func mustRank(t *testing.T, variant string, p Parallel) map[string]Tensor {
	t.Helper()
	cfg, ts := Checkpoint(variant, 7)
	out, err := Rank(cfg, ts, p)
	if err != nil {
		t.Fatalf("%s %+v: %v", variant, p, err)
	}
	return out
}

func same(a, b Tensor) bool {
	return a.DType == b.DType && slices.Equal(a.Shape, b.Shape) && bytes.Equal(a.Data, b.Data)
}

// catCols is torch.cat(ts, dim=1) of 2-D tensors, written independently of narrowCols.
func catCols(ts ...Tensor) Tensor {
	es := ElemSize(ts[0].DType)
	rows := ts[0].Shape[0]
	var cols int64
	for _, t := range ts {
		cols += t.Shape[1]
	}
	out := Tensor{DType: ts[0].DType, Shape: []int64{rows, cols}}
	for r := int64(0); r < rows; r++ {
		for _, t := range ts {
			w := t.Shape[1] * es
			out.Data = append(out.Data, t.Data[r*w:(r+1)*w]...)
		}
	}
	return out
}

// half splits rows [0, n/2) and [n/2, n) of a tensor.
func half(t Tensor) (Tensor, Tensor) {
	n := t.Shape[0] / 2
	return NarrowRows(t, 0, n, "a"), NarrowRows(t, n, n, "b")
}

// expert returns expert e of a stacked [E, ...] tensor.
func expert(t Tensor, e int64) Tensor {
	s := NarrowRows(t, e, 1, "expert")
	s.Shape = s.Shape[1:]
	return s
}

func TestCheckpointsAreSmallAndDeterministic(t *testing.T) {
	for _, v := range slices.Concat(Variants, SparseMoEVariants) {
		cfg, ts := Checkpoint(v, 1)
		var size int
		for _, x := range ts {
			x.check()
			size += len(x.Data)
		}
		if size > 2<<20 {
			t.Errorf("%s: %d bytes", v, size)
		}
		if !json.Valid(cfg) {
			t.Errorf("%s: config.json is not JSON", v)
		}
		cfg2, ts2 := Checkpoint(v, 1)
		_, ts3 := Checkpoint(v, 2)
		if !bytes.Equal(cfg, cfg2) || len(ts) != len(ts2) {
			t.Errorf("%s: not deterministic", v)
		}
		for n, x := range ts {
			if !same(x, ts2[n]) {
				t.Errorf("%s: %s differs for the same seed", v, n)
			}
		}
		if same(ts["model.embed_tokens.weight"], ts3["model.embed_tokens.weight"]) {
			t.Errorf("%s: seeds 1 and 2 give the same embedding", v)
		}
	}
}

// Every variant works at TP 1, 2 and 4.
func TestEveryVariantShardsAtSmallTP(t *testing.T) {
	for _, v := range Variants {
		cfg, hf := Checkpoint(v, 7)
		for _, tp := range []int{1, 2, 4} {
			for r := 0; r < tp; r++ {
				out, err := Rank(cfg, hf, Parallel{TP: tp, TPRank: r, DP: 1})
				if err != nil || len(out) == 0 {
					t.Fatalf("%s TP %d rank %d: %d tensors, %v", v, tp, r, len(out), err)
				}
			}
		}
	}
}

func TestColumnAndRowSlabsReassemble(t *testing.T) {
	cfg, hf := Checkpoint("llama", 7)
	for _, tp := range []int{2, 4, 8} {
		var gates, ups, downs, os, qs, embeds []Tensor
		for r := 0; r < tp; r++ {
			out, err := Rank(cfg, hf, Parallel{TP: tp, TPRank: r, DP: 1})
			if err != nil {
				t.Fatal(err)
			}
			g, u := half(out["model.layers.1.mlp.gate_up_proj.weight"])
			gates, ups = append(gates, g), append(ups, u)
			downs = append(downs, out["model.layers.1.mlp.down_proj.weight"])
			os = append(os, out["model.layers.1.self_attn.o_proj.weight"])
			qkv := out["model.layers.1.self_attn.qkv_proj.weight"]
			qRows := int64(tinyHeads / tp * tinyHeadDim)
			qs = append(qs, NarrowRows(qkv, 0, qRows, "q"))
			embeds = append(embeds, out["model.embed_tokens.weight"])
		}
		l := "model.layers.1."
		for name, c := range map[string]struct{ got, want Tensor }{
			"gate": {CatRows(gates...), hf[l+"mlp.gate_proj.weight"]},
			"up":   {CatRows(ups...), hf[l+"mlp.up_proj.weight"]},
			"down": {catCols(downs...), hf[l+"mlp.down_proj.weight"]},
			"o":    {catCols(os...), hf[l+"self_attn.o_proj.weight"]},
			"q":    {CatRows(qs...), hf[l+"self_attn.q_proj.weight"]},
		} {
			if !same(c.got, c.want) {
				t.Errorf("TP %d: the ranks' %s slabs do not reassemble the checkpoint tensor", tp, name)
			}
		}
		emb := CatRows(embeds...)
		if emb.Shape[0] != 1152 {
			t.Errorf("TP %d: padded vocab %d, want 1152 (1100 rounded up to 64)", tp, emb.Shape[0])
		}
		if !same(NarrowRows(emb, 0, tinyVocab, "e"), hf["model.embed_tokens.weight"]) {
			t.Errorf("TP %d: embedding rows differ", tp)
		}
		if pad := NarrowRows(emb, tinyVocab, 1152-tinyVocab, "pad"); !bytes.Equal(
			pad.Data,
			make([]byte, len(pad.Data)),
		) {
			t.Errorf("TP %d: padding rows are not zero", tp)
		}
	}
}

func TestKVHeadsReplicateWhenTPExceedsThem(t *testing.T) {
	cfg, hf := Checkpoint("llama", 7)
	k := hf["model.layers.0.self_attn.k_proj.weight"]
	v := hf["model.layers.0.self_attn.v_proj.weight"]
	for _, tp := range []int{4, 8} {
		for r := 0; r < tp; r++ {
			out, err := Rank(cfg, hf, Parallel{TP: tp, TPRank: r, DP: 1})
			if err != nil {
				t.Fatal(err)
			}
			qkv := out["model.layers.0.self_attn.qkv_proj.weight"]
			qRows := int64(tinyHeads / tp * tinyHeadDim)
			if qkv.Shape[0] != qRows+2*tinyHeadDim {
				t.Fatalf("TP %d: qkv rows %d, want %d q rows and one K and one V head", tp, qkv.Shape[0], qRows)
			}
			head := int64(r / (tp / tinyKV)) // rank r holds KV head r // (TP / num_kv_heads)
			wantK := NarrowRows(k, head*tinyHeadDim, tinyHeadDim, "k")
			wantV := NarrowRows(v, head*tinyHeadDim, tinyHeadDim, "v")
			if !same(NarrowRows(qkv, qRows, tinyHeadDim, "k"), wantK) ||
				!same(NarrowRows(qkv, qRows+tinyHeadDim, tinyHeadDim, "v"), wantV) {
				t.Errorf("TP %d rank %d does not hold KV head %d", tp, r, head)
			}
		}
	}
}

func TestQwen2BiasesFuseLikeWeights(t *testing.T) {
	cfg, hf := Checkpoint("qwen2", 7)
	hd := int64(tinyHidden / tinyHeads)
	for r := 0; r < 4; r++ {
		out, err := Rank(cfg, hf, Parallel{TP: 4, TPRank: r, DP: 1})
		if err != nil {
			t.Fatal(err)
		}
		a := "model.layers.1.self_attn."
		head := int64(r / 2)
		want := CatRows(
			NarrowRows(hf[a+"q_proj.bias"], int64(r)*2*hd, 2*hd, "q"),
			NarrowRows(hf[a+"k_proj.bias"], head*hd, hd, "k"),
			NarrowRows(hf[a+"v_proj.bias"], head*hd, hd, "v"))
		if !same(out[a+"qkv_proj.bias"], want) {
			t.Errorf("rank %d: qkv bias", r)
		}
		if out[a+"qkv_proj.weight"].DType != "F16" {
			t.Errorf("qwen2 runs in float16, got %s", out[a+"qkv_proj.weight"].DType)
		}
	}
}

// With EP every expert lives on exactly one of the TP x DP ranks, whole (MoE tp_size 1), in the
// linear placement with the first E % EP ranks holding one more.
func TestExpertParallelPlacesEveryExpertOnce(t *testing.T) {
	type moe struct {
		variant, prefix, hfPrefix string
		gate, up, down            string
	}
	for _, m := range []moe{
		{
			"mixtral", "model.layers.1.block_sparse_moe.experts", "model.layers.1.block_sparse_moe.experts.%d.",
			"w1", "w3", "w2",
		},
		{"qwen3moe", "model.layers.1.mlp.experts", "model.layers.1.mlp.experts.%d.", "gate_proj", "up_proj", "down_proj"},
		{"deepseekv3", "model.layers.1.mlp.experts", "model.layers.1.mlp.experts.%d.", "gate_proj", "up_proj", "down_proj"},
	} {
		cfg, hf := Checkpoint(m.variant, 7)
		for _, pd := range [][2]int{{2, 1}, {4, 1}, {8, 1}, {1, 2}, {2, 2}, {4, 2}} {
			tp, dp := pd[0], pd[1]
			ep := int64(tp * dp)
			seen := map[int64]int{}
			next := int64(0)
			for d := 0; d < dp; d++ {
				for r := 0; r < tp; r++ {
					out, err := Rank(cfg, hf, Parallel{TP: tp, TPRank: r, DP: dp, DPRank: d, EnableEP: true})
					if err != nil {
						t.Fatalf("%s TP %d DP %d: %v", m.variant, tp, dp, err)
					}
					flat := int64(d*tp + r)
					want := tinyExperts / ep
					if flat < tinyExperts%ep {
						want++
					}
					w13, ok := out[m.prefix+".w13_weight"]
					if !ok {
						t.Fatalf("%s: rank %d holds no experts", m.variant, flat)
					}
					if w13.Shape[0] != want {
						t.Errorf("%s EP %d rank %d: %d experts, want %d", m.variant, ep, flat, w13.Shape[0], want)
					}
					for j := int64(0); j < w13.Shape[0]; j++ {
						e := next
						next++
						seen[e]++
						x := fmt.Sprintf(m.hfPrefix, e)
						if !same(expert(w13, j), CatRows(hf[x+m.gate+".weight"], hf[x+m.up+".weight"])) {
							t.Errorf(
								"%s EP %d rank %d: local expert %d is not [w1; w3] of expert %d",
								m.variant,
								ep,
								flat,
								j,
								e,
							)
						}
						if !same(expert(out[m.prefix+".w2_weight"], j), hf[x+m.down+".weight"]) {
							t.Errorf(
								"%s EP %d rank %d: local expert %d is not w2 of expert %d",
								m.variant,
								ep,
								flat,
								j,
								e,
							)
						}
					}
				}
			}
			if int64(len(seen)) != tinyExperts || next != tinyExperts {
				t.Errorf("%s EP %d: experts placed %v", m.variant, ep, seen)
			}
		}
	}
}

// Without EP the MoE layers split every expert over TP x DP ranks (flatten_tp_across_dp), while
// attention is split over TP only and replicated over DP.
func TestMoETensorParallelFlattensDP(t *testing.T) {
	cfg, hf := Checkpoint("mixtral", 7)
	const tp, dp = 2, 2
	var w2s, w1s []Tensor
	attn := map[int]Tensor{}
	for d := 0; d < dp; d++ {
		for r := 0; r < tp; r++ {
			out, err := Rank(cfg, hf, Parallel{TP: tp, TPRank: r, DP: dp, DPRank: d})
			if err != nil {
				t.Fatal(err)
			}
			w13 := out["model.layers.0.block_sparse_moe.experts.w13_weight"]
			if w13.Shape[0] != tinyExperts || w13.Shape[1] != 2*tinyMoE/(tp*dp) {
				t.Fatalf("w13 shape %v", w13.Shape)
			}
			g, _ := half(expert(w13, 3))
			w1s = append(w1s, g)
			w2s = append(w2s, expert(out["model.layers.0.block_sparse_moe.experts.w2_weight"], 3))
			qkv := out["model.layers.0.self_attn.qkv_proj.weight"]
			if prev, ok := attn[r]; ok && !same(prev, qkv) {
				t.Errorf("DP replicas of TP rank %d differ in attention", r)
			}
			attn[r] = qkv
		}
	}
	x := "model.layers.0.block_sparse_moe.experts.3."
	if !same(CatRows(w1s...), hf[x+"w1.weight"]) || !same(catCols(w2s...), hf[x+"w2.weight"]) {
		t.Error("the flattened (dp_rank * TP + tp_rank) MoE slabs do not reassemble expert 3")
	}
}

func TestRanksWithoutExpertsHoldNone(t *testing.T) {
	cfg, hf := Checkpoint("mixtral", 7)
	var m map[string]any
	json.Unmarshal(cfg, &m)
	m["num_local_experts"] = 6
	m["architectures"] = []string{"MixtralForCausalLM"}
	cfg, _ = json.Marshal(m)
	for l := 0; l < 2; l++ {
		hf[fmt.Sprintf("model.layers.%d.block_sparse_moe.gate.weight", l)] = NarrowRows(
			hf[fmt.Sprintf("model.layers.%d.block_sparse_moe.gate.weight", l)],
			0,
			6,
			"gate",
		)
	}
	for r := 0; r < 8; r++ {
		out, err := Rank(cfg, hf, Parallel{TP: 8, TPRank: r, DP: 1, EnableEP: true})
		if err != nil {
			t.Fatal(err)
		}
		_, has := out["model.layers.0.block_sparse_moe.experts.w13_weight"]
		if has != (r < 6) {
			t.Errorf("EP 8 over 6 experts: rank %d holds experts: %v", r, has)
		}
		if _, ok := out["model.layers.0.block_sparse_moe.gate.weight"]; !ok {
			t.Errorf("rank %d lost the router", r)
		}
	}
}

func TestTiedEmbeddingsSaveAsLMHead(t *testing.T) {
	cfg, hf := Checkpoint("llama-tied", 7)
	if _, ok := hf["lm_head.weight"]; ok {
		t.Fatal("a tied checkpoint carries no lm_head")
	}
	out, err := Rank(cfg, hf, Parallel{TP: 8, TPRank: 7, DP: 1})
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := out["model.embed_tokens.weight"]; ok {
		t.Error("_filter_subtensors keeps only the smaller name, lm_head.weight")
	}
	want := PadRows(NarrowRows(hf["model.embed_tokens.weight"], 7*144, tinyVocab-7*144, "e"), 144)
	if !same(out["lm_head.weight"], want) {
		t.Error("lm_head of the last rank is not its 92 embedding rows and 52 zero rows")
	}
}

func TestDeepSeekNamesAndDTypes(t *testing.T) {
	out := mustRank(t, "deepseekv3-fp8", Parallel{TP: 2, TPRank: 1, DP: 1})
	want := map[string]string{
		"model.layers.0.self_attn.fused_qkv_a_proj.weight":                      "F8_E4M3",
		"model.layers.0.self_attn.fused_qkv_a_proj.weight_scale_inv":            "F32",
		"model.layers.0.self_attn.mla_attn.q_a_layernorm.weight":                "BF16",
		"model.layers.0.self_attn.mla_attn.q_b_proj.weight":                     "F8_E4M3",
		"model.layers.0.self_attn.kv_a_layernorm.weight":                        "BF16",
		"model.layers.0.self_attn.kv_b_proj.weight_scale_inv":                   "F32",
		"model.layers.0.self_attn.mla_attn.o_proj.weight":                       "F8_E4M3",
		"model.layers.0.mlp.gate_up_proj.weight":                                "F8_E4M3",
		"model.layers.1.mlp.gate.weight":                                        "BF16",
		"model.layers.1.mlp.experts.e_score_correction_bias":                    "F32",
		"model.layers.1.mlp.experts.w13_weight_scale_inv":                       "F32",
		"model.layers.1.mlp.experts._shared_experts.gate_up_proj.weight":        "F8_E4M3",
		"model.layers.1.mlp.experts._shared_experts.down_proj.weight_scale_inv": "F32",
		"lm_head.weight":            "BF16",
		"model.embed_tokens.weight": "BF16",
	}
	for n, dt := range want {
		if got, ok := out[n]; !ok || got.DType != dt {
			t.Errorf("%s: %v %s, want %s", n, ok, got.DType, dt)
		}
	}
	for _, n := range []string{
		"model.layers.0.self_attn.o_proj.weight", "model.layers.0.self_attn.mla_attn.fused_qkv_a_proj.weight",
		"model.layers.1.mlp.shared_experts.gate_up_proj.weight", "model.layers.1.mlp.gate.e_score_correction_bias",
		"model.layers.0.self_attn.q_a_proj.weight", "model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
	} {
		if _, ok := out[n]; ok {
			t.Errorf("%s should be saved under another alias", n)
		}
	}
	for n := range out {
		if strings.Contains(n, "k_scale") || strings.Contains(n, "v_scale") || strings.Contains(n, "input_scale") {
			t.Errorf("%s: process_weights_after_loading deletes it", n)
		}
	}
	plain := mustRank(t, "deepseekv3", Parallel{TP: 2, TPRank: 0, DP: 1})
	for _, n := range []string{
		"model.layers.0.self_attn.mla_attn.q_proj.weight",
		"model.layers.0.self_attn.kv_a_proj_with_mqa.weight",
	} {
		if _, ok := plain[n]; !ok {
			t.Errorf("q_lora_rank null: %s missing", n)
		}
	}
}

func TestFP8ScalesFollowTheirBlocks(t *testing.T) {
	cfg, hf := Checkpoint("deepseekv3-fp8", 7)
	a := "model.layers.1.self_attn."
	var qb, o, w2s []Tensor
	for r := 0; r < 2; r++ {
		out, err := Rank(cfg, hf, Parallel{TP: 2, TPRank: r, DP: 1})
		if err != nil {
			t.Fatal(err)
		}
		qb = append(qb, out[a+"mla_attn.q_b_proj.weight_scale_inv"])
		o = append(o, out[a+"mla_attn.o_proj.weight_scale_inv"])
		w2s = append(w2s, expert(out["model.layers.1.mlp.experts.w2_weight_scale_inv"], 4))
		// fused_qkv_a_proj is not TP-split: [q_a scales (4 rows); kv_a scales (5 rows, the last
		// block partial: 36 = 4*8 + 4)].
		want := CatRows(hf[a+"q_a_proj.weight_scale_inv"], hf[a+"kv_a_proj_with_mqa.weight_scale_inv"])
		if got := out[a+"fused_qkv_a_proj.weight_scale_inv"]; !same(got, want) || got.Shape[0] != 9 {
			t.Errorf("rank %d: fused_qkv_a_proj scale %v", r, got.Shape)
		}
		g, u := half(expert(out["model.layers.1.mlp.experts.w13_weight_scale_inv"], 4))
		x := "model.layers.1.mlp.experts.4."
		if !same(g, NarrowRows(hf[x+"gate_proj.weight_scale_inv"], int64(r)*2, 2, "g")) ||
			!same(u, NarrowRows(hf[x+"up_proj.weight_scale_inv"], int64(r)*2, 2, "u")) {
			t.Errorf("rank %d: expert 4's w13 scale blocks", r)
		}
	}
	if !same(CatRows(qb...), hf[a+"q_b_proj.weight_scale_inv"]) ||
		!same(catCols(o...), hf[a+"o_proj.weight_scale_inv"]) {
		t.Error("column/row scale slabs do not reassemble")
	}
	if !same(catCols(w2s...), hf["model.layers.1.mlp.experts.4.down_proj.weight_scale_inv"]) {
		t.Error("w2 scale slabs do not reassemble")
	}
}

func TestNormsConvertToTheModelDType(t *testing.T) {
	cfg, hf := Checkpoint("qwen3", 7)
	src := hf["model.layers.0.self_attn.q_norm.weight"]
	if src.DType != "F32" {
		t.Fatalf("the qwen3 checkpoint stores its norms F32, got %s", src.DType)
	}
	out, err := Rank(cfg, hf, Parallel{TP: 2, TPRank: 1, DP: 1})
	if err != nil {
		t.Fatal(err)
	}
	got := out["model.layers.0.self_attn.q_norm.weight"]
	if got.DType != "BF16" || !slices.Equal(got.Shape, []int64{tinyHeadDim}) {
		t.Fatalf("q_norm %s %v", got.DType, got.Shape)
	}
	for i := 0; i < tinyHeadDim; i++ {
		f := math.Float32frombits(binary.LittleEndian.Uint32(src.Data[4*i:]))
		back := math.Float32frombits(uint32(binary.LittleEndian.Uint16(got.Data[2*i:])) << 16)
		if math.Abs(float64(f-back)) > math.Abs(float64(f))/256 {
			t.Errorf("element %d: %v became %v", i, f, back)
		}
	}
	// Round to nearest even, independently: 1 + 2^-8 is a tie between 1 and 1 + 2^-7 -> 1.
	if bf16RNE(1+1.0/256) != 0x3F80 || bf16RNE(1+3.0/256) != 0x3F82 {
		t.Error("bf16 rounding is not nearest-even")
	}
}

func TestRefusals(t *testing.T) {
	edit := func(variant string, f func(map[string]any)) func() ([]byte, map[string]Tensor) {
		return func() ([]byte, map[string]Tensor) {
			cfg, hf := Checkpoint(variant, 7)
			var m map[string]any
			json.Unmarshal(cfg, &m)
			f(m)
			cfg, _ = json.Marshal(m)
			return cfg, hf
		}
	}
	plain := func(variant string) func() ([]byte, map[string]Tensor) {
		return func() ([]byte, map[string]Tensor) { return Checkpoint(variant, 7) }
	}
	cases := []struct {
		name string
		ck   func() ([]byte, map[string]Tensor)
		p    Parallel
		want string
	}{
		{"TP 3 does not divide 8 heads", plain("llama"), Parallel{TP: 3, DP: 1}, "num_attention_heads"},
		{"TP 16 over 8 heads", plain("qwen3"), Parallel{TP: 16, TPRank: 3, DP: 1}, "num_attention_heads"},
		{"TP 3 does not divide the MLA heads", plain("deepseekv3"), Parallel{TP: 3, DP: 1}, "num_attention_heads"},
		{"tp_rank out of range", plain("llama"), Parallel{TP: 2, TPRank: 2, DP: 1}, "tp_rank"},
		{"negative tp_rank", plain("llama"), Parallel{TP: 2, TPRank: -1, DP: 1}, "tp_rank"},
		{"dp_rank out of range", plain("mixtral"), Parallel{TP: 1, DP: 2, DPRank: 2}, "dp_rank"},
		{"TP 0", plain("llama"), Parallel{TP: 0, DP: 1}, "at least 1"},
		{
			"fp8 TP 8: q_b_proj's 20 rows straddle 8-row blocks",
			plain("deepseekv3-fp8"),
			Parallel{TP: 8, TPRank: 0, DP: 1},
			"block_n",
		},
		{
			"fp8 TP 4 x DP 2 without EP: experts' 32 split into 4",
			plain("deepseekv3-fp8"),
			Parallel{TP: 4, TPRank: 1, DP: 2, DPRank: 1},
			"block_n",
		},
		{
			"qwen2moe TP over the experts",
			edit("qwen2moe", func(m map[string]any) { m["num_experts"] = 4 }),
			Parallel{TP: 8, DP: 1},
			"greater than the number of experts",
		},
		{
			"qwen3moe TP over the experts",
			edit("qwen3moe", func(m map[string]any) { m["num_experts"] = 4 }),
			Parallel{TP: 8, DP: 1},
			"greater than the number of experts",
		},
		{
			"MoE intermediate not divisible by TP x DP",
			edit("mixtral", func(m map[string]any) { m["intermediate_size"] = 36 }),
			Parallel{TP: 4, TPRank: 0, DP: 2},
			"not divisible",
		},
		{
			"dense intermediate not divisible",
			edit("llama", func(m map[string]any) { m["intermediate_size"] = 60 }),
			Parallel{TP: 8, DP: 1},
			"not divisible",
		},
		{
			"KV heads neither divide nor are divided by TP",
			edit("llama", func(m map[string]any) { m["num_key_value_heads"] = 3 }),
			Parallel{TP: 2, DP: 1},
			"num_key_value_heads",
		},
		{
			"unknown architecture",
			edit("llama", func(m map[string]any) { m["architectures"] = []string{"GPT2LMHeadModel"} }),
			Parallel{TP: 1, DP: 1},
			"not modelled",
		},
		{
			"float32 model",
			edit("llama", func(m map[string]any) { m["torch_dtype"] = "float32" }),
			Parallel{TP: 1, DP: 1},
			"torch_dtype",
		},
		{
			"shape disagrees with config",
			edit("llama", func(m map[string]any) { m["vocab_size"] = 1000 }),
			Parallel{TP: 1, DP: 1},
			"shape",
		},
		{"missing tensor", func() ([]byte, map[string]Tensor) {
			cfg, hf := Checkpoint("qwen2", 7)
			delete(hf, "model.layers.1.self_attn.k_proj.bias")
			return cfg, hf
		}, Parallel{TP: 1, DP: 1}, "no tensor"},
	}
	for _, c := range cases {
		cfg, hf := c.ck()
		out, err := Rank(cfg, hf, c.p)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %d tensors, error %v; want one mentioning %q", c.name, len(out), err, c.want)
		}
	}
	// And the legal fp8 layouts around them.
	for _, p := range []Parallel{{TP: 1, DP: 1}, {TP: 2, TPRank: 1, DP: 1}, {TP: 4, TPRank: 3, DP: 1},
		{TP: 4, TPRank: 2, DP: 2, DPRank: 1, EnableEP: true},
		{TP: 2, TPRank: 1, DP: 2, DPRank: 1},
		{TP: 1, DP: 2, DPRank: 1},
	} {
		mustRank(t, "deepseekv3-fp8", p)
	}
}
