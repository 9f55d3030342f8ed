package vllmref

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"testing"
)

func TestNewerLinesCheckpointsAreSmallAndDeterministic(t *testing.T) {
	for _, v := range slices.Concat(GLMAndGptOssVariants, WideMoEVariants) {
		cfg, ts := Checkpoint(v, 1)
		cfg2, ts2 := Checkpoint(v, 1)
		_, ts3 := Checkpoint(v, 2)
		var size int
		for n, x := range ts {
			x.check()
			size += len(x.Data)
			if !same(x, ts2[n]) {
				t.Errorf("%s: %s differs for the same seed", v, n)
			}
		}
		if size > 2<<20 || !bytes.Equal(cfg, cfg2) || len(ts) != len(ts2) {
			t.Errorf("%s: %d bytes, deterministic config %v", v, size, bytes.Equal(cfg, cfg2))
		}
		if same(ts["model.embed_tokens.weight"], ts3["model.embed_tokens.weight"]) {
			t.Errorf("%s: seeds 1 and 2 give the same embedding", v)
		}
	}
}

// want is the checkpoint a variant must hold, written out from the config's numbers the way the
// Hugging Face checkpoints of GLM-4.5 and gpt-oss name and shape their tensors.
func wantNewerLines(t *testing.T, variant string, c HFConfig) map[string]string {
	t.Helper()
	out := map[string]string{}
	put := func(name, dtype string, shape ...int64) { out[name] = fmt.Sprintf("%s%v", dtype, shape) }
	h, v := c.Int("hidden_size"), c.Int("vocab_size")
	heads, kv, hd := c.Int("num_attention_heads"), c.Int("num_key_value_heads"), c.Int("head_dim")
	put("model.embed_tokens.weight", "BF16", v, h)
	put("model.norm.weight", "BF16", h)
	put("lm_head.weight", "BF16", v, h)
	_, fp8 := c["quantization_config"]
	fp8 = fp8 && variant != "gptoss"
	lin := func(name string, out, in int64) {
		if !fp8 {
			put(name+".weight", "BF16", out, in)
			return
		}
		put(name+".weight", "F8_E4M3", out, in)
		put(name+".weight_scale_inv", "F32", CeilDiv(out, 8), CeilDiv(in, 8))
	}
	for i := int64(0); i < c.Int("num_hidden_layers"); i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		put(l+"input_layernorm.weight", "BF16", h)
		put(l+"post_attention_layernorm.weight", "BF16", h)
		a := l + "self_attn."
		lin(a+"q_proj", heads*hd, h)
		lin(a+"k_proj", kv*hd, h)
		lin(a+"v_proj", kv*hd, h)
		lin(a+"o_proj", h, heads*hd)
		put(a+"q_proj.bias", "BF16", heads*hd)
		put(a+"k_proj.bias", "BF16", kv*hd)
		put(a+"v_proj.bias", "BF16", kv*hd)
		if variant == "gptoss" {
			put(a+"o_proj.bias", "BF16", h)
			put(a+"sinks", "BF16", heads)
			e, inter := c.Int("num_local_experts"), c.Int("intermediate_size")
			m := l + "mlp."
			put(m+"router.weight", "BF16", e, h)
			put(m+"router.bias", "BF16", e)
			put(m+"experts.gate_up_proj_blocks", "U8", e, 2*inter, h/32, 16)
			put(m+"experts.gate_up_proj_scales", "U8", e, 2*inter, h/32)
			put(m+"experts.gate_up_proj_bias", "BF16", e, 2*inter)
			put(m+"experts.down_proj_blocks", "U8", e, h, inter/32, 16)
			put(m+"experts.down_proj_scales", "U8", e, h, inter/32)
			put(m+"experts.down_proj_bias", "BF16", e, h)
			continue
		}
		if c.BoolOr("use_qk_norm", false) {
			put(a+"q_norm.weight", "BF16", hd)
			put(a+"k_norm.weight", "BF16", hd)
		}
		if i < c.Int("first_k_dense_replace") {
			lin(l+"mlp.gate_proj", c.Int("intermediate_size"), h)
			lin(l+"mlp.up_proj", c.Int("intermediate_size"), h)
			lin(l+"mlp.down_proj", h, c.Int("intermediate_size"))
			continue
		}
		e, moe := c.Int("n_routed_experts"), c.Int("moe_intermediate_size")
		router := "BF16"
		if fp8 {
			router = "F32"
		}
		put(l+"mlp.gate.weight", router, e, h)
		put(l+"mlp.gate.e_score_correction_bias", "F32", e)
		for x := int64(0); x < e; x++ {
			p := fmt.Sprintf("%smlp.experts.%d.", l, x)
			lin(p+"gate_proj", moe, h)
			lin(p+"up_proj", moe, h)
			lin(p+"down_proj", h, moe)
		}
		s := moe * c.Int("n_shared_experts")
		lin(l+"mlp.shared_experts.gate_proj", s, h)
		lin(l+"mlp.shared_experts.up_proj", s, h)
		lin(l+"mlp.shared_experts.down_proj", h, s)
	}
	return out
}

