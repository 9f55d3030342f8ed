package engine

import (
	"encoding/json"
	"fmt"
	"testing"

	"github.com/shardsrv/shardsrv/api"
)

// evaluate expands a tensors table element by element (the block formula, independent of how the
// layout built it) over sources whose element i of tensor name is the string "name[i]".
func evaluate(t *testing.T, tr api.TensorRequest, shapes map[string][]int64) []string {
	n := int64(1)
	for _, d := range tr.Shape {
		n *= d
	}
	out := make([]string, n)
	x := make([]int64, len(tr.Shape))
	for i := range n {
		rem := i
		for d := len(x) - 1; d >= 0; d-- {
			x[d], rem = rem%tr.Shape[d], rem/tr.Shape[d]
		}
		out[i] = "0"
		for _, b := range *tr.Blocks {
			inside := true
			for d := range x {
				inside = inside && x[d] >= b.Offsets[d] && x[d] < b.Offsets[d]+b.Lengths[d]
			}
			if !inside {
				continue
			}
			sh, flat := shapes[b.Source], int64(0)
			for s := range b.Base {
				idx := b.Base[s]
				for d := range x {
					idx += b.Coeff[s][d] * (x[d] - b.Offsets[d])
				}
				if idx >= sh[s] {
					t.Fatalf("%s: block reads %s past its end", tr.Name, b.Source)
				}
				flat = flat*sh[s] + idx
			}
			out[i] = fmt.Sprintf("%s[%d]", b.Source, flat)
		}
	}
	return out
}

func TestMegatronLlama(t *testing.T) {
	const hidden, heads, groups, hd, inter, vocab = 8, 4, 2, 2, 6, 300
	cfg, _ := json.Marshal(map[string]any{"architectures": []string{"LlamaForCausalLM"}, "torch_dtype": "bfloat16",
		"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": groups, "head_dim": hd,
		"num_hidden_layers": 1, "intermediate_size": inter, "vocab_size": vocab})
	shapes := map[string][]int64{
		"model.embed_tokens.weight": {vocab, hidden}, "lm_head.weight": {vocab, hidden}, "model.norm.weight": {hidden},
		"model.layers.0.input_layernorm.weight": {hidden}, "model.layers.0.post_attention_layernorm.weight": {hidden},
		"model.layers.0.self_attn.q_proj.weight": {
			heads * hd,
			hidden,
		}, "model.layers.0.self_attn.k_proj.weight": {groups * hd, hidden},
		"model.layers.0.self_attn.v_proj.weight": {
			groups * hd,
			hidden,
		}, "model.layers.0.self_attn.o_proj.weight": {hidden, heads * hd},
		"model.layers.0.mlp.gate_proj.weight": {inter, hidden}, "model.layers.0.mlp.up_proj.weight": {inter, hidden},
		"model.layers.0.mlp.down_proj.weight": {hidden, inter},
	}
	infos := map[string]TensorInfo{}
	for n, s := range shapes {
		infos[n] = TensorInfo{DType: "BF16", Shape: s}
	}
	for rank := range int64(2) {
		table, err := Build(Spec{Engine: "megatron", Parallel: Parallel{TP: 2, TPRank: rank, DP: 1}}, cfg, infos)
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][]string{}
		for _, tr := range table.Tensors {
			got[tr.Name] = evaluate(t, tr, shapes)
		}
		// Megatron pads 300 rows to a multiple of 128*2 = 512: 256 rows a rank.
		emb := got["embedding.word_embeddings.weight"]
		for row := range int64(256) {
			want := "0"
			if g := rank*256 + row; g < vocab {
				want = fmt.Sprintf("model.embed_tokens.weight[%d]", g*hidden)
			}
			if emb[row*hidden] != want {
				t.Fatalf("rank %d embedding row %d = %s, want %s", rank, row, emb[row*hidden], want)
			}
		}
		// One query group a rank: its 2 query heads, its key head, its value head.
		qkv := got["decoder.layers.0.self_attention.linear_qkv.weight"]
		var want []string
		for _, part := range []struct {
			src        string
			first, end int64
		}{
			{"q_proj", rank * 2 * hd, (rank + 1) * 2 * hd},
			{"k_proj", rank * hd, (rank + 1) * hd},
			{"v_proj", rank * hd, (rank + 1) * hd},
		} {
			for row := part.first; row < part.end; row++ {
				want = append(want, fmt.Sprintf("model.layers.0.self_attn.%s.weight[%d]", part.src, row*hidden))
			}
		}
		for i, w := range want {
			if qkv[int64(i)*hidden] != w {
				t.Fatalf("rank %d linear_qkv row %d = %s, want %s", rank, i, qkv[int64(i)*hidden], w)
			}
		}
		fc2 := got["decoder.layers.0.mlp.linear_fc2.weight"] // [hidden, inter/2]: columns of down_proj
		if w := fmt.Sprintf("model.layers.0.mlp.down_proj.weight[%d]", 1*inter+rank*3+2); fc2[1*3+2] != w {
			t.Errorf("rank %d linear_fc2[1][2] = %s, want %s", rank, fc2[5], w)
		}
		if len(got["decoder.layers.0.mlp.linear_fc1.layer_norm_weight"]) != hidden ||
			len(got["output_layer.weight"]) != 256*hidden {
			t.Errorf("rank %d: norms or output layer missing: %v", rank, len(got))
		}
	}
}

