package vllmref

import (
	"encoding/json"
	"fmt"
	"math"
)

// glm4moe is Glm4MoeForCausalLM
// (vllm/model_executor/models/glm4_moe.py@002d6073aa034d4f5545d45021b0e56d1f3c3593):
//
//	Glm4MoeAttention: qkv_proj = QKVParallelLinear(bias=config.attention_bias), o_proj =
//	  RowParallelLinear(bias=False), q_norm/k_norm = RMSNorm(head_dim) when use_qk_norm, head_dim =
//	  config.head_dim or hidden // heads, self.attn = Attention(prefix=f"{prefix}.attn");
//	layer i is Glm4MoE when n_routed_experts is not None and i >= first_k_dense_replace, else
//	  Glm4MoeMLP(intermediate_size) (gate_up_proj, down_proj);
//	Glm4MoE: gate = nn.Linear(hidden, n_routed_experts, bias=False, dtype=torch.float32) (an F32
//	  parameter, never quantized: not a LinearBase), gate.e_score_correction_bias = F32 parameter,
//	  shared_experts = Glm4MoeMLP(moe_intermediate_size * n_shared_experts) TP-split, experts =
//	  FusedMoEFactory(shared_experts=..., e_score_correction_bias=..., no gate=).
//
// So the runner registers the shared experts a second time (experts._shared_experts._layer, kept)
// and RoutedExperts the bias (experts.routed_experts.e_score_correction_bias, kept), while the gate
// weight stays "mlp.gate.weight". The model does not pass is_sequence_parallel, so nothing is
// replicated under sequence-parallel MoE. Shared-expert fusion (resolve_layer_fused_shared_expert)
// is ROCm AITER only; the plain CUDA path keeps the shared experts apart.
func (b *builder) glm4moe() {
	c := b.cfg
	if !b.rel.moeRunner {
		panic(Unmodelled("Glm4MoeForCausalLM is modelled on FusedMoEFactory lines only"))
	}
	if act := c.StringOr("hidden_act", "silu"); act != "silu" {
		panic(Refusal("Unsupported activation: " + act + ". Only silu is supported for now."))
	}
	if c.BoolOr("tie_word_embeddings", false) {
		panic(Unmodelled("Glm4MoeForCausalLM with tie_word_embeddings is not modelled"))
	}
	hidden, heads := c.Int("hidden_size"), c.Int("num_attention_heads")
	kvHeads := c.IntOr("num_key_value_heads", heads)
	headDim := c.IntOr("head_dim", hidden/heads)
	vocabSize, layers := c.Int("vocab_size"), c.Int("num_hidden_layers")
	qkvBias, qkNorm := c.BoolOr("attention_bias", false), c.BoolOr("use_qk_norm", false)
	quant := b.fp8
	_, routed := c.NullableInt("n_routed_experts")

	b.vocab([]string{"model.embed_tokens.weight"}, "model.embed_tokens.weight", vocabSize, hidden)
	for i := int64(0); i < layers; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		a := l + "self_attn."
		b.norm([]string{l + "input_layernorm.weight"}, l+"input_layernorm.weight", hidden)
		b.norm([]string{l + "post_attention_layernorm.weight"}, l+"post_attention_layernorm.weight", hidden)
		b.qkv([]string{a + "qkv_proj"}, a+"q_proj", a+"k_proj", a+"v_proj", quant, qkvBias, heads, kvHeads, headDim,
			hidden)
		b.row([]string{a + "o_proj"}, a+"o_proj", quant, false, hidden, heads*headDim)
		b.attentionScales(a + "attn")
		if qkNorm {
			b.norm([]string{a + "q_norm.weight"}, a+"q_norm.weight", headDim)
			b.norm([]string{a + "k_norm.weight"}, a+"k_norm.weight", headDim)
		}
		if !routed || i < c.IntOr("first_k_dense_replace", 0) {
			b.denseMLPq(l+"mlp", c.Int("intermediate_size"), hidden, quant)
			continue
		}
		p := l + "mlp"
		experts, inter := c.Int("n_routed_experts"), c.Int("moe_intermediate_size")
		b.add(Convert(b.get(p+".gate.weight", experts, hidden), "F32"), p+".gate.weight")
		b.add(Convert(b.get(p+".gate.e_score_correction_bias", experts), "F32"),
			p+".gate.e_score_correction_bias", p+".experts.routed_experts.e_score_correction_bias")
		if shared, ok := c.NullableInt("n_shared_experts"); ok {
			b.denseMLPq(p+".shared_experts", inter*shared, hidden, quant, p+".experts._shared_experts._layer")
		}
		b.fusedMoE([]string{p + ".experts.routed_experts"}, experts, inter, hidden, quant,
			func(e int64) (string, string, string) {
				x := fmt.Sprintf("%s.experts.%d.", p, e)
				return x + "gate_proj", x + "up_proj", x + "down_proj"
			})
	}
	b.norm([]string{"model.norm.weight"}, "model.norm.weight", hidden)
	b.lmHead(vocabSize, hidden)
}

