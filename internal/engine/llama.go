package engine

import (
	"fmt"
	"strings"
)

// Llama-family decoders as vLLM holds them (vllm/model_executor/models/llama.py, qwen2.py,
// qwen3.py): per layer self_attn.qkv_proj (QKVParallelLinear, with the checkpoint's q/k/v biases
// when it has them: Qwen2), self_attn.o_proj (row-parallel), Qwen3's per-head q_norm and k_norm
// (replicated), mlp.gate_up_proj and mlp.down_proj, and the two layer norms.
func init() {
	takes("vllm", dataParallel, dataParallelRank, enableExpertParallel, prefillContext, prefillContextRank,
		enableEPLB, redundantExperts, expertPlacement)
	register("vllm", llama, "LlamaForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM")
}

func llama(m *model) error {
	return m.decoder(func(i int64, pre string) error {
		return m.mlp(pre+"mlp.", pre+"mlp.", "gate_proj", "up_proj", "down_proj")
	})
}

// attentionShape reads the attention heads off config.json as vLLM's attention modules do: head_dim
// when the config has it, else hidden_size / num_attention_heads.
func (m *model) attentionShape() (heads, kvHeads, headDim int64, err error) {
	hidden, err := m.cfg.int("hidden_size", -1)
	if err != nil {
		return
	}
	if heads, err = m.cfg.int("num_attention_heads", -1); err != nil {
		return
	}
	if heads == 0 {
		return 0, 0, 0, configError("num_attention_heads", "is 0")
	}
	if kvHeads, err = m.cfg.int("num_key_value_heads", heads); err != nil {
		return
	}
	headDim, err = m.cfg.int("head_dim", hidden/heads)
	switch {
	case err != nil:
	case kvHeads == 0:
		err = configError("num_key_value_heads", "is 0")
	case headDim == 0:
		err = configError("head_dim", "is 0 (or hidden_size / num_attention_heads is)")
	}
	return
}

// qkNorm reports whether the architecture's attention holds per-head q_norm and k_norm: Qwen3's
// and Qwen3-MoE's build them unconditionally (Qwen3Attention, Qwen3MoeAttention in vLLM's and
// SGLang's qwen3.py / qwen3_moe.py), so a checkpoint without them is refused rather than served a
// table the loader would find short; GLM-4.x builds them where use_qk_norm says.
func (m *model) qkNorm() bool {
	switch m.cfg.architecture() {
	case "Qwen3ForCausalLM", "Qwen3MoeForCausalLM":
		return true
	case "Glm4MoeForCausalLM":
		return m.cfg.bool("use_qk_norm")
	}
	return false
}

// decoder lays out embeddings, layers and head around a per-layer MLP, with Llama's attention.
func (m *model) decoder(mlp func(i int64, pre string) error) error {
	heads, kvHeads, headDim, err := m.attentionShape()
	if err != nil {
		return err
	}
	layers, err := m.cfg.int("num_hidden_layers", -1)
	if err != nil {
		return err
	}
	return m.embedAndHead(func() error {
		for i := range layers {
			pre := fmt.Sprintf("model.layers.%d.", i)
			at := pre + "self_attn."
			if arch := m.cfg.architecture(); strings.HasPrefix(arch, "Qwen2") && !m.has(at+"q_proj.bias") {
				return checkpointError("%s holds q/k/v biases but the checkpoint has no %sq_proj.bias", arch, at)
			}
			if err := m.qkv(m.attention, at, at, heads, kvHeads, headDim); err != nil {
				return err
			}
			if err := m.rowLinearOver(m.attention, at+"o_proj", at+"o_proj"); err != nil {
				return err
			}
			if err := m.attentionScales(at+"attn.", at); err != nil {
				return err
			}
			if m.qkNorm() {
				if err := m.norm(at+"q_norm.weight", at+"k_norm.weight"); err != nil {
					return err
				}
			}
			if err := mlp(i, pre); err != nil {
				return err
			}
			if err := m.norm(pre+"input_layernorm.weight", pre+"post_attention_layernorm.weight"); err != nil {
				return err
			}
		}
		return nil
	})
}
