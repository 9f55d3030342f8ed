package engine

import (
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/big"
	"math/rand/v2"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
)

// extremes are the integers a hostile client tries first.
var extremes = []int64{
	0, -1, 1, 2, MaxRanks, MaxRanks + 1,
	math.MaxInt32, 1 << 31, 1 << 62, 1<<62 + 1, math.MaxInt64, math.MinInt64,
}

// draw is a size or rank: mostly small (so layouts succeed), sometimes extreme, sometimes anything.
func draw(r *rand.Rand) int64 {
	switch r.IntN(6) {
	case 0:
		return extremes[r.IntN(len(extremes))]
	case 1:
		return int64(r.Uint64())
	case 2:
		return r.Int64N(MaxRanks + 2)
	}
	return int64(1) << r.IntN(4)
}

// mixtralCheckpoint is the headers and config.json of a small Mixtral. Config integers may be
// overridden with anything, shapes follow the sane values.
func mixtralCheckpoint(
	heads, kvHeads, headDim, inter, experts, vocab int64, override map[string]any,
) ([]byte, map[string]TensorInfo) {
	hidden := heads * headDim
	cfg := map[string]any{
		"architectures": []string{"MixtralForCausalLM"}, "torch_dtype": "bfloat16",
		"hidden_size": hidden, "num_attention_heads": heads, "num_key_value_heads": kvHeads,
		"head_dim": headDim, "num_hidden_layers": 1, "num_local_experts": experts,
	}
	for k, v := range override {
		cfg[k] = v
	}
	raw, _ := json.Marshal(cfg)
	shapes := map[string][]int64{
		"model.embed_tokens.weight": {vocab, hidden},
		"lm_head.weight":            {vocab, hidden},
		"model.norm.weight":         {hidden},
	}
	at := "model.layers.0."
	shapes[at+"self_attn.q_proj.weight"] = []int64{heads * headDim, hidden}
	shapes[at+"self_attn.k_proj.weight"] = []int64{kvHeads * headDim, hidden}
	shapes[at+"self_attn.v_proj.weight"] = []int64{kvHeads * headDim, hidden}
	shapes[at+"self_attn.o_proj.weight"] = []int64{hidden, heads * headDim}
	shapes[at+"input_layernorm.weight"] = []int64{hidden}
	shapes[at+"post_attention_layernorm.weight"] = []int64{hidden}
	shapes[at+"block_sparse_moe.gate.weight"] = []int64{experts, hidden}
	for e := range experts {
		ex := fmt.Sprintf("%sblock_sparse_moe.experts.%d.", at, e)
		shapes[ex+"w1.weight"] = []int64{inter, hidden}
		shapes[ex+"w3.weight"] = []int64{inter, hidden}
		shapes[ex+"w2.weight"] = []int64{hidden, inter}
	}
	infos := map[string]TensorInfo{}
	for n, s := range shapes {
		infos[n] = TensorInfo{DType: "BF16", Shape: s}
	}
	return raw, infos
}

// wantRequestError is the pointer of the first out-of-range request field, computed in big
// integers so no wrap can hide one ("" when the request is in range).
func wantRequestError(p Parallel) string {
	b := func(x int64) *big.Int { return big.NewInt(x) }
	inRange := func(x, lo, hi *big.Int) bool { return x.Cmp(lo) >= 0 && x.Cmp(hi) <= 0 }
	maxRanks, zero, one := b(MaxRanks), b(0), b(1)
	switch {
	case !inRange(b(p.TP), one, maxRanks):
		return "/layout/tensor_parallel_size"
	case !inRange(b(p.TPRank), zero, new(big.Int).Sub(b(p.TP), one)):
		return "/layout/tp_rank"
	case !inRange(b(p.DP), one, maxRanks):
		return "/layout/data_parallel_size"
	case !inRange(b(p.DPRank), zero, new(big.Int).Sub(b(p.DP), one)):
		return "/layout/dp_rank"
	case new(big.Int).Mul(b(p.TP), b(p.DP)).Cmp(maxRanks) > 0:
		return "/layout/data_parallel_size"
	}
	return ""
}

var expertSource = regexp.MustCompile(`experts\.(\d+)\.w1\.weight$`)

