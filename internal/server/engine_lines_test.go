package server_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/store"
)

// These tests hold the server's vLLM layouts of the release lines after v0.10.2
// ("engine_version") to vllmref.RankAt, written from those lines' vLLM sources. A line or an
// architecture the server does not lay out yet is skipped, not failed, so the reference can land
// before the server implements the line.

// vrefLineLayout is vrefLayout naming a release line ("" names none: the server's default), with
// the fields of the newer lines where p sets them: they carry vLLM's own option names.
func vrefLineLayout(line string, p vllmref.Parallel) map[string]any {
	l := vrefLayout(p)
	delete(l, "engine_version")
	if line != "" {
		l["engine_version"] = line
	}
	if p.PCP > 1 {
		l["prefill_context_parallel_size"], l["pcp_rank"] = p.PCP, p.PCPRank
	}
	if p.RedundantExperts > 0 { // vLLM takes redundant experts only with --enable-eplb
		l["enable_eplb"], l["num_redundant_experts"] = true, p.RedundantExperts
	}
	if p.RoundRobin {
		l["expert_placement_strategy"] = "round_robin"
	}
	return l
}

// vrefLineMoEParallels are the MoE setups of the newer lines, every rank of each: EPLB's redundant
// experts (2 and 4, over TP 4 and over TP 2 x DP 2: each count divides the physical experts of some
// checkpoints evenly and of others not, which vLLM refuses), the round-robin placement (applied at
// DP 1, linear at DP 2), and prefill-context parallelism with EP off and on.
func vrefLineMoEParallels() [][]vllmref.Parallel {
	every := func(p vllmref.Parallel) []vllmref.Parallel {
		var out []vllmref.Parallel
		for d := 0; d < p.DP; d++ {
			for c := 0; c < max(p.PCP, 1); c++ {
				for r := 0; r < p.TP; r++ {
					q := p
					q.DPRank, q.PCPRank, q.TPRank = d, c, r
					out = append(out, q)
				}
			}
		}
		return out
	}
	return [][]vllmref.Parallel{
		every(vllmref.Parallel{TP: 4, DP: 1, EnableEP: true, RedundantExperts: 2}),
		every(vllmref.Parallel{TP: 2, DP: 2, EnableEP: true, RedundantExperts: 2}),
		every(vllmref.Parallel{TP: 4, DP: 1, EnableEP: true, RedundantExperts: 4}),
		every(vllmref.Parallel{TP: 2, DP: 2, EnableEP: true, RedundantExperts: 4}),
		every(vllmref.Parallel{TP: 4, DP: 1, EnableEP: true, RoundRobin: true}),
		every(vllmref.Parallel{TP: 2, DP: 2, EnableEP: true, RoundRobin: true}),
		every(vllmref.Parallel{TP: 2, DP: 1, PCP: 2}),
		every(vllmref.Parallel{TP: 2, DP: 1, PCP: 2, EnableEP: true}),
	}
}

// vrefLineParallels is the grid every line is held to: TP 1, 2, 4, 6, 8 x EP off and on x DP 1
// and 2 x every (dp_rank, tp_rank). TPs the heads do not allow are in it too: the server must
// refuse them as vLLM does.
func vrefLineParallels() []vllmref.Parallel {
	var out []vllmref.Parallel
	for _, tp := range []int{1, 2, 4, 6, 8} {
		for _, ep := range []bool{false, true} {
			for _, dp := range []int{1, 2} {
				for d := 0; d < dp; d++ {
					for r := 0; r < tp; r++ {
						out = append(out, vllmref.Parallel{TP: tp, TPRank: r, DP: dp, DPRank: d, EnableEP: ep})
					}
				}
			}
		}
	}
	return out
}

// vrefLineUnserved reports whether the server answered that it does not lay out this line (or this
// architecture on it, or the architecture at all): a 400 or 422 problem that names engine_version
// or points at /layout/engine.
func vrefLineUnserved(res response) bool {
	if res.status != 400 && res.status != 422 {
		return false
	}
	if res.problem.Errors != nil {
		for _, e := range *res.problem.Errors {
			if e.Pointer == "/layout/engine_version" || e.Pointer == "/layout/engine" {
				return true
			}
		}
	}
	return res.problem.Detail != nil && strings.Contains(*res.problem.Detail, "engine_version")
}

// gridTally counts the points of a grid, each a (checkpoint, parallel setup, rank, format), that
// the server served byte for byte as the reference lays them out, and those it refused where the
// reference refuses them.
type gridTally struct{ served, refused int }

func (g *gridTally) add(o gridTally) {
	g.served += o.served
	g.refused += o.refused
}