func TestLayoutErrorsPoint(t *testing.T) {
	cfg := []byte(`{"architectures": ["GPT2LMHeadModel"], "torch_dtype": "bfloat16"}`)
	for _, c := range []struct {
		spec    Spec
		pointer string
	}{
		{Spec{Engine: "tensorrt", Parallel: Parallel{TP: 1, DP: 1}}, "/layout/engine"},
		// An engine refuses the options only another engine has, before it reads the model.
		{Spec{Engine: "vllm", Parallel: Parallel{TP: 2, DP: 2, DPAttention: true}}, "/layout/enable_dp_attention"},
		{Spec{Engine: "vllm", Parallel: Parallel{TP: 2, DP: 1, EP: 2}}, "/layout/expert_parallel_size"},
		{Spec{Engine: "megatron", Parallel: Parallel{TP: 2, DP: 1, EP: 2}}, "/layout/expert_parallel_size"},
		{Spec{Engine: "sglang", Parallel: Parallel{TP: 2, DP: 1, ExpertParallel: true}}, "/layout/enable_expert_parallel"},
		{Spec{Engine: "sglang", Parallel: Parallel{TP: 1, DP: 2, DPRank: 1}}, "/layout/dp_rank"},
		{Spec{Engine: "sglang", Parallel: Parallel{TP: 1, DP: 1, PCP: 2}}, "/layout/prefill_context_parallel_size"},
		{Spec{Engine: "sglang", Parallel: Parallel{TP: 1, DP: 1, EP: -1}}, "/layout/expert_parallel_size"},
		{Spec{Engine: "sglang", Parallel: Parallel{TP: 1, DP: 1}}, "/layout/engine"}, // nor for SGLang
		{Spec{Engine: "vllm", Parallel: Parallel{TP: 2, TPRank: 2, DP: 1}}, "/layout/tp_rank"},
		{Spec{Engine: "vllm", Parallel: Parallel{TP: 0, DP: 1}}, "/layout/tensor_parallel_size"},
		{Spec{Engine: "vllm", Parallel: Parallel{TP: 1, DP: 2, DPRank: -1}}, "/layout/dp_rank"},
		{Spec{Engine: "vllm", Parallel: Parallel{TP: 1, DP: 1}}, "/layout/engine"}, // GPT-2 has no layout here
	} {
		_, err := Build(c.spec, cfg, nil)
		if e, ok := err.(*Error); !ok || e.Pointer != c.pointer {
			t.Errorf("%+v: %v, want an error at %s", c.spec, err, c.pointer)
		}
	}
}
