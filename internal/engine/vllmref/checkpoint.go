package vllmref

import (
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand"
	"slices"

	"github.com/x448/float16"
)

// Variants lists the checkpoint variants Checkpoint builds.
var Variants = []string{
	"llama",
	"llama-tied",
	"qwen2",
	"qwen3",
	"mixtral",
	"qwen2moe",
	"qwen3moe",
	"deepseekv3",
	"deepseekv3-fp8",
}

// SparseMoEVariants lists MoE checkpoints whose every layer is sparse, the shape of the released
// Qwen3-MoE models (decoder_sparse_step 1, no mlp_only_layers); they are not in Variants, whose
// qwen3moe mixes dense and sparse layers.
var SparseMoEVariants = []string{"qwen3moe-sparse"}

// The tiny sizes every variant shares. 8 query heads and 2 KV heads let TP 1, 2, 4 and 8 all work
// (TP 4 and 8 replicate the KV heads); a head_dim of 16 differs from hidden/heads (8) for the
// models that read head_dim; vocab 1100 is not a multiple of 64*TP, so the last rank carries zero
// rows; 10 experts over EP 4 or 8 split unevenly (and stay >= TP, so Qwen-MoE's tp > num_experts
// check does not fire).
const (
	tinyHidden  = 64
	tinyHeads   = 8
	tinyKV      = 2
	tinyHeadDim = 16
	tinyVocab   = 1100
	tinyInter   = 64
	tinyMoE     = 32
	tinyExperts = 10
)

