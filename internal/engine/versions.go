package engine

import (
	"fmt"
	"strings"
)

// release is what one release line of an engine changes in the rules: data the architecture code
// reads, never a copy of the rules. Each field names the source it was read from.
type release struct {
	// version is the line as a request names it ("0.29").
	version string
	// attentionScales: every Attention and MLAAttention module registers _k_scale, _v_scale,
	// _q_scale and _prob_scale as persistent F32 scalar buffers, 1.0 unless the checkpoint carries
	// KV-cache scales (set_default_quant_scales(register_buffer=True) from _init_kv_cache_quant in
	// vllm/model_executor/layers/attention/attention.py, read at commit
	// 0014ca6b9929614f1b72c4bb11e5238de49cba89; MLAAttention calls the same _init_kv_cache_quant in
	// layers/attention/mla_attention.py, read at commit 90b0a26e0e1a8ae3ba34e9e0ea514411f1a6a182):
	// they are in the state dict, so ShardedStateLoader saves them and requires them.
	attentionScales bool
	// vocabPaddingLCM: VocabParallelEmbedding pads the vocabulary to lcm(64, TP) rows
	// (self.padding_size = math.lcm(padding_size, self.tp_size)) instead of 64, so a padded
	// vocabulary always divides by TP. Read in a copy whose commit the search index does not name:
	// docs/engines.md lists it among the rules not read with confidence.
	vocabPaddingLCM bool
	// runner is how the line's FusedMoE registers a MoE layer's modules; nil where FusedMoE is
	// itself the module holding the experts (v0.10.2).
	runner *moeRunner
	// refused lists architectures the line does not lay out here, each with the reason; a request
	// for one is a 422 at /layout/engine_version.
	refused map[string]string
}

// moeRunner is a line on which FusedMoE is a factory (FusedMoEFactory in
// vllm/model_executor/layers/fused_moe/layer.py, read at commit
// 002d6073aa034d4f5545d45021b0e56d1f3c3593) returning a MoERunner (runner/moe_runner.py, read at
// commit 01cb3084506318d5a2d4c40f0798b0db04498b42) that the model assigns as mlp.experts. The
// runner registers the expert parameters in its routed_experts submodule (RoutedExperts,
// fused_moe/routed_experts.py at 002d6073aa034d4f5545d45021b0e56d1f3c3593), and registers a second
// time whatever the model hands it: gate= as runner.gate, shared_experts= wrapped in SharedExperts
// as runner._shared_experts._layer (runner/shared_experts.py at
// 01b747c915626eebf16d758526286955a041317c), and the router's e_score_correction_bias, which
// RoutedExperts keeps as an attribute and so registers. The router object itself (FusedMoERouter,
// router/fused_moe_router.py at 030ea52effcb05071543c8c42b8f0145e94cee43) is not an nn.Module. The
// state dict holds every one of these names and _filter_subtensors keeps the smallest, which is the
// mlp.experts. one. The same line lays out the parallel options these modules read: the
// sequence-parallel MoE of ParallelConfig.use_sequence_parallel_moe, EPLB's redundant experts, the
// round-robin expert placement and prefill-context parallelism.
type moeRunner struct {
	// gateInRunner lists the architectures whose MoE block passes its router as gate=, so its
	// weight (and a correction bias it holds) is saved as mlp.experts.gate.*: Qwen3-MoE
	// (qwen3_moe.py at 2e0831b0ab951c8896d4dd5d6cb9c3350a4574de, a copy from before the factory:
	// SharedFusedMoE(gate=self.gate, ...)) and DeepSeek-V2/V3 (deepseek_v2.py at
	// 002d6073aa034d4f5545d45021b0e56d1f3c3593: FusedMoEFactory(shared_experts=self.shared_experts,
	// gate=self.gate, ...)). Mixtral (mixtral.py at f0e26957c6af4d1ce3d0642120b011949da65885),
	// Qwen2-MoE (qwen2_moe.py at 002fb90788ae749626fb09c6272f0cb604de46b6: SharedFusedMoE with
	// shared_experts only) and GLM-4 MoE (glm4_moe.py at 002d6073aa034d4f5545d45021b0e56d1f3c3593:
	// an F32 nn.Linear gate the block calls itself) do not.
	gateInRunner map[string]bool
	// sequenceParallelShared lists the architectures whose shared experts are built with
	// is_sequence_parallel, which replicates them (disable_tp) when the line's sequence-parallel
	// MoE is on: DeepseekV2MLP(..., is_sequence_parallel=self.is_sequence_parallel) for
	// DeepseekV2MoE.shared_experts in deepseek_v2.py at 002d6073aa034d4f5545d45021b0e56d1f3c3593.
	// Its dense layers' MLPs are built without it and stay TP-split.
	sequenceParallelShared map[string]bool
	// eplb lists the architectures whose model implements MixtureOfExperts and passes
	// enable_eplb and num_redundant_experts to its FusedMoE; vLLM refuses EPLB for the others.
	eplb map[string]bool
}

// newOn029 is why an architecture added on "0.29" is not laid out on "0.10".
const newOn029 = "this architecture is laid out on engine_version \"0.29\" only"