// TestLayoutBoundsProperty draws sizes and ranks, sane and extreme, for requests and config.json
// fields alike, and holds Build to big-integer arithmetic: an out-of-range request field is a 422
// at its pointer, an out-of-range config integer names its key, and a layout that builds places
// every block inside its destination and its source (checked in big integers, where nothing
// wraps) and gives the rank exactly the experts vLLM's linear placement does.
func TestLayoutBoundsProperty(t *testing.T) {
	r := rand.New(rand.NewPCG(27, 1))
	configKeys := []string{
		"num_local_experts", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size", "num_hidden_layers",
	}
	built := 0
	for i := range 20000 {
		p := Parallel{TP: draw(r), TPRank: draw(r), DP: draw(r), DPRank: draw(r), ExpertParallel: r.IntN(2) == 0}
		if r.IntN(3) == 0 { // in range often enough that layouts build
			p.TPRank, p.DPRank = r.Int64N(max(1, min(p.TP, 8))), r.Int64N(max(1, min(p.DP, 8)))
		}
		heads := int64(1) << r.IntN(4)
		kv := max(1, heads>>r.IntN(3))
		experts := 1 + r.Int64N(12)
		override := map[string]any{}
		badKey := ""
		if r.IntN(8) == 0 {
			badKey = configKeys[r.IntN(len(configKeys))]
			bad := []any{-1, MaxConfigInt + 1, 1 << 53, 1e300, 2.5, math.MaxInt64, "8"}
			override[badKey] = bad[r.IntN(len(bad))]
		}
		cfg, infos := mixtralCheckpoint(heads, kv, 1<<r.IntN(4), 8<<r.IntN(3), experts, 64+r.Int64N(300), override)
		if r.IntN(16) == 0 { // a header with an empty or vast dimension
			dims := []int64{0, extremes[r.IntN(len(extremes))]}
			infos["model.layers.0.self_attn.o_proj.weight"] = TensorInfo{DType: "BF16", Shape: dims}
		}
		what := fmt.Sprintf("case %d: %+v experts %d override %v", i, p, experts, override)

		table, err := Build(Spec{Engine: "vllm", Version: "0.10", Parallel: p}, cfg, infos)
		wantPtr := wantRequestError(p)
		var lerr *Error
		if err != nil && !errors.As(err, &lerr) {
			t.Fatalf("%s: %v is not an engine.Error", what, err)
		}
		if wantPtr != "" {
			if lerr == nil || lerr.Pointer != wantPtr {
				t.Fatalf("%s: got %v, want an error at %s", what, err, wantPtr)
			}
			continue
		}
		if lerr != nil && strings.Contains(lerr.Detail, "must be in [1,") {
			t.Fatalf("%s: an in-range request refused: %v", what, err)
		}
		if badKey != "" {
			if lerr == nil || lerr.Pointer != "" || !strings.Contains(lerr.Detail, "config.json /"+badKey) {
				t.Fatalf("%s: got %v, want config.json /%s refused", what, err, badKey)
			}
			continue
		}
		if err != nil {
			continue // a split the checkpoint does not take: the engine's ordinary refusals
		}
		built++
		checkPlacement(t, what, table.Tensors, infos)
		checkExperts(t, what, p, experts, table.Tensors)
	}
	if built < 500 {
		t.Fatalf("only %d of the drawn layouts built; the property barely ran", built)
	}
}

// checkPlacement verifies in big integers that each block lies inside its destination and source.
func checkPlacement(t *testing.T, what string, out []api.TensorRequest, infos map[string]TensorInfo) {
	t.Helper()
	b := func(x int64) *big.Int { return big.NewInt(x) }
	for _, tr := range out {
		for _, blk := range *tr.Blocks {
			for d := range tr.Shape {
				end := new(big.Int).Add(b(blk.Offsets[d]), b(blk.Lengths[d]))
				if blk.Offsets[d] < 0 || blk.Lengths[d] < 1 || end.Cmp(b(tr.Shape[d])) > 0 {
					t.Fatalf("%s: %s block %v+%v outside %v", what, tr.Name, blk.Offsets, blk.Lengths, tr.Shape)
				}
			}
			src := infos[blk.Source].Shape
			lead := len(tr.Shape) - len(src)
			for s := range src {
				end := new(big.Int).Add(b(blk.Base[s]), b(blk.Lengths[lead+s]))
				if blk.Base[s] < 0 || end.Cmp(b(src[s])) > 0 {
					t.Fatalf("%s: %s reads %s at %v past %v", what, tr.Name, blk.Source, blk.Base, src)
				}
			}
		}
	}
}

// checkExperts verifies the rank's experts against linear placement over TP×DP computed in big
// integers: without expert parallelism every rank holds all of them.
func checkExperts(t *testing.T, what string, p Parallel, experts int64, out []api.TensorRequest) {
	t.Helper()
	first, local := big.NewInt(0), big.NewInt(experts)
	flat := new(big.Int).Mul(big.NewInt(p.TP), big.NewInt(p.DP))
	if p.ExpertParallel && flat.Cmp(big.NewInt(1)) != 0 {
		rank := new(big.Int).Add(new(big.Int).Mul(big.NewInt(p.DPRank), big.NewInt(p.TP)), big.NewInt(p.TPRank))
		base, extra := new(big.Int).QuoRem(big.NewInt(experts), flat, new(big.Int))
		first = new(big.Int).Add(new(big.Int).Mul(rank, base), bigMin(rank, extra))
		local = base
		if rank.Cmp(extra) < 0 {
			local = new(big.Int).Add(base, big.NewInt(1))
		}
	}
	var got []int64
	for _, tr := range out {
		if !strings.HasSuffix(tr.Name, "experts.w13_weight") {
			continue
		}
		for _, blk := range *tr.Blocks {
			if m := expertSource.FindStringSubmatch(blk.Source); m != nil {
				e, _ := strconv.ParseInt(m[1], 10, 64)
				got = append(got, e)
			}
		}
	}
	if int64(len(got)) != local.Int64() {
		t.Fatalf("%s: the rank holds experts %v, want %d from %d", what, got, local, first)
	}
	for j, e := range got {
		if e != first.Int64()+int64(j) {
			t.Fatalf("%s: the rank holds experts %v, want %d from %d", what, got, local, first)
		}
	}
}

func bigMin(a, b *big.Int) *big.Int {
	if a.Cmp(b) < 0 {
		return a
	}
	return b
}
