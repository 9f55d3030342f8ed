package server_test

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

func dequant(sources []string, block ...int64) *api.Deferred {
	d := &api.Deferred{Op: api.Fp8BlockDequant, Sources: sources}
	if len(block) > 0 {
		d.Params = &api.DeferredParams{Block: &block}
	}
	return d
}

// docs/references.md §4: block 4, scales [[1,2],[3,4]], window [2:6, 1:5] of an 8x8 tensor of 2.0.
func TestFP8BlockDequantDCPVector(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		w := make([]byte, 64)
		for i := range w {
			w[i] = 0x40 // 2.0 in E4M3
		}
		writeCheckpoint(t, h, "fp8",
			safetensors.TensorData{Name: "w", DType: "F8_E4M3", Shape: []int64{8, 8}, Data: w},
			safetensors.TensorData{Name: "w_scale_inv", DType: "F32", Shape: []int64{2, 2}, Data: f32(1, 2, 3, 4)})
		window := []api.Box{{Offsets: []int64{2, 1}, Lengths: []int64{4, 4}}}
		res := h.do(
			"POST",
			"/v1/shards",
			shardReq("fp8", api.TensorRequest{Name: "w", Dtype: api.F32, Shape: []int64{8, 8}, Boxes: window,
				Deferred: dequant([]string{"w", "w_scale_inv"}, 4, 4)}),
		)
		want := []float32{2, 2, 2, 4, 2, 2, 2, 4, 6, 6, 6, 8, 6, 6, 6, 8}
		if res.status != 200 || !slices.Equal(readF32(res.body), want) {
			t.Fatalf("%d %v, want quadrants 2, 4, 6, 8: %v", res.status, readF32(res.body), want)
		}
	})
}

// Ragged edges (5 x 7 in blocks of 2 x 4), every kind of FP8 code, BF16 scales, two boxes, both
// output dtypes and formats, small segments: checked against float32(w) * scale element by element.
func TestFP8BlockDequantRaggedAgainstBruteForce(t *testing.T) {
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 6 // segments of part of a row
	eachStore(t, opts, func(t *testing.T, h *harness) {
		r := rand.New(rand.NewPCG(8, 8))
		const rows, cols = 5, 7
		for _, wt := range []tensor.DType{tensor.F8E4M3, tensor.F8E5M2} {
			w := make([]byte, rows*cols)
			for i := range w {
				w[i] = byte(r.IntN(256))
			}
			copy(w, []byte{0x80, 0x01, 0x07, 0x7F, 0xFF, 0x08}) // -0, subnormals, NaNs, smallest normal
			scale := make([]float32, 3*2)
			for i := range scale {
				scale[i] = tensor.F32FromBF16(tensor.BF16FromF32(float32(r.NormFloat64() * 100)))
			}
			scale[0] = float32(math.Ldexp(1, -120)) // pushes products into subnormals
			writeCheckpoint(
				t,
				h,
				"rag",
				safetensors.TensorData{Name: "w", DType: wt.String(), Shape: []int64{rows, cols}, Data: w},
				safetensors.TensorData{Name: "s", DType: "BF16", Shape: []int64{3, 2}, Data: bf16(scale...)},
			)
			boxes := []api.Box{
				{Offsets: []int64{0, 0}, Lengths: []int64{rows, cols}},
				{Offsets: []int64{3, 2}, Lengths: []int64{2, 5}},
			}
			for _, dt := range []api.DType{api.BF16, api.F32} {
				res := h.do(
					"POST",
					"/v1/shards",
					shardReq("rag", api.TensorRequest{Name: "d", Dtype: dt, Shape: []int64{rows, cols}, Boxes: boxes,
						Deferred: dequant([]string{"w", "s"}, 2, 4)}),
				)
				var want []byte
				for _, b := range boxes {
					for i := b.Offsets[0]; i < b.Offsets[0]+b.Lengths[0]; i++ {
						for j := b.Offsets[1]; j < b.Offsets[1]+b.Lengths[1]; j++ {
							x := tensor.F32FromE4M3(w[i*cols+j])
							if wt == tensor.F8E5M2 {
								x = tensor.F32FromE5M2(w[i*cols+j])
							}
							v := x * scale[(i/2)*2+j/4]
							if dt == api.BF16 {
								want = binary.LittleEndian.AppendUint16(want, tensor.BF16FromF32(v))
							} else {
								want = binary.LittleEndian.AppendUint32(want, math.Float32bits(v))
							}
						}
					}
				}
				if res.status != 200 || string(res.body) != string(want) {
					t.Fatalf("%s → %s: %d\n got %x\nwant %x", wt, dt, res.status, res.body, want)
				}
			}
		}
	})
}

