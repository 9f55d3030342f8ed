package engine

import (
	"encoding/json"
	"strings"
	"testing"
)

// What SGLang lays out differently from vLLM, or refuses, beyond what the server's line grid
// against sglangref covers: MLA is declined with SGLang's name for it, and a quantized or
// inconsistent checkpoint is refused before anything is laid out.
func TestSGLangRefusals(t *testing.T) {
	llama := func(edit func(cfg map[string]any, infos map[string]TensorInfo)) ([]byte, map[string]TensorInfo) {
		raw, infos := llamaCheckpoint(1100, 1)
		var cfg map[string]any
		if err := json.Unmarshal(raw, &cfg); err != nil {
			t.Fatal(err)
		}
		cfg["vocab_size"], cfg["hidden_act"] = 1100, "silu"
		edit(cfg, infos)
		out, _ := json.Marshal(cfg)
		return out, infos
	}
	for _, c := range []struct {
		what       string
		par        Parallel
		edit       func(cfg map[string]any, infos map[string]TensorInfo)
		pointer    string
		inDetail   string
		wantServed bool
	}{
		{"a plain Llama", Parallel{TP: 2, TPRank: 1, DP: 1}, func(map[string]any, map[string]TensorInfo) {}, "", "", true},
		{"DeepSeek's MLA", Parallel{TP: 1, DP: 1}, func(cfg map[string]any, _ map[string]TensorInfo) {
			cfg["architectures"] = []string{"DeepseekV3ForCausalLM"}
		}, "/layout/engine", "fused_qkv_a_proj_with_mqa", false},
		{"an FP8 checkpoint", Parallel{TP: 1, DP: 1}, func(cfg map[string]any, _ map[string]TensorInfo) {
			cfg["quantization_config"] = map[string]any{"quant_method": "fp8", "weight_block_size": []int{128, 128}}
		}, "", "kernel formats", false},
		{"biases the config does not build", Parallel{TP: 1, DP: 1}, func(_ map[string]any, infos map[string]TensorInfo) {
			infos["model.layers.0.self_attn.q_proj.bias"] = TensorInfo{DType: "BF16", Shape: []int64{64}}
		}, "", "attention_bias", false},
		{"mlp_bias", Parallel{TP: 1, DP: 1}, func(cfg map[string]any, _ map[string]TensorInfo) {
			cfg["mlp_bias"] = true
		}, "", "mlp_bias", false},
		{"a vocabulary other than vocab_size", Parallel{TP: 1, DP: 1}, func(cfg map[string]any, _ map[string]TensorInfo) {
			cfg["vocab_size"] = 1024
		}, "", "vocab_size", false},
		{"DP attention over a TP size DP does not divide", Parallel{TP: 2, DP: 4, DPAttention: true}, func(map[string]any, map[string]TensorInfo) {},
			"/layout/data_parallel_size", "", false},
		{"an EP size that does not divide TP", Parallel{TP: 6, DP: 1, EP: 4}, func(map[string]any, map[string]TensorInfo) {},
			"/layout/expert_parallel_size", "", false},
	} {
		cfg, infos := llama(c.edit)
		table, err := Build(Spec{Engine: "sglang", Parallel: c.par}, cfg, infos)
		if c.wantServed {
			if err != nil || table.Version != "" || table.Tensors[0].Name != "model.embed_tokens.weight" ||
				table.Tensors[0].Shape[0] != 1152/2 {
				t.Errorf("%s: %v, want the embedding's 576 rows first, unversioned", c.what, err)
			}
			continue
		}
		e, ok := err.(*Error)
		if !ok || e.Pointer != c.pointer || !strings.Contains(e.Detail, c.inDetail) {
			t.Errorf("%s: %v, want a refusal at %q saying %q", c.what, err, c.pointer, c.inDetail)
		}
	}
}
