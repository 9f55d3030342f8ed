package vllmref

// Releases are the vLLM release lines the reference models, oldest first.
var Releases = []string{"0.10", "0.29"}

// The "0.29" rules were read from vllm-project/vllm at commit
// 002d6073aa034d4f5545d45021b0e56d1f3c3593 where the search index holds the file there: a
// main-branch snapshot that has FusedMoEFactory (the rename merged 2026-07-24, before v0.29.0 of
// 2026-09-09) and DeepSeek-V4 code. The index holds no copy tagged v0.29.0, so no "0.29" rule is
// pinned to the tag; files the index does not hold at that commit were read at the commit named
// beside the rule.

// release is what one line changes against the rules of v0.10.2 the builder's layers follow.
type release struct {
	// attentionScales: every Attention and MLAAttention module registers its q/k/v/prob scales as
	// persistent buffers.
	// vllm/model_executor/layers/attention/attention.py@0014ca6b9929614f1b72c4bb11e5238de49cba89,
	// _init_kv_cache_quant -> set_default_quant_scales(layer, register_buffer=True) (vLLM PR
	// #31395, merged 2025-12-27). v0.10.2 creates them as plain attributes.
	attentionScales bool

	// lcmVocabPadding: VocabParallelEmbedding.__init__ sets self.padding_size =
	// math.lcm(padding_size, self.tp_size) (vllm/model_executor/layers/vocab_parallel_embedding.py,
	// in a copy whose commit the search index does not name; the vllm-project copies it names pad to
	// 64 alone, so neither the commit nor the release that introduced it is pinned here).
	lcmVocabPadding bool

	// moeRunner: FusedMoEFactory
	// (vllm/model_executor/layers/fused_moe/layer.py@002d6073aa034d4f5545d45021b0e56d1f3c3593)
	// returns a MoERunner module (runner/moe_runner.py@01cb3084506318d5a2d4c40f0798b0db04498b42)
	// holding routed_experts (a RoutedExperts module,
	// routed_experts.py@002d6073aa034d4f5545d45021b0e56d1f3c3593, whose quant method registers
	// w13_weight, w2_weight and their scales on it, and which stores e_score_correction_bias as an
	// attribute, so a Parameter passed there is registered again), the model's gate when the model
	// passes gate=, and the model's shared experts wrapped as _shared_experts =
	// SharedExperts(layer) with the module as its _layer
	// (runner/shared_experts.py@01b747c915626eebf16d758526286955a041317c). The router
	// (router/fused_moe_router.py) is a plain object with no parameters. So the state dict lists
	// the experts under "experts.routed_experts.", and the gate, the correction bias and the shared
	// experts a second time under "experts.", where _filter_subtensors keeps the smaller names.
	moeRunner bool

	// sequenceParallelMoE: ParallelConfig.use_sequence_parallel_moe
	// (vllm/config/parallel.py@00193b82b0e2d4faea5d3b4ea4f6c4c2bd9d057a) is all2all_backend in
	// (allgather_reducescatter — the default — deepep_*, mori_*, nixl_ep) and
	// enable_expert_parallel and TP > 1 and DP > 1; DeepSeek then builds its shared experts with
	// disable_tp (deepseek_v2.py@002d6073aa034d4f5545d45021b0e56d1f3c3593,
	// DeepseekV2MLP(is_sequence_parallel=...)), whole on every rank. The expert split itself does
	// not change (FusedMoEParallelConfig.make only records sp_size).
	sequenceParallelMoE bool

	// unmodelled are the architectures the line does not model, with the reason.
	unmodelled map[string]string
}

var releases = map[string]release{
	"0.10": {unmodelled: map[string]string{
		"Glm4MoeForCausalLM": "the reference models GLM-4.x-MoE on the newer lines only",
		"GptOssForCausalLM":  "the reference models gpt-oss on the newer lines only",
	}},
	"0.29": {attentionScales: true, lcmVocabPadding: true, moeRunner: true, sequenceParallelMoE: true},
}

// Unmodelled is the error RankAt returns for an input the reference does not model on a line (as
// opposed to one vLLM refuses): a test should skip it, not expect the server to refuse it.
type Unmodelled string

func (u Unmodelled) Error() string { return string(u) }
