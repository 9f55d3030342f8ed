package vllmref

import (
	"fmt"
	"slices"
)

// Parallel is one rank of a vLLM deployment: TP x DP workers, optionally with
// --enable-expert-parallel. The fields after EnableEP exist from the "0.29" line on: PCP is
// --prefill-context-parallel-size (0 means 1) and PCPRank the rank in it, RedundantExperts is
// --enable-eplb with eplb_config.num_redundant_experts, RoundRobin is
// --expert-placement-strategy round_robin.
type Parallel struct {
	TP, TPRank, DP, DPRank int
	EnableEP               bool
	PCP, PCPRank           int
	RedundantExperts       int
	RoundRobin             bool
}

// Rank is RankAt the v0.10.2 line ("0.10").
func Rank(config []byte, tensors map[string]Tensor, p Parallel) (map[string]Tensor, error) {
	return RankAt("0.10", config, tensors, p)
}

// RankAt returns the tensors ShardedStateLoader.save_model of a vLLM release line (one of
// Releases) saves for that rank, keyed by the names _filter_subtensors keeps, or an error where vLLM
// refuses the configuration, or an Unmodelled error where the input is outside what the reference
// models for that line.
func RankAt(line string, config []byte, tensors map[string]Tensor, p Parallel) (out map[string]Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			switch e := r.(type) {
			case Refusal:
				out, err = nil, e
			case Unmodelled:
				out, err = nil, e
			default:
				panic(r)
			}
		}
	}()
	rel, ok := releases[line]
	if !ok {
		panic(Unmodelled("release line " + line + " is not modelled"))
	}
	if !rel.moeRunner && (p.PCP > 1 || p.RedundantExperts != 0 || p.RoundRobin) {
		panic(Unmodelled("prefill-context parallelism, EPLB and round-robin placement are modelled from 0.29 on"))
	}
	cfg := ParseConfig(config)
	b := &builder{cfg: cfg, hf: tensors, p: makePar(p), dtype: cfg.ModelDType(), rel: rel}
	arch := cfg.Architecture()
	if why, ok := rel.unmodelled[arch]; ok {
		panic(Unmodelled(arch + " on vLLM " + line + ": " + why))
	}
	switch {
	case arch == "GptOssForCausalLM": // its quantization is MXFP4 or none; gptoss reads it
	case mxfp4Method(cfg) == "mxfp4":
		panic(Refusal("the reference models MXFP4 for gpt-oss only"))
	default:
		b.bn, b.bk, b.fp8 = cfg.fp8Block()
	}
	b.p.sequenceParallel = rel.sequenceParallelMoE && p.EnableEP && p.TP > 1 && p.DP > 1
	// EPLB needs a model that implements MixtureOfExperts and hands FusedMoEFactory its
	// num_redundant_experts: DeepseekV2MoE, Glm4MoE, MixtralMoE
	// (mixtral.py@f0e26957c6af4d1ce3d0642120b011949da65885) and Qwen3MoeSparseMoeBlock
	// (qwen3_moe.py@2e0831b0ab951c8896d4dd5d6cb9c3350a4574de) do; Qwen2MoeForCausalLM (SupportsPP
	// and SupportsLoRA only, qwen2_moe.py@002fb90788ae749626fb09c6272f0cb604de46b6), gpt-oss's
	// MLPBlock and the dense models do not.
	if p.RedundantExperts > 0 && !slices.Contains([]string{"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM",
		"Glm4MoeForCausalLM", "MixtralForCausalLM", "Qwen3MoeForCausalLM"}, arch) {
		panic(Refusal(arch + " does not support EPLB's redundant experts"))
	}
	switch arch {
	case "LlamaForCausalLM",
		"Qwen2ForCausalLM",
		"Qwen3ForCausalLM",
		"MixtralForCausalLM",
		"Qwen2MoeForCausalLM",
		"Qwen3MoeForCausalLM":
		if b.fp8 {
			panic(Refusal("the reference models block fp8 for DeepSeek only"))
		}
		b.decoder(arch)
	case "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM":
		b.deepseek()
	case "Glm4MoeForCausalLM":
		b.glm4moe()
	case "GptOssForCausalLM":
		b.gptoss()
	default:
		panic(Refusal("architecture " + arch + " is not modelled by the reference"))
	}
	return b.result(), nil
}

