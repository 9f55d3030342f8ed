package layout

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"

	"github.com/shardsrv/shardsrv/api"
)

// Preset is a whole-model layout: the tensors one rank holds, named as vLLM names them.
type Preset struct {
	// HeadDim is the attention head dimension (128 for Llama-3 and Qwen3).
	HeadDim int64
	// DType is the dtype the engine holds weights in.
	DType api.DType
	// VocabPad pads the vocabulary to a multiple of this per rank (vLLM uses 64).
	VocabPad int64
	TP       Rank
	// EP splits stacked experts; zero means experts are split like the rest, by TP.
	EP Rank
}

var layerRE = regexp.MustCompile(`^model\.layers\.(\d+)\.`)

func layers(s Shapes) []int {
	seen := map[int]bool{}
	for name := range s {
		if m := layerRE.FindStringSubmatch(name); m != nil {
			n, _ := strconv.Atoi(m[1])
			seen[n] = true
		}
	}
	var out []int
	for n := range seen {
		out = append(out, n)
	}
	sort.Ints(out)
	return out
}

// Build lays out a Llama-style checkpoint: vocabulary-parallel embedding and LM head,
// vLLM's fused QKV and gate/up (column-parallel), o and down projections row-parallel, norms
// replicated. A layer whose MLP holds experts is laid out as Qwen-MoE: the router replicated,
// experts stacked as w13 (gate then up) and w2, split by EP (or by TP along their features).
func (p Preset) Build(s Shapes) ([]api.TensorRequest, error) {
	var out []api.TensorRequest
	add := func(t api.TensorRequest, err error) error {
		if err == nil {
			out = append(out, t)
		}
		return err
	}
	dt := p.DType
	if err := add(VocabParallel(s, "model.embed_tokens.weight", "model.embed_tokens.weight", dt, p.VocabPad, p.TP)); err != nil {
		return nil, err
	}
	for _, l := range layers(s) {
		pre := fmt.Sprintf("model.layers.%d.", l)
		at, mlp := pre+"self_attn.", pre+"mlp."
		steps := []func() error{
			func() error {
				return add(Replicated(s, pre+"input_layernorm.weight", pre+"input_layernorm.weight", dt))
			},
			func() error {
				return add(FusedQKV(s, at+"q_proj.weight", at+"k_proj.weight", at+"v_proj.weight", at+"qkv_proj.weight", dt, p.HeadDim, p.TP))
			},
			func() error { return add(RowParallel(s, at+"o_proj.weight", at+"o_proj.weight", dt, p.TP)) },
			func() error {
				return add(Replicated(s, pre+"post_attention_layernorm.weight", pre+"post_attention_layernorm.weight", dt))
			},
		}
		for _, norm := range []string{"q_norm.weight", "k_norm.weight"} { // Qwen3
			if _, ok := s[at+norm]; ok {
				steps = append(steps, func() error { return add(Replicated(s, at+norm, at+norm, dt)) })
			}
		}
		if _, ok := s[mlp+"experts.0.gate_proj.weight"]; ok {
			steps = append(steps, func() error { return p.experts(s, mlp, add) })
		} else {
			steps = append(steps,
				func() error {
					return add(GateUp(s, mlp+"gate_proj.weight", mlp+"up_proj.weight", mlp+"gate_up_proj.weight", dt, p.TP))
				},
				func() error { return add(RowParallel(s, mlp+"down_proj.weight", mlp+"down_proj.weight", dt, p.TP)) })
		}
		for _, step := range steps {
			if err := step(); err != nil {
				return nil, err
			}
		}
	}
	if err := add(Replicated(s, "model.norm.weight", "model.norm.weight", dt)); err != nil {
		return nil, err
	}
	if _, ok := s["lm_head.weight"]; ok {
		if err := add(VocabParallel(s, "lm_head.weight", "lm_head.weight", dt, p.VocabPad, p.TP)); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// experts lays out one MoE layer: the router replicated, w13 and w2 stacked over experts.
func (p Preset) experts(s Shapes, mlp string, add func(api.TensorRequest, error) error) error {
	if err := add(Replicated(s, mlp+"gate.weight", mlp+"gate.weight", p.DType)); err != nil {
		return err
	}
	var w13, w2 [][]string
	for e := 0; ; e++ {
		ex := fmt.Sprintf("%sexperts.%d.", mlp, e)
		if _, ok := s[ex+"gate_proj.weight"]; !ok {
			break
		}
		w13 = append(w13, []string{ex + "gate_proj.weight", ex + "up_proj.weight"})
		w2 = append(w2, []string{ex + "down_proj.weight"})
	}
	ep := p.EP
	if ep.Size == 0 {
		ep = Rank{Size: 1}
	}
	if err := add(StackedExperts(s, w13, mlp+"experts.w13_weight", p.DType, ep)); err != nil {
		return err
	}
	return add(StackedExperts(s, w2, mlp+"experts.w2_weight", p.DType, ep))
}
