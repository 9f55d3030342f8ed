package planner

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// blockDequant is fp8_block_dequant, DeepSeek-V3's and Qwen3-FP8's weight format: an FP8 weight
// [rows, cols] with one scale per block of b0 x b1 elements (ragged at the edges), element
// (r, c) = float32(w[r][c]) * float32(scale[r/b0][c/b1]), computed in float32 as DeepSeek's
// reference and PyTorch do, then converted to the destination dtype. Sources: weight, scale;
// params: block (default [128, 128]).
type blockDequant struct{}

func (blockDequant) sources() int { return 2 }

func (blockDequant) validate(c *completionCheck) completionSpec {
	d := c.t.Deferred
	block := [2]int64{128, 128}
	if d.Params != nil && d.Params.Block != nil {
		b := *d.Params.Block
		if len(b) != 2 || b[0] < 1 || b[1] < 1 {
			c.schema(c.op("/params/block"), "block is two positive sizes [b0, b1]")
			return nil
		}
		block = [2]int64{b[0], b[1]}
	}
	for i, name := range d.Sources {
		if st, ok := c.source(i); ok && len(st.Shape) != 2 {
			c.add(c.op(fmt.Sprintf("/sources/%d", i)), "%q has shape %v; fp8_block_dequant takes 2-d tensors",
				name, st.Shape)
		}
	}
	if len(c.Errors) > c.before { // a bad source, or blocks or fill found before
		return nil
	}
	w, s := c.sources[0], c.sources[1]
	switch {
	case !w.DType.IsFP8():
		c.add(c.op("/sources/0"), "the weight must be F8_E4M3 or F8_E5M2, not %s", w.DType)
		return nil
	case s.DType != tensor.F32 && s.DType != tensor.BF16:
		c.add(c.op("/sources/1"), "the scale must be F32 or BF16, not %s", s.DType)
		return nil
	}
	out, err := tensor.NewPipeline(tensor.F32, nil, c.dst)
	if err != nil {
		c.add(c.ptr+"/dtype", "the dequantized float32 values cannot become %s", c.dst)
		return nil
	}
	if !slices.Equal(c.t.Shape, w.Shape) {
		c.add(c.ptr+"/shape", "the tensor's shape must be the weight's, %v", w.Shape)
		return nil
	}
	want := []int64{(w.Shape[0] + block[0] - 1) / block[0], (w.Shape[1] + block[1] - 1) / block[1]}
	if !slices.Equal(s.Shape, want) {
		c.add(c.op("/sources/1"), "the scale of a %v weight in blocks of %v has shape %v, %q has %v",
			w.Shape, block, want, d.Sources[1], s.Shape)
		return nil
	}
	return &blockDequantSpec{weight: w, scale: s, block: block, out: out, outSize: int64(c.dst.Size())}
}

type blockDequantSpec struct {
	weight, scale *checkpoint.Tensor
	block         [2]int64
	out           *tensor.Pipeline // float32 to the destination dtype
	outSize       int64
}

func (d *blockDequantSpec) kernel(off, lens []int64) Kernel {
	return &blockDequantBox{d, off[0], off[1], lens[0], lens[1]}
}

// blockDequantBox computes the box of rows [r0, r0+rows) and columns [c0, c0+cols).
type blockDequantBox struct {
	*blockDequantSpec
	r0, c0, rows, cols int64
}

// Sources are the weight's box and the scale rows and columns that cover it.
func (k *blockDequantBox) Sources(dst []Region) []Region {
	w, s := k.weight, k.scale
	wCols, sCols, ss := w.Shape[1], s.Shape[1], int64(s.DType.Size())
	sr0, sc0 := k.r0/k.block[0], k.c0/k.block[1]
	nr, nc := (k.r0+k.rows-1)/k.block[0]-sr0+1, (k.c0+k.cols-1)/k.block[1]-sc0+1
	return append(dst,
		region(w, w.Begin+k.r0*wCols+k.c0, 1, []int64{k.rows, k.cols}, []int64{wCols, 1}),
		region(s, s.Begin+(sr0*sCols+sc0)*ss, ss, []int64{nr, nc}, []int64{sCols * ss, ss}))
}

// Run writes the box, row-major, in the destination dtype.
func (k *blockDequantBox) Run(seg []byte, files Files) error {
	decode := tensor.F32FromE4M3
	if k.weight.DType == tensor.F8E5M2 {
		decode = tensor.F32FromE5M2
	}
	scaleAt := func(b []byte, i int64) float32 {
		return math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	if k.scale.DType == tensor.BF16 {
		scaleAt = func(b []byte, i int64) float32 { return tensor.F32FromBF16(binary.LittleEndian.Uint16(b[2*i:])) }
	}
	weights, scales := files(k.weight.Key), files(k.scale.Key)
	b0, b1 := k.block[0], k.block[1]
	wCols, sCols, ss := k.weight.Shape[1], k.scale.Shape[1], int64(k.scale.DType.Size())
	first, last := k.c0/b1, (k.c0+k.cols-1)/b1
	tmp := make([]byte, 4*k.cols)
	for r := k.r0; r < k.r0+k.rows; r++ {
		w := weights.Slice(k.weight.Begin+r*wCols+k.c0, k.cols)
		s := scales.Slice(k.scale.Begin+((r/b0)*sCols+first)*ss, (last-first+1)*ss)
		if w == nil || s == nil {
			return fmt.Errorf("the plan did not read row %d of a block-scaled weight", r)
		}
		for c := range k.cols {
			v := decode(w[c]) * scaleAt(s, (k.c0+c)/b1-first)
			binary.LittleEndian.PutUint32(tmp[4*c:], math.Float32bits(v))
		}
		k.out.Run(seg[(r-k.r0)*k.cols*k.outSize:], int(k.outSize), tmp, 4, int(k.cols))
	}
	return nil
}

func (k *blockDequantBox) String() string {
	return fmt.Sprintf("fp8_block_dequant weight=%s scale=%s block=%v rows=[%d, %d) cols=[%d, %d)", k.weight.Name,
		k.scale.Name, k.block, k.r0, k.r0+k.rows, k.c0, k.c0+k.cols)
}
