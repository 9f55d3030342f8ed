package engine

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
)

// refCheckpoint is one of the reference's tiny Hugging Face checkpoints, as headers.
func refCheckpoint(variant string) ([]byte, map[string]TensorInfo, map[string][]int64) {
	cfg, hf := vllmref.Checkpoint(variant, 1)
	infos, shapes := map[string]TensorInfo{}, map[string][]int64{}
	for n, x := range hf {
		infos[n] = TensorInfo{DType: x.DType, Shape: x.Shape}
		shapes[n] = x.Shape
	}
	return cfg, infos, shapes
}

func buildAt(t *testing.T, version string, p Parallel, cfg []byte, infos map[string]TensorInfo) []api.TensorRequest {
	t.Helper()
	table, err := Build(Spec{Engine: "vllm", Version: version, Parallel: p}, cfg, infos)
	if err != nil {
		t.Fatalf("%s %+v: %v", version, p, err)
	}
	return table.Tensors
}

// moeRenames is what the MoERunner line saves under another name than v0.10.2, architecture by
// architecture (docs/engines.md): the routed experts' parameters move into routed_experts, the
// shared experts into SharedExperts' _layer, and a router the block hands the runner (with its
// correction bias) under mlp.experts.gate.
var moeRenames = map[string][][2]string{
	"mixtral":    {{".experts.w", ".experts.routed_experts.w"}},
	"qwen3moe":   {{".experts.w", ".experts.routed_experts.w"}, {"mlp.gate.", "mlp.experts.gate."}},
	"qwen2moe":   {{".experts.w", ".experts.routed_experts.w"}, {"mlp.shared_expert_gate.", "mlp.experts._shared_experts._layer.expert_gate."}, {"mlp.shared_expert.", "mlp.experts._shared_experts._layer."}},
	"deepseekv3": {{".experts.w", ".experts.routed_experts.w"}, {"mlp.gate.", "mlp.experts.gate."}, {"mlp.experts.e_score", "mlp.experts.gate.e_score"}, {"mlp.experts._shared_experts.", "mlp.experts._shared_experts._layer."}},
}

// TestMoERunnerLineRenamesTheV010Layout: without sequence-parallel MoE, every MoE architecture's
// "0.29" rank holds exactly its "0.10" rank's tensors, block for block, under the documented
// new names, plus four scale buffers per attention module and nothing else.
func TestMoERunnerLineRenamesTheV010Layout(t *testing.T) {
	for _, variant := range []string{"mixtral", "qwen2moe", "qwen3moe", "deepseekv3", "deepseekv3-fp8"} {
		cfg, infos, _ := refCheckpoint(variant)
		renames := moeRenames[strings.TrimSuffix(variant, "-fp8")]
		for _, p := range []Parallel{
			{TP: 1, DP: 1}, {TP: 2, TPRank: 1, DP: 1}, {TP: 4, TPRank: 2, DP: 1, ExpertParallel: true},
			{TP: 2, TPRank: 1, DP: 2, DPRank: 1}, {TP: 1, DP: 2, DPRank: 1, ExpertParallel: true},
		} {
			what := fmt.Sprintf("%s %+v", variant, p)
			old, cur := buildAt(t, "0.10", p, cfg, infos), buildAt(t, "0.29", p, cfg, infos)
			byName := map[string]api.TensorRequest{}
			for _, x := range cur {
				byName[x.Name] = x
			}
			for _, x := range old {
				name := x.Name
				for _, r := range renames {
					if strings.Contains(name, r[0]) {
						name = strings.Replace(name, r[0], r[1], 1)
						break
					}
				}
				y, ok := byName[name]
				if !ok {
					t.Fatalf("%s: 0.10's %s is not on 0.29 as %s", what, x.Name, name)
				}
				if x.Dtype != y.Dtype || !slices.Equal(x.Shape, y.Shape) || !reflect.DeepEqual(x.Blocks, y.Blocks) ||
					!reflect.DeepEqual(x.Fill, y.Fill) {
					t.Fatalf("%s: %s differs from 0.10's %s", what, name, x.Name)
				}
				delete(byName, name)
			}
			for name := range byName {
				if !slices.ContainsFunc(kvScaleBuffers, func(b string) bool { return strings.HasSuffix(name, "attn."+b) }) {
					t.Fatalf("%s: 0.29 holds %s, which 0.10 has not", what, name)
				}
			}
			if len(byName) != 4*countLayers(cfg) {
				t.Fatalf("%s: %d scale buffers, want 4 a layer", what, len(byName))
			}
		}
	}
}

func countLayers(cfg []byte) int {
	c, _ := parseConfig(cfg)
	n, _ := c.int("num_hidden_layers", -1)
	return int(n)
}

