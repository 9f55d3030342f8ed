package vllmref

import (
	"encoding/json"
	"fmt"
	"math/rand"
	"slices"
)

// GLMAndGptOssVariants lists checkpoints of the architectures vLLM lays out only on the newer release
// lines (the "0.10" line does not model them): GLM-4.5/4.6/4.7 and gpt-oss. Their head counts
// allow TP 1, 2, 4, 6 and 8.
//
//   - glm4moe: Glm4MoeForCausalLM in bfloat16: 24 query heads over 2 KV heads (head_dim 8),
//     attention biases, q/k norms, layer 0 dense (first_k_dense_replace 1), layers 1 and 2 MoE with
//     12 routed experts (uneven over EP 8, none for some ranks of EP 16), one shared expert, the
//     router stored in bfloat16 (vLLM's gate is an F32 nn.Linear, so it is converted) and its F32
//     e_score_correction_bias.
//   - glm4moe-fp8: the same in block FP8 ([8, 8] blocks, weight_scale_inv on every linear but the
//     router), no q/k norms, the router stored in F32, two shared experts, and expert intermediate
//     96, which splits into 8-row blocks over 1, 2, 4, 6 and 12 MoE ranks but not over 8 or 16.
//   - gptoss: GptOssForCausalLM with MXFP4 experts as OpenAI's checkpoints store them: 48 query
//     heads over 24 KV heads (head_dim 8), q/k/v/o biases, per-head attention sinks, a router with a
//     bias, and 48 experts whose gate_up/down projections are *_blocks (U8, two 4-bit values a
//     byte, 16 bytes a 32-element block) and *_scales (U8 E8M0 exponents, one a block) with BF16
//     *_bias. Intermediate 96 is three MXFP4 blocks, so vLLM's per-rank rule (whole blocks, ceil of
//     blocks over ranks) leaves later ranks shorter or empty.
var GLMAndGptOssVariants = []string{"glm4moe", "glm4moe-fp8", "gptoss"}

// WideMoEVariants lists MoE checkpoints of the older architectures whose heads allow TP 6:
// deepseekv3-wide is DeepseekV3ForCausalLM with 24 MLA heads (q_lora_rank null), 12 routed experts
// in 2 groups (n_group 2, so the round-robin placement applies where vLLM allows it), one shared
// expert and a dense first layer; mixtral-wide, qwen2moe-wide and qwen3moe-wide are those models on
// the wide dense checkpoints' skeleton (24 query heads over 2 KV heads, 1000 rows of vocabulary)
// with 12 experts of 48 features, Qwen2-MoE's a shared expert, both Qwen models a dense layer.
var WideMoEVariants = []string{"deepseekv3-wide", "mixtral-wide", "qwen2moe-wide", "qwen3moe-wide"}

// The sizes the new-architecture checkpoints share.
const (
	newHidden  = 64
	newVocab   = 1000
	newHeadDim = 8

	glmHeads      = 24
	glmKV         = 2
	glmInter      = 192
	glmExperts    = 12
	glmMoE        = 48
	glmMoEFP8     = 96
	glmLayers     = 3
	gptossHeads   = 48
	gptossKV      = 24
	gptossInter   = 96
	gptossExperts = 48
	gptossLayers  = 2
	mxfp4Block    = 32
)

var newerLinesDims = dims{hidden: newHidden, heads: glmHeads, kv: glmKV, vocab: newVocab}

func newerLinesCheckpoint(variant string, seed int64) ([]byte, map[string]Tensor) {
	g := &gen{rng: rand.New(rand.NewSource(seed)), out: map[string]Tensor{}, dims: newerLinesDims}
	var cfg map[string]any
	switch variant {
	case "glm4moe", "glm4moe-fp8":
		cfg = g.glm4moe(variant == "glm4moe-fp8")
	case "gptoss":
		g.heads, g.kv = gptossHeads, gptossKV
		cfg = g.gptoss()
	case "deepseekv3-wide":
		g.heads = glmHeads
		cfg = g.deepseekWide()
	default:
		panic("vllmref: unknown variant " + variant)
	}
	config, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		panic(err)
	}
	return config, g.out
}

