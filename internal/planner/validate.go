package planner

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"unsafe"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// FieldError is one thing wrong with a request, at a JSON pointer into its body.
type FieldError struct {
	Pointer string
	Detail  string
}

// ValidationError lists what is wrong with a request. Schema is true when any error breaks the
// schema (a 400); otherwise the request is well-formed but impossible (a 422).
type ValidationError struct {
	Schema bool
	Errors []FieldError
	// Total counts every error found; Errors holds the first maxErrors of them.
	Total int
}

func (e *ValidationError) Error() string {
	if len(e.Errors) == 0 {
		return "invalid request"
	}
	msg := e.Errors[0].Pointer + ": " + e.Errors[0].Detail
	if more := e.Total - 1; more > 0 {
		msg += fmt.Sprintf(" (and %d more)", more)
	}
	return msg
}

// maxErrors caps the list a client gets back: enough to fix a table, not a megabyte of problems.
const maxErrors = 100

type errs struct{ ValidationError }

func (e *errs) schema(ptr, format string, args ...any) {
	e.Schema = true
	e.add(ptr, format, args...)
}

func (e *errs) add(ptr, format string, args ...any) {
	e.Total++
	if len(e.Errors) < maxErrors {
		e.Errors = append(e.Errors, FieldError{Pointer: ptr, Detail: fmt.Sprintf(format, args...)})
	}
}

func (e *errs) ok() bool { return len(e.Errors) == 0 }

// add is checked int64 addition: any overflow is a 422, never a wraparound (tensor.CheckedMul
// and tensor.CheckedProduct multiply).
func add(a, b int64) (int64, bool) {
	s := a + b
	return s, (s >= a) == (b >= 0)
}

// tensorSpec is a validated destination tensor.
type tensorSpec struct {
	index  int
	name   string
	dtype  tensor.DType
	shape  []int64
	boxes  []api.Box
	fill   []byte // the encoded fill element, nil without fill
	blocks []blockSpec
	lookup *blockIndex // the blocks, for finding those a box meets
	// pipelineBytes is about the memory of the blocks' own conversions (those with post ops; the
	// others share one per dtype pair), which copies keep.
	pipelineBytes int64
	deferred      *deferredSpec
}

// blockSpec is a validated block with what planning needs of its source.
type blockSpec struct {
	index int
	// Block is the request's own (it outlives planning), not a copy.
	*api.Block
	src      *checkpoint.Tensor
	pipeline *tensor.Pipeline
	// srcStrides is the byte stride of one step along each destination dimension in the source
	// file; zero where the block is one long, so huge unused coefficients cannot overflow.
	srcStrides []int64
	// baseOffset is the file offset of the element at base.
	baseOffset int64
	// nibbles: the source is packed F4, and offsets and strides count half bytes.
	nibbles bool
}

// validate checks a request against docs/contract.md and the checkpoint, and returns what planning needs.
// The error is a *ValidationError, or the context's error when c stops planning.
func validate(req *api.ShardRequest, ck *checkpoint.Checkpoint, c *checker) ([]tensorSpec, error) {
	e := &errs{}
	pipelines := map[[2]tensor.DType]*tensor.Pipeline{} // conversions without post ops, shared by blocks
	if req.Format != nil && *req.Format != api.Raw && *req.Format != api.Safetensors {
		e.schema("/format", "format must be \"raw\" or \"safetensors\", got %q", *req.Format)
	}
	if len(req.Tensors) == 0 {
		e.schema("/tensors", "a request needs at least one tensor")
	}
	names := map[string]int{}
	var specs []tensorSpec
	for i := range req.Tensors {
		t := &req.Tensors[i]
		ptr := fmt.Sprintf("/tensors/%d", i)
		if prev, dup := names[t.Name]; dup {
			e.add(
				ptr+"/name",
				"tensor %q is already requested at /tensors/%d: names within a request are distinct",
				t.Name,
				prev,
			)
		}
		names[t.Name] = i
		if spec, ok := validateTensor(e, ptr, i, t, ck, c, pipelines); ok {
			specs = append(specs, spec)
		}
		if c.err != nil {
			return nil, c.err
		}
	}
	if !e.ok() {
		return nil, &e.ValidationError
	}
	return specs, nil
}