// decoder builds the Llama-family models: llama.py, qwen2.py, qwen3.py, mixtral.py, qwen2_moe.py,
// qwen3_moe.py. They share the skeleton
//
//	model.embed_tokens, model.layers.N.{input_layernorm, self_attn.{qkv_proj,o_proj}, post_attention_layernorm, mlp},
//
// model.norm, lm_head
//
// and differ in attention biases, q_norm/k_norm, head_dim and the MLP/MoE block.
func (b *builder) decoder(arch string) {
	c := b.cfg
	hidden := c.Int("hidden_size")
	heads := c.Int("num_attention_heads")
	kvHeads := c.IntOr("num_key_value_heads", heads) // HF configs default num_key_value_heads to num_attention_heads
	vocabSize := c.Int("vocab_size")
	layers := c.Int("num_hidden_layers")

	// head_dim: LlamaAttention, Qwen3Attention, Qwen3MoeAttention and MixtralAttention use
	// config.head_dim when set (getattr(config, "head_dim", None) or hidden // heads);
	// Qwen2Attention and Qwen2MoeAttention use hidden_size // num_heads.
	headDim := c.IntOr("head_dim", hidden/heads)
	if arch == "Qwen2ForCausalLM" || arch == "Qwen2MoeForCausalLM" {
		headDim = hidden / heads
	}
	// Attention biases: Qwen2/Qwen2-MoE qkv_proj bias=True (o_proj none); Llama bias =
	// config.attention_bias on qkv_proj and o_proj; Qwen3/Qwen3-MoE qkv_bias = attention_bias.
	qkvBias, oBias := false, false
	switch arch {
	case "Qwen2ForCausalLM", "Qwen2MoeForCausalLM":
		qkvBias = true
	case "LlamaForCausalLM":
		qkvBias = c.BoolOr("attention_bias", false)
		oBias = qkvBias
		if c.BoolOr("mlp_bias", false) {
			panic(Refusal("llama mlp_bias is not modelled by the reference"))
		}
	case "Qwen3ForCausalLM", "Qwen3MoeForCausalLM":
		qkvBias = c.BoolOr("attention_bias", false)
	}
	qkNorm := arch == "Qwen3ForCausalLM" || arch == "Qwen3MoeForCausalLM"

	b.vocab([]string{"model.embed_tokens.weight"}, "model.embed_tokens.weight", vocabSize, hidden)
	for i := int64(0); i < layers; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		b.norm([]string{l + "input_layernorm.weight"}, l+"input_layernorm.weight", hidden)
		b.norm([]string{l + "post_attention_layernorm.weight"}, l+"post_attention_layernorm.weight", hidden)
		b.qkv([]string{l + "self_attn.qkv_proj"}, l+"self_attn.q_proj", l+"self_attn.k_proj", l+"self_attn.v_proj",
			false, qkvBias, heads, kvHeads, headDim, hidden)
		b.row([]string{l + "self_attn.o_proj"}, l+"self_attn.o_proj", false, oBias, hidden, heads*headDim)
		// LlamaAttention, Qwen2Attention and Qwen3Attention: self.attn = Attention(..., prefix=f"{prefix}.attn").
		b.attentionScales(l + "self_attn.attn")
		if qkNorm {
			// Qwen3Attention: q_norm, k_norm = RMSNorm(head_dim), replicated.
			b.norm([]string{l + "self_attn.q_norm.weight"}, l+"self_attn.q_norm.weight", headDim)
			b.norm([]string{l + "self_attn.k_norm.weight"}, l+"self_attn.k_norm.weight", headDim)
		}
		switch arch {
		case "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM":
			b.denseMLP(l+"mlp", c.Int("intermediate_size"), hidden)
		case "MixtralForCausalLM":
			b.mixtralMoE(l, hidden)
		case "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM":
			b.qwenMoE(arch, i, l, hidden)
		}
	}
	b.norm([]string{"model.norm.weight"}, "model.norm.weight", hidden)
	b.lmHead(vocabSize, hidden)
}