// glm4moe follows the Hugging Face Glm4MoeConfig and the names of GLM-4.5's checkpoints.
func (g *gen) glm4moe(fp8 bool) map[string]any {
	moeInter, shared, routerDType, qkNorm := int64(glmMoE), int64(1), "BF16", true
	if fp8 {
		moeInter, shared, routerDType, qkNorm = glmMoEFP8, 2, "F32", false
	}
	cfg := map[string]any{
		"architectures": []string{"Glm4MoeForCausalLM"}, "model_type": "glm4_moe",
		"hidden_size": g.hidden, "intermediate_size": glmInter, "moe_intermediate_size": moeInter,
		"num_attention_heads": g.heads, "num_key_value_heads": g.kv, "head_dim": newHeadDim,
		"num_hidden_layers": glmLayers, "vocab_size": g.vocab, "attention_bias": true, "use_qk_norm": qkNorm,
		"partial_rotary_factor": 0.5, "n_routed_experts": glmExperts, "n_shared_experts": shared,
		"num_experts_per_tok": 2, "first_k_dense_replace": 1, "n_group": 1, "topk_group": 1,
		"norm_topk_prob": true, "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 0,
		"tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-5,
		"rope_theta": 1000000.0, "max_position_embeddings": 512,
	}
	if fp8 {
		cfg["quantization_config"] = map[string]any{
			"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": []int{8, 8},
		}
	}
	q, kv := g.heads*newHeadDim, g.kv*newHeadDim
	g.rand("model.embed_tokens.weight", "BF16", g.vocab, g.hidden)
	for i := 0; i < glmLayers; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		g.rand(l+"input_layernorm.weight", "BF16", g.hidden)
		g.rand(l+"post_attention_layernorm.weight", "BF16", g.hidden)
		a := l + "self_attn."
		g.linear(a+"q_proj", fp8, q, g.hidden)
		g.linear(a+"k_proj", fp8, kv, g.hidden)
		g.linear(a+"v_proj", fp8, kv, g.hidden)
		g.rand(a+"q_proj.bias", "BF16", q)
		g.rand(a+"k_proj.bias", "BF16", kv)
		g.rand(a+"v_proj.bias", "BF16", kv)
		g.linear(a+"o_proj", fp8, g.hidden, q)
		if qkNorm {
			g.rand(a+"q_norm.weight", "BF16", newHeadDim)
			g.rand(a+"k_norm.weight", "BF16", newHeadDim)
		}
		if i == 0 {
			g.linear(l+"mlp.gate_proj", fp8, glmInter, g.hidden)
			g.linear(l+"mlp.up_proj", fp8, glmInter, g.hidden)
			g.linear(l+"mlp.down_proj", fp8, g.hidden, glmInter)
			continue
		}
		g.rand(l+"mlp.gate.weight", routerDType, glmExperts, g.hidden)
		g.rand(l+"mlp.gate.e_score_correction_bias", "F32", glmExperts)
		for e := 0; e < glmExperts; e++ {
			x := fmt.Sprintf("%smlp.experts.%d.", l, e)
			g.linear(x+"gate_proj", fp8, moeInter, g.hidden)
			g.linear(x+"up_proj", fp8, moeInter, g.hidden)
			g.linear(x+"down_proj", fp8, g.hidden, moeInter)
		}
		s := l + "mlp.shared_experts."
		g.linear(s+"gate_proj", fp8, moeInter*shared, g.hidden)
		g.linear(s+"up_proj", fp8, moeInter*shared, g.hidden)
		g.linear(s+"down_proj", fp8, g.hidden, moeInter*shared)
	}
	g.rand("model.norm.weight", "BF16", g.hidden)
	g.rand("lm_head.weight", "BF16", g.vocab, g.hidden)
	return cfg
}

// gptoss follows the Hugging Face GptOssConfig and the names and packing of OpenAI's MXFP4
// checkpoints (gpt-oss-20b / -120b): attention, router, norms and embeddings in bfloat16, experts
// as MXFP4 blocks and scales.
func (g *gen) gptoss() map[string]any {
	cfg := map[string]any{
		"architectures": []string{"GptOssForCausalLM"}, "model_type": "gpt_oss",
		"hidden_size": g.hidden, "intermediate_size": gptossInter, "num_attention_heads": g.heads,
		"num_key_value_heads": g.kv, "head_dim": newHeadDim, "num_hidden_layers": gptossLayers,
		"vocab_size": g.vocab, "num_local_experts": gptossExperts, "num_experts_per_tok": 4,
		"experts_per_token": 4, "attention_bias": true, "sliding_window": 128,
		"layer_types": []string{"sliding_attention", "full_attention"}, "swiglu_limit": 7.0,
		"hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 150000.0, "initial_context_length": 4096,
		"max_position_embeddings": 131072, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
		"rope_scaling": map[string]any{
			"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0, "truncate": false,
			"original_max_position_embeddings": 4096,
		},
		"quantization_config": map[string]any{
			"quant_method": "mxfp4",
			"modules_to_not_convert": []string{
				"model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head",
			},
		},
	}
	q, kv := g.heads*newHeadDim, g.kv*newHeadDim
	g.rand("model.embed_tokens.weight", "BF16", g.vocab, g.hidden)
	for i := 0; i < gptossLayers; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		g.rand(l+"input_layernorm.weight", "BF16", g.hidden)
		g.rand(l+"post_attention_layernorm.weight", "BF16", g.hidden)
		a := l + "self_attn."
		g.rand(a+"q_proj.weight", "BF16", q, g.hidden)
		g.rand(a+"q_proj.bias", "BF16", q)
		g.rand(a+"k_proj.weight", "BF16", kv, g.hidden)
		g.rand(a+"k_proj.bias", "BF16", kv)
		g.rand(a+"v_proj.weight", "BF16", kv, g.hidden)
		g.rand(a+"v_proj.bias", "BF16", kv)
		g.rand(a+"o_proj.weight", "BF16", g.hidden, q)
		g.rand(a+"o_proj.bias", "BF16", g.hidden)
		g.rand(a+"sinks", "BF16", g.heads)
		m := l + "mlp."
		g.rand(m+"router.weight", "BF16", gptossExperts, g.hidden)
		g.rand(m+"router.bias", "BF16", gptossExperts)
		// gate_up rows interleave gate and up (row 2j is gate j, row 2j+1 up j), as OpenAI stores them.
		g.mxfp4(m+"experts.gate_up_proj", gptossExperts, 2*gptossInter, g.hidden)
		g.rand(m+"experts.gate_up_proj_bias", "BF16", gptossExperts, 2*gptossInter)
		g.mxfp4(m+"experts.down_proj", gptossExperts, g.hidden, gptossInter)
		g.rand(m+"experts.down_proj_bias", "BF16", gptossExperts, g.hidden)
	}
	g.rand("model.norm.weight", "BF16", g.hidden)
	g.rand("lm_head.weight", "BF16", g.vocab, g.hidden)
	return cfg
}