// releases are the release lines each engine's layouts follow, oldest first. An engine without
// releases is not versioned.
var releases = map[string][]release{
	"vllm": {
		// vLLM v0.10.2: the rules as the architecture files cite them.
		{version: "0.10", refused: map[string]string{
			"Glm4MoeForCausalLM": newOn029,
			"GptOssForCausalLM":  newOn029,
		}},
		// vLLM v0.29.0 (the tag is commit 98dff2a81d747d1dba01a47f939f48c3526d4206, as third-party
		// patch notes in the search index name it; the index holds no vllm-project copy at it):
		// each field cites the commit of the copy it was read from, the newest that could be found
		// with the structure the release notes describe.
		{
			version:         "0.29",
			attentionScales: true,
			vocabPaddingLCM: true,
			runner: &moeRunner{
				gateInRunner: map[string]bool{
					"Qwen3MoeForCausalLM":   true,
					"DeepseekV2ForCausalLM": true,
					"DeepseekV3ForCausalLM": true,
				},
				sequenceParallelShared: map[string]bool{
					"DeepseekV2ForCausalLM": true,
					"DeepseekV3ForCausalLM": true,
				},
				eplb: map[string]bool{
					"MixtralForCausalLM":    true,
					"Qwen3MoeForCausalLM":   true,
					"DeepseekV2ForCausalLM": true,
					"DeepseekV3ForCausalLM": true,
					"Glm4MoeForCausalLM":    true,
				},
			},
		},
	},
}

// Versions lists each versioned engine's release lines, oldest first.
func Versions() map[string][]string {
	out := map[string][]string{}
	for e, rs := range releases {
		for _, r := range rs {
			out[e] = append(out[e], r.version)
		}
	}
	return out
}

// MaxVersionLen bounds engine_version, the one string field a layout reads: release lines are
// short ("0.29"), and an unknown one is quoted back in the problem's detail.
const MaxVersionLen = 16

// lookupRelease resolves a request's engine_version for an architecture. Empty is the newest line
// that lays the architecture out (every architecture has one), so a request that names no line
// gets the newest rules the server has for its model, and the table says which.
func lookupRelease(engine, version, arch string) (*release, error) {
	rs := releases[engine]
	if len(rs) == 0 {
		if version != "" {
			return nil, &Error{"/layout/engine_version", fmt.Sprintf("%s layouts are not versioned", engine)}
		}
		return &release{}, nil
	}
	if len(version) > MaxVersionLen { // not echoed back: a detail never carries unbounded input
		return nil, &Error{"/layout/engine_version", fmt.Sprintf(
			"a release line is at most %d characters; this server lays out %s", MaxVersionLen,
			quoted(Versions()[engine]))}
	}
	for i := len(rs) - 1; i >= 0; i-- {
		r := &rs[i]
		why, refused := r.refused[arch]
		if version == "" && !refused {
			return r, nil
		}
		if r.version == version {
			if refused {
				return nil, &Error{"/layout/engine_version", fmt.Sprintf("%s on %s %s: %s", arch, engine, version, why)}
			}
			return r, nil
		}
	}
	return nil, &Error{"/layout/engine_version", fmt.Sprintf(
		"unknown %s release line %q; this server lays out %s", engine, version,
		quoted(Versions()[engine]))}
}

func quoted(vs []string) string {
	out := make([]string, len(vs))
	for i, v := range vs {
		out[i] = fmt.Sprintf("%q", v)
	}
	return strings.Join(out, ", ")
}

// checkParallel refuses the parallel options a line does not lay out, and of those it does what
// vLLM refuses: ParallelConfig._validate_parallel_config (vllm/config/parallel.py at
// 00193b82b0e2d4faea5d3b4ea4f6c4c2bd9d057a; vllm-ascend's copy of the v0.29.0 validator reads the
// same but for the PCP check it drops for Ascend) refuses redundant experts without EPLB, EPLB
// without expert parallelism or without TP × PCP × DP > 1, and prefill-context with data
// parallelism; vLLM refuses EPLB for a model that does not implement MixtureOfExperts.
func (r *release) checkParallel(engine, arch string, p Parallel) error {
	if r.runner == nil {
		line := engine
		if r.version != "" {
			line += " " + r.version
		}
		for _, o := range []struct {
			set          bool
			field, value string
		}{
			{p.PCP > 1, "prefill_context_parallel_size", fmt.Sprint(p.PCP)},
			{p.EPLB, "enable_eplb", "true"},
			{p.RedundantExperts > 0, "num_redundant_experts", fmt.Sprint(p.RedundantExperts)},
			{p.Placement == "round_robin", "expert_placement_strategy", `"round_robin"`},
		} {
			if o.set {
				return &Error{"/layout/" + o.field, fmt.Sprintf("%s %s is not laid out on %s", o.field, o.value, line)}
			}
		}
		return nil
	}
	switch {
	case p.RedundantExperts > 0 && !p.EPLB:
		return &Error{"/layout/num_redundant_experts", "redundant experts need enable_eplb (vLLM refuses them without EPLB)"}
	case p.EPLB && !p.ExpertParallel:
		return &Error{"/layout/enable_eplb", "EPLB needs enable_expert_parallel (vLLM refuses it without)"}
	case p.EPLB && p.TP*p.PCP*p.DP == 1:
		return &Error{"/layout/enable_eplb", "EPLB needs tensor, prefill-context or data parallelism (vLLM refuses it on one rank)"}
	case p.EPLB && !r.runner.eplb[arch]:
		return &Error{"/layout/enable_eplb", fmt.Sprintf("vLLM's %s does not support EPLB", arch)}
	case p.PCP > 1 && p.DP > 1:
		return &Error{"/layout/prefill_context_parallel_size",
			"prefill-context parallelism with data_parallel_size > 1 is refused by vLLM 0.29"}
	}
	return nil
}