// Checkpoint builds a tiny Hugging Face checkpoint of a variant: its config.json bytes and its
// tensors by HF name, random values from seed. It panics on an unknown variant.
func Checkpoint(variant string, seed int64) (config []byte, tensors map[string]Tensor) {
	if slices.Contains(WideVariants, variant) || slices.Contains(wideDecoderMoEVariants, variant) {
		return wideCheckpoint(variant, seed)
	}
	if isNewerLinesVariant(variant) {
		return newerLinesCheckpoint(variant, seed)
	}
	g := &gen{rng: rand.New(rand.NewSource(seed)), out: map[string]Tensor{}, dims: tinyDims}
	var cfg map[string]any
	switch variant {
	case "llama", "llama-tied":
		tied := variant == "llama-tied"
		cfg = map[string]any{
			"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama",
			"hidden_size": tinyHidden, "intermediate_size": tinyInter, "num_attention_heads": tinyHeads,
			"num_key_value_heads": tinyKV, "head_dim": tinyHeadDim, "num_hidden_layers": 2, "vocab_size": tinyVocab,
			"tie_word_embeddings": tied, "attention_bias": false, "mlp_bias": false, "torch_dtype": "bfloat16",
			"hidden_act": "silu", "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "max_position_embeddings": 512,
		}
		g.decoder("BF16", 2, tinyHeadDim, false, false, "BF16", func(l string) { g.mlp(l+"mlp", "BF16", tinyInter) })
		if !tied {
			g.rand("lm_head.weight", "BF16", tinyVocab, tinyHidden)
		}
	case "qwen2":
		cfg = map[string]any{
			"architectures": []string{"Qwen2ForCausalLM"}, "model_type": "qwen2",
			"hidden_size": tinyHidden, "intermediate_size": tinyInter, "num_attention_heads": tinyHeads,
			"num_key_value_heads": tinyKV, "num_hidden_layers": 2, "vocab_size": tinyVocab,
			"tie_word_embeddings": false, "torch_dtype": "float16", "hidden_act": "silu", "rms_norm_eps": 1e-6,
			"rope_theta": 1000000.0, "max_position_embeddings": 512,
		}
		g.decoder(
			"F16",
			2,
			tinyHidden/tinyHeads,
			true,
			false,
			"F16",
			func(l string) { g.mlp(l+"mlp", "F16", tinyInter) },
		)
		g.rand("lm_head.weight", "F16", tinyVocab, tinyHidden)
	case "qwen3":
		// The norms are stored F32 while the model runs in bfloat16: vLLM copies them into BF16
		// parameters (torch rounds to nearest even).
		cfg = map[string]any{
			"architectures": []string{"Qwen3ForCausalLM"}, "model_type": "qwen3",
			"hidden_size": tinyHidden, "intermediate_size": tinyInter, "num_attention_heads": tinyHeads,
			"num_key_value_heads": tinyKV, "head_dim": tinyHeadDim, "num_hidden_layers": 2, "vocab_size": tinyVocab,
			"tie_word_embeddings": false, "attention_bias": false, "torch_dtype": "bfloat16", "hidden_act": "silu",
			"rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "max_position_embeddings": 512,
		}
		g.decoder("BF16", 2, tinyHeadDim, false, true, "F32", func(l string) { g.mlp(l+"mlp", "BF16", tinyInter) })
		g.rand("lm_head.weight", "BF16", tinyVocab, tinyHidden)
	case "mixtral":
		cfg = map[string]any{
			"architectures": []string{"MixtralForCausalLM"}, "model_type": "mixtral",
			"hidden_size": tinyHidden, "intermediate_size": tinyMoE, "num_attention_heads": tinyHeads,
			"num_key_value_heads": tinyKV, "head_dim": tinyHidden / tinyHeads, "num_hidden_layers": 2,
			"vocab_size": tinyVocab, "num_local_experts": tinyExperts, "num_experts_per_tok": 2,
			"tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-5,
			"rope_theta": 1000000.0, "max_position_embeddings": 512,
		}
		g.decoder("BF16", 2, tinyHidden/tinyHeads, false, false, "BF16", func(l string) {
			p := l + "block_sparse_moe."
			g.rand(p+"gate.weight", "BF16", tinyExperts, tinyHidden)
			for e := 0; e < tinyExperts; e++ {
				x := fmt.Sprintf("%sexperts.%d.", p, e)
				g.rand(x+"w1.weight", "BF16", tinyMoE, tinyHidden)
				g.rand(x+"w2.weight", "BF16", tinyHidden, tinyMoE)
				g.rand(x+"w3.weight", "BF16", tinyMoE, tinyHidden)
			}
		})
		g.rand("lm_head.weight", "BF16", tinyVocab, tinyHidden)
	case "qwen2moe":
		// Layer 1 is dense (mlp_only_layers); layers 0 and 2 are sparse with a shared expert.
		cfg = map[string]any{
			"architectures": []string{"Qwen2MoeForCausalLM"}, "model_type": "qwen2_moe",
			"hidden_size": tinyHidden, "intermediate_size": tinyInter, "moe_intermediate_size": tinyMoE,
			"shared_expert_intermediate_size": 48, "num_attention_heads": tinyHeads, "num_key_value_heads": tinyKV,
			"num_hidden_layers": 3, "vocab_size": tinyVocab, "num_experts": tinyExperts, "num_experts_per_tok": 2,
			"decoder_sparse_step": 1, "mlp_only_layers": []int{1}, "norm_topk_prob": false,
			"tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-6,
			"rope_theta": 1000000.0, "max_position_embeddings": 512,
		}
		layer := 0
		g.decoder("BF16", 3, tinyHidden/tinyHeads, true, false, "BF16", func(l string) {
			defer func() { layer++ }()
			if layer == 1 {
				g.mlp(l+"mlp", "BF16", tinyInter)
				return
			}
			g.moe(l+"mlp.", "BF16", tinyExperts, false)
			g.mlp(l+"mlp.shared_expert", "BF16", 48)
			g.rand(l+"mlp.shared_expert_gate.weight", "BF16", 1, tinyHidden)
		})
		g.rand("lm_head.weight", "BF16", tinyVocab, tinyHidden)
	case "qwen3moe", "qwen3moe-sparse":
		// qwen3moe: decoder_sparse_step 2, so layer 1 is sparse and layers 0 and 2 dense.
		// qwen3moe-sparse: decoder_sparse_step 1, every layer sparse.
		sparseStep := 2
		if variant == "qwen3moe-sparse" {
			sparseStep = 1
		}
		cfg = map[string]any{
			"architectures": []string{"Qwen3MoeForCausalLM"}, "model_type": "qwen3_moe",
			"hidden_size": tinyHidden, "intermediate_size": tinyInter, "moe_intermediate_size": tinyMoE,
			"num_attention_heads": tinyHeads, "num_key_value_heads": tinyKV, "head_dim": tinyHeadDim,
			"num_hidden_layers": 3, "vocab_size": tinyVocab, "num_experts": tinyExperts, "num_experts_per_tok": 2,
			"decoder_sparse_step": sparseStep, "mlp_only_layers": []int{}, "norm_topk_prob": true,
			"attention_bias": false, "tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-6,
			"rope_theta": 1000000.0, "max_position_embeddings": 512,
		}
		layer := 0
		g.decoder("BF16", 3, tinyHeadDim, false, true, "BF16", func(l string) {
			defer func() { layer++ }()
			if (layer+1)%sparseStep != 0 {
				g.mlp(l+"mlp", "BF16", tinyInter)
				return
			}
			g.moe(l+"mlp.", "BF16", tinyExperts, false)
		})
		g.rand("lm_head.weight", "BF16", tinyVocab, tinyHidden)
	case "deepseekv3", "deepseekv3-fp8":
		// deepseekv3: q_lora_rank null (q_proj + kv_a_proj_with_mqa). deepseekv3-fp8: q_lora_rank 32
		// (fused_qkv_a_proj), block [8, 8] fp8. kv_lora_rank + qk_rope_head_dim = 36 ends in a
		// partial block; q_b_proj's 8*(16+4) = 160 rows split over TP 8 are 20 rows, which is not a
		// multiple of block_n 8, so vLLM refuses TP 8 (and a TP x DP of 8 without EP splits the
		// experts' 32 into 4, below block_n).
		fp8 := variant == "deepseekv3-fp8"
		cfg = map[string]any{
			"architectures": []string{"DeepseekV3ForCausalLM"}, "model_type": "deepseek_v3",
			"hidden_size": tinyHidden, "intermediate_size": tinyInter, "moe_intermediate_size": tinyMoE,
			"num_attention_heads": tinyHeads, "num_key_value_heads": tinyHeads, "num_hidden_layers": 2,
			"vocab_size": tinyVocab, "q_lora_rank": nil, "kv_lora_rank": 32, "qk_nope_head_dim": 16,
			"qk_rope_head_dim": 4, "v_head_dim": 16, "n_routed_experts": tinyExperts, "n_shared_experts": 1,
			"num_experts_per_tok": 2, "first_k_dense_replace": 1, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
			"topk_method": "noaux_tc", "scoring_func": "sigmoid", "norm_topk_prob": true, "routed_scaling_factor": 2.5,
			"tie_word_embeddings": false, "torch_dtype": "bfloat16", "hidden_act": "silu", "rms_norm_eps": 1e-6,
			"rope_theta": 10000.0, "max_position_embeddings": 512,
		}
		if fp8 {
			cfg["q_lora_rank"] = 32
			cfg["quantization_config"] = map[string]any{
				"quant_method": "fp8", "activation_scheme": "dynamic", "fmt": "e4m3", "weight_block_size": []int{8, 8},
			}
		}
		g.rand("model.embed_tokens.weight", "BF16", tinyVocab, tinyHidden)
		for i := 0; i < 2; i++ {
			l := fmt.Sprintf("model.layers.%d.", i)
			g.rand(l+"input_layernorm.weight", "BF16", tinyHidden)
			g.rand(l+"post_attention_layernorm.weight", "BF16", tinyHidden)
			a := l + "self_attn."
			if fp8 {
				g.linear(a+"q_a_proj", true, 32, tinyHidden)
				g.rand(a+"q_a_layernorm.weight", "BF16", 32)
				g.linear(a+"q_b_proj", true, 8*(16+4), 32)
			} else {
				g.linear(a+"q_proj", false, 8*(16+4), tinyHidden)
			}
			g.linear(a+"kv_a_proj_with_mqa", fp8, 32+4, tinyHidden)
			g.rand(a+"kv_a_layernorm.weight", "BF16", 32)
			g.linear(a+"kv_b_proj", fp8, 8*(16+16), 32)
			g.linear(a+"o_proj", fp8, tinyHidden, 8*16)
			if i == 0 {
				g.linear(l+"mlp.gate_proj", fp8, tinyInter, tinyHidden)
				g.linear(l+"mlp.up_proj", fp8, tinyInter, tinyHidden)
				g.linear(l+"mlp.down_proj", fp8, tinyHidden, tinyInter)
				continue
			}
			g.rand(l+"mlp.gate.weight", "BF16", tinyExperts, tinyHidden)
			g.rand(l+"mlp.gate.e_score_correction_bias", "F32", tinyExperts)
			g.moe(l+"mlp.", "BF16", tinyExperts, fp8)
			g.linear(l+"mlp.shared_experts.gate_proj", fp8, tinyMoE, tinyHidden)
			g.linear(l+"mlp.shared_experts.up_proj", fp8, tinyMoE, tinyHidden)
			g.linear(l+"mlp.shared_experts.down_proj", fp8, tinyHidden, tinyMoE)
		}
		g.rand("model.norm.weight", "BF16", tinyHidden)
		g.rand("lm_head.weight", "BF16", tinyVocab, tinyHidden)
	default:
		panic("vllmref: unknown variant " + variant)
	}
	config, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		panic(err)
	}
	return config, g.out
}