func validateTensor(e *errs, ptr string, index int, t *api.TensorRequest, ck *checkpoint.Checkpoint, c *checker,
	pipelines map[[2]tensor.DType]*tensor.Pipeline) (tensorSpec, bool) {
	before := len(e.Errors)
	spec := tensorSpec{index: index, name: t.Name, shape: t.Shape, boxes: t.Boxes}
	if t.Name == "" {
		e.schema(ptr+"/name", "a tensor needs a name")
	}
	dtype, ok := tensor.ParseDType(string(t.Dtype))
	if !ok || dtype == tensor.F4 {
		e.schema(ptr+"/dtype", "unknown dtype %q (F4 is read from checkpoints, never written)", t.Dtype)
	}
	spec.dtype = dtype
	for d, n := range t.Shape {
		if n < 0 {
			e.schema(fmt.Sprintf("%s/shape/%d", ptr, d), "dimensions are >= 0")
		}
	}
	if len(e.Errors) > before {
		return spec, false
	}
	if n, ok := tensor.CheckedProduct(t.Shape...); !ok || n > math.MaxInt64/8 {
		e.add(ptr+"/shape", "shape %v has more elements than this service can address", t.Shape)
		return spec, false
	}
	if t.Fill != nil {
		fill, err := tensor.EncodeFill(dtype, t.Fill.String())
		if err != nil {
			e.add(ptr+"/fill", "%v", err)
		}
		spec.fill = fill
	}
	if len(t.Boxes) == 0 {
		e.schema(ptr+"/boxes", "a tensor needs at least one box")
	}
	for b, box := range t.Boxes {
		if c.tick(1) {
			return spec, false
		}
		checkBox(e, elemPtr{ptr, "boxes", b}, box.Offsets, box.Lengths, t.Shape)
	}
	var blocks []api.Block
	if t.Blocks != nil {
		blocks = *t.Blocks
	}
	spec.blocks = make([]blockSpec, 0, len(blocks))
	rank := len(t.Shape)
	strides := make([]int64, rank*len(blocks)) // every block's srcStrides, in one allocation
	for j := range blocks {
		if c.tick(1) {
			return spec, false
		}
		b, ok := validateBlock(
			e,
			elemPtr{ptr, "blocks", j},
			j,
			&blocks[j],
			t.Shape,
			dtype,
			ck,
			pipelines,
			strides[j*rank:(j+1)*rank:(j+1)*rank],
		)
		if ok {
			spec.blocks = append(spec.blocks, b)
		}
	}
	for _, b := range spec.blocks {
		if b.Post != nil && len(*b.Post) > 0 {
			spec.pipelineBytes += int64(unsafe.Sizeof(tensor.Pipeline{})) + 32*int64(len(*b.Post)+1)
		}
	}
	if t.Deferred != nil {
		spec.deferred = validateDeferred(e, ptr, t, dtype, ck)
	}
	if len(e.Errors) > before {
		return spec, false
	}
	if spec.deferred == nil {
		if spec.lookup = newBlockIndex(spec.blocks, c); spec.lookup == nil {
			return spec, false
		}
	}
	checkOverlaps(e, ptr, spec.blocks, spec.lookup, c)
	if spec.fill == nil && spec.deferred == nil && len(e.Errors) == before {
		var hits []int32
		for b, box := range t.Boxes {
			var missing int64
			if missing, hits = uncovered(box, spec.blocks, spec.lookup, hits[:0], c); missing > 0 {
				e.add(
					fmt.Sprintf("%s/boxes/%d", ptr, b),
					"%d elements of the box are covered by no block and the tensor has no fill",
					missing,
				)
			}
		}
	}
	return spec, len(e.Errors) == before
}

// elemPtr is the JSON pointer of a box or block, formatted only when an error needs it: a request
// may carry a million of them.
type elemPtr struct {
	tensor string // the tensor's pointer
	kind   string // "boxes" or "blocks"
	i      int
}

func (p elemPtr) String() string { return p.tensor + "/" + p.kind + "/" + strconv.Itoa(p.i) }

func (p elemPtr) at(suffix string) string { return p.String() + suffix }

