package planner

import (
	"cmp"
	"fmt"
	"math"
	"slices"
	"sort"
	"strings"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// segmenter cuts items into segments and plans each segment's reads.
type segmenter struct {
	opts     Options
	plan     *Plan
	c        *checker
	segments int64
	overlaps int64 // (segment, block) overlaps and completion kernels planned: copies and direct runs
	pieces   int64
	mem      int64 // memory the plan holds so far (Plan.MemoryBytes as it grows)
	ck       *checkpoint.Checkpoint
	fileEnds map[string]int64 // end of the last tensor of each file, made when first needed
	tensor   int              // the request index of the tensor being planned, for error pointers
	// scratch, reused from one copy to the next
	hits      []int32
	o, l      []int64
	runsBuf   [][2]int64
	spansBuf  [][3]int64
	odometer  tensor.Odometer
	regions   []Region
	copies    []stridedCopy
	directs   []Read
	pending   []Read
	merging   []Read  // the second buffer of share's merges
	lay       scratch // a copy's layout before it is kept
	fused     scratch // a fused copy's layout
	group     fusion
	committed int64 // reads of the segments planned so far (ReadRequests)
	// whole keeps emit from halving, and oversized says whether it would have halved a segment.
	whole, oversized bool
	direct           int64 // direct reads of the segment being built
}

func rowStrides(lengths []int64, elem int64) []int64 {
	out := make([]int64, len(lengths))
	for d := len(lengths) - 1; d >= 0; d-- {
		out[d] = elem
		elem *= lengths[d]
	}
	return out
}

// charge adds n bytes to the plan's memory, refusing past MaxPlanBytes.
func (s *segmenter) charge(n int64) error {
	if s.mem += n; s.mem > s.opts.MaxPlanBytes {
		detail := fmt.Sprintf(
			"the plan would take more than %d bytes of memory, the most this server gives one plan; split the request",
			s.opts.MaxPlanBytes,
		)
		return &ValidationError{Errors: []FieldError{{fmt.Sprintf("/tensors/%d", s.tensor), detail}}, Total: 1}
	}
	return nil
}

func (s *segmenter) tooMany(what string, n, limit int64) error {
	detail := fmt.Sprintf(
		"the plan needs more than %d %s (at least %d); split the request or use a layout with longer contiguous runs",
		limit,
		what,
		n,
	)
	return &ValidationError{Errors: []FieldError{{fmt.Sprintf("/tensors/%d", s.tensor), detail}}, Total: 1}
}

// cut is how segment cuts a box of these lengths: k is the outermost dimension whose one step
// fits in a segment, chunk how many steps of it a segment takes, step the byte strides of the box.
func (s *segmenter) cut(lengths []int64, elem int64) (k int, chunk int64, step []int64) {
	step = rowStrides(lengths, elem)
	for k < len(lengths)-1 && step[k] > s.opts.SegmentBytes {
		k++
	}
	return k, max(1, s.opts.SegmentBytes/step[k]), step
}

// count is how many segments segment cuts an item into before any is halved (at least how many
// the item needs), computed without building them; ok is false past int64.
func (s *segmenter) count(lengths []int64, elem int64) (int64, bool) {
	if len(lengths) == 0 {
		return 1, true
	}
	k, chunk, _ := s.cut(lengths, elem)
	n, ok := tensor.CheckedProduct(lengths[:k]...)
	if !ok {
		return 0, false
	}
	return tensor.CheckedMul(n, (lengths[k]+chunk-1)/chunk)
}

// segmentAndShare segments an item and lets its segments share a rectangle where that costs less
// (share). The item is first cut at SegmentBytes without halving: where the segments then share a
// rectangle, each reads a view of it, so halving them by what they would read on their own only
// multiplies segments and planning (a 4096 × 4096 BF16 transpose: 32 segments planned 56 times
// over, against 8 once). Where a segment would have been halved and there is no rectangle, the
// item is planned again, halved.
func (s *segmenter) segmentAndShare(spec *tensorSpec, it *Item) error {
	p := s.plan
	before := struct {
		segments, overlaps, committed, mem, reads, readBytes, needed int64
	}{s.segments, s.overlaps, s.committed, s.mem, p.ReadRequests, p.ReadBytes, p.NeededBytes}
	s.whole, s.oversized = true, false
	err := s.segment(spec, it)
	s.whole = false
	if err == nil {
		err = s.share(it)
	}
	if err != nil || !s.oversized || it.Rectangle != nil {
		return err
	}
	s.segments, s.overlaps, s.committed, s.mem = before.segments, before.overlaps, before.committed, before.mem
	p.ReadRequests, p.ReadBytes, p.NeededBytes = before.reads, before.readBytes, before.needed
	it.Segments = it.Segments[:0]
	if err := s.segment(spec, it); err != nil {
		return err
	}
	return s.share(it)
}

// segment cuts an item into row-major runs of the box that are boxes themselves: fixed indices on
// the dimensions before k, a range along k, whole lengths after it, with k the outermost dimension
// whose one step fits in a segment.
func (s *segmenter) segment(spec *tensorSpec, it *Item) error {
	s.tensor = it.Tensor
	elem := int64(spec.dtype.Size())
	if len(it.Lengths) == 0 {
		return s.emit(spec, it, nil, nil, it.Output)
	}
	k, chunk, step := s.cut(it.Lengths, elem)
	var o tensor.Odometer // over the dimensions before k, carrying the output offset
	o.Reset(it.Lengths[:k], step[:k], step[:k], it.Output, 0)
	for more := true; more; more = o.Next() {
		for j := int64(0); j < it.Lengths[k]; j += chunk {
			off := slices.Clone(it.Offsets)
			lens := slices.Clone(it.Lengths)
			for a := range k {
				off[a] += o.Index[a]
				lens[a] = 1
			}
			off[k] += j
			lens[k] = min(chunk, it.Lengths[k]-j)
			if err := s.emit(spec, it, off, lens, o.Src+j*step[k]); err != nil {
				return err
			}
		}
	}
	return nil
}

// emit plans one segment, halving it while it would read more than SegmentReadBytes.
func (s *segmenter) emit(spec *tensorSpec, it *Item, off, lens []int64, out int64) error {
	if s.c.tick(1) {
		return s.c.err
	}
	if s.segments++; s.segments > s.opts.MaxReads {
		return s.tooMany("segments", s.segments, s.opts.MaxReads)
	}
	seg, needed, work, err := s.build(spec, off, lens, out)
	if err != nil {
		return err
	}
	var spanBytes int64
	for _, r := range seg.Spans {
		spanBytes += r.Length
	}
	if spanBytes > s.opts.SegmentReadBytes && s.whole {
		s.oversized = true
	} else if spanBytes > s.opts.SegmentReadBytes {
		// Halve along the first dimension longer than one: the dimensions before it are one long
		// and the ones after it whole, so both halves stay contiguous in the body.
		for d, n := range lens {
			if n == 1 {
				continue
			}
			h := n / 2
			lo, hi := slices.Clone(lens), slices.Clone(lens)
			lo[d], hi[d] = h, n-h
			hiOff := slices.Clone(off)
			hiOff[d] += h
			s.segments--
			if err := s.emit(spec, it, off, lo, out); err != nil {
				return err
			}
			loBytes, _ := tensor.CheckedProduct(lo...)
			return s.emit(spec, it, hiOff, hi, out+loBytes*int64(spec.dtype.Size()))
		}
	}
	p := s.plan
	p.NeededBytes += needed
	p.ReadRequests += int64(len(seg.Direct) + len(seg.Spans))
	for _, list := range [][]Read{seg.Direct, seg.Spans} {
		for _, r := range list {
			p.ReadBytes += r.Length
		}
	}
	if p.ReadRequests > s.opts.MaxReads {
		return s.tooMany("reads", p.ReadRequests, s.opts.MaxReads)
	}
	s.committed = p.ReadRequests
	s.overlaps += work
	it.Segments = append(it.Segments, seg)
	return s.charge(segmentMemory(&seg))
}

// compactReads is how many gather reads a segment collects before it coalesces them: a segment
// meeting a million blocks holds a few thousand reads at a time, not a million.
const compactReads = 1 << 14

// build plans the copies and reads of one segment and returns the source bytes it depends on and
// the overlaps it plans (copies, direct runs and completion kernels).
func (s *segmenter) build(spec *tensorSpec, off, lens []int64, out int64) (Segment, int64, int64, error) {
	elem := int64(spec.dtype.Size())
	total, _ := tensor.CheckedProduct(lens...)
	seg := Segment{Output: out, Bytes: total * elem}
	dstStrides := rowStrides(lens, elem)
	spans := s.pending[:0] // gather reads, coalesced every so often
	defer func() { s.pending = spans[:0] }()
	var covered, needed int64
	s.direct = 0
	compactAt := compactReads
	s.hits = spec.lookup.query(off, lens, s.hits[:0], s.c)
	if s.c.err != nil {
		return seg, 0, 0, s.c.err
	}
	work := int64(len(s.hits))
	if spec.deferred != nil {
		work = 1
	}
	if s.overlaps+work > s.opts.MaxReads {
		return seg, 0, 0, s.tooMany("copies", s.overlaps+work, s.opts.MaxReads)
	}
	rank := len(lens)
	if cap(s.o) < 2*rank {
		s.o, s.l = make([]int64, 2*rank), make([]int64, 2*rank)
		s.lay, s.fused = newScratch(rank), newScratch(rank+1)
	}
	o, l := s.o[:rank], s.l[:rank]
	// Copies and direct reads collect in scratch and are cloned at their final size: a plan may
	// hold a million of them, and growing its slices would copy them again and again.
	s.copies, s.directs = s.copies[:0], s.directs[:0]
	defer func() { s.copies, s.directs = s.copies[:0], s.directs[:0] }()
	// Copies of consecutive blocks that differ only by a constant step in source and destination
	// (column blocks, per-head blocks, experts) are fused into one copy with one more dimension,
	// which may then be contiguous enough to read directly.
	g := &s.group
	g.k = 0
	flush := func() error {
		if g.k == 0 {
			return nil
		}
		k := g.k
		g.k = 0
		lay := g.layout
		if k > 1 {
			f := s.fused.reset()
			at := 0
			for at < len(lay.Lengths) && lay.Dst[at] > g.dD { // keep the destination row-major
				at++
			}
			f.Lengths = append(append(append(f.Lengths, lay.Lengths[:at]...), k), lay.Lengths[at:]...)
			f.Src = append(append(append(f.Src, lay.Src[:at]...), g.dS), lay.Src[at:]...)
			f.Dst = append(append(append(f.Dst, lay.Dst[:at]...), g.dD), lay.Dst[at:]...)
			lay = f
		}
		return s.plan1(g.b, simplify(lay.Lengths, lay.Src, lay.Dst), g.src, g.dst, &spans, &compactAt)
	}
	for _, j := range s.hits {
		if s.c.tick(1) {
			return seg, 0, 0, s.c.err
		}
		b := &spec.blocks[j]
		n := int64(1)
		for d := range rank {
			lo, hi := max(off[d], b.Offsets[d]), min(off[d]+lens[d], b.Offsets[d]+b.Lengths[d])
			o[d], l[d] = lo, hi-lo
			n *= hi - lo
		}
		covered += n
		src, dst := b.baseOffset, int64(0)
		for a := range l {
			src += (o[a] - b.Offsets[a]) * b.srcStrides[a]
			dst += (o[a] - off[a]) * dstStrides[a]
		}
		layout := s.lay.simplify(l, b.srcStrides, dstStrides)
		if b.nibbles {
			needed += (touched(layout.Lengths, layout.Src) + 1) / 2
		} else {
			needed += touched(layout.Lengths, layout.Src) * int64(b.src.DType.Size())
		}
		if g.k > 0 && g.extends(b, layout, src, dst) {
			continue
		}
		if err := flush(); err != nil {
			return seg, 0, 0, err
		}
		if b.nibbles {
			if err := s.plan1(b, simplify(layout.Lengths, layout.Src, layout.Dst), src, dst, &spans, &compactAt); err != nil {
				return seg, 0, 0, err
			}
			continue
		}
		g.start(b, layout, src, dst)
	}
	if err := flush(); err != nil {
		return seg, 0, 0, err
	}
	if len(s.copies) > 0 { // one array for the copies, one for the kernels
		copies := slices.Clone(s.copies)
		seg.Kernels = make([]Kernel, len(copies))
		for i := range copies {
			seg.Kernels[i] = &copies[i]
		}
	}
	if len(s.directs) > 0 {
		seg.Direct = slices.Clone(s.directs)
	}
	if d := spec.deferred; d != nil {
		n, sp, err := s.completionSegment(d, off, lens, &seg)
		if err != nil {
			return seg, 0, 0, err
		}
		needed += n
		covered = total
		spans = append(spans, sp...)
	}
	if covered < total {
		seg.Fill = spec.fill
	}
	if spans = coalesce(spans, s.opts); len(spans) > 0 {
		seg.Spans = layOut(spans, s.opts.MaxRead)
	}
	return seg, needed, work, nil
}

// plan1 plans one copy (of a block, or of consecutive blocks fused): a direct read of each run
// when it changes nothing and its runs are at least MaxGap long, else a copy from span buffers
// and the spans it reads, added to spans (coalesced when they pass compactAt).
func (s *segmenter) plan1(b *blockSpec, layout tensor.Strided, src, dst int64, spans *[]Read, compactAt *int) error {
	srcElem := int64(b.src.DType.Size())
	if b.nibbles {
		srcElem = 1 // addresses count nibbles
	}
	if run, ok := directRun(layout, srcElem, b.pipeline.Identity()); ok && !b.nibbles && run >= s.opts.MaxGap {
		runs, err := s.runs(
			layout.Lengths[:max(0, len(layout.Lengths)-1)],
			layout.Src,
			layout.Dst,
			src,
			dst,
			s.committed+s.direct,
		)
		if err != nil {
			return err
		}
		n, ok := tensor.CheckedMul(int64(len(runs)), (run+s.opts.MaxRead-1)/s.opts.MaxRead)
		if !ok || n > s.opts.MaxReads-s.committed-s.direct {
			return s.tooMany("reads", s.committed+s.direct+min(n, s.opts.MaxReads), s.opts.MaxReads)
		}
		s.direct += n
		for _, r := range runs {
			s.directs = splitRead(
				s.directs,
				Read{Key: b.src.Key, Version: b.src.Version, Offset: r[0], Length: run, Dst: r[1], Needed: run},
				s.opts.MaxRead,
			)
		}
		return nil
	}
	s.copies = append(s.copies, stridedCopy{pipeline: b.pipeline, source: b.src, src: src, dst: dst, layout: layout,
		nibbles: b.nibbles})
	var err error
	s.regions = s.copies[len(s.copies)-1].Sources(s.regions[:0])
	for _, r := range s.regions {
		if *spans, err = s.regionReads(*spans, r); err != nil {
			return err
		}
	}
	if len(*spans) > *compactAt {
		*spans = coalesce(*spans, s.opts)
		*compactAt = max(compactReads, 2*len(*spans))
		if n := s.committed + s.direct + int64(len(*spans)); n > s.opts.MaxReads {
			return s.tooMany("reads", n, s.opts.MaxReads)
		}
	}
	return nil
}

// fusion is the run of consecutive copies being fused: the first one's block, offsets and
// layout, how many there are, and the step from one to the next.
type fusion struct {
	b            *blockSpec
	src, dst     int64
	layout       tensor.Strided // in scratch of its own
	buf          scratch
	k, dS, dD    int64
	lastS, lastD int64
}

func (g *fusion) start(b *blockSpec, layout tensor.Strided, src, dst int64) {
	if len(g.buf.buf) < 3*len(layout.Lengths) {
		g.buf = newScratch(len(layout.Lengths))
	}
	f := g.buf.reset()
	f.Lengths = append(f.Lengths, layout.Lengths...)
	f.Src = append(f.Src, layout.Src...)
	f.Dst = append(f.Dst, layout.Dst...)
	g.b, g.layout, g.src, g.dst, g.k, g.lastS, g.lastD = b, f, src, dst, 1, src, dst
}

// extends adds the copy to the run when it continues it: same source file and conversion, same
// layout, and the next step of the run (the second copy sets the step; it must move forward in
// the destination and not backward in the source).
func (g *fusion) extends(b *blockSpec, layout tensor.Strided, src, dst int64) bool {
	if b.pipeline != g.b.pipeline || b.src.Key != g.b.src.Key || b.nibbles ||
		!slices.Equal(layout.Lengths, g.layout.Lengths) ||
		!slices.Equal(layout.Src, g.layout.Src) ||
		!slices.Equal(layout.Dst, g.layout.Dst) {
		return false
	}
	dS, dD := src-g.lastS, dst-g.lastD
	if g.k == 1 {
		if dD <= 0 || dS < 0 {
			return false
		}
		g.dS, g.dD = dS, dD
	} else if dS != g.dS || dD != g.dD {
		return false
	}
	g.k++
	g.lastS, g.lastD = src, dst
	return true
}

// scratch holds a Strided's three slices without allocating.
type scratch struct{ buf []int64 }

func newScratch(rank int) scratch { return scratch{make([]int64, 3*rank)} }

func (s scratch) reset() tensor.Strided {
	n := len(s.buf) / 3
	return tensor.Strided{Lengths: s.buf[0:0:n], Src: s.buf[n : n : 2*n], Dst: s.buf[2*n : 2*n : 3*n]}
}

// simplify is tensor.Strided.Simplify into the scratch, valid until its next use.
func (s scratch) simplify(lengths, src, dst []int64) tensor.Strided {
	return tensor.Strided{Lengths: lengths, Src: src, Dst: dst}.SimplifyInto(s.reset())
}

// simplify is tensor.Strided.Simplify for a copy of these lengths and strides, in one allocation:
// a plan may hold a million copies.
func simplify(lengths, src, dst []int64) tensor.Strided {
	n := 0
	for _, x := range lengths {
		if x != 1 {
			n++
		}
	}
	if n == 0 {
		return tensor.Strided{}
	}
	buf := make([]int64, 3*n)
	out := tensor.Strided{Lengths: buf[0:0:n], Src: buf[n : n : 2*n], Dst: buf[2*n : 2*n : 3*n]}
	return tensor.Strided{Lengths: lengths, Src: src, Dst: dst}.SimplifyInto(out)
}

// regionReads appends to out the reads of a source region: the byte ranges spans merges it into,
// rounded out to whole bytes for nibbles.
func (s *segmenter) regionReads(out []Read, r Region) ([]Read, error) {
	sp, err := s.spans(tensor.Strided{Lengths: r.Lengths, Src: r.Strides}, r.Start, r.Elem)
	if err != nil {
		return out, err
	}
	if r.Nibbles { // nibble ranges to the bytes that hold them
		for i, x := range sp {
			lo, hi := x[0]>>1, (x[0]+x[1]+1)>>1
			sp[i] = [3]int64{lo, hi - lo, min(hi-lo, x[2])} // x[2] nibbles lie in at most x[2] bytes
		}
	}
	return s.reads(out, r.Tensor, sp), nil
}

// reads appends to out a tensor's byte ranges (offset, length, needed) as reads, aligned to the
// cache's chunks when the cache is on and the aligned read stays within MaxOverread times what it
// needs.
func (s *segmenter) reads(out []Read, t *checkpoint.Tensor, ranges [][3]int64) []Read {
	for _, r := range ranges {
		off, end := r[0], r[0]+r[1]
		if a := s.opts.Align; a > 0 {
			ao, ae := off/a*a, min((end+a-1)/a*a, s.fileEnd(t.Key))
			if limit, ok := tensor.CheckedMul(s.opts.MaxOverread, r[2]); !ok || ae-ao <= limit {
				off, end = ao, max(ae, end)
			}
		}
		out = append(out, Read{Key: t.Key, Version: t.Version, Offset: off, Length: end - off, Needed: r[2]})
	}
	return out
}

// fileEnd is where the last tensor of a file ends: aligned reads stop there.
func (s *segmenter) fileEnd(key string) int64 {
	if s.fileEnds == nil {
		s.fileEnds = map[string]int64{}
		for _, t := range s.ck.Tensors {
			if s.c.tick(1) {
				break // planning stops (newPlan returns the error whatever this answers)
			}
			s.fileEnds[t.Key] = max(s.fileEnds[t.Key], t.End)
		}
	}
	return s.fileEnds[key]
}

// directRun reports whether a copy can be read straight into the output: bytes unchanged and the
// innermost dimension contiguous in both file and output. It returns the bytes of one run.
func directRun(l tensor.Strided, elem int64, identity bool) (int64, bool) {
	if !identity {
		return 0, false
	}
	inner := len(l.Lengths) - 1
	if inner < 0 {
		return elem, true
	}
	if l.Src[inner] != elem || l.Dst[inner] != elem {
		return 0, false
	}
	return l.Lengths[inner] * elem, true
}

// runs enumerates the (source, destination) offsets of every index of the given outer dimensions,
// refusing before it allocates when they would take the plan past MaxReads reads (planned counts
// the reads already planned). The result is scratch, valid until the next call.
func (s *segmenter) runs(lengths, src, dst []int64, srcAt, dstAt, planned int64) ([][2]int64, error) {
	count, ok := tensor.CheckedProduct(lengths...)
	if !ok || count > s.opts.MaxReads-planned {
		if !ok {
			count = math.MaxInt64
		}
		return nil, s.tooMany("reads", planned+min(count, math.MaxInt64-planned), s.opts.MaxReads)
	}
	if s.c.tick(int(count)) {
		return nil, s.c.err
	}
	out := s.runsBuf[:0]
	o := &s.odometer
	for o.Reset(lengths, src, dst, srcAt, dstAt); ; {
		out = append(out, [2]int64{o.Src, o.Dst})
		if !o.Next() {
			s.runsBuf = out[:0]
			return out, nil
		}
	}
}

// worthMerging is the cost model: reading a gap costs its bytes, another request costs MaxGap
// bytes, and no merged read may exceed MaxOverread times what it needs, so no plan reads more than
// MaxOverread times its needed bytes however often runs are merged.
func worthMerging(opts Options, gap, extent, needed int64) bool {
	r := opts.MaxOverread
	if r <= 0 {
		r = DefaultMaxOverread
	}
	limit, ok := tensor.CheckedMul(r, needed)
	return gap <= opts.MaxGap && (!ok || extent <= limit)
}

// spans returns the byte ranges (offset, length, needed) of the file a copy touches, merging
// along dimensions, smallest source stride first, while the cost model says so. The result is
// scratch, valid until the next call.
func (s *segmenter) spans(l tensor.Strided, src, elem int64) ([][3]int64, error) {
	var dims []int
	for d, st := range l.Src {
		if st != 0 {
			dims = append(dims, d)
		}
	}
	sort.Slice(dims, func(i, j int) bool { return l.Src[dims[i]] < l.Src[dims[j]] })
	extent, needed, m := elem, elem, 0
	for ; m < len(dims); m++ {
		st, n := l.Src[dims[m]], l.Lengths[dims[m]]
		if !worthMerging(s.opts, st-extent, extent+(n-1)*st, needed*n) {
			break
		}
		extent += (n - 1) * st
		needed *= n
	}
	outer := dims[m:]
	lengths := make([]int64, len(outer))
	strides := make([]int64, len(outer))
	for i, d := range outer { // largest stride outermost, so the runs come in file order as a rule
		lengths[len(outer)-1-i], strides[len(outer)-1-i] = l.Lengths[d], l.Src[d]
	}
	starts, err := s.runs(lengths, strides, make([]int64, len(outer)), src, 0, 0)
	if err != nil {
		return nil, err
	}
	out := s.spansBuf[:0]
	for _, st := range starts {
		out = append(out, [3]int64{st[0], extent, min(extent, needed)})
	}
	s.spansBuf = out[:0]
	return out, nil
}

// coalesce sorts reads by file and offset and merges those that overlap, and those the cost model
// says are cheaper read as one. It works in place and returns the start of reads.
func coalesce(reads []Read, opts Options) []Read {
	slices.SortFunc(reads, byFileOffset)
	return mergeSorted(reads, opts)
}

// byFileOffset orders reads by file, then offset.
func byFileOffset(a, b Read) int {
	if a.Key != b.Key {
		return strings.Compare(a.Key, b.Key)
	}
	return cmp.Compare(a.Offset, b.Offset)
}

// mergeSorted is coalesce of reads already in byFileOffset order.
func mergeSorted(reads []Read, opts Options) []Read {
	if len(reads) == 0 {
		return nil
	}
	out := reads[:1]
	for _, r := range reads[1:] {
		last := &out[len(out)-1]
		gap := r.Offset - (last.Offset + last.Length)
		length := max(last.Length, r.Offset+r.Length-last.Offset)
		if r.Key == last.Key && (gap <= 0 || worthMerging(opts, gap, length, last.Needed+r.Needed)) {
			last.Length = length
			last.Needed = min(length, last.Needed+r.Needed)
			continue
		}
		out = append(out, r)
	}
	return out
}

// mergeRuns appends to out the reads of a and b, each in byFileOffset order, in that order.
func mergeRuns(out, a, b []Read) []Read {
	for len(a) > 0 && len(b) > 0 {
		if byFileOffset(b[0], a[0]) < 0 {
			out, b = append(out, b[0]), b[1:]
		} else {
			out, a = append(out, a[0]), a[1:]
		}
	}
	return append(append(out, a...), b...)
}

// touched counts the distinct source elements of a copy: broadcast dimensions read nothing new.
func touched(lengths, src []int64) int64 {
	n := int64(1)
	for d, l := range lengths {
		if src[d] != 0 {
			n *= l
		}
	}
	return n
}

// layOut places coalesced spans one after another in a buffer (each span's Dst) and cuts each
// into reads of at most size bytes.
func layOut(spans []Read, size int64) []Read {
	out := make([]Read, 0, requests(spans, size))
	var at int64
	for _, r := range spans {
		r.Dst = at
		at += r.Length
		out = splitRead(out, r, size)
	}
	return out
}

// interleaved reports whether two segments read overlapping extents of one file.
func (s *segmenter) interleaved(segs []Segment) bool {
	type extent struct {
		key    string
		lo, hi int64
	}
	var extents []extent
	for i := range segs {
		spans := segs[i].Spans
		for len(spans) > 0 { // spans are sorted by file: one extent a file
			k := 1
			for k < len(spans) && spans[k].Key == spans[0].Key {
				k++
			}
			last := spans[k-1]
			extents = append(extents, extent{spans[0].Key, spans[0].Offset, last.Offset + last.Length})
			spans = spans[k:]
		}
	}
	slices.SortFunc(extents, func(a, b extent) int {
		if a.key != b.key {
			return strings.Compare(a.key, b.key)
		}
		return cmp.Compare(a.lo, b.lo)
	})
	for i := 1; i < len(extents); i++ {
		if extents[i].key == extents[i-1].key && extents[i].lo < extents[i-1].hi {
			return true
		}
	}
	return false
}

// requests is how many reads of at most size bytes the spans take.
func requests(spans []Read, size int64) int64 {
	var n int64
	for _, r := range spans {
		n += (r.Length + size - 1) / size
	}
	return n
}

// share gives an item's segments one rectangle to read (Item.Rectangle) instead of spans of
// their own when they read the same or interleaved bytes of a file — the extents of two
// segments' spans overlap — and the union of their spans, coalesced by the same cost model (no
// gap over MaxGap read through, no read more than MaxOverread times what it needs), costs less
// (its bytes, and MaxGap a request of at most SegmentReadBytes) and fits RegionBytes. A
// transpose's segments each read a band of columns, a run of a few hundred bytes from every
// source row; shared, the rows are read once, in a few requests. Segments that read bytes of
// their own, one after another (a slab, every other element), keep their spans, read as each
// segment is produced.
func (s *segmenter) share(it *Item) error {
	if len(it.Segments) < 2 || !s.interleaved(it.Segments) {
		return nil
	}
	var own, ownBytes int64
	// Each segment's spans are coalesced, so in file and offset order: the union grows by merging
	// them in, never by sorting (a transpose's segments hold a hundred thousand spans).
	union, next := s.pending[:0], s.merging[:0]
	defer func() { s.pending, s.merging = union[:0], next[:0] }()
	for i := range it.Segments {
		spans := it.Segments[i].Spans
		for _, r := range spans {
			own++
			ownBytes += r.Length
		}
		next = mergeSorted(mergeRuns(next[:0], union, spans), s.opts)
		union, next = next, union
		if s.c.tick(1) {
			return s.c.err
		}
	}
	var bytes int64
	for _, r := range union {
		bytes += r.Length
	}
	size := min(s.opts.SegmentReadBytes, s.opts.MaxRead)
	n := requests(union, size)
	if own == 0 || bytes > s.opts.RegionBytes || bytes+n*s.opts.MaxGap >= ownBytes+own*s.opts.MaxGap {
		return nil
	}
	if err := s.charge(n * readSize); err != nil {
		return err
	}
	it.Rectangle = layOut(union, size)
	for i := range it.Segments {
		s.mem -= int64(cap(it.Segments[i].Spans)) * readSize
		it.Segments[i].Spans = nil
	}
	p := s.plan
	p.ReadBytes += bytes - ownBytes
	p.ReadRequests += n - own
	s.committed = p.ReadRequests
	return nil
}

// splitRead appends r to out cut into reads of at most size bytes, in order, each landing after
// the one before (Dst), the bytes it needs counted first come first.
func splitRead(out []Read, r Read, size int64) []Read {
	needed := r.Needed
	for done := int64(0); done < r.Length; done += size {
		part := r
		part.Offset += done
		part.Dst += done
		part.Length = min(size, r.Length-done)
		part.Needed = min(part.Length, needed)
		needed -= part.Needed
		out = append(out, part)
	}
	return out
}