// gen makes random tensors in generation order, so a seed always gives the same checkpoint.
type gen struct {
	rng *rand.Rand
	out map[string]Tensor
	dims
}

// dims are the sizes of a checkpoint's Llama-family skeleton.
type dims struct {
	hidden, heads, kv, vocab int64
}

var tinyDims = dims{hidden: tinyHidden, heads: tinyHeads, kv: tinyKV, vocab: tinyVocab}

// rand adds a tensor of uniform values in [-1, 1) (F8_E4M3: random bytes that are not NaN).
func (g *gen) rand(name, dtype string, shape ...int64) {
	n := numel(shape)
	t := Tensor{DType: dtype, Shape: shape, Data: make([]byte, n*ElemSize(dtype))}
	for i := int64(0); i < n; i++ {
		x := g.rng.Float32()*2 - 1
		switch dtype {
		case "F32":
			binary.LittleEndian.PutUint32(t.Data[4*i:], math.Float32bits(x))
		case "BF16":
			binary.LittleEndian.PutUint16(t.Data[2*i:], uint16(math.Float32bits(x)>>16))
		case "F16":
			binary.LittleEndian.PutUint16(t.Data[2*i:], float16.Fromfloat32(x).Bits())
		case "F8_E4M3":
			b := byte(g.rng.Intn(256))
			if b&0x7F == 0x7F { // 0x7F and 0xFF are NaN in e4m3fn
				b--
			}
			t.Data[i] = b
		default:
			panic("vllmref: gen: dtype " + dtype)
		}
	}
	g.out[name] = t
}

