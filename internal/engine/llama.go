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
			for _, norm := range []string{"q_norm.weight", "k_norm.weight"} { // Qwen3Attention
				if m.has(at + norm) {
					if err := m.norm(at + norm); err != nil {
						return err
					}
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
