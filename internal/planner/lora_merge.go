package planner

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// loraMerge is lora_merge: W + (alpha/rank) * B @ A, with W [out, in], A [r, in], B [out, r].
// It is computed box by box: a box of rows i and columns j needs W's box, B's rows i and A's
// columns j, so nothing is read or computed whole. Sums run in float32 with k in order. Sources:
// W, A, B; params: alpha (default 1) and rank (default r).
type loraMerge struct{}

func (loraMerge) sources() int { return 3 }

func (loraMerge) validate(c *completionCheck) completionSpec {
	for i, name := range c.t.Deferred.Sources {
		st, ok := c.source(i)
		if !ok {
			return nil
		}
		if len(st.Shape) != 2 || !st.DType.IsFloat() {
			c.add(c.op(fmt.Sprintf("/sources/%d", i)), "lora_merge takes 2-d float tensors, %q is %s %v",
				name, st.DTypeName, st.Shape)
			return nil
		}
	}
	w, a, b := c.sources[0], c.sources[1], c.sources[2]
	r := a.Shape[0]
	if a.Shape[1] != w.Shape[1] || !slices.Equal(b.Shape, []int64{w.Shape[0], r}) {
		c.add(c.op("/sources"), "W %v, A %v and B %v do not make W + B @ A (A must be [r, %d], B [%d, r])",
			w.Shape, a.Shape, b.Shape, w.Shape[1], w.Shape[0])
		return nil
	}
	if !slices.Equal(c.t.Shape, w.Shape) {
		c.add(c.ptr+"/shape", "the tensor's shape must be W's, %v", w.Shape)
		return nil
	}
	alpha, rank := 1.0, r
	if p := c.t.Deferred.Params; p != nil {
		if p.Alpha != nil {
			alpha = *p.Alpha
		}
		if p.Rank != nil {
			if rank = *p.Rank; rank < 1 {
				c.schema(c.op("/params/rank"), "rank is >= 1")
				return nil
			}
		}
	}
	l := &loraSpec{w: w, a: a, b: b, r: r, scale: float32(alpha / float64(rank)), outSize: int64(c.dst.Size())}
	for i, t := range []*checkpoint.Tensor{w, a, b} {
		l.toF32[i], _ = tensor.NewPipeline(t.DType, nil, tensor.F32) // floats: always possible
	}
	var err error
	if l.out, err = tensor.NewPipeline(tensor.F32, nil, c.dst); err != nil {
		c.add(c.ptr+"/dtype", "the merged float32 values cannot become %s", c.dst)
		return nil
	}
	return l
}

type loraSpec struct {
	w, a, b *checkpoint.Tensor
	r       int64
	scale   float32 // alpha / rank, rounded to float32
	toF32   [3]*tensor.Pipeline
	out     *tensor.Pipeline // float32 to the destination dtype
	outSize int64
}

func (l *loraSpec) kernel(off, lens []int64) Kernel {
	return &loraBox{l, off[0], lens[0], off[1], lens[1]}
}

// loraBox computes the box of rows [r0, r0+nr) and columns [c0, c0+nc) of the merged weight.
type loraBox struct {
	*loraSpec
	r0, nr, c0, nc int64
}

// Sources are W's box, A's columns and B's rows of the box.
func (k *loraBox) Sources(dst []Region) []Region {
	w, a, b := k.w, k.a, k.b
	in, r := w.Shape[1], k.r
	ws, as, bs := int64(w.DType.Size()), int64(a.DType.Size()), int64(b.DType.Size())
	return append(dst,
		region(w, w.Begin+(k.r0*in+k.c0)*ws, ws, []int64{k.nr, k.nc}, []int64{in * ws, ws}),
		region(a, a.Begin+k.c0*as, as, []int64{r, k.nc}, []int64{in * as, as}),
		region(b, b.Begin+k.r0*r*bs, bs, []int64{k.nr * r}, []int64{bs}))
}

// f32s decodes n elements of source i (W, A or B) into float32s.
func (k *loraBox) f32s(i int, src []byte, stride, n int) []float32 {
	tmp := make([]byte, 4*n)
	k.toF32[i].Run(tmp, 4, src, stride, n)
	out := make([]float32, n)
	for j := range out {
		out[j] = math.Float32frombits(binary.LittleEndian.Uint32(tmp[4*j:]))
	}
	return out
}

// Run writes the box, row-major, in the destination dtype.
func (k *loraBox) Run(seg []byte, files Files) error {
	w, a, b := files(k.w.Key), files(k.a.Key), files(k.b.Key)
	in := k.w.Shape[1]
	ws, as, bs := int64(k.w.DType.Size()), int64(k.a.DType.Size()), int64(k.b.DType.Size())
	// A's columns of the box, k-major: acols[kk*nc + j].
	acols := make([]float32, 0, k.r*k.nc)
	for kk := range k.r {
		row := a.Slice(k.a.Begin+(kk*in+k.c0)*as, k.nc*as)
		if row == nil {
			return fmt.Errorf("the plan did not read row %d of A", kk)
		}
		acols = append(acols, k.f32s(1, row, int(as), int(k.nc))...)
	}
	out := k.outSize
	tmp := make([]byte, 4*k.nc)
	for i := k.r0; i < k.r0+k.nr; i++ {
		wrow := w.Slice(k.w.Begin+(i*in+k.c0)*ws, k.nc*ws)
		brow := b.Slice(k.b.Begin+i*k.r*bs, k.r*bs)
		if wrow == nil || brow == nil {
			return fmt.Errorf("the plan did not read row %d of W or B", i)
		}
		wv, bv := k.f32s(0, wrow, int(ws), int(k.nc)), k.f32s(2, brow, int(bs), int(k.r))
		for j := range k.nc {
			var acc float32
			for kk := range k.r {
				acc = float32(acc + float32(bv[kk]*acols[kk*k.nc+j]))
			}
			binary.LittleEndian.PutUint32(tmp[4*j:], math.Float32bits(float32(wv[j]+float32(k.scale*acc))))
		}
		k.out.Run(seg[(i-k.r0)*k.nc*out:], int(out), tmp, 4, int(k.nc))
	}
	return nil
}

func (k *loraBox) String() string {
	return fmt.Sprintf("lora_merge w=%s a=%s b=%s scale=%g rows=[%d, %d) cols=[%d, %d)", k.w.Name, k.a.Name, k.b.Name,
		k.scale, k.r0, k.r0+k.nr, k.c0, k.c0+k.nc)
}