func TestInvalidDeferredRequests(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		writeCheckpoint(t, h, "q",
			safetensors.TensorData{Name: "w", DType: "F8_E4M3", Shape: []int64{8, 8}, Data: make([]byte, 64)},
			safetensors.TensorData{Name: "s", DType: "F32", Shape: []int64{2, 2}, Data: make([]byte, 16)},
			safetensors.TensorData{Name: "s3", DType: "F32", Shape: []int64{3, 2}, Data: make([]byte, 24)},
			safetensors.TensorData{Name: "i", DType: "I32", Shape: []int64{2, 2}, Data: make([]byte, 16)},
			safetensors.TensorData{Name: "f", DType: "F32", Shape: []int64{8, 8}, Data: make([]byte, 256)})
		tr := func(dt api.DType, shape []int64, d *api.Deferred) api.TensorRequest {
			return api.TensorRequest{Name: "d", Dtype: dt, Shape: shape, Boxes: whole(shape...), Deferred: d}
		}
		ok := func() *api.Deferred { return dequant([]string{"w", "s"}, 4, 4) }
		withBlocks := tr(api.F32, []int64{8, 8}, ok())
		withBlocks.Blocks = copyOf("f", 8, 8)
		cases := []struct {
			name    string
			t       api.TensorRequest
			status  int
			pointer string
		}{
			{
				"unknown op",
				tr(api.F32, []int64{8, 8}, &api.Deferred{Op: "mxfp8", Sources: []string{"w", "s"}}),
				400,
				"/tensors/0/deferred/op",
			},
			{
				"one source",
				tr(api.F32, []int64{8, 8}, dequant([]string{"w"}, 4, 4)),
				422,
				"/tensors/0/deferred/sources",
			},
			{
				"same source twice",
				tr(api.F32, []int64{8, 8}, dequant([]string{"w", "w"}, 4, 4)),
				422,
				"/tensors/0/deferred/sources/1",
			},
			{
				"missing source",
				tr(api.F32, []int64{8, 8}, dequant([]string{"w", "nope"}, 4, 4)),
				422,
				"/tensors/0/deferred/sources/1",
			},
			{
				"weight not FP8",
				tr(api.F32, []int64{8, 8}, dequant([]string{"f", "s"}, 4, 4)),
				422,
				"/tensors/0/deferred/sources/0",
			},
			{
				"scale not float",
				tr(api.F32, []int64{8, 8}, dequant([]string{"w", "i"}, 4, 4)),
				422,
				"/tensors/0/deferred/sources/1",
			},
			{
				"scale shape",
				tr(api.F32, []int64{8, 8}, dequant([]string{"w", "s3"}, 4, 4)),
				422,
				"/tensors/0/deferred/sources/1",
			},
			{
				"default block",
				tr(api.F32, []int64{8, 8}, dequant([]string{"w", "s"})),
				422,
				"/tensors/0/deferred/sources/1",
			},
			{
				"zero block",
				tr(api.F32, []int64{8, 8}, dequant([]string{"w", "s"}, 0, 4)),
				400,
				"/tensors/0/deferred/params/block",
			},
			{"tensor shape", tr(api.F32, []int64{4, 16}, ok()), 422, "/tensors/0/shape"},
			{"integer output", tr(api.I32, []int64{8, 8}, ok()), 422, "/tensors/0/dtype"},
			{"blocks beside", withBlocks, 422, "/tensors/0/deferred"},
		}
		for _, c := range cases {
			res := h.do("POST", "/v1/plan", shardReq("q", c.t))
			if res.status != c.status || res.problem.Errors == nil ||
				!slices.ContainsFunc(
					*res.problem.Errors,
					func(e api.FieldError) bool { return e.Pointer == c.pointer },
				) {
				t.Errorf("%s: %d %s, want %d at %s", c.name, res.status, res.body, c.status, c.pointer)
			}
		}
	})
}