// lmHead is ParallelLMHead. With tie_word_embeddings the models make lm_head share the
// embedding's parameter (llama.py: lm_head.tie_weights(model.embed_tokens); qwen2/qwen3:
// lm_head = model.embed_tokens), so the state dict lists one tensor as both
// "lm_head.weight" and "model.embed_tokens.weight" and _filter_subtensors keeps "lm_head.weight".
func (b *builder) lmHead(vocabSize, hidden int64) {
	if b.cfg.BoolOr("tie_word_embeddings", false) {
		i := slices.IndexFunc(
			b.params,
			func(p param) bool { return slices.Contains(p.names, "model.embed_tokens.weight") },
		)
		b.params[i].names = append(b.params[i].names, "lm_head.weight")
		return
	}
	b.vocab([]string{"lm_head.weight"}, "lm_head.weight", vocabSize, hidden)
}

// denseMLP is LlamaMLP / Qwen2MLP / Qwen2MoeMLP / Qwen3MoeMLP / DeepseekV2MLP:
// gate_up_proj = MergedColumnParallelLinear(hidden, [I, I]) from gate_proj + up_proj (the models'
// stacked_params_mapping), down_proj = RowParallelLinear(I, hidden).
func (b *builder) denseMLP(prefix string, inter, hidden int64, aliases ...string) {
	b.denseMLPq(prefix, inter, hidden, false, aliases...)
}

func (b *builder) denseMLPq(prefix string, inter, hidden int64, quant bool, aliases ...string) {
	prefixes := append([]string{prefix}, aliases...)
	b.merged(
		suffixed(prefixes, ".gate_up_proj"),
		[]string{prefix + ".gate_proj", prefix + ".up_proj"},
		quant,
		false,
		[]int64{inter, inter},
		hidden,
	)
	b.row(suffixed(prefixes, ".down_proj"), prefix+".down_proj", quant, false, hidden, inter)
}

// mixtralMoE is MixtralMoE (mixtral.py): block_sparse_moe.gate = ReplicatedLinear(hidden,
// num_local_experts, quant_config=None), block_sparse_moe.experts = FusedMoE(num_local_experts,
// intermediate_size) from experts.N.w1 / w3 / w2.
//
// On a moeRunner line the experts are FusedMoEFactory with the arguments MixtralMoE gave FusedMoE
// before the factory (mixtral.py@f0e26957c6af4d1ce3d0642120b011949da65885, a vllm-project copy from
// before the factory: num_experts, top_k, hidden_size, intermediate_size, enable_eplb,
// num_redundant_experts; no gate=, no shared_experts=). PR #41184 made FusedMoE the factory of a
// MoERunner owning RoutedExperts and PR #44941 renamed it; they change the module tree under
// "experts", not what the models pass. So the gate stays "block_sparse_moe.gate.weight" and the
// experts save under "experts.routed_experts.".
func (b *builder) mixtralMoE(l string, hidden int64) {
	experts := b.cfg.Int("num_local_experts")
	inter := b.cfg.Int("intermediate_size")
	p := l + "block_sparse_moe"
	expertNames := p + ".experts"
	if b.rel.moeRunner {
		expertNames = p + ".experts.routed_experts"
	}
	b.replicated([]string{p + ".gate"}, p+".gate", false, experts, hidden)
	b.fusedMoE([]string{expertNames}, experts, inter, hidden, false, func(e int64) (string, string, string) {
		x := fmt.Sprintf("%s.experts.%d.", p, e)
		return x + "w1", x + "w3", x + "w2"
	})
}

