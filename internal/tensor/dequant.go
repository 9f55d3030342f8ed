package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// BlockDequant is fp8_block_dequant, DeepSeek-V3's and Qwen3-FP8's weight format: an FP8 weight
// [rows, cols] with one scale per block of Block[0] x Block[1] elements (ragged at the edges),
// element (r, c) = float32(w[r][c]) * float32(scale[r/b0][c/b1]), computed in float32 as
// DeepSeek's reference and PyTorch do, then converted to the destination dtype by Out.
type BlockDequant struct {
	Weight, Scale DType
	Block         [2]int64
	Out           *Pipeline // F32 to the destination dtype
}

// NewBlockDequant checks the dtypes and builds the kernel.
func NewBlockDequant(weight, scale, dst DType, block [2]int64) (*BlockDequant, error) {
	if !weight.IsFP8() {
		return nil, fmt.Errorf("the weight must be F8_E4M3 or F8_E5M2, not %s", weight)
	}
	if scale != F32 && scale != BF16 {
		return nil, fmt.Errorf("the scale must be F32 or BF16, not %s", scale)
	}
	out, err := NewPipeline(F32, nil, dst)
	if err != nil {
		return nil, fmt.Errorf("the dequantized float32 values cannot become %s", dst)
	}
	return &BlockDequant{Weight: weight, Scale: scale, Block: block, Out: out}, nil
}

func (d *BlockDequant) scaleAt(b []byte, i int) float32 {
	if d.Scale == BF16 {
		return F32FromBF16(binary.LittleEndian.Uint16(b[2*i:]))
	}
	return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
}

// Region is where a box of a block-scaled weight lies in the files.
type Region struct {
	WeightOff, WeightCols int64 // file offset of w[0][0]; the weight's columns
	ScaleOff, ScaleCols   int64 // file offset of scale[0][0]; the scale's columns
	R0, C0, Rows, Cols    int64 // the box
}

// Run writes the box, row-major, in the destination dtype.
func (d *BlockDequant) Run(dst []byte, weights, scales Source, g Region) error {
	dec := e4m3Table
	if d.Weight == F8E5M2 {
		dec = e5m2Table
	}
	b0, b1 := d.Block[0], d.Block[1]
	ss := int64(d.Scale.Size())
	first, last := g.C0/b1, (g.C0+g.Cols-1)/b1
	tmp := make([]byte, 4*g.Cols)
	out := int64(d.Out.dst.Size())
	for r := g.R0; r < g.R0+g.Rows; r++ {
		w := weights.Slice(g.WeightOff+r*g.WeightCols+g.C0, g.Cols)
		s := scales.Slice(g.ScaleOff+((r/b0)*g.ScaleCols+first)*ss, (last-first+1)*ss)
		if w == nil || s == nil {
			return fmt.Errorf("the plan did not read row %d of a block-scaled weight", r)
		}
		for c := range g.Cols {
			v := dec[w[c]] * d.scaleAt(s, int((g.C0+c)/b1-first))
			binary.LittleEndian.PutUint32(tmp[4*c:], math.Float32bits(v))
		}
		d.Out.Run(dst[(r-g.R0)*g.Cols*out:], int(out), tmp, 4, int(g.Cols))
	}
	return nil
}