// TestMLAScaleBuffersUnderTheWrappersAttention: MLA's scale buffers belong to the MLAAttention the
// wrapper at self_attn.mla_attn holds as its own mla_attn.
func TestMLAScaleBuffersUnderTheWrappersAttention(t *testing.T) {
	cfg, infos, _ := refCheckpoint("deepseekv3")
	var names []string
	for _, x := range buildAt(t, "0.29", Parallel{TP: 2, DP: 1}, cfg, infos) {
		names = append(names, x.Name)
	}
	at := "model.layers.0.self_attn."
	i := slices.Index(names, at+"mla_attn.o_proj.weight")
	want := []string{at + "mla_attn.mla_attn._k_scale", at + "mla_attn.mla_attn._v_scale",
		at + "mla_attn.mla_attn._q_scale", at + "mla_attn.mla_attn._prob_scale"}
	if i < 0 || !slices.Equal(names[i+1:i+5], want) {
		t.Fatalf("after o_proj: %v, want %v", names[i+1:min(i+5, len(names))], want)
	}
}

// TestSequenceParallelMoEReplicatesDeepSeekSharedExperts: with EP, TP > 1 and DP > 1 on "0.29",
// every rank holds DeepSeek's shared experts whole (the dense first layer stays TP-split); on
// "0.10", or without DP, they are split as before.
func TestSequenceParallelMoEReplicatesDeepSeekSharedExperts(t *testing.T) {
	for _, variant := range []string{"deepseekv3", "deepseekv3-fp8"} {
		cfg, infos, shapes := refCheckpoint(variant)
		for _, c := range []struct {
			version string
			p       Parallel
			whole   bool
		}{
			{"0.29", Parallel{TP: 2, TPRank: 1, DP: 2, DPRank: 1, ExpertParallel: true}, true},
			{"0.29", Parallel{TP: 2, TPRank: 1, DP: 1, ExpertParallel: true}, false},
			{"0.29", Parallel{TP: 2, TPRank: 1, DP: 2, DPRank: 1}, false},
			{"0.10", Parallel{TP: 2, TPRank: 1, DP: 2, DPRank: 1, ExpertParallel: true}, false},
		} {
			what := fmt.Sprintf("%s %s %+v", variant, c.version, c.p)
			checked := 0
			for _, x := range buildAt(t, c.version, c.p, cfg, infos) {
				var src string
				switch {
				case strings.HasSuffix(x.Name, "_shared_experts._layer.down_proj.weight"),
					strings.HasSuffix(x.Name, "_shared_experts.down_proj.weight"):
					src = "mlp.shared_experts.down_proj.weight"
				case strings.HasSuffix(x.Name, "layers.0.mlp.down_proj.weight"):
					src = "mlp.down_proj.weight"
				default:
					continue
				}
				layer := x.Name[:strings.Index(x.Name, ".mlp.")]
				full := shapes[layer+"."+src]
				whole := c.whole && strings.Contains(x.Name, "shared")
				if got := x.Shape[1] == full[1]; got != whole {
					t.Errorf("%s: %s has shape %v of %v, whole %v, want %v", what, x.Name, x.Shape, full, got, whole)
				}
				if whole && !slices.Equal(evaluate(t, x, shapes), evaluate(t, wholeTensor(layer+"."+src, full), shapes)) {
					t.Errorf("%s: %s is not the whole %s", what, x.Name, src)
				}
				checked++
			}
			if checked < 2 {
				t.Fatalf("%s: checked %d down projections", what, checked)
			}
		}
	}
}

func wholeTensor(src string, shape []int64) api.TensorRequest {
	blocks := []api.Block{}
	tr := api.TensorRequest{Name: src, Shape: shape, Blocks: &blocks}
	param{&tr}.place(src, make([]int64, len(shape)), make([]int64, len(shape)), shape)
	return tr
}

// TestExpertPlacementAgainstBruteForce holds moeGroup to a slot-by-slot assignment: physical slot
// p goes to the rank whose consecutive share it falls in (linear: the first (E+R) % EP ranks one
// more) or to rank p mod EP (round-robin, where vLLM keeps it), and holds logical expert p mod E.
func TestExpertPlacementAgainstBruteForce(t *testing.T) {
	for experts := int64(1); experts <= 13; experts++ {
		for redundant := int64(0); redundant <= 5; redundant++ {
			for _, shape := range [][3]int64{{1, 1, 1}, {2, 1, 1}, {2, 1, 2}, {4, 1, 1}, {1, 3, 1}, {2, 2, 1}, {3, 1, 2}} {
				tp, pcp, dp := shape[0], shape[1], shape[2]
				for _, placement := range []string{"linear", "round_robin"} {
					for _, groups := range []int64{0, 4} {
						eplb := redundant > 0
						flat, physical := tp*pcp*dp, experts+redundant
						if flat == 1 || (eplb && physical%flat != 0) {
							continue
						}
						rr := placement == "round_robin" && groups > 1 && !eplb && dp == 1
						owner := make([]int64, physical)
						share, extra := physical/flat, physical%flat
						for p, rank, left := int64(0), int64(0), int64(-1); p < physical; p++ {
							if left <= 0 {
								if left == 0 {
									rank++
								}
								left = share
								if rank < extra {
									left++
								}
							}
							owner[p], left = rank, left-1
							if rr {
								owner[p] = p % flat
							}
						}
						for rank := range flat {
							var want []int64
							for p := range physical {
								if owner[p] == rank {
									want = append(want, p%experts)
								}
							}
							m := &model{rel: &releases["vllm"][1], par: Parallel{
								TP: tp, TPRank: rank % tp, PCP: pcp, PCPRank: rank / tp % pcp, DP: dp, DPRank: rank / (tp * pcp),
								ExpertParallel: true, EPLB: eplb, RedundantExperts: redundant, Placement: placement,
							}}
							g, err := m.moeGroup(experts, groups)
							if err != nil {
								t.Fatal(err)
							}
							if !slices.Equal(g.slots, want) && !(len(want) == 0 && len(g.slots) == 0) {
								t.Fatalf("E %d R %d TP %d PCP %d DP %d %s groups %d rank %d: slots %v, want %v",
									experts, redundant, tp, pcp, dp, placement, groups, rank, g.slots, want)
							}
						}
					}
				}
			}
		}
	}
}