// mxfp4 adds name_blocks [experts, rows, cols/32, 16] of random bytes (every byte is two valid
// E2M1 values) and name_scales [experts, rows, cols/32] of E8M0 exponents within 2^-8 .. 2^7.
func (g *gen) mxfp4(name string, experts, rows, cols int64) {
	if cols%mxfp4Block != 0 {
		panic("vllmref: gen: an MXFP4 row must be whole blocks")
	}
	nb := cols / mxfp4Block
	blocks := Tensor{DType: "U8", Shape: []int64{experts, rows, nb, mxfp4Block / 2}}
	blocks.Data = make([]byte, numel(blocks.Shape))
	for i := range blocks.Data {
		blocks.Data[i] = byte(g.rng.Intn(256))
	}
	scales := Tensor{DType: "U8", Shape: []int64{experts, rows, nb}}
	scales.Data = make([]byte, numel(scales.Shape))
	for i := range scales.Data {
		scales.Data[i] = byte(127 - 8 + g.rng.Intn(16))
	}
	g.out[name+"_blocks"] = blocks
	g.out[name+"_scales"] = scales
}

// deepseekWide follows the Hugging Face DeepseekV3Config and DeepSeek-V3's tensor names.
func (g *gen) deepseekWide() map[string]any {
	const nope, rope, vDim, kvLora = 16, 4, 16, 32
	cfg := map[string]any{
		"architectures": []string{"DeepseekV3ForCausalLM"}, "model_type": "deepseek_v3",
		"hidden_size": g.hidden, "intermediate_size": glmInter, "moe_intermediate_size": glmMoE,
		"num_attention_heads": g.heads, "num_key_value_heads": g.heads, "num_hidden_layers": 2,
		"vocab_size": g.vocab, "q_lora_rank": nil, "kv_lora_rank": kvLora, "qk_nope_head_dim": nope,
		"qk_rope_head_dim": rope, "v_head_dim": vDim, "n_routed_experts": glmExperts, "n_shared_experts": 1,
		"num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 2, "topk_group": 1,
		"topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
		"tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-6,
		"rope_theta": 10000.0, "max_position_embeddings": 512,
	}
	g.rand("model.embed_tokens.weight", "BF16", g.vocab, g.hidden)
	for i := 0; i < 2; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		g.rand(l+"input_layernorm.weight", "BF16", g.hidden)
		g.rand(l+"post_attention_layernorm.weight", "BF16", g.hidden)
		a := l + "self_attn."
		g.rand(a+"q_proj.weight", "BF16", g.heads*(nope+rope), g.hidden)
		g.rand(a+"kv_a_proj_with_mqa.weight", "BF16", kvLora+rope, g.hidden)
		g.rand(a+"kv_a_layernorm.weight", "BF16", kvLora)
		g.rand(a+"kv_b_proj.weight", "BF16", g.heads*(nope+vDim), kvLora)
		g.rand(a+"o_proj.weight", "BF16", g.hidden, g.heads*vDim)
		if i == 0 {
			g.mlp(l+"mlp", "BF16", glmInter)
			continue
		}
		g.rand(l+"mlp.gate.weight", "BF16", glmExperts, g.hidden)
		g.rand(l+"mlp.gate.e_score_correction_bias", "F32", glmExperts)
		for e := 0; e < glmExperts; e++ {
			x := fmt.Sprintf("%smlp.experts.%d.", l, e)
			g.rand(x+"gate_proj.weight", "BF16", glmMoE, g.hidden)
			g.rand(x+"up_proj.weight", "BF16", glmMoE, g.hidden)
			g.rand(x+"down_proj.weight", "BF16", g.hidden, glmMoE)
		}
		g.mlp(l+"mlp.shared_experts", "BF16", glmMoE)
	}
	g.rand("model.norm.weight", "BF16", g.hidden)
	g.rand("lm_head.weight", "BF16", g.vocab, g.hidden)
	return cfg
}

// isNewerLinesVariant reports whether a variant is built by newerLinesCheckpoint.
func isNewerLinesVariant(variant string) bool {
	return slices.Contains(GLMAndGptOssVariants, variant) || slices.Contains(WideMoEVariants, variant)
}
