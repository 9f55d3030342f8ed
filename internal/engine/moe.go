package engine

import (
	"fmt"

	"github.com/shardsrv/shardsrv/api"
)

// expertModules names one expert's gate, up and down projections in the checkpoint.
type expertModules func(e int64) (gate, up, down string)

// moeGroup is how a FusedMoE layer spreads over the ranks (FusedMoEParallelConfig.make in
// vllm/model_executor/layers/fused_moe/config.py). Without expert parallelism the experts are
// split like linear layers over a TP group flattened across DP (flatten_tp_across_dp: size TP*DP,
// rank DP_rank*TP + TP_rank). With it they spread whole over EP = TP*DP ranks in that order, the
// MoE TP size being 1, placed linearly: the first E % EP ranks hold one more (determine_expert_map).
type moeGroup struct {
	tp, tpRank   int64 // the split of each expert's intermediate features
	first, local int64 // the experts this rank holds
}

func (m *model) moeGroup(experts int64) (moeGroup, error) {
	flat, flatRank := m.par.TP*m.par.DP, m.par.DPRank*m.par.TP+m.par.TPRank
	if !m.par.ExpertParallel || flat == 1 {
		return moeGroup{tp: flat, tpRank: flatRank, first: 0, local: experts}, nil
	}
	base, extra := experts/flat, experts%flat
	g := moeGroup{tp: 1, first: flatRank*base + min(flatRank, extra), local: base}
	if flatRank < extra {
		g.local++
	}
	return g, nil
}

// experts lays out FusedMoE's stacked weights (layers/fused_moe/layer.py, weight_loader):
// w13_weight [E_local, 2*I/tp, H] holds each expert's [gate_r; up_r] (w1 then w3), and w2_weight
// [E_local, H, I/tp] each expert's down-projection columns of the rank. Block-FP8 checkpoints add
// w13_weight_scale_inv and w2_weight_scale_inv, split the same way in block units.
func (m *model) experts(dst string, count int64, names expertModules) error {
	g, err := m.moeGroup(count)
	if err != nil || g.local == 0 {
		// More ranks than experts leave this one none: its expert parameters are empty, and
		// _filter_subtensors drops empty tensors from the state dict.
		return err
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
	w13 := m.param(dst+"w13_weight", m.weightDType(gate0), g.local, 2*per, hidden)
	w2 := m.param(dst+"w2_weight", m.weightDType(gate0), g.local, hidden, per)
	for j := range g.local {
		gate, up, down := names(g.first + j)
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
	s13 := m.param(dst+"w13_weight_scale_inv", api.F32, g.local, 2*rows, cols)
	outRows, inCols := ceilDiv(hidden, m.blockN), ceilDiv(per, m.blockK)
	s2 := m.param(dst+"w2_weight_scale_inv", api.F32, g.local, outRows, inCols)
	for j := range g.local {
		gate, up, down := names(g.first + j)
		s13.place(gate+".weight_scale_inv", []int64{j, 0, 0}, []int64{g.tpRank * rows, 0}, []int64{rows, cols})
		s13.place(up+".weight_scale_inv", []int64{j, rows, 0}, []int64{g.tpRank * rows, 0}, []int64{rows, cols})
		s2.place(down+".weight_scale_inv", []int64{j, 0, 0}, []int64{0, g.tpRank * inCols}, []int64{outRows, inCols})
	}
	return nil
}
