package server_test

import (
	"encoding/binary"
	"fmt"
	"math"
	"math/rand"
	"testing"

	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// mxfp4Values is FP4_VALUES of transformers' integrations/mxfp4.py: E2M1 by nibble, sign in bit 3
// (nibble 8 is -0.0, which a Go constant -0 is not).
var mxfp4Values = [16]float32{
	0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6,
}

// mxfp4Reference is transformers' convert_moe_packed_tensors, written from its source for blocks
// [E, rows, G, B] and scales [E, rows, G]: row r's out[r, 2i] = lut[blocks[i] & 0x0F] and
// out[r, 2i+1] = lut[blocks[i] >> 4] over the G*B bytes of the row, then torch.ldexp(out, scale -
// 127) (a float32 product with 2**exp), reshaped to [E, rows, G*2B] and transposed to
// [E, G*2B, rows]. It returns float32 values indexed [e][k][r].
func mxfp4Reference(blocks, scales []byte, e, rows, g, b int) []float32 {
	cols := g * 2 * b
	out := make([]float32, e*cols*rows)
	for x := 0; x < e; x++ {
		for r := 0; r < rows; r++ {
			for gi := 0; gi < g; gi++ {
				exp := int(scales[(x*rows+r)*g+gi]) - 127
				pow := float32(math.Ldexp(1, exp))
				for i := 0; i < b; i++ {
					byt := blocks[((x*rows+r)*g+gi)*b+i]
					for half, nib := range []byte{byt & 0x0F, byt >> 4} {
						k := gi*2*b + 2*i + half
						out[(x*cols+k)*rows+r] = mxfp4Values[nib] * pow
					}
				}
			}
		}
	}
	return out
}

// TestMXFP4DequantMatchesTransformers asks the server for gpt-oss style MXFP4 experts through
// the mxfp4_dequant completion, whole and in a box, in F32 and BF16, with U8 and F8_E8M0
// scales, and compares every element with mxfp4Reference. Scales stop at 254: for 255 transformers
// gives ±inf (0 * inf = NaN for a zero nibble) while the contract answers NaN, as OCP E8M0 reads it.
func TestMXFP4DequantMatchesTransformers(t *testing.T) {
	const e, rows, g, b = 3, 5, 2, 16
	rng := rand.New(rand.NewSource(3))
	blocks := make([]byte, e*rows*g*b)
	rng.Read(blocks)
	scales := make([]byte, e*rows*g)
	for i := range scales {
		scales[i] = byte(rng.Intn(255))
	}
	// The range ends: the smallest scale (2^-127, a float32 subnormal), 1, and scales whose
	// products overflow float32 for the larger nibbles.
	scales[0], scales[1], scales[2], scales[3] = 0, 127, 254, 253
	want := mxfp4Reference(blocks, scales, e, rows, g, b)
	cols := g * 2 * b

	dir := t.TempDir()
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	for _, scaleDType := range []string{"U8", "F8_E8M0"} {
		name := "gptoss-" + scaleDType
		writeCheckpoint(t, h, name,
			safetensors.TensorData{
				Name: "experts.gate_up_proj_blocks", DType: "U8", Shape: []int64{e, rows, g, b}, Data: blocks,
			},
			safetensors.TensorData{
				Name: "experts.gate_up_proj_scales", DType: scaleDType, Shape: []int64{e, rows, g}, Data: scales,
			},
		)
		for _, dtype := range []string{"F32", "BF16"} {
			for _, box := range [][2][3]int{{{0, 0, 0}, {e, cols, rows}}, {{1, 7, 2}, {2, 40, 3}}} {
				off, n := box[0], box[1]
				res := h.do("POST", "/v1/shards", map[string]any{"checkpoint": name, "format": "raw", "tensors": []any{
					map[string]any{
						"name": "experts.gate_up_proj", "dtype": dtype, "shape": []int{e, cols, rows},
						"boxes": []any{map[string]any{"offsets": off[:], "lengths": n[:]}},
						"deferred": map[string]any{
							"op": "mxfp4_dequant", "sources": []string{"experts.gate_up_proj_blocks", "experts.gate_up_proj_scales"},
						},
					},
				}})
				what := fmt.Sprintf("scales %s, %s box %v", scaleDType, dtype, box)
				size := 4
				if dtype == "BF16" {
					size = 2
				}
				if res.status != 200 || len(res.body) != n[0]*n[1]*n[2]*size {
					t.Fatalf("%s: %d, %d bytes %.300s", what, res.status, len(res.body), res.body)
				}
				bad := 0
				i := 0
				for x := off[0]; x < off[0]+n[0]; x++ {
					for k := off[1]; k < off[1]+n[1]; k++ {
						for r := off[2]; r < off[2]+n[2]; r++ {
							w := want[(x*cols+k)*rows+r]
							var got, wantBits uint32
							if dtype == "F32" {
								got, wantBits = binary.LittleEndian.Uint32(res.body[4*i:]), math.Float32bits(w)
							} else {
								// Every FP4 value times a power of two is exact in bfloat16 (two
								// mantissa bits, float32's exponent range): the top half of its bits.
								got, wantBits = uint32(binary.LittleEndian.Uint16(res.body[2*i:])), math.Float32bits(w)>>16
							}
							if got != wantBits && bad < 5 {
								t.Errorf("%s: element [%d %d %d] is %#x, transformers gives %v (%#x)", what, x, k, r, got, w, wantBits)
							}
							if got != wantBits {
								bad++
							}
							i++
						}
					}
				}
				if bad > 0 {
					t.Errorf("%s: %d of %d elements differ", what, bad, i)
				}
			}
		}
	}
}