// gptoss is GptOssForCausalLM with an MXFP4 checkpoint. The loader's per-rank rule is
// GptOssModel._load_weights_mxfp4
// (vllm/model_executor/models/gpt_oss.py@a6b6cfaa0cedff84872a0118380c6cfea91b635d, the newest copy
// of vllm-project's file found, from before the factory: its experts a FusedMoE; on a moeRunner line
// they are taken to be the factory's MoERunner with RoutedExperts holding them, as for Mixtral):
//
//	tp_size, tp_rank = flatten_tp_across_dp_and_pcp(TP, DP, dp_rank, ...): TP x DP, dp_rank*TP+tp_rank;
//	per_rank = cdiv(intermediate // 32, tp_size) * 32; start = tp_rank * per_rank,
//	  end = min((tp_rank + 1) * per_rank, intermediate) (whole MXFP4 blocks; later ranks shorter,
//	  possibly empty);
//	w13_weight: gate_up_proj_blocks viewed [E, 2I, H/2], rows [2*start, 2*end) (gate and up rows
//	  interleave in the checkpoint, so a row range keeps pairs together); w13_weight_scale likewise;
//	  w13_bias columns [2*start, 2*end);
//	w2_weight: down_proj_blocks viewed [E, H, I/2], columns [start/2, end/2); w2_weight_scale columns
//	  [start/32, end/32); w2_bias whole, zeroed where tp_rank != 0 (the bias is added once);
//	with enable_expert_parallel: experts [ep_rank * E // ep, (ep_rank + 1) * E // ep) of each,
//	  whole, w2_bias not zeroed;
//	sinks: narrow(0, tp_rank * heads // TP, heads // TP) with the attention TP rank.
//
// The saved parameters are Mxfp4MoEMethod's, whose intermediate size is rounded up for the kernels;
// the reference holds what the loader narrows (the unpadded slice), as the server does, and drops
// a slice with no element as _filter_subtensors drops an empty tensor. The attention (OAIAttention:
// qkv_proj and o_proj with biases, the o_proj bias whole on every rank), the router (a Linear with a
// bias, never quantized) and the norms are in the model dtype; names follow the module tree
// (model.embedding, model.layers.N.attn.*, model.layers.N.mlp.router), which the model's
// hf_to_vllm_mapper maps the checkpoint's names onto.
func (b *builder) gptoss() {
	c := b.cfg
	if !b.rel.moeRunner {
		panic(Unmodelled("GptOssForCausalLM is modelled on FusedMoEFactory lines only"))
	}
	if mxfp4Method(c) != "mxfp4" {
		panic(Unmodelled("GptOssForCausalLM is modelled with MXFP4 experts only"))
	}
	if c.BoolOr("tie_word_embeddings", false) {
		panic(Unmodelled("GptOssForCausalLM with tie_word_embeddings is not modelled"))
	}
	hidden, heads, kvHeads := c.Int("hidden_size"), c.Int("num_attention_heads"), c.Int("num_key_value_heads")
	headDim, vocabSize, layers := c.Int("head_dim"), c.Int("vocab_size"), c.Int("num_hidden_layers")
	experts, inter := c.Int("num_local_experts"), c.Int("intermediate_size")
	tp, r := b.p.tp, b.p.tpRank
	// OAIAttention gives Attention num_kv_heads = num_key_value_heads // tp_size, which must be at
	// least one (Attention asserts num_heads % num_kv_heads == 0).
	if kvHeads/tp == 0 {
		panic(Refusal(fmt.Sprintf("num_key_value_heads %d over tensor_parallel_size %d leaves a rank none", kvHeads, tp)))
	}
	// MLPBlock: assert config.intermediate_size % self.world_size == 0 (the ranks of TP x DP).
	world := b.p.moeTP * b.p.ep
	if inter%world != 0 {
		panic(Refusal(fmt.Sprintf("intermediate_size %d is not divisible by the world size %d", inter, world)))
	}
	if inter%mxfp4Block != 0 || hidden%mxfp4Block != 0 {
		panic(Refusal("MXFP4 rows must be whole 32-element blocks"))
	}
	headsPP := divide(heads, tp, "num_attention_heads")

	b.vocab([]string{"model.embedding.weight"}, "model.embed_tokens.weight", vocabSize, hidden)
	for i := int64(0); i < layers; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		a, hfA := l+"attn.", l+"self_attn."
		b.norm([]string{l + "input_layernorm.weight"}, l+"input_layernorm.weight", hidden)
		b.norm([]string{l + "post_attention_layernorm.weight"}, l+"post_attention_layernorm.weight", hidden)
		b.add(NarrowRows(b.unquantized(hfA+"sinks", heads), r*headsPP, headsPP, hfA+"sinks"), a+"sinks")
		b.qkv([]string{a + "qkv_proj"}, hfA+"q_proj", hfA+"k_proj", hfA+"v_proj", false, true, heads, kvHeads,
			headDim, hidden)
		b.row([]string{a + "o_proj"}, hfA+"o_proj", false, true, hidden, heads*headDim)
		b.attentionScales(a + "attn")
		m := l + "mlp."
		b.add(b.unquantized(m+"router.weight", experts, hidden), m+"router.weight")
		b.add(b.unquantized(m+"router.bias", experts), m+"router.bias")
		b.mxfp4Experts(m+"experts.routed_experts.", m+"experts.", experts, inter, hidden)
	}
	b.norm([]string{"model.norm.weight"}, "model.norm.weight", hidden)
	b.lmHead(vocabSize, hidden)
}