// gpt-oss experts: blocks U8 [E, rows, groups, 16], scales U8 [E, rows, groups], read as
// transformers' convert_moe_packed_tensors does (low nibble first, 2^(s-127), result transposed to
// [E, groups*32, rows]); scales at the extremes; checked element by element.
func TestMXFP4DequantAgainstBruteForce(t *testing.T) {
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 40 // segments of a few columns
	eachStore(t, opts, func(t *testing.T, h *harness) {
		fp4 := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}
		const experts, rows, groups = 2, 3, 2
		r := rand.New(rand.NewPCG(4, 4))
		blocks := make([]byte, experts*rows*groups*16)
		for i := range blocks {
			blocks[i] = byte(r.IntN(256))
		}
		scales := []byte{127, 0, 254, 255, 128, 1, 126, 130, 125, 127, 64, 200}
		writeCheckpoint(
			t,
			h,
			"oss",
			safetensors.TensorData{
				Name:  "mlp1_weight.blocks",
				DType: "U8",
				Shape: []int64{experts, rows, groups, 16},
				Data:  blocks,
			},
			safetensors.TensorData{
				Name:  "mlp1_weight.scales",
				DType: "U8",
				Shape: []int64{experts, rows, groups},
				Data:  scales,
			},
		)
		value := func(e, c, row int64) float32 {
			b := blocks[((e*rows+row)*groups+c/32)*16+(c%32)/2]
			code := b & 0xF
			if c%2 == 1 {
				code = b >> 4
			}
			s := scales[(e*rows+row)*groups+c/32]
			if s == 255 {
				return float32(math.NaN())
			}
			return fp4[code] * float32(math.Ldexp(1, int(s)-127))
		}
		shape := []int64{experts, groups * 32, rows}
		boxes := []api.Box{
			{Offsets: []int64{0, 0, 0}, Lengths: shape},
			{Offsets: []int64{1, 30, 1}, Lengths: []int64{1, 5, 2}},
		}
		for _, dt := range []api.DType{api.BF16, api.F32} {
			res := h.do(
				"POST",
				"/v1/shards",
				shardReq("oss", api.TensorRequest{Name: "w", Dtype: dt, Shape: shape, Boxes: boxes,
					Deferred: &api.Deferred{
						Op:      api.Mxfp4Dequant,
						Sources: []string{"mlp1_weight.blocks", "mlp1_weight.scales"},
					}}),
			)
			var want []byte
			for _, b := range boxes {
				for e := b.Offsets[0]; e < b.Offsets[0]+b.Lengths[0]; e++ {
					for c := b.Offsets[1]; c < b.Offsets[1]+b.Lengths[1]; c++ {
						for row := b.Offsets[2]; row < b.Offsets[2]+b.Lengths[2]; row++ {
							v := value(e, c, row)
							if dt == api.BF16 {
								want = binary.LittleEndian.AppendUint16(want, tensor.BF16FromF32(v))
							} else {
								want = binary.LittleEndian.AppendUint32(want, math.Float32bits(v))
							}
						}
					}
				}
			}
			if res.status != 200 || string(res.body) != string(want) {
				t.Fatalf("%s: %d %s", dt, res.status, res.body[:min(len(res.body), 200)])
			}
		}
		// The wrong result shape is a 422 naming the shape transformers' reading gives.
		res := h.do(
			"POST",
			"/v1/plan",
			shardReq(
				"oss",
				api.TensorRequest{
					Name:  "w",
					Dtype: api.BF16,
					Shape: []int64{experts, rows, groups * 32},
					Boxes: whole(experts, rows, groups*32),
					Deferred: &api.Deferred{
						Op:      api.Mxfp4Dequant,
						Sources: []string{"mlp1_weight.blocks", "mlp1_weight.scales"},
					},
				},
			),
		)
		if res.status != 422 || !strings.Contains(string(res.body), "[2 64 3]") {
			t.Errorf("wrong shape: %d %s", res.status, res.body)
		}
	})
}

