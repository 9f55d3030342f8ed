package engine

import (
	"fmt"

	"github.com/shardsrv/shardsrv/api"
)

// expertModules names one expert's gate, up and down projections in the checkpoint.
type expertModules func(e int64) (gate, up, down string)

// moeGroup is how a FusedMoE layer spreads over the ranks (FusedMoEParallelConfig.make and
// flatten_tp_across_dp_and_pcp in vllm/model_executor/layers/fused_moe/config.py): the MoE group
// flattens TP across prefill-context and data parallelism, size DP*PCP*TP, rank (dp_rank*PCP +
// pcp_rank)*TP + tp_rank. Without expert parallelism (or on one rank) the experts are split like
// linear layers over that group. With it the MoE TP size is 1 and the E + R physical experts (R
// redundant under EPLB) go whole over it (determine_expert_map in fused_moe/expert_map_manager.py,
// read at commit 04d26335ddf7fb894244a56de9dc3b841323b0ae): placed linearly the first (E+R) % EP
// ranks hold one more, consecutive slots; placed round-robin rank r holds slots r, r+EP, r+2EP, ...
// Physical slot p holds logical expert p mod E (EPLB's initial map: slot E+j is logical expert j).
// On v0.10.2 PCP is 1 and there are neither redundant experts nor round-robin.
type moeGroup struct {
	tp, tpRank int64   // the split of each expert's intermediate features
	slots      []int64 // the logical expert each of the rank's expert slots holds
}

// moeGroup places count logical experts; groups is the model's num_expert_group (0 without).
func (m *model) moeGroup(count, groups int64) (moeGroup, error) {
	p := m.par
	flat, rank := p.TP*p.PCP*p.DP, (p.DPRank*p.PCP+p.PCPRank)*p.TP+p.TPRank
	if !p.ExpertParallel || flat == 1 {
		g := moeGroup{tp: flat, tpRank: rank, slots: make([]int64, count)}
		for e := range g.slots {
			g.slots[e] = int64(e)
		}
		return g, nil
	}
	physical := count + p.RedundantExperts
	if p.EPLB && physical%flat != 0 { // FusedMoEFactory: "EPLB currently only supports even distribution"
		return moeGroup{}, &Error{"/layout/num_redundant_experts", fmt.Sprintf(
			"EPLB needs the %d physical experts (%d and %d redundant) to divide evenly over the %d expert-parallel ranks",
			physical, count, p.RedundantExperts, flat)}
	}
	base, extra := physical/flat, physical%flat
	g := moeGroup{tp: 1, slots: make([]int64, base)}
	if rank < extra {
		g.slots = append(g.slots, 0)
	}
	first, step := rank*base+min(rank, extra), int64(1)
	if m.roundRobin(groups) {
		first, step = rank, flat
	}
	for j := range g.slots {
		g.slots[j] = (first + int64(j)*step) % count
	}
	return g, nil
}

// roundRobin reports whether the round-robin placement a request names is the one vLLM uses: it
// falls back to linear, with a warning, unless the model groups its experts (num_expert_group > 1),
// there are no redundant experts and no EPLB, and the all2all kernels that run with DP > 1 are
// DeepEP low-latency or NIXL, which the default backend (allgather_reducescatter) is not
// (determine_expert_placement_strategy in expert_map_manager.py at
// 04d26335ddf7fb894244a56de9dc3b841323b0ae).
func (m *model) roundRobin(groups int64) bool {
	p := m.par
	return p.Placement == "round_robin" && groups > 1 && p.RedundantExperts == 0 && !p.EPLB && p.DP == 1
}

// sequenceParallelMoE is ParallelConfig.use_sequence_parallel_moe on the default all2all backend
// (vllm/config/parallel.py at 00193b82b0e2d4faea5d3b4ea4f6c4c2bd9d057a): expert parallelism with
// TP > 1 and DP > 1, on a line whose MoE layers are built for it.
func (m *model) sequenceParallelMoE() bool {
	return m.rel.runner != nil && m.par.ExpertParallel && m.par.TP > 1 && m.par.DP > 1
}

// moeNames are the names a MoE block's modules are saved under (see moeRunner): its router, the
// router's correction bias, its shared experts and its routed experts' parameters.
type moeNames struct{ gate, bias, shared, routed string }

func (m *model) moeNames(block string) moeNames {
	ex := block + "experts."
	if m.rel.runner == nil { // FusedMoE registers the bias, SharedFusedMoE the shared experts
		return moeNames{block + "gate.", ex + "e_score_correction_bias", ex + "_shared_experts.", ex}
	}
	n := moeNames{block + "gate.", ex + "routed_experts.e_score_correction_bias", ex + "_shared_experts._layer.",
		ex + "routed_experts."}
	if m.rel.runner.gateInRunner[m.cfg.architecture()] {
		n.gate = ex + "gate."
		n.bias = n.gate + "e_score_correction_bias"
	}
	return n
}