// mxfp4Experts lays out one gpt-oss MoE layer's experts by _load_weights_mxfp4's rule (gptoss).
func (b *builder) mxfp4Experts(name, hf string, experts, inter, hidden int64) {
	nbH, nbI := hidden/mxfp4Block, inter/mxfp4Block
	w13 := b.get(hf+"gate_up_proj_blocks", experts, 2*inter, nbH, mxfp4Block/2)
	s13 := b.get(hf+"gate_up_proj_scales", experts, 2*inter, nbH)
	b13 := Convert(b.get(hf+"gate_up_proj_bias", experts, 2*inter), b.dtype)
	w2 := b.get(hf+"down_proj_blocks", experts, hidden, nbI, mxfp4Block/2)
	s2 := b.get(hf+"down_proj_scales", experts, hidden, nbI)
	b2 := Convert(b.get(hf+"down_proj_bias", experts, hidden), b.dtype)
	for _, t := range []Tensor{w13, s13, w2, s2} {
		if t.DType != "U8" {
			panic(Refusal(fmt.Sprintf("%s MXFP4 blocks and scales are U8, not %s", hf, t.DType)))
		}
	}
	// The blocks viewed as [E, rows, cols/2]: one row of packed bytes per output row.
	w13.Shape, w2.Shape = []int64{experts, 2 * inter, hidden / 2}, []int64{experts, hidden, inter / 2}
	if b.p.ep > 1 {
		if experts%b.p.ep != 0 {
			panic(Refusal(fmt.Sprintf("%d experts over %d expert-parallel ranks: the gpt-oss loader slices "+
				"num_experts // ep_size experts a rank, which does not fill the layer's %d local experts",
				experts, b.p.ep, CeilDiv(experts, b.p.ep))))
		}
		per := experts / b.p.ep
		for _, x := range []struct {
			suffix string
			t      Tensor
		}{{"w13_weight", w13}, {"w13_weight_scale", s13}, {"w13_bias", b13}, {"w2_weight", w2},
			{"w2_weight_scale", s2}, {"w2_bias", b2}} {
			b.add(NarrowRows(x.t, b.p.epRank*per, per, hf+x.suffix), name+x.suffix)
		}
		return
	}
	per := CeilDiv(nbI, b.p.moeTP) * mxfp4Block
	start := b.p.moeTPRank * per
	end := min(start+per, inter)
	n := max(end-start, 0)
	start = min(start, inter)
	b.add(perExpert(w13, func(t Tensor) Tensor { return NarrowRows(t, 2*start, 2*n, hf+"gate_up_proj_blocks") }),
		name+"w13_weight")
	b.add(perExpert(s13, func(t Tensor) Tensor { return NarrowRows(t, 2*start, 2*n, hf+"gate_up_proj_scales") }),
		name+"w13_weight_scale")
	b.add(NarrowCols(b13, 2*start, 2*n, hf+"gate_up_proj_bias"), name+"w13_bias")
	b.add(perExpert(w2, func(t Tensor) Tensor { return NarrowCols(t, start/2, n/2, hf+"down_proj_blocks") }),
		name+"w2_weight")
	b.add(perExpert(s2, func(t Tensor) Tensor {
		return NarrowCols(t, start/mxfp4Block, n/mxfp4Block, hf+"down_proj_scales")
	}), name+"w2_weight_scale")
	if b.p.moeTPRank != 0 {
		b2 = Tensor{DType: b2.DType, Shape: b2.Shape, Data: make([]byte, len(b2.Data))}
	}
	b.add(b2, name+"w2_bias")
}

