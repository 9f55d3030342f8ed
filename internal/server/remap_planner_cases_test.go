package server_test

import (
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// The cases of hyper_parallel's own RemapLoadPlanner tests (docs/references.md §1), through HTTP.

func qk(t *testing.T, h *harness, dtype string, q, k []byte) {
	writeCheckpoint(t, h, "qk",
		safetensors.TensorData{Name: "q", DType: dtype, Shape: []int64{4, 3}, Data: q},
		safetensors.TensorData{Name: "k", DType: dtype, Shape: []int64{2, 3}, Data: k})
}

func TestRemapBlocksFillOneTensorFromTwo(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		qk(t, h, "BF16", bf16(arange(0, 12)...), bf16(arange(100, 6)...))
		blocks := []api.Block{rowsBlock("q", 0, 4, 3, 0), rowsBlock("k", 0, 2, 3, 4)}
		res := h.do(
			"POST",
			"/v1/shards",
			shardReq(
				"qk",
				api.TensorRequest{
					Name:   "qk",
					Dtype:  api.F32,
					Shape:  []int64{6, 3},
					Boxes:  whole(6, 3),
					Blocks: &blocks,
				},
			),
		)
		want := append(arange(0, 12), arange(100, 6)...)
		if res.status != 200 || !slices.Equal(readF32(res.body), want) {
			t.Fatalf("%d %v, want %v", res.status, readF32(res.body), want)
		}
		if res.header.Get("Shard-Length") != "72" {
			t.Errorf("Shard-Length %q", res.header.Get("Shard-Length"))
		}
	})
}

func TestRemapTransposeIsCopiedStraight(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		writeCheckpoint(
			t,
			h,
			"w",
			safetensors.TensorData{Name: "w", DType: "F32", Shape: []int64{2, 3}, Data: f32(arange(0, 6)...)},
		)
		blocks := []api.Block{
			{
				Offsets: []int64{0, 0},
				Lengths: []int64{3, 2},
				Source:  "w",
				Base:    []int64{0, 0},
				Coeff:   [][]int64{{0, 1}, {1, 0}},
			},
		}
		req := shardReq(
			"w",
			api.TensorRequest{Name: "t", Dtype: api.F32, Shape: []int64{3, 2}, Boxes: whole(3, 2), Blocks: &blocks},
		)
		res := h.do("POST", "/v1/shards", req)
		if want := []float32{0, 3, 1, 4, 2, 5}; res.status != 200 || !slices.Equal(readF32(res.body), want) {
			t.Fatalf("%d %v, want %v", res.status, readF32(res.body), want)
		}
		var plan api.PlanResponse
		json.Unmarshal(h.do("POST", "/v1/plan", req).body, &plan)
		if p := plan.Tensors[0].Boxes[0].Pieces; len(p) != 1 || p[0].Mode != api.Direct {
			t.Errorf("a transpose is a direct copy, got %+v", p)
		}
	})
}

func TestRemapGatheredBlockAppliesPostInCheckpointDType(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		src := make([]float32, 10)
		for i := range src {
			src[i] = tensor.F32FromBF16(tensor.BF16FromF32(float32(-3 + 6*float64(i)/9)))
		}
		writeCheckpoint(
			t,
			h,
			"v",
			safetensors.TensorData{Name: "v", DType: "BF16", Shape: []int64{10}, Data: bf16(src...)},
		)
		one := 1.0
		post := []api.PostOp{{Op: "add", Value: &one}}
		blocks := []api.Block{
			{
				Offsets: []int64{0},
				Lengths: []int64{5},
				Source:  "v",
				Base:    []int64{0},
				Coeff:   [][]int64{{2}},
				Post:    &post,
			},
		}
		req := shardReq(
			"v",
			api.TensorRequest{Name: "v", Dtype: api.F32, Shape: []int64{5}, Boxes: whole(5), Blocks: &blocks},
		)
		res := h.do("POST", "/v1/shards", req)
		for i, got := range readF32(res.body) {
			if want := tensor.F32FromBF16(tensor.BF16FromF32(src[2*i] + 1)); got != want {
				t.Errorf("element %d: %v, want %v (add in BF16, then widen)", i, got, want)
			}
		}
		var plan api.PlanResponse
		json.Unmarshal(h.do("POST", "/v1/plan", req).body, &plan)
		if p := plan.Tensors[0].Boxes[0].Pieces; p[0].Mode != api.Gather {
			t.Errorf("a strided block with post ops gathers, got %+v", p)
		}
	})
}