// gridRank is one rank of an engine's grid: the layout the server is asked for, the engine and
// release line its __metadata__ and /v1/layouts must name (line "": none), and what the reference
// says the engine saves for it, or its refusal.
type gridRank struct {
	what, checkpoint string
	layout           map[string]any
	engine, line     string
	want             map[string]vllmref.Tensor
	refusal          error
}

// gridCheck holds one rank to the reference in both formats: the safetensors body with its
// __metadata__, and /v1/layouts' table with the raw body it frames. Where the reference refuses
// the rank, every request must be a 422. It returns the formats that matched.
func gridCheck(t *testing.T, h *harness, r gridRank) gridTally {
	t.Helper()
	var tally gridTally
	st := h.do("POST", "/v1/shards", map[string]any{"checkpoint": r.checkpoint, "format": "safetensors", "layout": r.layout})
	lt := h.do("POST", "/v1/layouts", map[string]any{"checkpoint": r.checkpoint, "layout": r.layout})
	raw := h.do("POST", "/v1/shards", map[string]any{"checkpoint": r.checkpoint, "format": "raw", "layout": r.layout})
	if r.refusal != nil {
		for _, c := range []struct {
			format  string
			refused bool
		}{{"safetensors", vrefIsProblem(st, 422)}, {"raw", vrefIsProblem(lt, 422) && vrefIsProblem(raw, 422)}} {
			if !c.refused {
				t.Errorf("%s %s: the engine refuses it (%v); the server answered /v1/shards %d (safetensors), %d (raw), /v1/layouts %d",
					r.what, c.format, r.refusal, st.status, raw.status, lt.status)
				continue
			}
			tally.refused++
		}
		return tally
	}
	if st.status != 200 || st.header.Get("Content-Type") != "application/vnd.safetensors" {
		t.Errorf("%s: %d %s %.300s", r.what, st.status, st.header.Get("Content-Type"), st.body)
	} else {
		got, md := vrefParseSafetensors(t, st.body)
		named := md["shardsrv.engine"] == r.engine && md["shardsrv.engine_version"] == r.line
		if !named {
			t.Errorf("%s: __metadata__ names engine %q line %q, want %q %q (docs/engines.md)", r.what,
				md["shardsrv.engine"], md["shardsrv.engine_version"], r.engine, r.line)
		}
		if vrefReport(t, r.what, vrefDiff(got, r.want)) && named {
			tally.served++
		}
	}
	what := r.what + " raw"
	if lt.status != 200 || raw.status != 200 {
		t.Errorf("%s: /v1/layouts %d %.200s; /v1/shards %d %.200s", what, lt.status, lt.body, raw.status, raw.body)
		return tally
	}
	table := vrefLayoutTable(t, what, lt.body)
	named := table.Checkpoint == r.checkpoint && table.EngineVersion == r.line
	if !named {
		t.Errorf("%s: /v1/layouts answers checkpoint %q line %q, want %q %q", what, table.Checkpoint,
			table.EngineVersion, r.checkpoint, r.line)
	}
	if got, ok := vrefSplitRaw(t, what, table, raw.body); ok && vrefReport(t, what, vrefDiff(got, r.want)) && named {
		tally.served++
	}
	return tally
}

// vrefLineCheck holds one rank of a vLLM line to vllmref.RankAt in both formats. line is the
// engine_version asked for ("": none, the server's default), want the line the server must follow.
func vrefLineCheck(
	t *testing.T, h *harness, name, line, want string, cfg []byte, hf map[string]vllmref.Tensor, p vllmref.Parallel,
) gridTally {
	t.Helper()
	ref, refErr := vllmref.RankAt(want, cfg, hf, p)
	var unmodelled vllmref.Unmodelled
	if errors.As(refErr, &unmodelled) {
		t.Fatalf("%s: %v", name, refErr)
	}
	return gridCheck(t, h, gridRank{
		what: fmt.Sprintf("%s line %q %+v", name, line, p), checkpoint: name, layout: vrefLineLayout(line, p),
		engine: "vllm", line: want, want: ref, refusal: refErr,
	})
}

