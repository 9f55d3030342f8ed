package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"testing"
)

// llamaCheckpoint is a Llama with the given vocabulary and layers (0 or 1), 8 heads of 8 over 8
// KV heads.
func llamaCheckpoint(vocab, layers int64) ([]byte, map[string]TensorInfo) {
	cfg, _ := json.Marshal(map[string]any{"architectures": []string{"LlamaForCausalLM"}, "torch_dtype": "bfloat16",
		"hidden_size": 64, "num_attention_heads": 8, "num_key_value_heads": 8, "num_hidden_layers": layers})
	at := "model.layers.0."
	shapes := map[string][]int64{
		"model.embed_tokens.weight": {vocab, 64}, "lm_head.weight": {vocab, 64}, "model.norm.weight": {64},
		at + "self_attn.q_proj.weight": {64, 64}, at + "self_attn.k_proj.weight": {64, 64},
		at + "self_attn.v_proj.weight": {64, 64}, at + "self_attn.o_proj.weight": {64, 64},
		at + "mlp.gate_proj.weight": {96, 64}, at + "mlp.up_proj.weight": {96, 64}, at + "mlp.down_proj.weight": {64, 96},
		at + "input_layernorm.weight": {64}, at + "post_attention_layernorm.weight": {64},
	}
	infos := map[string]TensorInfo{}
	for n, s := range shapes {
		infos[n] = TensorInfo{DType: "BF16", Shape: s}
	}
	return cfg, infos
}

func TestVersionsDefaultAndUnknown(t *testing.T) {
	cfg, infos := llamaCheckpoint(1100, 1)
	table, err := Build(Spec{Engine: "vllm", Parallel: Parallel{TP: 1, DP: 1}}, cfg, infos)
	if err != nil {
		t.Fatal(err)
	}
	known := Versions()["vllm"]
	if table.Version != known[len(known)-1] || table.Version != "0.29" {
		t.Fatalf("default version %q, want the newest of %v", table.Version, known)
	}
	_, err = Build(Spec{Engine: "vllm", Version: "0.11", Parallel: Parallel{TP: 1, DP: 1}}, cfg, infos)
	e, ok := err.(*Error)
	if !ok || e.Pointer != "/layout/engine_version" || !strings.Contains(e.Detail, `"0.10", "0.29"`) {
		t.Fatalf("unknown version: %v, want a 422 at /layout/engine_version listing the known ones", err)
	}
	_, err = Build(Spec{Engine: "vllm", Version: strings.Repeat("9", 1<<20), Parallel: Parallel{TP: 1, DP: 1}}, cfg, infos)
	if e, ok := err.(*Error); !ok || e.Pointer != "/layout/engine_version" || len(e.Detail) > 200 {
		t.Fatalf("a 1 MiB version: %.300v, want a short 422 at /layout/engine_version", err)
	}
	_, err = Build(Spec{Engine: "megatron", Version: "0.10", Parallel: Parallel{TP: 1, DP: 1}}, cfg, infos)
	if e, ok := err.(*Error); !ok || e.Pointer != "/layout/engine_version" {
		t.Fatalf("a versioned megatron layout: %v", err)
	}
	table, err = Build(Spec{Engine: "megatron", Parallel: Parallel{TP: 1, DP: 1}}, cfg, infos)
	if err != nil || table.Version != "" {
		t.Fatalf("megatron: %v, version %q, want unversioned", err, table.Version)
	}
}