// lora_merge: W + (alpha/rank) * B @ A, computed box by box in float32, checked element by element.
func TestLoRAMergeAgainstBruteForce(t *testing.T) {
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 12
	eachStore(t, opts, func(t *testing.T, h *harness) {
		r := rand.New(rand.NewPCG(5, 5))
		const out, in, rank = 6, 5, 2
		vals := func(n int, round bool) []float32 {
			v := make([]float32, n)
			for i := range v {
				v[i] = float32(r.NormFloat64())
				if round {
					v[i] = tensor.F32FromBF16(tensor.BF16FromF32(v[i]))
				}
			}
			return v
		}
		w, a, b := vals(out*in, true), vals(rank*in, false), vals(out*rank, true)
		writeCheckpoint(t, h, "lora",
			safetensors.TensorData{Name: "W", DType: "BF16", Shape: []int64{out, in}, Data: bf16(w...)},
			safetensors.TensorData{Name: "A", DType: "F32", Shape: []int64{rank, in}, Data: f32(a...)},
			safetensors.TensorData{Name: "B", DType: "BF16", Shape: []int64{out, rank}, Data: bf16(b...)})
		alpha := 4.0
		boxes := []api.Box{
			{Offsets: []int64{0, 0}, Lengths: []int64{out, in}},
			{Offsets: []int64{2, 1}, Lengths: []int64{3, 3}},
		}
		for _, dt := range []api.DType{api.F32, api.BF16} {
			req := shardReq("lora", api.TensorRequest{Name: "merged", Dtype: dt, Shape: []int64{out, in}, Boxes: boxes,
				Deferred: &api.Deferred{
					Op:      api.LoraMerge,
					Sources: []string{"W", "A", "B"},
					Params:  &api.DeferredParams{Alpha: &alpha},
				}})
			res := h.do("POST", "/v1/shards", req)
			var want []byte
			for _, bx := range boxes {
				for i := bx.Offsets[0]; i < bx.Offsets[0]+bx.Lengths[0]; i++ {
					for j := bx.Offsets[1]; j < bx.Offsets[1]+bx.Lengths[1]; j++ {
						var acc float32
						for k := range int64(rank) {
							acc = float32(acc + float32(b[i*rank+k]*a[k*in+j]))
						}
						v := float32(w[i*in+j] + float32(float32(alpha/rank)*acc))
						if dt == api.BF16 {
							want = binary.LittleEndian.AppendUint16(want, tensor.BF16FromF32(v))
						} else {
							want = binary.LittleEndian.AppendUint32(want, math.Float32bits(v))
						}
					}
				}
			}
			if res.status != 200 || string(res.body) != string(want) {
				t.Fatalf("%s: %d\n got %x\nwant %x", dt, res.status, res.body, want)
			}
		}
		bad := shardReq(
			"lora",
			api.TensorRequest{Name: "m", Dtype: api.F32, Shape: []int64{out, in}, Boxes: whole(out, in),
				Deferred: &api.Deferred{Op: api.LoraMerge, Sources: []string{"W", "B", "A"}}},
		)
		if res := h.do("POST", "/v1/plan", bad); res.status != 422 ||
			!strings.Contains(string(res.body), "/tensors/0/deferred/sources") {
			t.Errorf("swapped adapters: %d %s", res.status, res.body)
		}
	})
}

// Blocks read MX scales (F8_E8M0) directly, as float32, and can scale them by a constant.
func TestE8M0SourcesInBlocks(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		scales := []byte{127, 128, 0, 254, 255, 120}
		writeCheckpoint(
			t,
			h,
			"mx",
			safetensors.TensorData{Name: "s", DType: "F8_E8M0", Shape: []int64{6}, Data: scales},
		)
		three := 3.0
		block := func(post *[]api.PostOp) *[]api.Block {
			return &[]api.Block{
				{
					Offsets: []int64{0},
					Lengths: []int64{6},
					Source:  "s",
					Base:    []int64{0},
					Coeff:   [][]int64{{1}},
					Post:    post,
				},
			}
		}
		res := h.do(
			"POST",
			"/v1/shards",
			shardReq("mx", api.TensorRequest{Name: "x", Dtype: api.F32, Shape: []int64{6}, Boxes: whole(6),
				Blocks: block(&[]api.PostOp{{Op: "mul", Value: &three}})}),
		)
		got := readF32(res.body)
		for i, s := range scales {
			want := float32(3 * math.Ldexp(1, int(s)-127))
			if s == 255 {
				if !math.IsNaN(float64(got[i])) {
					t.Errorf("0xFF is NaN, got %v", got[i])
				}
				continue
			}
			if got[i] != want {
				t.Errorf("scale %d: %v, want %v", s, got[i], want)
			}
		}
		if res := h.do(
			"POST",
			"/v1/shards",
			shardReq(
				"mx",
				api.TensorRequest{Name: "x", Dtype: api.F8E8M0, Shape: []int64{6}, Boxes: whole(6), Blocks: block(nil)},
			),
		); res.status != 200 ||
			string(res.body) != string(scales) {
			t.Errorf("an F8_E8M0 copy: %d %x", res.status, res.body)
		}
		writeCheckpoint(
			t,
			h,
			"f",
			safetensors.TensorData{Name: "s", DType: "F32", Shape: []int64{6}, Data: make([]byte, 24)},
		)
		if res := h.do(
			"POST",
			"/v1/plan",
			shardReq(
				"f",
				api.TensorRequest{Name: "x", Dtype: api.F8E8M0, Shape: []int64{6}, Boxes: whole(6), Blocks: block(nil)},
			),
		); res.status != 422 {
			t.Errorf("F32 to F8_E8M0 must be refused: %d %s", res.status, res.body)
		}
	})
}