// TestVLLMLinesMatchReference runs, for every line after "0.10" and every checkpoint the reference
// models on it, the whole grid of vrefLineParallels (and of vrefLineMoEParallels for MoE
// checkpoints) in both formats, and a few requests without engine_version against the newest line;
// it logs how many points of each line matched.
func TestVLLMLinesMatchReference(t *testing.T) {
	newest := vllmref.Releases[len(vllmref.Releases)-1]
	tally := map[string]*gridTally{}
	for _, line := range vllmref.Releases[1:] {
		tally[line] = &gridTally{}
		variants := slices.Concat(vllmref.Variants, vllmref.SparseMoEVariants, vllmref.WideVariants,
			vllmref.GLMAndGptOssVariants, vllmref.WideMoEVariants)
		for _, variant := range variants {
			cfg, hf := vllmref.Checkpoint(variant, 42)
			var unmodelled vllmref.Unmodelled
			if _, err := vllmref.RankAt(line, cfg, hf, vllmref.Parallel{TP: 1, DP: 1}); errors.As(err, &unmodelled) {
				continue
			}
			t.Run(line+"/"+variant, func(t *testing.T) {
				dir := t.TempDir()
				st, err := store.NewLocal(dir)
				if err != nil {
					t.Fatal(err)
				}
				h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
				vrefPut(t, h, variant, variant)
				probe := h.do("POST", "/v1/layouts", map[string]any{
					"checkpoint": variant, "layout": vrefLineLayout(line, vllmref.Parallel{TP: 1, DP: 1}),
				})
				if vrefLineUnserved(probe) {
					t.Skipf("the server does not lay out %s on vLLM line %s yet: %d %.300s", variant, line, probe.status,
						probe.body)
				}
				for _, p := range vrefLineParallels() {
					tally[line].add(vrefLineCheck(t, h, variant, line, line, cfg, hf, p))
				}
				if line == newest { // the default line: checked, not counted again
					for _, p := range []vllmref.Parallel{{TP: 1, DP: 1}, {TP: 6, TPRank: 5, DP: 1}, {TP: 8, TPRank: 3, DP: 1}} {
						vrefLineCheck(t, h, variant, "", newest, cfg, hf, p)
					}
				}
				if !slices.ContainsFunc(slices.Collect(maps.Keys(hf)), func(n string) bool {
					return strings.Contains(n, ".experts.")
				}) {
					return // a dense model
				}
				for _, set := range vrefLineMoEParallels() {
					for _, p := range set {
						tally[line].add(vrefLineCheck(t, h, variant, line, line, cfg, hf, p))
					}
				}
			})
		}
		t.Logf("vLLM line %s: %d points (checkpoint, setup, rank, format) served byte for byte, %d refused as vLLM refuses them",
			line, tally[line].served, tally[line].refused)
	}
}

// TestVLLMGptOssMXFP4ThroughTheServer decodes the MXFP4 experts the server serves for every rank of
// a few TP x DP x EP setups, element by element as transformers documents the packing, and holds
// them to the checkpoint's decoded experts (vllmref.GptOssExpertsReassemble): a check of what the
// bytes mean that does not go through the reference's slicing rule.
func TestVLLMGptOssMXFP4ThroughTheServer(t *testing.T) {
	line := vllmref.Releases[len(vllmref.Releases)-1]
	dir := t.TempDir()
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	_, hf := vrefPut(t, h, "gptoss", "gptoss")
	probe := h.do("POST", "/v1/layouts", map[string]any{
		"checkpoint": "gptoss", "layout": vrefLineLayout(line, vllmref.Parallel{TP: 1, DP: 1}),
	})
	if vrefLineUnserved(probe) {
		t.Skipf("the server does not lay out gpt-oss on vLLM line %s yet: %d %.300s", line, probe.status, probe.body)
	}
	for _, c := range []struct {
		tp, dp int
		ep     bool
	}{{1, 1, false}, {2, 1, false}, {4, 2, false}, {6, 1, false}, {8, 2, false}, {4, 1, true}, {6, 2, true}} {
		var ranks []map[string]vllmref.Tensor
		for d := 0; d < c.dp; d++ {
			for r := 0; r < c.tp; r++ {
				p := vllmref.Parallel{TP: c.tp, TPRank: r, DP: c.dp, DPRank: d, EnableEP: c.ep}
				res := h.do("POST", "/v1/shards", map[string]any{
					"checkpoint": "gptoss", "format": "safetensors", "layout": vrefLineLayout(line, p),
				})
				if res.status != 200 {
					t.Fatalf("%+v: %d %.300s", p, res.status, res.body)
				}
				got, _ := vrefParseSafetensors(t, res.body)
				ranks = append(ranks, got)
			}
		}
		for l := 0; l < 2; l++ {
			prefix := fmt.Sprintf("model.layers.%d.mlp.experts.", l)
			if err := vllmref.GptOssExpertsReassemble(hf, prefix, ranks, c.ep); err != nil {
				t.Errorf("TP %d DP %d EP %v layer %d: %v", c.tp, c.dp, c.ep, l, err)
			}
		}
	}
}