// The attention scale buffers: on 0.29 each layer's self_attn.attn holds four F32 scalars of 1.0
// after o_proj (Attention registers them after its parent's linear layers); 0.10 has none.
func TestVersionsAttentionScales(t *testing.T) {
	cfg, infos := llamaCheckpoint(1100, 1)
	names := func(version string) []string {
		table, err := Build(Spec{Engine: "vllm", Version: version, Parallel: Parallel{TP: 2, TPRank: 1, DP: 1}}, cfg, infos)
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, tr := range table.Tensors {
			out = append(out, tr.Name)
			if strings.Contains(tr.Name, "_scale") {
				if tr.Dtype != "F32" || len(tr.Shape) != 0 || len(*tr.Blocks) != 0 || tr.Fill == nil ||
					tr.Fill.String() != "1" || len(tr.Boxes) != 1 || len(tr.Boxes[0].Lengths) != 0 {
					t.Fatalf("%s: %+v, want an F32 scalar filled with 1", tr.Name, tr)
				}
			}
		}
		return out
	}
	old, cur := names("0.10"), names("0.29")
	at := "model.layers.0.self_attn."
	want := slices.Clone(old)
	i := slices.Index(want, at+"o_proj.weight") + 1
	want = slices.Insert(want, i, at+"attn._k_scale", at+"attn._v_scale", at+"attn._q_scale", at+"attn._prob_scale")
	if !slices.Equal(cur, want) {
		t.Fatalf("0.29 names\n%v\nwant\n%v", cur, want)
	}
	infos[at+"k_scale"] = TensorInfo{DType: "F32", Shape: []int64{}}
	if _, err := Build(Spec{Engine: "vllm", Parallel: Parallel{TP: 1, DP: 1}}, cfg, infos); err == nil {
		t.Fatal("a checkpoint with KV-cache scales was laid out with the default ones")
	}
}

// The vocabulary: 0.10 pads to 64 and refuses a TP that does not divide the padded rows; 0.29 pads
// to lcm(64, TP).
func TestVersionsVocabularyPadding(t *testing.T) {
	for _, c := range []struct {
		vocab, tp   int64
		rows0, rows int64 // rows a rank holds on 0.10 (0: refused) and on 0.29
	}{
		{1000, 3, 0, 384},     // 1024 rows do not split over 3; lcm 192 pads to 1152
		{1100, 6, 192, 192},   // 1152 = 6 × 192 either way
		{151552, 6, 0, 25280}, // GLM-4.7's vocabulary on 6 GPUs
		{129280, 24, 0, 5392}, // DeepSeek-V4's on 24
		{128256, 8, 16032, 16032},
	} {
		cfg, infos := llamaCheckpoint(c.vocab, 0) // no layers: any TP splits them
		for version, want := range map[string]int64{"0.10": c.rows0, "0.29": c.rows} {
			what := fmt.Sprintf("vocab %d TP %d on %s", c.vocab, c.tp, version)
			table, err := Build(Spec{Engine: "vllm", Version: version, Parallel: Parallel{TP: c.tp, DP: 1}}, cfg, infos)
			if want == 0 {
				if e, ok := err.(*Error); !ok || e.Pointer != "/layout/tensor_parallel_size" {
					t.Fatalf("%s: %v, want refused", what, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("%s: %v", what, err)
			}
			if got := table.Tensors[0].Shape[0]; got != want {
				t.Fatalf("%s: %d rows, want %d", what, got, want)
			}
		}
	}
}

// A line that does not lay an architecture out refuses it when named, a request naming no line
// gets the newest that does, and every architecture has one.
func TestVersionsRefuseWhatTheyDoNotLayOut(t *testing.T) {
	for engine, rs := range releases {
		for _, arch := range Engines()[engine] {
			refused := 0
			for _, r := range rs {
				if _, ok := r.refused[arch]; ok {
					refused++
				}
			}
			if refused == len(rs) {
				t.Errorf("%s: no %s line lays out %s", engine, engine, arch)
			}
		}
	}
	for arch := range releases["vllm"][0].refused {
		if _, err := lookupRelease("vllm", "0.10", arch); err == nil {
			t.Errorf("%s on 0.10: laid out, want refused", arch)
		} else if e := err.(*Error); e.Pointer != "/layout/engine_version" || !strings.Contains(e.Detail, `"0.29"`) {
			t.Errorf("%s on 0.10: %v, want a refusal at engine_version naming \"0.29\"", arch, err)
		}
		if r, err := lookupRelease("vllm", "", arch); err != nil || r.version != "0.29" {
			t.Errorf("%s on the default line: %v %+v, want 0.29", arch, err, r)
		}
	}
}