func TestNewerLinesCheckpointsHoldTheHFTensors(t *testing.T) {
	for _, v := range GLMAndGptOssVariants {
		cfg, ts := Checkpoint(v, 3)
		c := ParseConfig(cfg)
		want := wantNewerLines(t, v, c)
		var names []string
		for n, x := range ts {
			names = append(names, n)
			if got := fmt.Sprintf("%s%v", x.DType, x.Shape); got != want[n] {
				t.Errorf("%s: %s is %s, want %q", v, n, got, want[n])
			}
		}
		for n := range want {
			if _, ok := ts[n]; !ok {
				t.Errorf("%s: no %s", v, n)
			}
		}
		sort.Strings(names)
		if t.Failed() {
			t.Logf("%s holds %v", v, names)
		}
	}
}

// The configs carry what the Hugging Face config classes and vLLM's model classes read, and the
// head counts allow every TP of the grid: query heads divide by 1, 2, 4, 6 and 8, and KV heads are
// divided by TP or divide it.
func TestGLMAndGptOssConfigsAllowTheGrid(t *testing.T) {
	for _, v := range GLMAndGptOssVariants {
		cfg, _ := Checkpoint(v, 3)
		c := ParseConfig(cfg)
		heads, kv := c.Int("num_attention_heads"), c.Int("num_key_value_heads")
		for _, tp := range []int64{1, 2, 4, 6, 8} {
			if heads%tp != 0 || (kv%tp != 0 && tp%kv != 0) {
				t.Errorf("%s: %d heads over %d KV heads at TP %d", v, heads, kv, tp)
			}
		}
		switch c.Architecture() {
		case "Glm4MoeForCausalLM":
			for _, k := range []string{"n_group", "topk_group", "routed_scaling_factor", "norm_topk_prob",
				"partial_rotary_factor", "num_experts_per_tok"} {
				if !c.Has(k) {
					t.Errorf("%s: config lacks %s", v, k)
				}
			}
		case "GptOssForCausalLM":
			var q struct {
				QuantMethod string `json:"quant_method"`
			}
			if err := json.Unmarshal(c["quantization_config"], &q); err != nil || q.QuantMethod != "mxfp4" {
				t.Errorf("%s: quantization_config %s", v, c["quantization_config"])
			}
			// vLLM's GptOss MLPBlock asserts intermediate_size % world_size == 0 for every TP x DP of
			// the grid (up to 8 x 2), and the loader reads whole 32-element blocks.
			inter := c.Int("intermediate_size")
			for _, w := range []int64{1, 2, 4, 6, 8, 12, 16} {
				if inter%w != 0 {
					t.Errorf("%s: intermediate %d over world %d", v, inter, w)
				}
			}
			if inter%32 != 0 || c.Int("hidden_size")%32 != 0 {
				t.Errorf("%s: MXFP4 rows of %d and %d are not whole blocks", v, inter, c.Int("hidden_size"))
			}
			// The loader's experts_per_rank is num_experts // ep_size: experts that do not divide
			// would be lost, so the checkpoint divides by every EP size of the grid.
			if e := c.Int("num_local_experts"); slices.ContainsFunc([]int64{1, 2, 4, 6, 8, 12, 16},
				func(ep int64) bool { return e%ep != 0 }) {
				t.Errorf("%s: %d experts do not divide by every EP size of the grid", v, e)
			}
		default:
			t.Errorf("%s: architecture %s", v, c.Architecture())
		}
	}
}

// Every scale is an E8M0 exponent near 2^0, so decoded weights stay finite and small.
func TestGptOssScalesAreModest(t *testing.T) {
	_, ts := Checkpoint("gptoss", 3)
	for n, x := range ts {
		if x.DType != "U8" || len(x.Shape) != 3 {
			continue
		}
		for i, b := range x.Data {
			if b < 127-8 || b > 127+7 {
				t.Fatalf("%s[%d] = %d", n, i, b)
			}
		}
	}
}
