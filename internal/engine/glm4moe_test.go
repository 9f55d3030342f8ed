package engine

import (
	"encoding/json"
	"strings"
	"testing"
)

// TestGLM4AttentionFollowsTheConfig: vLLM builds q/k/v biases and q/k norms where config.json's
// attention_bias and use_qk_norm say, so a checkpoint that disagrees is refused at /layout, and
// "0.10" does not lay GLM-4 out at all.
func TestGLM4AttentionFollowsTheConfig(t *testing.T) {
	raw, infos, _ := refCheckpoint("glm4moe")
	if _, err := Build(Spec{Engine: "vllm", Version: "0.29", Parallel: Parallel{TP: 2, DP: 1}}, raw, infos); err != nil {
		t.Fatalf("as saved: %v", err)
	}
	for _, key := range []string{"attention_bias", "use_qk_norm"} {
		var cfg map[string]any
		if err := json.Unmarshal(raw, &cfg); err != nil {
			t.Fatal(err)
		}
		cfg[key] = false
		b, _ := json.Marshal(cfg)
		_, err := Build(Spec{Engine: "vllm", Parallel: Parallel{TP: 2, DP: 1}}, b, infos)
		if e, ok := err.(*Error); !ok || e.Pointer != "" || !strings.Contains(e.Detail, key) {
			t.Errorf("%s false over a checkpoint that has them: %v, want a checkpoint error naming it", key, err)
		}
	}
	_, err := Build(Spec{Engine: "vllm", Version: "0.10", Parallel: Parallel{TP: 1, DP: 1}}, raw, infos)
	if e, ok := err.(*Error); !ok || e.Pointer != "/layout/engine_version" {
		t.Errorf("on 0.10: %v, want a refusal at /layout/engine_version", err)
	}
}