// qwenMoE is the MLP of Qwen2MoeDecoderLayer / Qwen3MoeDecoderLayer: a sparse block when
// layer_idx not in mlp_only_layers and num_experts > 0 and (layer_idx + 1) % decoder_sparse_step
// == 0, else Qwen2MoeMLP / Qwen3MoeMLP(intermediate_size).
//
// Qwen2MoeSparseMoeBlock / Qwen3MoeSparseMoeBlock raise ValueError when tp_size > num_experts.
// The sparse block holds gate = ReplicatedLinear(hidden, num_experts, quant_config=None), experts =
// FusedMoE(num_experts, moe_intermediate_size); Qwen2-MoE adds shared_expert = Qwen2MoeMLP
// (shared_expert_intermediate_size, TP-split) when that size > 0 and shared_expert_gate =
// torch.nn.Linear(hidden, 1, bias=False) (replicated, model dtype). In v0.10.2 these are plain
// FusedMoE and plain attributes.
//
// On a moeRunner line the blocks give FusedMoEFactory what they gave SharedFusedMoE before the
// factory (PRs #41184 and #44941 change the module tree under "experts", not the arguments):
//
//	Qwen3-MoE (qwen3_moe.py@2e0831b0ab951c8896d4dd5d6cb9c3350a4574de): gate=self.gate,
//	  shared_experts=self.shared_expert (None without shared_expert_intermediate_size), enable_eplb,
//	  num_redundant_experts, is_sequence_parallel. The runner registers the gate again:
//	  "experts.gate.weight" is kept.
//	Qwen2-MoE (qwen2_moe.py@002fb90788ae749626fb09c6272f0cb604de46b6, and a FusedMoEFactory-era copy
//	  of the file in a fork, which reads the same): shared_experts=self.shared_expert, no gate=.
//	  shared_expert_gate (an nn.Linear there, a ReplicatedLinear in the fork: [1, hidden] in the
//	  model dtype either way) is also the shared expert's expert_gate, so it is
//	  "shared_expert_gate", "shared_expert.expert_gate" and, through the runner's SharedExperts
//	  (whose _layer is the shared expert), "experts._shared_experts._layer.expert_gate", the last
//	  kept like the shared expert's "experts._shared_experts._layer.*".
//
// Neither builds its shared or dense MLPs with is_sequence_parallel, so sequence-parallel MoE
// replicates nothing here. A Qwen3-MoE checkpoint with a shared expert is not modelled (the
// released ones have none).
func (b *builder) qwenMoE(arch string, i int64, l string, hidden int64) {
	c := b.cfg
	experts := c.Int("num_experts")
	step := c.IntOr("decoder_sparse_step", 1)
	sparse := !slices.Contains(c.IntsOr("mlp_only_layers"), i) && experts > 0 && (i+1)%step == 0
	if !sparse {
		b.denseMLP(l+"mlp", c.Int("intermediate_size"), hidden)
		return
	}
	if b.p.tp > experts {
		panic(
			Refusal(fmt.Sprintf("Tensor parallel size %d is greater than the number of experts %d.", b.p.tp, experts)),
		)
	}
	p := l + "mlp"
	gateNames, expertNames, sharedAliases := []string{p + ".gate"}, p+".experts", []string(nil)
	if b.rel.moeRunner {
		expertNames, sharedAliases = p+".experts.routed_experts", []string{p + ".experts._shared_experts._layer"}
		if arch == "Qwen3MoeForCausalLM" {
			gateNames = append(gateNames, p+".experts.gate")
			if c.IntOr("shared_expert_intermediate_size", 0) > 0 {
				panic(Unmodelled("Qwen3MoeForCausalLM with a shared expert is not modelled"))
			}
		}
	}
	b.fusedMoE(
		[]string{expertNames},
		experts,
		c.Int("moe_intermediate_size"),
		hidden,
		false,
		func(e int64) (string, string, string) {
			x := fmt.Sprintf("%s.experts.%d.", p, e)
			return x + "gate_proj", x + "up_proj", x + "down_proj"
		},
	)
	b.replicated(gateNames, p+".gate", false, experts, hidden)
	if arch == "Qwen2MoeForCausalLM" {
		shared := c.IntOr("shared_expert_intermediate_size", 0)
		gateNames := []string{p + ".shared_expert_gate.weight"}
		if shared > 0 {
			b.denseMLP(p+".shared_expert", shared, hidden, sharedAliases...)
			if b.rel.moeRunner {
				gateNames = append(gateNames, p+".shared_expert.expert_gate.weight",
					p+".experts._shared_experts._layer.expert_gate.weight")
			}
		}
		b.add(b.unquantized(p+".shared_expert_gate.weight", 1, hidden), gateNames...)
	}
}

