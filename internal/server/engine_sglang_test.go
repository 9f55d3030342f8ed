package server_test

import (
	"errors"
	"fmt"
	"testing"

	"github.com/shardsrv/shardsrv/internal/engine/sglangref"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/store"
)

// sglangLayout is the layout object of one SGLang rank, in SGLang's option names (--tp-size as
// tensor_parallel_size, --dp-size, --enable-dp-attention, --ep-size as expert_parallel_size). It
// has no dp_rank: SGLang names a rank's files by its TP rank alone.
func sglangLayout(p sglangref.Parallel) map[string]any {
	return map[string]any{
		"engine": "sglang", "tensor_parallel_size": p.TP, "tp_rank": p.TPRank, "data_parallel_size": max(p.DP, 1),
		"enable_dp_attention": p.EnableDPAttention, "expert_parallel_size": max(p.EP, 1),
	}
}

// sglangParallels is the grid: TP 1, 2, 4, 6, 8 x DP 1 and 2 x DP attention off and on (on only
// with DP 2) x EP 1 and 2 x every TP rank. Setups SGLang refuses are in it: the server must refuse
// them too.
func sglangParallels() []sglangref.Parallel {
	var out []sglangref.Parallel
	for _, tp := range []int{1, 2, 4, 6, 8} {
		for _, dp := range []int{1, 2} {
			for _, dpa := range []bool{false, true} {
				if dpa && dp == 1 {
					continue
				}
				for _, ep := range []int{1, 2} {
					for r := 0; r < tp; r++ {
						out = append(out, sglangref.Parallel{TP: tp, TPRank: r, DP: dp, EnableDPAttention: dpa, EP: ep})
					}
				}
			}
		}
	}
	return out
}

// TestSGLangLinesMatchReference holds the server's "engine": "sglang" layouts to sglangref, written
// from SGLang's sources, for every checkpoint the reference models at every point of
// sglangParallels, in both formats, and logs how many points matched.
func TestSGLangLinesMatchReference(t *testing.T) {
	var tally gridTally
	for _, variant := range sglangref.Variants {
		t.Run(variant, func(t *testing.T) {
			dir := t.TempDir()
			st, err := store.NewLocal(dir)
			if err != nil {
				t.Fatal(err)
			}
			h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
			cfg, hf := vrefPut(t, h, variant, variant)
			var unmodelled sglangref.Unmodelled
			for _, p := range sglangParallels() {
				what := fmt.Sprintf("%s %+v", variant, p)
				ref, refErr := sglangref.Rank(cfg, hf, p)
				if errors.As(refErr, &unmodelled) {
					t.Fatalf("%s: %v", what, refErr)
				}
				tally.add(gridCheck(t, h, gridRank{
					what: what, checkpoint: variant, layout: sglangLayout(p), engine: "sglang", want: ref, refusal: refErr,
				}))
			}
		})
	}
	t.Logf("SGLang: %d points (checkpoint, setup, rank, format) served byte for byte, %d refused as SGLang refuses them",
		tally.served, tally.refused)
}
