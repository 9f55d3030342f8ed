package engine

import (
	"encoding/json"
	"fmt"
	"testing"
)

// vLLM pads the vocabulary to a multiple of 64, then divides by TP: Llama-3's, Llama-2's and two
// that padding changes.
func TestVLLMVocabularyRows(t *testing.T) {
	for _, c := range []struct{ vocab, tp, rows int64 }{
		{128256, 8, 16032},
		{32000, 8, 4000},
		{1100, 4, 288},
		{1100, 8, 144},
	} {
		cfg, _ := json.Marshal(map[string]any{"architectures": []string{"LlamaForCausalLM"}, "torch_dtype": "bfloat16",
			"hidden_size": 8, "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": 0, "vocab_size": c.vocab})
		shapes := map[string][]int64{
			"model.embed_tokens.weight": {c.vocab, 8},
			"lm_head.weight":            {c.vocab, 8},
			"model.norm.weight":         {8},
		}
		infos := map[string]TensorInfo{}
		for n, s := range shapes {
			infos[n] = TensorInfo{DType: "BF16", Shape: s}
		}
		last := c.tp - 1
		spec := Spec{Engine: "vllm", Version: "0.10", Parallel: Parallel{TP: c.tp, TPRank: last, DP: 1}}
		table, err := Build(spec, cfg, infos)
		if err != nil {
			t.Fatal(err)
		}
		emb := table.Tensors[0]
		if emb.Name != "model.embed_tokens.weight" || emb.Shape[0] != c.rows {
			t.Fatalf("vocab %d TP %d: %s %v, want %d rows", c.vocab, c.tp, emb.Name, emb.Shape, c.rows)
		}
		got := evaluate(t, emb, shapes)
		for row := range c.rows {
			want := "0"
			if g := last*c.rows + row; g < c.vocab {
				want = fmt.Sprintf("model.embed_tokens.weight[%d]", g*8)
			}
			if got[row*8] != want {
				t.Fatalf("vocab %d TP %d, last rank row %d = %s, want %s", c.vocab, c.tp, row, got[row*8], want)
			}
		}
	}
}
