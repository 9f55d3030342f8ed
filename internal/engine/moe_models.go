package engine

import (
	"fmt"
	"slices"
)

// Mixture-of-experts decoders with Llama's attention:
//   - MixtralForCausalLM (models/mixtral.py): block_sparse_moe.gate (the router, replicated) and
//     block_sparse_moe.experts from the checkpoint's experts.N.w1 (gate), w3 (up), w2 (down).
//   - Qwen2MoeForCausalLM (models/qwen2_moe.py): a sparse layer where the layer is not in
//     mlp_only_layers and (i+1) % decoder_sparse_step == 0, else a dense mlp; sparse layers hold
//     mlp.gate, mlp.experts, when shared_expert_intermediate_size > 0 mlp.shared_expert (a
//     TP-split gated MLP), and always mlp.shared_expert_gate [1, H] (replicated).
//   - Qwen3MoeForCausalLM (models/qwen3_moe.py): the same sparse rule, no shared expert.
func init() {
	register("vllm", mixtral, "MixtralForCausalLM")
	register("vllm", qwenMoE, "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM")
}

func mixtral(m *model) error {
	experts, err := m.cfg.int("num_local_experts", -1)
	if err != nil {
		return err
	}
	return m.decoder(func(i int64, pre string) error {
		moe := pre + "block_sparse_moe."
		names := m.moeNames(moe)
		if err := m.replicated(names.gate+"weight", moe+"gate.weight", m.dtype); err != nil {
			return err
		}
		return m.experts(names.routed, experts, 0, func(e int64) (string, string, string) {
			ex := fmt.Sprintf("%sexperts.%d.", moe, e)
			return ex + "w1", ex + "w3", ex + "w2"
		})
	})
}

func qwenMoE(m *model) error {
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
	return m.decoder(func(i int64, pre string) error {
		mlp := pre + "mlp."
		if slices.Contains(dense, i) || experts == 0 || step == 0 || (i+1)%step != 0 {
			return m.mlp(mlp, mlp, "gate_proj", "up_proj", "down_proj")
		}
		names := m.moeNames(mlp)
		if err := m.replicated(names.gate+"weight", mlp+"gate.weight", m.dtype); err != nil {
			return err
		}
		routed := func() error {
			return m.experts(names.routed, experts, 0, func(e int64) (string, string, string) {
				ex := fmt.Sprintf("%sexperts.%d.", mlp, e)
				return ex + "gate_proj", ex + "up_proj", ex + "down_proj"
			})
		}
		if m.cfg.architecture() != "Qwen2MoeForCausalLM" {
			return routed()
		}
		shared, err := m.cfg.int("shared_expert_intermediate_size", 0)
		if err != nil {
			return err
		}
		// Built whether or not there is a shared expert: a checkpoint without it is refused.
		gate := mlp + "shared_expert_gate.weight"
		if m.rel.runner == nil {
			// v0.10.2 registers the experts, the shared expert, then its gate.
			if err := routed(); err != nil {
				return err
			}
			if shared > 0 {
				if err := m.mlp(mlp+"shared_expert.", mlp+"shared_expert.", "gate_proj", "up_proj", "down_proj"); err != nil {
					return err
				}
			}
			return m.replicated(gate, gate, m.dtype)
		}
		// The runner line's block registers the shared expert's gate, the shared expert (a
		// Qwen2MoeMLP holding that gate as expert_gate) and then the experts; the runner
		// registers the shared expert again, so the gate's smallest name is its expert_gate
		// under mlp.experts._shared_experts._layer.
		if shared == 0 {
			if err := m.replicated(gate, gate, m.dtype); err != nil {
				return err
			}
			return routed()
		}
		if err := m.replicated(names.shared+"expert_gate.weight", gate, m.dtype); err != nil {
			return err
		}
		if err := m.sharedExperts(names.shared, mlp+"shared_expert."); err != nil {
			return err
		}
		return routed()
	})
}