// checkBox checks that offsets and lengths have one entry per dimension, lengths are >= 1, and the
// box lies inside shape.
func checkBox(e *errs, ptr elemPtr, offsets, lengths, shape []int64) bool {
	before := len(e.Errors)
	if len(offsets) != len(shape) || len(lengths) != len(shape) {
		e.add(
			ptr.String(),
			"offsets %v and lengths %v need one entry per dimension of shape %v",
			offsets,
			lengths,
			shape,
		)
		return false
	}
	for d := range shape {
		switch {
		case offsets[d] < 0:
			e.schema(fmt.Sprintf("%s/offsets/%d", ptr, d), "offsets are >= 0")
		case lengths[d] < 1:
			e.schema(fmt.Sprintf("%s/lengths/%d", ptr, d), "lengths are >= 1")
		case offsets[d] > shape[d] || lengths[d] > shape[d]-offsets[d]:
			e.add(
				ptr.String(),
				"[%d, %d) along dimension %d is outside the shape %v",
				offsets[d],
				offsets[d]+lengths[d],
				d,
				shape,
			)
		}
	}
	return len(e.Errors) == before
}

// pipelines shares conversions without post ops between blocks; strides is the block's srcStrides,
// zeros, from one allocation for the whole table.
func validateBlock(
	e *errs,
	ptr elemPtr,
	index int,
	b *api.Block,
	shape []int64,
	dst tensor.DType,
	ck *checkpoint.Checkpoint,
	pipelines map[[2]tensor.DType]*tensor.Pipeline,
	strides []int64,
) (blockSpec, bool) {
	before := len(e.Errors)
	spec := blockSpec{index: index, Block: b}
	checkBox(e, ptr, b.Offsets, b.Lengths, shape)
	var ops []tensor.Op
	if b.Post != nil {
		for k, p := range *b.Post {
			pptr := fmt.Sprintf("%s/post/%d", ptr, k)
			kind, ok := tensor.ParseOpKind(string(p.Op))
			op := tensor.Op{Kind: kind}
			switch {
			case !ok:
				e.schema(pptr+"/op", "unknown op %q: one of neg, mul, add, exp, cast", p.Op)
			case (kind == tensor.OpMul || kind == tensor.OpAdd) && p.Value == nil:
				e.schema(pptr+"/value", "%s needs a value", p.Op)
			case kind == tensor.OpCast && p.Dtype == nil:
				e.schema(pptr+"/dtype", "cast needs a dtype")
			case kind == tensor.OpCast:
				if op.DType, ok = tensor.ParseDType(string(*p.Dtype)); !ok {
					e.schema(pptr+"/dtype", "unknown dtype %q", *p.Dtype)
				}
			default:
				if p.Value != nil {
					op.Value = *p.Value
				}
			}
			ops = append(ops, op)
		}
	}
	src, ok := ck.Tensors[b.Source]
	if !ok {
		e.add(ptr.at("/source"), "checkpoint %q has no tensor %q", ck.Name, b.Source)
		return spec, false
	}
	spec.src = src
	if src.DType == 0 {
		e.add(
			ptr.at("/source"),
			"checkpoint tensor %q has dtype %s, which this service cannot read",
			b.Source,
			src.DTypeName,
		)
	}
	srank := len(src.Shape)
	if len(b.Base) != srank {
		e.add(ptr.at("/base"), "base needs one entry per dimension of %q, which has shape %v", b.Source, src.Shape)
	}
	if len(b.Coeff) != srank {
		e.add(ptr.at("/coeff"), "coeff needs one row per dimension of %q, which has shape %v", b.Source, src.Shape)
	}
	for s, row := range b.Coeff {
		if len(row) != len(shape) {
			e.add(
				fmt.Sprintf("%s/coeff/%d", ptr, s),
				"each coeff row needs one step per destination dimension (%d)",
				len(shape),
			)
		}
		for a, c := range row {
			if c < 0 {
				e.schema(fmt.Sprintf("%s/coeff/%d/%d", ptr, s, a), "steps are >= 0")
			}
		}
	}
	for s, x := range b.Base {
		if x < 0 {
			e.schema(fmt.Sprintf("%s/base/%d", ptr, s), "base entries are >= 0")
		}
	}
	if len(e.Errors) > before {
		return spec, false
	}
	// The last element the block reads along each source dimension must be inside the tensor.
	for s := range srank {
		last, ok := b.Base[s], true
		for a, c := range b.Coeff[s] {
			var step int64
			if step, ok = tensor.CheckedMul(c, b.Lengths[a]-1); !ok {
				break
			}
			if last, ok = add(last, step); !ok {
				break
			}
		}
		if !ok || last >= src.Shape[s] {
			e.add(
				ptr.String(),
				"the block reads past the end of checkpoint tensor %q: dimension %d has size %d, the block reaches index %s",
				b.Source,
				s,
				src.Shape[s],
				reach(ok, last),
			)
			return spec, false
		}
	}
	spec.nibbles = src.DType == tensor.F4
	if src.DType != 0 {
		from := src.DType
		if spec.nibbles {
			from = tensor.F32 // F4 is decoded to float32 first, as FP8 is
		}
		p, cached := pipelines[[2]tensor.DType{from, dst}]
		var err error
		if !cached || len(ops) > 0 {
			p, err = tensor.NewPipeline(from, ops, dst)
		}
		if err == nil && !cached && len(ops) == 0 {
			pipelines[[2]tensor.DType{from, dst}] = p
		}
		if err != nil {
			var pe *tensor.PipelineError
			if !errors.As(err, &pe) {
				e.add(ptr.String(), "%v", err)
			} else if pe.Op >= 0 {
				e.add(fmt.Sprintf("%s/post/%d", ptr, pe.Op), "%s", pe.Msg)
			} else {
				e.add(ptr.String(), "%s (source %q to the tensor's dtype)", pe.Msg, b.Source)
			}
			return spec, false
		}
		spec.pipeline = p
	}
	// Byte strides in the source file, per destination dimension (nibbles for F4).
	var small [8]int64
	rowStride := small[:0]
	if srank > len(small) {
		rowStride = make([]int64, srank)
	}
	rowStride = rowStride[:srank]
	stride := int64(src.DType.Size())
	spec.baseOffset = src.Begin
	if spec.nibbles {
		stride, spec.baseOffset = 1, 2*src.Begin
	}
	for s := srank - 1; s >= 0; s-- {
		rowStride[s] = stride
		stride *= src.Shape[s]
	}
	for s := range srank {
		spec.baseOffset += b.Base[s] * rowStride[s] // base is inside the tensor, so this fits
	}
	spec.srcStrides = strides // zeros, len(shape) of them
	for a := range shape {
		if b.Lengths[a] == 1 {
			continue
		}
		for s := range srank {
			spec.srcStrides[a] += b.Coeff[s][a] * rowStride[s] // c < size of dim s, so this fits
		}
	}
	return spec, len(e.Errors) == before
}

