package engine

import "fmt"

// Megatron-Core's GPT model with the TransformerEngine layer spec, for the Llama family
// (megatron/core/models/gpt, transformer/attention.py, tensor_parallel/layers.py):
//   - embedding.word_embeddings and output_layer: the vocabulary padded to a multiple of
//     make_vocab_size_divisible_by (128) x TP (_vocab_size_with_padding), split by rows, padding
//     rows zero;
//   - self_attention.linear_qkv: q, k and v interleaved per query group — each group's query heads,
//     then its key head, then its value head — with rank r holding groups [r*G/TP, (r+1)*G/TP);
//     its layer_norm_weight is the layer's input norm (TE fuses it into the linear);
//   - self_attention.linear_proj and mlp.linear_fc2 row-parallel; mlp.linear_fc1 the rank's
//     [gate_r; up_r], with the post-attention norm as its layer_norm_weight;
//   - decoder.final_layernorm replicated.
func init() {
	// Megatron's data and expert parallelism do not change what a dense Llama rank holds.
	takes("megatron", dataParallel, dataParallelRank, enableExpertParallel)
	register("megatron", megatronGPT, "LlamaForCausalLM")
}

// megatronVocabMultiple is Megatron-LM's default --make-vocab-size-divisible-by.
const megatronVocabMultiple = 128

func megatronGPT(m *model) error {
	heads, groups, headDim, err := m.attentionShape()
	if err != nil {
		return err
	}
	layers, err := m.cfg.int("num_hidden_layers", -1)
	if err != nil {
		return err
	}
	if err := m.megatronVocab("embedding.word_embeddings.weight", "model.embed_tokens.weight"); err != nil {
		return err
	}
	local, err := divide("num_key_value_heads (query groups)", groups, m.par.TP, "/layout/tensor_parallel_size")
	if err != nil {
		return err
	}
	if heads%groups != 0 {
		return checkpointError("%d attention heads do not form %d query groups", heads, groups)
	}
	perGroup := heads / groups
	for i := range layers {
		src, dst := fmt.Sprintf("model.layers.%d.", i), fmt.Sprintf("decoder.layers.%d.", i)
		q, k, v := src+"self_attn.q_proj", src+"self_attn.k_proj", src+"self_attn.v_proj"
		var parts []slab
		for g := m.par.TPRank * local; g < (m.par.TPRank+1)*local; g++ {
			parts = append(parts, slab{q, g, perGroup * headDim}, slab{k, g, headDim}, slab{v, g, headDim})
		}
		steps := []func() error{
			func() error { return m.columnLinear(dst+"self_attention.linear_qkv", m.par.TP, parts...) },
			func() error {
				return m.replicated(
					dst+"self_attention.linear_qkv.layer_norm_weight",
					src+"input_layernorm.weight",
					m.dtype,
				)
			},
			func() error { return m.rowLinear(dst+"self_attention.linear_proj", src+"self_attn.o_proj") },
			func() error { return m.gateUp(dst+"mlp.linear_fc1", src+"mlp.gate_proj", src+"mlp.up_proj") },
			func() error {
				return m.replicated(
					dst+"mlp.linear_fc1.layer_norm_weight",
					src+"post_attention_layernorm.weight",
					m.dtype,
				)
			},
			func() error { return m.rowLinear(dst+"mlp.linear_fc2", src+"mlp.down_proj") },
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return err
			}
		}
	}
	if err := m.replicated("decoder.final_layernorm.weight", "model.norm.weight", m.dtype); err != nil {
		return err
	}
	if m.cfg.bool("tie_word_embeddings") {
		return nil // Megatron shares embedding.word_embeddings as the output layer
	}
	return m.megatronVocab("output_layer.weight", "lm_head.weight")
}

// megatronVocab is VocabParallelEmbedding / the output ColumnParallelLinear over a vocabulary
// padded to a multiple of 128 x TP.
func (m *model) megatronVocab(name, src string) error {
	sh, err := m.shape(src, 2)
	if err != nil {
		return err
	}
	unit := megatronVocabMultiple * m.par.TP
	return m.vocabRows(m.tp(), name, src, ceilDiv(sh[0], unit)*unit)
}
