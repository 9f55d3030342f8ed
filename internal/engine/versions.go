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
	// vllm/model_executor/layers/attention/attention.py, read at commit 0014ca6b): they are in the
	// state dict, so ShardedStateLoader saves them and requires them.
	attentionScales bool
	// vocabPaddingLCM: VocabParallelEmbedding pads the vocabulary to lcm(64, TP) rows
	// (self.padding_size = math.lcm(padding_size, self.tp_size)) instead of 64, so a padded
	// vocabulary always divides by TP.
	vocabPaddingLCM bool
	// refused lists architectures the line does not lay out here, each with the reason; a request
	// for one is a 422 at /layout/engine_version.
	refused map[string]string
}

// moeRefusal is why the MoE architectures are not laid out on the newer line: FusedMoE became a
// factory over MoERunner, whose submodules (router, gate, routed_experts, shared experts) each own
// a part of the layer's state dict, and the names they save could not be read from one consistent
// release of vLLM's sources.
const moeRefusal = "the state-dict names of vLLM's MoERunner layers (routed_experts, its router, gate " +
	"and shared experts) are not laid out here for this release; engine_version \"0.10\" serves " +
	"vLLM v0.10.2's FusedMoE names"

// releases are the release lines each engine's layouts follow, oldest first. An engine without
// releases is not versioned.
var releases = map[string][]release{
	"vllm": {
		// vLLM v0.10.2: the rules as the architecture files cite them.
		{version: "0.10"},
		// vLLM v0.29.0 (tag at 98dff2a8): the fields below, read at the commits they cite.
		{
			version:         "0.29",
			attentionScales: true,
			vocabPaddingLCM: true,
			refused: map[string]string{
				"MixtralForCausalLM":    moeRefusal,
				"Qwen2MoeForCausalLM":   moeRefusal,
				"Qwen3MoeForCausalLM":   moeRefusal,
				"DeepseekV2ForCausalLM": moeRefusal,
				"DeepseekV3ForCausalLM": moeRefusal,
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
// that lays the architecture out (the oldest line of each engine refuses none), so a request that
// names no line gets the newest rules the server has for its model, and the table says which.
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
