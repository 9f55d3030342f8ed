package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// LoRA is lora_merge: W + (alpha/rank) * B @ A, with W [out, in], A [r, in], B [out, r]. It is
// computed box by box: a box of rows i and columns j needs W's box, B's rows i and A's columns j,
// so nothing is read or computed whole. Sums run in float32 with k in order.
type LoRA struct {
	W, A, B DType
	Scale   float32 // alpha / rank, rounded to float32
	R       int64
	toF32   [3]*Pipeline
	Out     *Pipeline // F32 to the destination dtype
}

// NewLoRA checks the dtypes and builds the kernel.
func NewLoRA(w, a, b, dst DType, r int64, scale float64) (*LoRA, error) {
	l := &LoRA{W: w, A: a, B: b, R: r, Scale: float32(scale)}
	for i, d := range []DType{w, a, b} {
		if !d.IsFloat() {
			return nil, fmt.Errorf("source %d is %s; lora_merge takes float tensors", i, d)
		}
		l.toF32[i], _ = NewPipeline(d, nil, F32)
	}
	out, err := NewPipeline(F32, nil, dst)
	if err != nil {
		return nil, fmt.Errorf("the merged float32 values cannot become %s", dst)
	}
	l.Out = out
	return l, nil
}

// LoRARegion is where a box of the merged weight lies in the files.
type LoRARegion struct {
	WOff, AOff, BOff int64 // file offsets of W[0][0], A[0][0], B[0][0]
	In               int64 // columns of W and A
	R0, NR, C0, NC   int64 // the box
}

// f32s decodes n elements of a source into float32s.
func (l *LoRA) f32s(i int, src []byte, stride, n int) []float32 {
	tmp := make([]byte, 4*n)
	l.toF32[i].Run(tmp, 4, src, stride, n)
	out := make([]float32, n)
	for k := range out {
		out[k] = math.Float32frombits(binary.LittleEndian.Uint32(tmp[4*k:]))
	}
	return out
}

// Run writes the box, row-major, in the destination dtype.
func (l *LoRA) Run(dst []byte, w, a, b Source, g LoRARegion) error {
	ws, as, bs := int64(l.W.Size()), int64(l.A.Size()), int64(l.B.Size())
	// A's columns of the box, k-major: acols[k*NC + j].
	acols := make([]float32, 0, l.R*g.NC)
	for k := range l.R {
		row := a.Slice(g.AOff+(k*g.In+g.C0)*as, g.NC*as)
		if row == nil {
			return fmt.Errorf("the plan did not read row %d of A", k)
		}
		acols = append(acols, l.f32s(1, row, int(as), int(g.NC))...)
	}
	out := int64(l.Out.dst.Size())
	tmp := make([]byte, 4*g.NC)
	for i := g.R0; i < g.R0+g.NR; i++ {
		wrow := w.Slice(g.WOff+(i*g.In+g.C0)*ws, g.NC*ws)
		brow := b.Slice(g.BOff+i*l.R*bs, l.R*bs)
		if wrow == nil || brow == nil {
			return fmt.Errorf("the plan did not read row %d of W or B", i)
		}
		wv, bv := l.f32s(0, wrow, int(ws), int(g.NC)), l.f32s(2, brow, int(bs), int(l.R))
		for j := range g.NC {
			var acc float32
			for k := range l.R {
				acc = float32(acc + float32(bv[k]*acols[k*g.NC+j]))
			}
			binary.LittleEndian.PutUint32(tmp[4*j:], math.Float32bits(float32(wv[j]+float32(l.Scale*acc))))
		}
		l.Out.Run(dst[(i-g.R0)*g.NC*out:], int(out), tmp, 4, int(g.NC))
	}
	return nil
}