// perExpert applies a 2-D slice to every expert of an [E, ...] tensor and stacks the results.
func perExpert(t Tensor, slice func(Tensor) Tensor) Tensor {
	var out []Tensor
	for e := int64(0); e < t.Shape[0]; e++ {
		x := NarrowRows(t, e, 1, "expert")
		x.Shape = x.Shape[1:]
		out = append(out, slice(x))
	}
	return Stack(out)
}

// mxfp4Method is quantization_config.quant_method, or "" without one.
func mxfp4Method(c HFConfig) string {
	if !c.Has("quantization_config") || c.IsNull("quantization_config") {
		return ""
	}
	var q struct {
		QuantMethod string `json:"quant_method"`
	}
	if err := json.Unmarshal(c["quantization_config"], &q); err != nil {
		panic(Refusal("config.json: quantization_config: " + err.Error()))
	}
	return q.QuantMethod
}

// qkvScale is the block scale of a block-fp8 QKVParallelLinear: the parameter has
// ceil(sum(out_pp) / block_n) rows (filled with float32 min), and shard q, k, v lands at
// ceil(offset / block_n) with ceil(size / block_n) rows, read from rows shard_rank * that size of
// its checkpoint scale, shard_rank being tp_rank for q and tp_rank // num_kv_head_replicas for k and
// v (QKVParallelLinear.weight_loader_v2 with BlockQuantScaleParameter, load_qkv_weight).
func (b *builder) qkvScale(hfs [3]string, outs, pps, ranks [3]int64, in int64) Tensor {
	scale := filledF32(-math.MaxFloat32, CeilDiv(pps[0]+pps[1]+pps[2], b.bn), CeilDiv(in, b.bk))
	var off int64
	for k, hf := range hfs {
		size := CeilDiv(pps[k], b.bn)
		src := NarrowRows(b.linScale(hf, outs[k], in), ranks[k]*size, size, hf+".weight_scale_inv")
		copyRowsInto(&scale, CeilDiv(off, b.bn), src, hf+".weight_scale_inv")
		off += pps[k]
	}
	return scale
}
