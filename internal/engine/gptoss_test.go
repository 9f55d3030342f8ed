package engine

import (
	"encoding/json"
	"testing"
)

// TestGptOssRefusals: gpt-oss is laid out from MXFP4 checkpoints only, MXFP4 only for gpt-oss, and
// expert parallelism only where its loader's E / EP split matches FusedMoE's placement.
func TestGptOssRefusals(t *testing.T) {
	raw, infos, _ := refCheckpoint("gptoss")
	edit := func(from []byte, f func(map[string]any)) []byte {
		var cfg map[string]any
		if err := json.Unmarshal(from, &cfg); err != nil {
			t.Fatal(err)
		}
		f(cfg)
		b, _ := json.Marshal(cfg)
		return b
	}
	unquantized := edit(raw, func(c map[string]any) { delete(c, "quantization_config") })
	llama, llamaInfos, _ := refCheckpoint("llama")
	mxfp4Llama := edit(llama, func(c map[string]any) { c["quantization_config"] = map[string]any{"quant_method": "mxfp4"} })
	fewer := edit(raw, func(c map[string]any) { c["num_local_experts"] = 40 })
	for _, c := range []struct {
		what    string
		cfg     []byte
		infos   map[string]TensorInfo
		p       Parallel
		pointer string
	}{
		{"unquantized", unquantized, infos, Parallel{TP: 1, DP: 1}, ""},
		{"MXFP4 Llama", mxfp4Llama, llamaInfos, Parallel{TP: 1, DP: 1}, ""},
		{"40 experts over EP 6", fewer, infos, Parallel{TP: 6, DP: 1, ExpertParallel: true}, "/layout/enable_expert_parallel"},
		{"EPLB", raw, infos, Parallel{TP: 4, DP: 1, ExpertParallel: true, EPLB: true}, "/layout/enable_eplb"},
	} {
		_, err := Build(Spec{Engine: "vllm", Parallel: c.p}, c.cfg, c.infos)
		if e, ok := err.(*Error); !ok || e.Pointer != c.pointer {
			t.Errorf("%s: %v, want a 422 at %q", c.what, err, c.pointer)
		}
	}
	if _, err := Build(Spec{Engine: "vllm", Parallel: Parallel{TP: 6, DP: 1, ExpertParallel: true}}, raw, infos); err != nil {
		t.Errorf("48 experts over EP 6: %v", err)
	}
}