// linear adds name.weight [out, in], and for fp8 an F8_E4M3 weight and its F32 weight_scale_inv
// [ceil(out/8), ceil(in/8)] (the tiny fp8 variant's block is 8x8).
func (g *gen) linear(name string, fp8 bool, out, in int64) {
	if !fp8 {
		g.rand(name+".weight", "BF16", out, in)
		return
	}
	g.rand(name+".weight", "F8_E4M3", out, in)
	s := Tensor{DType: "F32", Shape: []int64{CeilDiv(out, 8), CeilDiv(in, 8)}}
	s.Data = make([]byte, 4*numel(s.Shape))
	for i := int64(0); i < numel(s.Shape); i++ {
		binary.LittleEndian.PutUint32(s.Data[4*i:], math.Float32bits(0.001+g.rng.Float32()/16))
	}
	g.out[name+".weight_scale_inv"] = s
}

// mlp adds gate_proj, up_proj, down_proj of a dense MLP.
func (g *gen) mlp(prefix, dtype string, inter int64) {
	g.rand(prefix+".gate_proj.weight", dtype, inter, g.hidden)
	g.rand(prefix+".up_proj.weight", dtype, inter, g.hidden)
	g.rand(prefix+".down_proj.weight", dtype, g.hidden, inter)
}

// moe adds prefix+"gate.weight" (unless fp8 DeepSeek, which adds its own) and the experts.
func (g *gen) moe(prefix, dtype string, experts int, fp8 bool) {
	if _, ok := g.out[prefix+"gate.weight"]; !ok {
		g.rand(prefix+"gate.weight", dtype, int64(experts), tinyHidden)
	}
	for e := 0; e < experts; e++ {
		x := fmt.Sprintf("%sexperts.%d.", prefix, e)
		if fp8 {
			g.linear(x+"gate_proj", true, tinyMoE, tinyHidden)
			g.linear(x+"up_proj", true, tinyMoE, tinyHidden)
			g.linear(x+"down_proj", true, tinyHidden, tinyMoE)
			continue
		}
		g.rand(x+"gate_proj.weight", dtype, tinyMoE, tinyHidden)
		g.rand(x+"up_proj.weight", dtype, tinyMoE, tinyHidden)
		g.rand(x+"down_proj.weight", dtype, tinyHidden, tinyMoE)
	}
}