func reach(ok bool, last int64) string {
	if !ok {
		return "beyond int64"
	}
	return fmt.Sprint(last)
}

// checkOverlaps reports the first block (in request order) that shares an element with an earlier
// block of its tensor, naming the first such earlier block. The index says whether any two meet
// (asking once per leaf); only then does each block in turn ask which blocks it meets. A table of
// disjoint blocks costs about O(n log n), not O(n²).
func checkOverlaps(e *errs, ptr string, blocks []blockSpec, idx *blockIndex, c *checker) {
	if idx == nil || idx.line || !idx.anyOverlap(c) {
		return // disjoint (a line index is by construction), or planning stops
	}
	var hits []int32
	for i := range blocks {
		hits = idx.query(blocks[i].Offsets, blocks[i].Lengths, hits[:0], c)
		if c.err != nil {
			return
		}
		if len(hits) > 0 && int(hits[0]) < i {
			e.add(
				fmt.Sprintf("%s/blocks/%d", ptr, blocks[i].index),
				"overlaps block %d: blocks of one tensor must not share elements",
				blocks[hits[0]].index,
			)
			return
		}
	}
}

// uncovered counts the elements of a box no block covers; blocks do not overlap, so it is the
// box's volume less the volumes of its overlaps. hits is scratch for the index, returned grown.
func uncovered(box api.Box, blocks []blockSpec, idx *blockIndex, hits []int32, c *checker) (int64, []int32) {
	total, _ := tensor.CheckedProduct(box.Lengths...)
	hits = idx.query(box.Offsets, box.Lengths, hits, c)
	for _, j := range hits {
		b := &blocks[j]
		v := int64(1)
		for d := range box.Offsets {
			v *= min(box.Offsets[d]+box.Lengths[d], b.Offsets[d]+b.Lengths[d]) - max(box.Offsets[d], b.Offsets[d])
		}
		total -= v
	}
	return total, hits
}