// Blocks read packed F4 tensors (two E2M1 values a byte, the lower nibble first) directly: a
// transpose, a stride and a box starting at an odd element, with a post op.
func TestF4SourcesInBlocks(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		packed := []byte{0x21, 0x43, 0x65, 0x87, 0xA9, 0xFC} // elements 1,2,3,4,5,6,7,8,9,A,C,F
		writeCheckpoint(t, h, "f4", safetensors.TensorData{Name: "q", DType: "F4", Shape: []int64{3, 4}, Data: packed})
		fp4 := []float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}
		elem := func(i, j int64) float32 {
			e := i*4 + j
			return fp4[(packed[e/2]>>(4*(e%2)))&0xF]
		}
		two := 2.0
		// t[a][b] = 2 * q[b][a]: a transpose with a post op.
		res := h.do(
			"POST",
			"/v1/shards",
			shardReq("f4", api.TensorRequest{Name: "t", Dtype: api.F32, Shape: []int64{4, 3}, Boxes: whole(4, 3),
				Blocks: &[]api.Block{
					{
						Offsets: []int64{0, 0},
						Lengths: []int64{4, 3},
						Source:  "q",
						Base:    []int64{0, 0},
						Coeff:   [][]int64{{0, 1}, {1, 0}},
						Post:    &[]api.PostOp{{Op: "mul", Value: &two}},
					},
				}}),
		)
		var want []float32
		for a := range int64(4) {
			for b := range int64(3) {
				want = append(want, 2*elem(b, a))
			}
		}
		if got := readF32(res.body); res.status != 200 || !slices.Equal(got, want) {
			t.Errorf("transpose: %d %v, want %v", res.status, got, want)
		}
		// Every other element of row 1 from element 1 (odd nibbles), into BF16.
		res = h.do(
			"POST",
			"/v1/shards",
			shardReq("f4", api.TensorRequest{Name: "s", Dtype: api.BF16, Shape: []int64{2}, Boxes: whole(2),
				Blocks: &[]api.Block{
					{
						Offsets: []int64{0},
						Lengths: []int64{2},
						Source:  "q",
						Base:    []int64{1, 1},
						Coeff:   [][]int64{{0}, {2}},
					},
				}}),
		)
		if want := bf16(elem(1, 1), elem(1, 3)); res.status != 200 || string(res.body) != string(want) {
			t.Errorf("strided: %d %x, want %x", res.status, res.body, want)
		}
		// A box that starts mid-byte: rows 1-2, columns 1-3.
		res = h.do(
			"POST",
			"/v1/shards",
			shardReq("f4", api.TensorRequest{Name: "c", Dtype: api.F32, Shape: []int64{3, 4},
				Boxes: []api.Box{{Offsets: []int64{1, 1}, Lengths: []int64{2, 3}}}, Blocks: copyOf("q", 3, 4)}),
		)
		want = nil
		for i := int64(1); i < 3; i++ {
			for j := int64(1); j < 4; j++ {
				want = append(want, elem(i, j))
			}
		}
		if got := readF32(res.body); res.status != 200 || !slices.Equal(got, want) {
			t.Errorf("box: %d %v, want %v", res.status, got, want)
		}
		if res := h.do(
			"POST",
			"/v1/plan",
			shardReq(
				"f4",
				api.TensorRequest{Name: "c", Dtype: "F4", Shape: []int64{3, 4}, Boxes: whole(3, 4), Blocks: copyOf("q", 3, 4)},
			),
		); res.status != 400 {
			t.Errorf("F4 is never written: %d", res.status)
		}
	})
}