// decoder adds the embedding, per-layer norms and attention, and the final norm of a Llama-family
// model; mlp adds each layer's MLP. normDType is the dtype the norms are stored in.
func (g *gen) decoder(
	dtype string,
	layers int,
	headDim int64,
	qkvBias, qkNorm bool,
	normDType string,
	mlp func(l string),
) {
	g.rand("model.embed_tokens.weight", dtype, g.vocab, g.hidden)
	for i := 0; i < layers; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		g.rand(l+"input_layernorm.weight", normDType, g.hidden)
		g.rand(l+"post_attention_layernorm.weight", normDType, g.hidden)
		a := l + "self_attn."
		g.rand(a+"q_proj.weight", dtype, g.heads*headDim, g.hidden)
		g.rand(a+"k_proj.weight", dtype, g.kv*headDim, g.hidden)
		g.rand(a+"v_proj.weight", dtype, g.kv*headDim, g.hidden)
		if qkvBias {
			g.rand(a+"q_proj.bias", dtype, g.heads*headDim)
			g.rand(a+"k_proj.bias", dtype, g.kv*headDim)
			g.rand(a+"v_proj.bias", dtype, g.kv*headDim)
		}
		g.rand(a+"o_proj.weight", dtype, g.hidden, g.heads*headDim)
		if qkNorm {
			g.rand(a+"q_norm.weight", normDType, headDim)
			g.rand(a+"k_norm.weight", normDType, headDim)
		}
		mlp(l)
	}
	g.rand("model.norm.weight", normDType, g.hidden)
}

// WideVariants lists dense checkpoints whose head counts allow TP 6 as well as 1, 2, 4 and 8: 24
// query heads over 2 KV heads (replicated 3 and 4 times at TP 6 and 8), an intermediate size of 96,
// and a vocabulary of 1000, whose 64-row padding (1024) does not divide by 6, so TP 6 tells
// lcm(64, TP) padding (1152 rows, 192 a rank) from v0.10.2's, which refuses it.
var WideVariants = []string{"llama-wide", "llama-wide-tied", "qwen2-wide", "qwen3-wide"}

const (
	wideInter   = 96
	wideHeadDim = 8
	// The wide MoE decoders' 12 experts of 48 features split over TP x DP up to 16 and TP 6 x DP 2.
	wideExperts = 12
	wideMoE     = 48
)

// wideDecoderMoEVariants are the WideMoEVariants built on the wide Llama-family skeleton.
var wideDecoderMoEVariants = []string{"mixtral-wide", "qwen2moe-wide", "qwen3moe-wide"}

var wideDims = dims{hidden: 96, heads: 24, kv: 2, vocab: 1000}