// sharedExperts lays out a MoE block's shared experts from the checkpoint module src: a gated MLP
// split like a dense one, or whole on every rank where the line's sequence-parallel MoE
// replicates them (DeepseekV2MLP with is_sequence_parallel: disable_tp on both projections).
func (m *model) sharedExperts(dst, src string) error {
	if !m.sequenceParallelMoE() || !m.rel.runner.sequenceParallelShared[m.cfg.architecture()] {
		return m.mlp(dst, src, "gate_proj", "up_proj", "down_proj")
	}
	if err := m.replicatedLinear(dst+"gate_up_proj", src+"gate_proj", src+"up_proj"); err != nil {
		return err
	}
	return m.replicatedLinear(dst+"down_proj", src+"down_proj")
}

// experts lays out vLLM's FusedMoE (layers/fused_moe/layer.py, weight_loader; on lines with a
// MoERunner, RoutedExperts.weight_loader in routed_experts.py) under the prefix dst, its experts
// placed by moeGroup. groups is the model's num_expert_group (0 when it has none).
func (m *model) experts(dst string, count, groups int64, names expertModules) error {
	g, err := m.moeGroup(count, groups)
	if err != nil {
		return err
	}
	return m.stackExperts(dst, g, names)
}

// stackExperts lays out a FusedMoE's stacked weights for the rank's place g in the MoE group:
// w13_weight [E_local, 2*I/tp, H] holds each expert's [gate_r; up_r] (w1 then w3), and w2_weight
// [E_local, H, I/tp] each expert's down-projection columns of the rank. Block-FP8 checkpoints add
// w13_weight_scale_inv and w2_weight_scale_inv, split the same way in block units.
func (m *model) stackExperts(dst string, g moeGroup, names expertModules) error {
	local := int64(len(g.slots))
	if local == 0 {
		// More ranks than experts leave this one none: its expert parameters are empty, and
		// _filter_subtensors drops empty tensors from the state dict.
		return nil
	}
	gate0, _, _ := names(0)
	sh, err := m.shape(gate0+".weight", 2)
	if err != nil {
		return err
	}
	inter, hidden := sh[0], sh[1]
	per, err := divide("the experts' intermediate size", inter, g.tp, "/layout/tensor_parallel_size")
	if err != nil {
		return err
	}
	quant := m.quantized(gate0)
	if quant { // Fp8MoEMethod.create_weights refuses partitions that are not whole blocks
		if per%m.blockN != 0 || (m.par.TP > 1 && per%m.blockK != 0) {
			return &Error{"/layout/tensor_parallel_size", fmt.Sprintf(
				"the experts' %d intermediate features per rank are not whole FP8 scale blocks of %dx%d (vLLM refuses this split)",
				per,
				m.blockN,
				m.blockK,
			)}
		}
	}
	at := g.tpRank * per
	w13 := m.param(dst+"w13_weight", m.weightDType(gate0), local, 2*per, hidden)
	w2 := m.param(dst+"w2_weight", m.weightDType(gate0), local, hidden, per)
	for i, e := range g.slots {
		j := int64(i)
		gate, up, down := names(e)
		for _, mod := range []string{gate, up} {
			if s, err := m.shape(mod+".weight", 2); err != nil {
				return err
			} else if s[0] != inter || s[1] != hidden {
				return checkpointError("%s.weight has shape %v where %s.weight has %v", mod, s, gate0, sh)
			}
		}
		if s, err := m.shape(down+".weight", 2); err != nil {
			return err
		} else if s[0] != hidden || s[1] != inter {
			return checkpointError("%s.weight has shape %v, not [%d, %d]", down, s, hidden, inter)
		}
		w13.place(gate+".weight", []int64{j, 0, 0}, []int64{at, 0}, []int64{per, hidden})
		w13.place(up+".weight", []int64{j, per, 0}, []int64{at, 0}, []int64{per, hidden})
		w2.place(down+".weight", []int64{j, 0, 0}, []int64{0, at}, []int64{hidden, per})
	}
	if !quant {
		return nil
	}
	rows, cols := per/m.blockN, ceilDiv(hidden, m.blockK)
	s13 := m.param(dst+"w13_weight_scale_inv", api.F32, local, 2*rows, cols)
	outRows, inCols := ceilDiv(hidden, m.blockN), ceilDiv(per, m.blockK)
	s2 := m.param(dst+"w2_weight_scale_inv", api.F32, local, outRows, inCols)
	for i, e := range g.slots {
		j := int64(i)
		gate, up, down := names(e)
		s13.place(gate+".weight_scale_inv", []int64{j, 0, 0}, []int64{g.tpRank * rows, 0}, []int64{rows, cols})
		s13.place(up+".weight_scale_inv", []int64{j, rows, 0}, []int64{g.tpRank * rows, 0}, []int64{rows, cols})
		s2.place(down+".weight_scale_inv", []int64{j, 0, 0}, []int64{0, g.tpRank * inCols}, []int64{outRows, inCols})
	}
	return nil
}
