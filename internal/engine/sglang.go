package engine

import (
	"fmt"
	"slices"
)

// SGLang's sharded_state layouts: what ShardedStateLoader.save_model writes for a rank
// (python/sglang/srt/model_loader/loader.py at 005cbe0ea796446e420b6aab62ce51a488f5e7c7):
// _filter_subtensors(model.state_dict()) to model-rank-{rank}-part-{part}.safetensors, rank the TP
// rank. Its load_model runs every module's process_weights_after_loading before it copies the files
// in and raises "Missing keys" for a parameter they lack, so the files must be the state of a model
// whose post-load processing is the identity: unquantized weights (layers/linear.py at
// 0079fcc18b3ee44bfeaaea8a9268c1d50b57b3e1: UnquantizedLinearMethod repacks only on CPU with AMX)
// on the default MoE runner.
//
// The parallel options are SGLang's server arguments:
//   - --tp-size: the embedding, every linear layer and the LM head split over the TP group as
//     vLLM's layers do (SGLang's linear.py and vocab_parallel_embedding.py at
//     04d5e392629c53b9db96052947733bd434ea00a2 are adapted from vLLM's: the vocabulary pads to a
//     multiple of 64, which must divide by the group, and the checkpoint's rows must be
//     config.json's vocab_size).
//   - --dp-size with --enable-dp-attention: the TP group is DP groups of TP / DP consecutive ranks
//     for attention (compute_dp_attention_world_info in layers/dp_attention.py at
//     2aa2e2d0ffda0a44ed9a022fdd9d5d042f365eee: attention TP rank = tp_rank % (TP / DP));
//     server_args.py (_handle_data_parallelism, in copies whose commit the search index does not
//     name) refuses TP % DP != 0 and turns DP attention off at DP 1. Without it DP starts whole
//     replicas, each one writing the same files.
//   - --ep-size: the MoE layers split the TP group into EP groups of TP / EP MoE-TP ranks
//     (initialize_model_parallel in distributed/parallel_state.py at
//     0005973a84f7a02787e270b6be5970d3022d07fe: MoE TP groups consecutive, so MoE TP rank = tp_rank
//     % (TP / EP) and EP rank = tp_rank / (TP / EP)); TP / EP must be whole.
//
// Architectures:
//   - LlamaForCausalLM (models/llama.py at 00239548f1cd1a06ca145a5447a86738090a48f1): every module
//     over the whole TP group, DP attention or not (LlamaAttention reads the TP world size, its
//     embedding has no enable_tp); q/k/v and o biases where attention_bias or bias says, no MLP
//     bias, SiLU only.
//   - Qwen3ForCausalLM (models/qwen3.py at 01b5f572b7b678e2fa5a727881f1ff3ab4dd3c6d, its model
//     Qwen2Model in qwen2.py, whose enable_tp was read in a copy the index names no commit for):
//     Qwen3Attention's qkv_proj and o_proj (biases where attention_bias
//     says) over the attention TP group, the embedding whole on every rank under DP attention
//     (enable_tp = not is_dp_attention_enabled()), the MLP and the LM head over the TP group
//     (enable_dp_lm_head is off by default); tied embeddings make lm_head the embedding module.
//   - Qwen3MoeForCausalLM (models/qwen3_moe.py at 008af3a6f95b956ea4d50986f9a921f13dced28b, its
//     model Qwen2MoeModel in qwen2_moe.py at 0115497da8f2340cdce444597387cf2a4d499f5c): Qwen3's
//     attention and embedding; every layer sparse ("Qwen3MoE all layers are sparse"), mlp.experts a
//     FusedMoE (layers/moe/fused_moe_triton/layer.py at 008d7d0e947e436a572cf8243674adf264dc8836:
//     E / EP experts a rank, EP rank e holding [e·E/EP, (e+1)·E/EP), each split by MoE TP into
//     w13_weight and w2_weight) and mlp.gate a ReplicatedLinear; the LM head is always its own
//     ParallelLMHead.
func init() {
	takes("sglang", dataParallel, enableDPAttention, expertParallelSize)
	register("sglang", sglangLlama, "LlamaForCausalLM")
	register("sglang", sglangQwen3, "Qwen3ForCausalLM")
	register("sglang", sglangQwen3MoE, "Qwen3MoeForCausalLM")
	decline("sglang", "SGLang's MLA fuses q_a_proj and kv_a_proj_with_mqa into fused_qkv_a_proj_with_mqa "+
		"(loader.py's packed modules) and derives its absorbed w_kc and w_vc after loading (post_load_weights, "+
		"which ShardedStateLoader runs too); that layout is not modelled here",
		"DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
}

func sglangLlama(m *model) error {
	if m.cfg.bool("mlp_bias") {
		return checkpointError("SGLang's LlamaMLP has no biases; a checkpoint with mlp_bias would load without them")
	}
	if err := m.sglangDecoder(m.cfg.bool("attention_bias") || m.cfg.bool("bias"), true); err != nil {
		return err
	}
	return llama(m)
}

func sglangQwen3(m *model) error {
	if err := m.sglangDecoder(m.cfg.bool("attention_bias"), true); err != nil {
		return err
	}
	m.sglangDPAttention()
	return llama(m)
}

func sglangQwen3MoE(m *model) error {
	if m.cfg.bool("tie_word_embeddings") {
		return checkpointError("SGLang's Qwen3-MoE builds its own lm_head, which a checkpoint with tied embeddings does not fill")
	}
	if err := m.sglangDecoder(m.cfg.bool("attention_bias"), false); err != nil {
		return err
	}
	m.sglangDPAttention()
	layers, err := m.cfg.int("num_hidden_layers", -1)
	if err != nil {
		return err
	}
	experts, err := m.cfg.int("num_experts", -1)
	if err != nil {
		return err
	}
	step, err := m.cfg.int("decoder_sparse_step", 1)
	if err != nil {
		return err
	}
	dense, err := m.cfg.ints("mlp_only_layers")
	if err != nil {
		return err
	}
	for i := range layers {
		if experts == 0 || step == 0 || (i+1)%step != 0 || slices.Contains(dense, i) {
			return checkpointError("layer %d of the checkpoint is a dense MLP; SGLang's Qwen3-MoE builds every "+
				"layer sparse, so its experts would be left unfilled", i)
		}
	}
	g, err := m.sglangExperts(experts)
	if err != nil {
		return err
	}
	return m.decoder(func(i int64, pre string) error {
		mlp := pre + "mlp."
		if err := m.stackExperts(mlp+"experts.", g, func(e int64) (string, string, string) {
			ex := fmt.Sprintf("%sexperts.%d.", mlp, e)
			return ex + "gate_proj", ex + "up_proj", ex + "down_proj"
		}); err != nil {
			return err
		}
		return m.replicated(mlp+"gate.weight", mlp+"gate.weight", m.dtype)
	})
}

// sglangDPAttention puts the attention on DP attention's group and the embedding whole on every
// rank, where DP attention is on (the models that read it). sglangDecoder has checked the sizes.
func (m *model) sglangDPAttention() {
	if !m.par.DPAttention || m.par.DP == 1 {
		return
	}
	size := m.par.TP / m.par.DP
	m.attention, m.embedding = tpGroup{size, m.par.TPRank % size}, tpGroup{1, 0}
}

// sglangDecoder refuses what SGLang refuses for every architecture here, or would load into
// something else: quantized checkpoints, DP attention over a TP group it does not divide, an EP
// size that does not divide TP, a vocabulary other than config.json's, attention biases other than
// the config builds (SGLang builds them from the config, and the loader refuses a key the model
// lacks), and for a dense MLP an activation other than SiLU. Qwen3's q/k norms, which its
// attention always builds, the decoder requires (qkNorm).
func (m *model) sglangDecoder(bias, denseMLP bool) error {
	if m.cfg.has("quantization_config") {
		return checkpointError("SGLang loads a sharded_state directory into the weights its quantization " +
			"methods leave after process_weights_after_loading, in kernel formats; sglang layouts are for " +
			"unquantized (BF16, F16) checkpoints")
	}
	p := m.par
	if p.DPAttention && p.DP > 1 && p.TP%p.DP != 0 {
		return &Error{"/layout/data_parallel_size", fmt.Sprintf(
			"DP attention splits the %d TP ranks into %d groups; SGLang refuses a TP size the DP size does not divide",
			p.TP, p.DP)}
	}
	if p.TP%p.EP != 0 {
		return &Error{"/layout/expert_parallel_size", fmt.Sprintf(
			"SGLang splits the %d TP ranks into expert-parallel groups of %d; it does not divide them", p.TP, p.EP)}
	}
	if denseMLP && m.cfg.str("hidden_act") != "silu" {
		return checkpointError("SGLang's MLP runs SiLU only; config.json's hidden_act is %q", m.cfg.str("hidden_act"))
	}
	vocab, err := m.cfg.int("vocab_size", -1)
	if err != nil {
		return err
	}
	heads := []string{"model.embed_tokens.weight"}
	if !m.cfg.bool("tie_word_embeddings") {
		heads = append(heads, "lm_head.weight")
	}
	for _, name := range heads {
		if sh, err := m.shape(name, 2); err != nil {
			return err
		} else if sh[0] != vocab {
			return checkpointError("%s has %d rows; SGLang loads it only when they are config.json's vocab_size %d",
				name, sh[0], vocab)
		}
	}
	layers, err := m.cfg.int("num_hidden_layers", -1)
	if err != nil {
		return err
	}
	for i := range layers {
		at := fmt.Sprintf("model.layers.%d.self_attn.", i)
		for _, t := range []string{"q_proj.bias", "k_proj.bias", "v_proj.bias", "o_proj.bias"} {
			if m.has(at+t) != bias {
				return checkpointError("the checkpoint %s %s%s, where SGLang builds the attention %s biases "+
					"(config.json's attention_bias)", map[bool]string{true: "has", false: "has no"}[m.has(at+t)],
					at, t, map[bool]string{true: "with", false: "without"}[bias])
			}
		}
	}
	return nil
}

// sglangExperts places count experts: E / EP of them on the rank's EP rank, split by its MoE TP
// rank, refusing what FusedMoE and Qwen3MoeSparseMoeBlock assert.
func (m *model) sglangExperts(count int64) (moeGroup, error) {
	p := m.par
	moeTP := p.TP / p.EP
	if count%p.EP != 0 {
		return moeGroup{}, &Error{"/layout/expert_parallel_size", fmt.Sprintf(
			"SGLang's FusedMoE needs the %d experts to divide over the %d expert-parallel ranks", count, p.EP)}
	}
	if moeTP > count {
		return moeGroup{}, &Error{"/layout/tensor_parallel_size", fmt.Sprintf(
			"the MoE TP size %d (tensor_parallel_size / expert_parallel_size) is greater than the %d experts, "+
				"which SGLang refuses", moeTP, count)}
	}
	local, epRank := count/p.EP, p.TPRank/moeTP
	g := moeGroup{tp: moeTP, tpRank: p.TPRank % moeTP, slots: make([]int64, local)}
	for j := range g.slots {
		g.slots[j] = epRank*local + int64(j)
	}
	return g, nil
}
