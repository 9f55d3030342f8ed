package engine

import (
	"fmt"

	"github.com/shardsrv/shardsrv/api"
)

// GLM-4.5/4.6/4.7 as vLLM holds them (Glm4MoeForCausalLM, vllm/model_executor/models/glm4_moe.py,
// read at commit 002d6073aa034d4f5545d45021b0e56d1f3c3593; laid out on release lines with a
// MoERunner only):
//   - self_attn: Llama's qkv_proj with the checkpoint's biases (attention_bias), o_proj without a
//     bias, the attention's scale buffers, and per-head q_norm and k_norm (replicated) when
//     use_qk_norm.
//   - mlp: layers i < first_k_dense_replace are a dense gated MLP of intermediate_size; the others
//     a Glm4MoE block: the router gate, an nn.Linear built in float32 whatever the model's dtype,
//     and its e_score_correction_bias (float32), which the block hands the MoE runner as
//     e_score_correction_bias= — so its smallest state-dict name is
//     mlp.experts.routed_experts.e_score_correction_bias; the shared experts (a TP-split gated MLP
//     of moe_intermediate_size * n_shared_experts, built without is_sequence_parallel, so split
//     under sequence-parallel MoE too) passed as shared_experts=; and the routed experts, grouped
//     (n_group) for the placement.
//   - The multi-token-prediction layer past num_hidden_layers is skipped by the loader
//     (skip_spec_layers) and is not part of the model.
//
// ROCm AITER's fused shared experts (resolve_layer_fused_shared_expert) fold the shared experts
// into the routed ones; they are off by default and not laid out here.
func init() {
	register("vllm", glm4MoE, "Glm4MoeForCausalLM")
}

func glm4MoE(m *model) error {
	firstDense, err := m.cfg.int("first_k_dense_replace", 0)
	if err != nil {
		return err
	}
	experts, err := m.cfg.int("n_routed_experts", 0)
	if err != nil {
		return err
	}
	groups, err := m.cfg.int("n_group", 1)
	if err != nil {
		return err
	}
	shared, err := m.cfg.int("n_shared_experts", 0)
	if err != nil {
		return err
	}
	if err := m.glm4Attention(); err != nil {
		return err
	}
	return m.decoder(func(i int64, pre string) error {
		mlp := pre + "mlp."
		if !m.cfg.has("n_routed_experts") || i < firstDense {
			return m.mlp(mlp, mlp, "gate_proj", "up_proj", "down_proj")
		}
		names := m.moeNames(mlp)
		if err := m.replicated(names.gate+"weight", mlp+"gate.weight", api.F32); err != nil {
			return err
		}
		if err := m.replicated(names.bias, mlp+"gate.e_score_correction_bias", api.F32); err != nil {
			return err
		}
		if shared > 0 {
			if err := m.sharedExperts(names.shared, mlp+"shared_experts."); err != nil {
				return err
			}
		}
		return m.experts(names.routed, experts, groups, func(e int64) (string, string, string) {
			ex := fmt.Sprintf("%sexperts.%d.", mlp, e)
			return ex + "gate_proj", ex + "up_proj", ex + "down_proj"
		})
	})
}

// glm4Attention checks that the checkpoint agrees with what the config makes vLLM build: the
// decoder lays out q/k/v biases where the checkpoint has them and q/k norms where use_qk_norm
// says, and vLLM builds both where attention_bias and use_qk_norm say, so a disagreement would
// leave parameters the table does not hold or serve tensors the model has no place for.
func (m *model) glm4Attention() error {
	at := "model.layers.0.self_attn."
	for _, c := range []struct{ key, tensor string }{
		{"attention_bias", at + "q_proj.bias"},
		{"use_qk_norm", at + "q_norm.weight"},
	} {
		if m.cfg.bool(c.key) != m.has(c.tensor) {
			return checkpointError("config.json's %s is %v but the checkpoint %s %s",
				c.key, m.cfg.bool(c.key), map[bool]string{true: "has", false: "has no"}[m.has(c.tensor)], c.tensor)
		}
	}
	return nil
}