// deepseek is DeepseekV2ForCausalLM / DeepseekV3ForCausalLM (deepseek_v2.py of v0.10.2) with MLA
// (model_config.use_mla, the default on GPUs).
func (b *builder) deepseek() {
	c := b.cfg
	hidden := c.Int("hidden_size")
	vocabSize := c.Int("vocab_size")
	layers := c.Int("num_hidden_layers")
	quant := b.fp8

	b.vocab([]string{"model.embed_tokens.weight"}, "model.embed_tokens.weight", vocabSize, hidden)
	for i := int64(0); i < layers; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		b.norm([]string{l + "input_layernorm.weight"}, l+"input_layernorm.weight", hidden)
		b.norm([]string{l + "post_attention_layernorm.weight"}, l+"post_attention_layernorm.weight", hidden)
		b.mla(l+"self_attn", hidden, quant)
		// DeepseekV2DecoderLayer: DeepseekV2MoE when n_routed_experts is not None and
		// layer_idx >= first_k_dense_replace and layer_idx % moe_layer_freq == 0, else
		// DeepseekV2MLP(intermediate_size).
		_, routed := c.NullableInt("n_routed_experts")
		if routed && i >= c.IntOr("first_k_dense_replace", 0) && i%c.IntOr("moe_layer_freq", 1) == 0 {
			b.deepseekMoE(l+"mlp", hidden, quant)
		} else {
			b.denseMLPq(l+"mlp", c.Int("intermediate_size"), hidden, quant)
		}
	}
	b.norm([]string{"model.norm.weight"}, "model.norm.weight", hidden)
	// ParallelLMHead(vocab_size, hidden_size, quant_config): Fp8Config.get_quant_method returns
	// no fp8 method for it (not a LinearBase), so it stays in the model dtype.
	b.lmHead(vocabSize, hidden)
}

// mla is DeepseekV2MLAAttention. With q_lora_rank: fused_qkv_a_proj =
// MergedColumnParallelLinear(hidden, [q_lora_rank, kv_lora_rank + qk_rope_head_dim],
// disable_tp=True) loaded from q_a_proj and kv_a_proj_with_mqa (stacked_params_mapping, since the
// "[perf] fused MLA QKV" change of July 2025), q_a_layernorm = RMSNorm(q_lora_rank), q_b_proj =
// ColumnParallelLinear(q_lora_rank, heads * qk_head_dim). Without it: q_proj =
// ColumnParallelLinear(hidden, heads * qk_head_dim), kv_a_proj_with_mqa = ReplicatedLinear(hidden,
// kv_lora_rank + qk_rope_head_dim). Then kv_a_layernorm = RMSNorm(kv_lora_rank), kv_b_proj =
// ColumnParallelLinear(kv_lora_rank, heads * (qk_nope + v_head_dim)), o_proj =
// RowParallelLinear(heads * v_head_dim, hidden). All quantized in a block-fp8 checkpoint.
//
// v0.10.2 also hands these modules to MultiHeadLatentAttention (layers/mla.py, PR #23332), which
// stores them as its own attributes (self.fused_qkv_a_proj = mla_modules.fused_qkv_a_proj, ...),
// so each is in the state dict under "self_attn.X" and "self_attn.mla_attn.X". The rotary
// embedding holds only a non-persistent buffer; the inner Attention's kv-cache scales
// (Fp8KVCacheMethod.create_weights) are deleted by process_weights_after_loading.
func (b *builder) mla(p string, hidden int64, quant bool) {
	c := b.cfg
	heads := c.Int("num_attention_heads")
	qLora, hasQLora := c.NullableInt("q_lora_rank")
	kvLora := c.Int("kv_lora_rank")
	nope, rope, vDim := c.Int("qk_nope_head_dim"), c.Int("qk_rope_head_dim"), c.Int("v_head_dim")
	divide(heads, b.p.tp, "num_attention_heads") // DeepseekV2MLAAttention: assert num_heads % tp_size == 0
	names := func(m string) []string { return []string{p + "." + m, p + ".mla_attn." + m} }
	if hasQLora {
		b.merged(names("fused_qkv_a_proj"), []string{p + ".q_a_proj", p + ".kv_a_proj_with_mqa"}, quant, true,
			[]int64{qLora, kvLora + rope}, hidden)
		b.norm(suffixed(names("q_a_layernorm"), ".weight"), p+".q_a_layernorm.weight", qLora)
		b.column(names("q_b_proj"), p+".q_b_proj", quant, false, heads*(nope+rope), qLora)
	} else {
		b.column(names("q_proj"), p+".q_proj", quant, false, heads*(nope+rope), hidden)
		b.replicated(names("kv_a_proj_with_mqa"), p+".kv_a_proj_with_mqa", quant, kvLora+rope, hidden)
	}
	b.norm(suffixed(names("kv_a_layernorm"), ".weight"), p+".kv_a_layernorm.weight", kvLora)
	b.column(names("kv_b_proj"), p+".kv_b_proj", quant, false, heads*(nope+vDim), kvLora)
	b.row(names("o_proj"), p+".o_proj", quant, false, hidden, heads*vDim)
	// MultiHeadLatentAttentionWrapper holds its MLAAttention as self.mla_attn (created with prefix
	// f"{prefix}.attn", which names it for the forward context, not in the module tree): the
	// scale buffers are under self_attn.mla_attn.mla_attn (layers/mla.py, the wrapper's __init__).
	b.attentionScales(p + ".mla_attn.mla_attn")
}