func wideCheckpoint(variant string, seed int64) ([]byte, map[string]Tensor) {
	g := &gen{rng: rand.New(rand.NewSource(seed)), out: map[string]Tensor{}, dims: wideDims}
	cfg := map[string]any{
		"hidden_size": g.hidden, "intermediate_size": wideInter, "num_attention_heads": g.heads,
		"num_key_value_heads": g.kv, "num_hidden_layers": 2, "vocab_size": g.vocab, "hidden_act": "silu",
		"rms_norm_eps": 1e-6, "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": false,
		"torch_dtype": "bfloat16",
	}
	mlp := func(dtype string) func(string) { return func(l string) { g.mlp(l+"mlp", dtype, wideInter) } }
	// experts adds a router and wideExperts experts of the checkpoint's names under prefix.
	experts := func(prefix, gate, up, down string) {
		g.rand(prefix+"gate.weight", "BF16", wideExperts, g.hidden)
		for e := 0; e < wideExperts; e++ {
			x := fmt.Sprintf("%sexperts.%d.", prefix, e)
			g.rand(x+gate+".weight", "BF16", wideMoE, g.hidden)
			g.rand(x+up+".weight", "BF16", wideMoE, g.hidden)
			g.rand(x+down+".weight", "BF16", g.hidden, wideMoE)
		}
	}
	switch variant {
	case "llama-wide", "llama-wide-tied":
		tied := variant == "llama-wide-tied"
		cfg["architectures"], cfg["model_type"] = []string{"LlamaForCausalLM"}, "llama"
		cfg["head_dim"], cfg["tie_word_embeddings"], cfg["attention_bias"], cfg["mlp_bias"] = wideHeadDim, tied, false, false
		g.decoder("BF16", 2, wideHeadDim, false, false, "BF16", mlp("BF16"))
		if !tied {
			g.rand("lm_head.weight", "BF16", g.vocab, g.hidden)
		}
	case "qwen2-wide":
		// Qwen2Attention's head_dim is hidden_size // num_heads = 4.
		cfg["architectures"], cfg["model_type"], cfg["torch_dtype"] = []string{"Qwen2ForCausalLM"}, "qwen2", "float16"
		g.decoder("F16", 2, g.hidden/g.heads, true, false, "F16", mlp("F16"))
		g.rand("lm_head.weight", "F16", g.vocab, g.hidden)
	case "qwen3-wide":
		cfg["architectures"], cfg["model_type"] = []string{"Qwen3ForCausalLM"}, "qwen3"
		cfg["head_dim"], cfg["attention_bias"] = wideHeadDim, false
		g.decoder("BF16", 2, wideHeadDim, false, true, "F32", mlp("BF16"))
		g.rand("lm_head.weight", "BF16", g.vocab, g.hidden)
	case "mixtral-wide":
		cfg["architectures"], cfg["model_type"], cfg["head_dim"] = []string{"MixtralForCausalLM"}, "mixtral", wideHeadDim
		cfg["intermediate_size"], cfg["num_local_experts"], cfg["num_experts_per_tok"] = wideMoE, wideExperts, 2
		g.decoder("BF16", 2, wideHeadDim, false, false, "BF16", func(l string) {
			experts(l+"block_sparse_moe.", "w1", "w3", "w2")
		})
		g.rand("lm_head.weight", "BF16", g.vocab, g.hidden)
	case "qwen2moe-wide":
		// Layer 0 sparse with a shared expert and its gate, layer 1 dense (mlp_only_layers); the
		// attention's head_dim is hidden_size // num_heads = 4.
		cfg["architectures"], cfg["model_type"] = []string{"Qwen2MoeForCausalLM"}, "qwen2_moe"
		cfg["moe_intermediate_size"], cfg["shared_expert_intermediate_size"] = wideMoE, wideMoE
		cfg["num_experts"], cfg["num_experts_per_tok"], cfg["decoder_sparse_step"] = wideExperts, 2, 1
		cfg["mlp_only_layers"], cfg["norm_topk_prob"] = []int{1}, false
		layer := 0
		g.decoder("BF16", 2, g.hidden/g.heads, true, false, "BF16", func(l string) {
			defer func() { layer++ }()
			if layer == 1 {
				g.mlp(l+"mlp", "BF16", wideInter)
				return
			}
			experts(l+"mlp.", "gate_proj", "up_proj", "down_proj")
			g.mlp(l+"mlp.shared_expert", "BF16", wideMoE)
			g.rand(l+"mlp.shared_expert_gate.weight", "BF16", 1, g.hidden)
		})
		g.rand("lm_head.weight", "BF16", g.vocab, g.hidden)
	case "qwen3moe-wide":
		// decoder_sparse_step 2: layer 0 dense, layer 1 sparse.
		cfg["architectures"], cfg["model_type"] = []string{"Qwen3MoeForCausalLM"}, "qwen3_moe"
		cfg["head_dim"], cfg["attention_bias"], cfg["moe_intermediate_size"] = wideHeadDim, false, wideMoE
		cfg["num_experts"], cfg["num_experts_per_tok"], cfg["decoder_sparse_step"] = wideExperts, 2, 2
		cfg["mlp_only_layers"], cfg["norm_topk_prob"] = []int{}, true
		layer := 0
		g.decoder("BF16", 2, wideHeadDim, false, true, "BF16", func(l string) {
			defer func() { layer++ }()
			if layer == 0 {
				g.mlp(l+"mlp", "BF16", wideInter)
				return
			}
			experts(l+"mlp.", "gate_proj", "up_proj", "down_proj")
		})
		g.rand("lm_head.weight", "BF16", g.vocab, g.hidden)
	default:
		panic("vllmref: unknown variant " + variant)
	}
	config, err := json.MarshalIndent(cfg, "", "  ")
	if err != nil {
		panic(err)
	}
	return config, g.out
}