func TestRemapBlocksAreCutToTheShard(t *testing.T) {
	opts := planner.DefaultOptions()
	opts.MaxGap = 0 // read exactly what is needed
	eachStore(t, opts, func(t *testing.T, h *harness) {
		qk(t, h, "F32", f32(arange(0, 12)...), f32(arange(100, 6)...))
		blocks := []api.Block{rowsBlock("q", 0, 4, 3, 0), rowsBlock("k", 0, 2, 3, 4)}
		req := shardReq("qk", api.TensorRequest{Name: "qk", Dtype: api.F32, Shape: []int64{6, 3},
			Boxes: []api.Box{{Offsets: []int64{3, 0}, Lengths: []int64{3, 3}}}, Blocks: &blocks})
		res := h.do("POST", "/v1/shards", req)
		if want := []float32{9, 10, 11, 100, 101, 102, 103, 104, 105}; !slices.Equal(readF32(res.body), want) {
			t.Fatalf("%v, want %v", readF32(res.body), want)
		}
		var plan api.PlanResponse
		json.Unmarshal(h.do("POST", "/v1/plan", req).body, &plan)
		pieces := plan.Tensors[0].Boxes[0].Pieces
		if len(pieces) != 2 || pieces[0].Source != "q" || !slices.Equal(pieces[0].Offsets, []int64{3, 0}) ||
			!slices.Equal(pieces[0].Lengths, []int64{1, 3}) ||
			pieces[1].Source != "k" ||
			!slices.Equal(pieces[1].Offsets, []int64{4, 0}) ||
			!slices.Equal(pieces[1].Lengths, []int64{2, 3}) {
			t.Errorf("pieces %+v", pieces)
		}
		// q row 3 and k rows 0-1: 12 + 24 bytes, and nothing else.
		if s := plan.Summary; s.NeededBytes != 36 || s.ReadBytes != 36 {
			t.Errorf("summary %+v, want 36 bytes needed and read", s)
		}
	})
}

func TestRemapReadsPastTheEndAndMissingSourcesAreRefused(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		writeCheckpoint(
			t,
			h,
			"w",
			safetensors.TensorData{Name: "w", DType: "F32", Shape: []int64{2, 3}, Data: make([]byte, 24)},
		)
		for _, c := range []struct {
			block   api.Block
			pointer string
			quoted  string
		}{
			{rowsBlock("w", 0, 3, 3, 0), "/tensors/0/blocks/0", `"w"`},
			{rowsBlock("missing", 0, 2, 3, 0), "/tensors/0/blocks/0/source", `"missing"`},
		} {
			blocks := []api.Block{c.block}
			res := h.do(
				"POST",
				"/v1/shards",
				shardReq(
					"w",
					api.TensorRequest{
						Name:   "d",
						Dtype:  api.F32,
						Shape:  []int64{3, 3},
						Boxes:  whole(3, 3),
						Blocks: &blocks,
						Fill:   ptr(json.Number("0")),
					},
				),
			)
			if res.status != http.StatusUnprocessableEntity || res.problem.Errors == nil ||
				(*res.problem.Errors)[0].Pointer != c.pointer ||
				!strings.Contains((*res.problem.Errors)[0].Detail, c.quoted) {
				t.Errorf("%+v: %d %s", c.block, res.status, res.body)
			}
		}
	})
}

func TestRemapMalformedBlocksAreRefused(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		writeCheckpoint(
			t,
			h,
			"w",
			safetensors.TensorData{Name: "w", DType: "F32", Shape: []int64{6}, Data: make([]byte, 24)},
		)
		for _, c := range []struct {
			block  api.Block
			status int
		}{
			{
				api.Block{Offsets: []int64{0, 0}, Lengths: []int64{2}, Source: "w", Base: []int64{0}, Coeff: [][]int64{{1, 0}}},
				422,
			},
			{api.Block{Offsets: []int64{0}, Lengths: []int64{2}, Source: "w", Base: []int64{4}, Coeff: [][]int64{{-1}}}, 400},
		} {
			blocks := []api.Block{c.block}
			res := h.do(
				"POST",
				"/v1/shards",
				shardReq(
					"w",
					api.TensorRequest{Name: "d", Dtype: api.F32, Shape: []int64{2}, Boxes: whole(2), Blocks: &blocks},
				),
			)
			if res.status != c.status || res.problem.Errors == nil {
				t.Errorf("%+v: %d %s", c.block, res.status, res.body)
			}
		}
	})
}
