package planner

import (
	"fmt"
	"slices"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// deferredSpec is a validated completion. Both dequantizations are elementwise-local, so they are
// planned like blocks: each segment reads only its part of the quantized tensor and the scales
// covering it, never the whole tensor. weight and scale are the two sources of either op.
type deferredSpec struct {
	kernel        *tensor.BlockDequant // fp8_block_dequant
	mx            *tensor.MXFP4        // mxfp4_dequant
	lora          *tensor.LoRA         // lora_merge: weight is W, scale is A, b is B
	weight, scale *checkpoint.Tensor
	b             *checkpoint.Tensor
}

func validateDeferred(e *errs, tptr string, t *api.TensorRequest, dst tensor.DType, ck *checkpoint.Checkpoint) *deferredSpec {
	d := t.Deferred
	ptr := tptr + "/deferred"
	before := len(e.Errors)
	if !d.Op.Valid() {
		e.schema(ptr+"/op", "unknown op %q: this server runs fp8_block_dequant and mxfp4_dequant", d.Op)
		return nil
	}
	if t.Blocks != nil && len(*t.Blocks) > 0 {
		e.add(ptr, "a tensor computed by a completion takes no blocks: the completion covers it whole")
	}
	if t.Fill != nil {
		e.add(ptr, "a tensor computed by a completion takes no fill: the completion covers it whole")
	}
	if want := map[api.DeferredOp]int{api.LoraMerge: 3}[d.Op]; len(d.Sources) != max(want, 2) {
		e.add(ptr+"/sources", "%s needs %d sources, got %d", d.Op, max(want, 2), len(d.Sources))
		return nil
	}
	for i, name := range d.Sources {
		if j := slices.Index(d.Sources, name); j < i {
			e.add(fmt.Sprintf("%s/sources/%d", ptr, i), "sources must be distinct: %q is also source %d", name, j)
			return nil
		}
	}
	if d.Op == api.LoraMerge {
		return validateLoRA(e, tptr, t, dst, ck)
	}
	if d.Op == api.Mxfp4Dequant {
		return validateMXFP4(e, tptr, t, dst, ck)
	}
	block := [2]int64{128, 128}
	if d.Params != nil && d.Params.Block != nil {
		b := *d.Params.Block
		if len(b) != 2 || b[0] < 1 || b[1] < 1 {
			e.schema(ptr+"/params/block", "block is two positive sizes [b0, b1]")
			return nil
		}
		block = [2]int64{b[0], b[1]}
	}
	var src [2]*checkpoint.Tensor
	for i, name := range d.Sources {
		st, ok := ck.Tensors[name]
		switch {
		case !ok:
			e.add(fmt.Sprintf("%s/sources/%d", ptr, i), "checkpoint %q has no tensor %q", ck.Name, name)
		case len(st.Shape) != 2:
			e.add(fmt.Sprintf("%s/sources/%d", ptr, i), "%q has shape %v; fp8_block_dequant takes 2-d tensors", name, st.Shape)
		}
		src[i] = st
	}
	if len(e.Errors) > before {
		return nil
	}
	w, s := src[0], src[1]
	kernel, err := tensor.NewBlockDequant(w.DType, s.DType, dst, block)
	if err != nil {
		at := tptr + "/dtype" // the weight and scale are fine: the destination dtype is not
		switch {
		case !w.DType.IsFP8():
			at = ptr + "/sources/0"
		case s.DType != tensor.F32 && s.DType != tensor.BF16:
			at = ptr + "/sources/1"
		}
		e.add(at, "%v", err)
		return nil
	}
	if !slices.Equal(t.Shape, w.Shape) {
		e.add(tptr+"/shape", "the tensor's shape must be the weight's, %v", w.Shape)
		return nil
	}
	want := []int64{(w.Shape[0] + block[0] - 1) / block[0], (w.Shape[1] + block[1] - 1) / block[1]}
	if !slices.Equal(s.Shape, want) {
		e.add(ptr+"/sources/1", "the scale of a %v weight in blocks of %v has shape %v, %q has %v", w.Shape, block, want, d.Sources[1], s.Shape)
		return nil
	}
	return &deferredSpec{kernel: kernel, weight: w, scale: s}
}

// dequantSegment plans one segment of a block-dequantized tensor: its weight region and the scale
// rows and columns that cover it.
func (s *segmenter) dequantSegment(d *deferredSpec, off, lens []int64, seg *Segment) (needed int64, spans []Read, err error) {
	r0, c0, rows, cols := off[0], off[1], lens[0], lens[1]
	b0, b1 := d.kernel.Block[0], d.kernel.Block[1]
	wCols, sCols := d.weight.Shape[1], d.scale.Shape[1]
	ss := int64(d.scale.DType.Size())
	g := tensor.Region{WeightOff: d.weight.Begin, WeightCols: wCols, ScaleOff: d.scale.Begin, ScaleCols: sCols, R0: r0, C0: c0, Rows: rows, Cols: cols}
	sr0, sc0 := r0/b0, c0/b1
	nr, nc := (r0+rows-1)/b0-sr0+1, (c0+cols-1)/b1-sc0+1
	needed, spans, err = s.partReads(
		sourcePart{d.weight, d.weight.Begin + r0*wCols + c0, tensor.Strided{Lengths: []int64{rows, cols}, Src: []int64{wCols, 1}}, 1},
		sourcePart{d.scale, d.scale.Begin + (sr0*sCols+sc0)*ss, tensor.Strided{Lengths: []int64{nr, nc}, Src: []int64{sCols * ss, ss}}, ss})
	if err != nil {
		return 0, nil, err
	}
	seg.Dequants = append(seg.Dequants, Dequant{Kernel: d.kernel, WeightKey: d.weight.Key, ScaleKey: d.scale.Key, Region: g})
	return needed, spans, nil
}

func validateMXFP4(e *errs, tptr string, t *api.TensorRequest, dst tensor.DType, ck *checkpoint.Checkpoint) *deferredSpec {
	ptr := tptr + "/deferred"
	var src [2]*checkpoint.Tensor
	for i, name := range t.Deferred.Sources {
		st, ok := ck.Tensors[name]
		if !ok {
			e.add(fmt.Sprintf("%s/sources/%d", ptr, i), "checkpoint %q has no tensor %q", ck.Name, name)
			return nil
		}
		src[i] = st
	}
	b, s := src[0], src[1]
	if b.DType != tensor.U8 || len(b.Shape) < 3 || len(b.Shape) > 4 {
		e.add(ptr+"/sources/0", "the blocks must be U8 [experts, rows, groups, bytes] or [rows, groups, bytes], %q is %s %v", b.Name, b.DTypeName, b.Shape)
		return nil
	}
	if (s.DType != tensor.U8 && s.DTypeName != "F8_E8M0") || !slices.Equal(s.Shape, b.Shape[:len(b.Shape)-1]) {
		e.add(ptr+"/sources/1", "the scales must be U8 or F8_E8M0 of shape %v, %q is %s %v", b.Shape[:len(b.Shape)-1], s.Name, s.DTypeName, s.Shape)
		return nil
	}
	out, err := tensor.NewPipeline(tensor.F32, nil, dst)
	if err != nil {
		e.add(tptr+"/dtype", "the dequantized float32 values cannot become %s", dst)
		return nil
	}
	n := len(b.Shape)
	gb := b.Shape[n-1]
	want := []int64{b.Shape[n-3], b.Shape[n-2] * 2 * gb}
	transposed := n == 4
	if transposed {
		want = []int64{b.Shape[0], b.Shape[2] * 2 * gb, b.Shape[1]}
	}
	if !slices.Equal(t.Shape, want) {
		e.add(tptr+"/shape", "the dequantized shape of %v blocks is %v", b.Shape, want)
		return nil
	}
	return &deferredSpec{mx: &tensor.MXFP4{GroupBytes: gb, Transposed: transposed, Out: out}, weight: b, scale: s}
}

// mxfp4Segment plans one segment of an MXFP4-dequantized tensor: the block bytes and scales of
// its rows and groups.
func (s *segmenter) mxfp4Segment(d *deferredSpec, off, lens []int64, seg *Segment) (needed int64, spans []Read, err error) {
	b := d.weight.Shape
	n := len(b)
	rows, groups, gb := b[n-3], b[n-2], b[n-1]
	g := tensor.MXRegion{BlocksOff: d.weight.Begin, ScalesOff: d.scale.Begin, Rows: rows, Groups: groups, NE: 1}
	if d.mx.Transposed {
		g.E0, g.NE, g.C0, g.NC, g.R0, g.NR = off[0], lens[0], off[1], lens[1], off[2], lens[2]
	} else {
		g.R0, g.NR, g.C0, g.NC = off[0], lens[0], off[1], lens[1]
	}
	first := g.C0 / (2 * gb)
	ng := (g.C0+g.NC-1)/(2*gb) - first + 1
	needed, spans, err = s.partReads(
		sourcePart{d.weight, d.weight.Begin + ((g.E0*rows+g.R0)*groups+first)*gb, tensor.Strided{Lengths: []int64{g.NE, g.NR, ng * gb}, Src: []int64{rows * groups * gb, groups * gb, 1}}, 1},
		sourcePart{d.scale, d.scale.Begin + (g.E0*rows+g.R0)*groups + first, tensor.Strided{Lengths: []int64{g.NE, g.NR, ng}, Src: []int64{rows * groups, groups, 1}}, 1})
	if err != nil {
		return 0, nil, err
	}
	seg.MXFP4s = append(seg.MXFP4s, MXFP4{Kernel: d.mx, BlocksKey: d.weight.Key, ScalesKey: d.scale.Key, Region: g})
	return needed, spans, nil
}

func validateLoRA(e *errs, tptr string, t *api.TensorRequest, dst tensor.DType, ck *checkpoint.Checkpoint) *deferredSpec {
	ptr := tptr + "/deferred"
	var src [3]*checkpoint.Tensor
	for i, name := range t.Deferred.Sources {
		st, ok := ck.Tensors[name]
		switch {
		case !ok:
			e.add(fmt.Sprintf("%s/sources/%d", ptr, i), "checkpoint %q has no tensor %q", ck.Name, name)
			return nil
		case len(st.Shape) != 2 || !st.DType.IsFloat():
			e.add(fmt.Sprintf("%s/sources/%d", ptr, i), "lora_merge takes 2-d float tensors, %q is %s %v", name, st.DTypeName, st.Shape)
			return nil
		}
		src[i] = st
	}
	w, a, b := src[0], src[1], src[2]
	r := a.Shape[0]
	if a.Shape[1] != w.Shape[1] || !slices.Equal(b.Shape, []int64{w.Shape[0], r}) {
		e.add(ptr+"/sources", "W %v, A %v and B %v do not make W + B @ A (A must be [r, %d], B [%d, r])", w.Shape, a.Shape, b.Shape, w.Shape[1], w.Shape[0])
		return nil
	}
	if !slices.Equal(t.Shape, w.Shape) {
		e.add(tptr+"/shape", "the tensor's shape must be W's, %v", w.Shape)
		return nil
	}
	alpha, rank := 1.0, r
	if p := t.Deferred.Params; p != nil {
		if p.Alpha != nil {
			alpha = *p.Alpha
		}
		if p.Rank != nil {
			if rank = *p.Rank; rank < 1 {
				e.schema(ptr+"/params/rank", "rank is >= 1")
				return nil
			}
		}
	}
	k, err := tensor.NewLoRA(w.DType, a.DType, b.DType, dst, r, alpha/float64(rank))
	if err != nil {
		e.add(tptr+"/dtype", "%v", err)
		return nil
	}
	return &deferredSpec{lora: k, weight: w, scale: a, b: b}
}

// loraSegment plans one segment of a merged LoRA weight: W's box, B's rows and A's columns.
func (s *segmenter) loraSegment(d *deferredSpec, off, lens []int64, seg *Segment) (needed int64, spans []Read, err error) {
	w, a, b := d.weight, d.scale, d.b
	in, r := w.Shape[1], a.Shape[0]
	g := tensor.LoRARegion{WOff: w.Begin, AOff: a.Begin, BOff: b.Begin, In: in, R0: off[0], NR: lens[0], C0: off[1], NC: lens[1]}
	ws, as, bs := int64(w.DType.Size()), int64(a.DType.Size()), int64(b.DType.Size())
	needed, spans, err = s.partReads(
		sourcePart{w, w.Begin + (g.R0*in+g.C0)*ws, tensor.Strided{Lengths: []int64{g.NR, g.NC}, Src: []int64{in * ws, ws}}, ws},
		sourcePart{a, a.Begin + g.C0*as, tensor.Strided{Lengths: []int64{r, g.NC}, Src: []int64{in * as, as}}, as},
		sourcePart{b, b.Begin + g.R0*r*bs, tensor.Strided{Lengths: []int64{g.NR * r}, Src: []int64{bs}}, bs})
	if err != nil {
		return 0, nil, err
	}
	seg.LoRAs = append(seg.LoRAs, LoRA{Kernel: d.lora, WKey: w.Key, AKey: a.Key, BKey: b.Key, Region: g})
	return needed, spans, nil
}

// sourcePart is a region of a completion's source: the file offset of its first element, the
// strides of its dimensions, and its element size.
type sourcePart struct {
	t      *checkpoint.Tensor
	start  int64
	layout tensor.Strided // Lengths and Src only
	elem   int64
}

// partReads plans the reads of a completion's source regions and counts the bytes they need.
func (s *segmenter) partReads(parts ...sourcePart) (needed int64, reads []Read, err error) {
	for _, p := range parts {
		p.layout.Dst = make([]int64, len(p.layout.Lengths))
		sp, err := s.spans(p.layout.Simplify(), p.start, p.elem)
		if err != nil {
			return 0, nil, err
		}
		reads = s.reads(reads, p.t, sp)
		needed += touched(p.layout.Lengths, p.layout.Src) * p.elem
	}
	return needed, reads, nil
}
