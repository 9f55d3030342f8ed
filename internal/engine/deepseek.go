package engine

import (
	"fmt"

	"github.com/shardsrv/shardsrv/api"
)

// DeepSeek-V2/V3 as vLLM holds them (vllm/model_executor/models/deepseek_v2.py) with MLA:
//   - self_attn: with q_lora_rank, fused_qkv_a_proj (q_a_proj and kv_a_proj_with_mqa merged,
//     disable_tp: every rank holds it whole), q_a_layernorm and q_b_proj (column-parallel);
//     without it q_proj (column-parallel) and kv_a_proj_with_mqa (replicated); then
//     kv_a_layernorm, kv_b_proj (column-parallel) and o_proj (row-parallel).
//   - mlp: layers i >= first_k_dense_replace with i % moe_layer_freq == 0 are sparse: mlp.gate
//     (the router, replicated, never quantized), the router's correction bias (float32, when
//     topk_method is noaux_tc), the shared experts (a TP-split gated MLP of
//     moe_intermediate_size * n_shared_experts) and mlp.experts; the others a dense mlp.
//
// FP8 block-quantized checkpoints keep every quantized linear layer in FP8 with its
// weight_scale_inv. Multi-token-prediction layers past num_hidden_layers are not part of the model.
func init() {
	register("vllm", deepseek, "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM")
}

func deepseek(m *model) error {
	layers, err := m.cfg.int("num_hidden_layers", -1)
	if err != nil {
		return err
	}
	heads, err := m.cfg.int("num_attention_heads", -1)
	if err != nil {
		return err
	}
	if _, err := divide("num_attention_heads", heads, m.par.TP, "/layout/tensor_parallel_size"); err != nil {
		return err
	}
	experts, err := m.cfg.int("n_routed_experts", 0)
	if err != nil {
		return err
	}
	firstDense, err := m.cfg.int("first_k_dense_replace", 0)
	if err != nil {
		return err
	}
	freq, err := m.cfg.int("moe_layer_freq", 1)
	if err != nil {
		return err
	}
	return m.embedAndHead(func() error {
		for i := range layers {
			pre := fmt.Sprintf("model.layers.%d.", i)
			if err := m.mla(pre + "self_attn."); err != nil {
				return err
			}
			mlp := pre + "mlp."
			var err error
			if m.cfg.has("n_routed_experts") && experts > 0 && i >= firstDense && freq > 0 && i%freq == 0 {
				err = m.deepseekMoE(mlp, experts)
			} else {
				err = m.mlp(mlp, mlp, "gate_proj", "up_proj", "down_proj")
			}
			if err != nil {
				return err
			}
			if err := m.norm(pre+"input_layernorm.weight", pre+"post_attention_layernorm.weight"); err != nil {
				return err
			}
		}
		return nil
	})
}

// mla lays out the attention. MultiHeadLatentAttention (layers/mla.py) registers the attention's
// modules a second time under self_attn.mla_attn, so each parameter has two names in the state
// dict; _filter_subtensors keeps the smaller, which is the mla_attn one for the modules whose names
// sort after "mla_attn" (q_a_layernorm, q_b_proj, q_proj, o_proj). The names here are the kept ones,
// the keys ShardedStateLoader writes and looks up.
func (m *model) mla(at string) error {
	alias := at + "mla_attn."
	steps := []func() error{}
	if m.cfg.has("q_lora_rank") {
		steps = append(steps,
			func() error { return m.replicatedLinear(at+"fused_qkv_a_proj", at+"q_a_proj", at+"kv_a_proj_with_mqa") },
			func() error { return m.replicated(alias+"q_a_layernorm.weight", at+"q_a_layernorm.weight", m.dtype) },
			func() error { return m.column(alias+"q_b_proj", at+"q_b_proj") })
	} else {
		steps = append(steps,
			func() error { return m.column(alias+"q_proj", at+"q_proj") },
			func() error { return m.replicatedLinear(at+"kv_a_proj_with_mqa", at+"kv_a_proj_with_mqa") })
	}
	steps = append(steps,
		func() error { return m.norm(at + "kv_a_layernorm.weight") },
		func() error { return m.column(at+"kv_b_proj", at+"kv_b_proj") },
		func() error { return m.rowLinear(alias+"o_proj", at+"o_proj") },
		// The MLA wrapper's own MLAAttention, at self_attn.mla_attn.mla_attn.
		func() error { return m.attentionScales(alias+"mla_attn.", at) })
	for _, step := range steps {
		if err := step(); err != nil {
			return err
		}
	}
	return nil
}

func (m *model) deepseekMoE(mlp string, experts int64) error {
	names := m.moeNames(mlp)
	if err := m.replicated(names.gate+"weight", mlp+"gate.weight", m.dtype); err != nil {
		return err
	}
	if m.cfg.str("topk_method") == "noaux_tc" {
		bias := mlp + "gate.e_score_correction_bias"
		if err := m.replicated(names.bias, bias, api.F32); err != nil {
			return err
		}
	}
	if shared, err := m.cfg.int("n_shared_experts", 0); err != nil {
		return err
	} else if shared > 0 {
		if err := m.sharedExperts(names.shared, mlp+"shared_experts."); err != nil {
			return err
		}
	}
	groups, err := m.cfg.int("n_group", 1)
	if err != nil {
		return err
	}
	return m.experts(names.routed, experts, groups, func(e int64) (string, string, string) {
		ex := fmt.Sprintf("%sexperts.%d.", mlp, e)
		return ex + "gate_proj", ex + "up_proj", ex + "down_proj"
	})
}