// TestParallelOptionsRefused: each option a line does not lay out, and each combination vLLM
// refuses, is a 422 at the field to change.
func TestParallelOptionsRefused(t *testing.T) {
	for _, c := range []struct {
		version, variant string
		p                Parallel
		pointer          string
	}{
		{"0.10", "qwen3moe", Parallel{TP: 1, DP: 1, PCP: 2}, "/layout/prefill_context_parallel_size"},
		{"0.10", "qwen3moe", Parallel{TP: 2, DP: 1, ExpertParallel: true, EPLB: true}, "/layout/enable_eplb"},
		{"0.10", "qwen3moe", Parallel{TP: 2, DP: 1, ExpertParallel: true, Placement: "round_robin"}, "/layout/expert_placement_strategy"},
		{"0.29", "qwen3moe", Parallel{TP: 2, DP: 1, ExpertParallel: true, RedundantExperts: 2}, "/layout/num_redundant_experts"},
		{"0.29", "qwen3moe", Parallel{TP: 2, DP: 1, EPLB: true}, "/layout/enable_eplb"},
		{"0.29", "qwen3moe", Parallel{TP: 1, DP: 1, ExpertParallel: true, EPLB: true}, "/layout/enable_eplb"},
		{"0.29", "qwen2moe", Parallel{TP: 2, DP: 1, ExpertParallel: true, EPLB: true}, "/layout/enable_eplb"},
		{"0.29", "llama", Parallel{TP: 2, DP: 1, ExpertParallel: true, EPLB: true}, "/layout/enable_eplb"},
		{"0.29", "qwen3moe", Parallel{TP: 1, DP: 2, PCP: 2}, "/layout/prefill_context_parallel_size"},
		{"0.29", "qwen3moe", Parallel{TP: 4, DP: 1, ExpertParallel: true, EPLB: true, RedundantExperts: 1}, "/layout/num_redundant_experts"},
		{"0.29", "qwen3moe", Parallel{TP: 1, DP: 1, PCP: 2, PCPRank: 2}, "/layout/pcp_rank"},
		{"0.29", "qwen3moe", Parallel{TP: 1, DP: 1, Placement: "striped"}, "/layout/expert_placement_strategy"},
	} {
		cfg, infos, _ := refCheckpoint(c.variant)
		_, err := Build(Spec{Engine: "vllm", Version: c.version, Parallel: c.p}, cfg, infos)
		if e, ok := err.(*Error); !ok || e.Pointer != c.pointer {
			t.Errorf("%s %s %+v: %v, want a 422 at %s", c.variant, c.version, c.p, err, c.pointer)
		}
	}
}

// TestPrefillContextParallelJoinsTheMoEGroup: a PCP rank holds its TP rank's attention and dense
// weights, and its own share of the experts, as the rank of a group PCP times wider would.
func TestPrefillContextParallelJoinsTheMoEGroup(t *testing.T) {
	cfg, infos, shapes := refCheckpoint("qwen3moe")
	for _, ep := range []bool{false, true} {
		for pcpRank := range int64(2) {
			got := buildAt(t, "0.29", Parallel{TP: 2, TPRank: 1, PCP: 2, PCPRank: pcpRank, DP: 1, ExpertParallel: ep}, cfg, infos)
			dense := buildAt(t, "0.29", Parallel{TP: 2, TPRank: 1, DP: 1, ExpertParallel: ep}, cfg, infos)
			wide := buildAt(t, "0.29", Parallel{TP: 4, TPRank: 2*pcpRank + 1, DP: 1, ExpertParallel: ep}, cfg, infos)
			for i, x := range got {
				want := dense[i]
				if strings.Contains(x.Name, "routed_experts.") {
					want = wide[slices.IndexFunc(wide, func(y api.TensorRequest) bool { return y.Name == x.Name })]
				}
				if x.Name != want.Name || !slices.Equal(evaluate(t, x, shapes), evaluate(t, want, shapes)) {
					t.Fatalf("EP %v pcp_rank %d: %s differs from %s", ep, pcpRank, x.Name, want.Name)
				}
			}
		}
	}
}