// deepseekMoE is DeepseekV2MoE of v0.10.2:
//
//	gate = ReplicatedLinear(hidden, n_routed_experts, quant_config=None): model dtype, replicated;
//	gate.e_score_correction_bias = nn.Parameter(torch.empty(n_routed_experts, dtype=torch.float32))
//	  when topk_method == "noaux_tc", and passed to FusedMoE, whose __init__ stores it as
//	  self.e_score_correction_bias: one F32 tensor named "gate.e_score_correction_bias" and
//	  "experts.e_score_correction_bias", the second kept;
//	shared_experts = DeepseekV2MLP(moe_intermediate_size * n_shared_experts, TP-split) when
//	  n_shared_experts is not None, and experts = SharedFusedMoE(shared_experts=..., ...), which
//	  stores it as self._shared_experts: named "shared_experts.*" and "experts._shared_experts.*",
//	  the second kept;
//	experts = FusedMoE(n_routed_experts, moe_intermediate_size) from experts.N.{gate,up,down}_proj.
//
// On a moeRunner line (deepseek_v2.py@002d6073aa034d4f5545d45021b0e56d1f3c3593) the gate is a
// GateLinear (a ReplicatedLinear, quant_config None, params_dtype None so the model dtype:
// router_dtype is None without moe_router_dtype) holding the same F32 bias, and the model passes
// gate=self.gate and shared_experts=self.shared_experts to FusedMoEFactory, so the smallest names
// are "experts.gate.weight", "experts.gate.e_score_correction_bias" (before
// "experts.routed_experts.e_score_correction_bias"), "experts._shared_experts._layer.*" and
// "experts.routed_experts.w13_weight". With sequence-parallel MoE the shared experts are built with
// disable_tp: whole on every rank.
func (b *builder) deepseekMoE(p string, hidden int64, quant bool) {
	c := b.cfg
	experts := c.Int("n_routed_experts")
	gateNames, sharedAlias, expertNames := []string{p + ".gate"}, p+".experts._shared_experts", p+".experts"
	biasNames := []string{p + ".gate.e_score_correction_bias", p + ".experts.e_score_correction_bias"}
	if b.rel.moeRunner {
		gateNames = append(gateNames, p+".experts.gate")
		sharedAlias, expertNames = p+".experts._shared_experts._layer", p+".experts.routed_experts"
		biasNames = []string{
			p + ".gate.e_score_correction_bias", p + ".experts.gate.e_score_correction_bias",
			p + ".experts.routed_experts.e_score_correction_bias",
		}
	}
	b.replicated(gateNames, p+".gate", false, experts, hidden)
	if c.StringOr("topk_method", "") == "noaux_tc" {
		b.add(Convert(b.get(p+".gate.e_score_correction_bias", experts), "F32"), biasNames...)
	}
	if shared, ok := c.NullableInt("n_shared_experts"); ok {
		build := func() {
			b.denseMLPq(p+".shared_experts", c.Int("moe_intermediate_size")*shared, hidden, quant, sharedAlias)
		}
		if b.p.sequenceParallel {
			b.withoutTP(build)
		} else {
			build()
		}
	}
	b.fusedMoE(
		[]string{expertNames},
		experts,
		c.Int("moe_intermediate_size"),
		hidden,
		quant,
		func(e int64) (string, string, string) {
			x := fmt.Sprintf("%s.experts.%d.", p, e)
			return x + "gate_proj", x + "up_proj", x + "down_proj"
		},
	)
}

// withoutTP builds layers created with disable_tp=True: their tp_size is 1 and tp_rank 0
// (LinearBase.__init__ in layers/linear.py), so every rank holds them whole.
func (b *builder) withoutTP(build func()) {
	tp, r := b.p.tp, b.p.tpRank
	b.p.tp, b.p.tpRank = 1, 0
	defer func() { b.p.tp, b.p.tpRank = tp, r }()
	build()
}
