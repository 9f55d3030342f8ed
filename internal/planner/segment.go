package planner

import (
	"fmt"
	"slices"
	"sort"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// segmenter cuts items into segments and plans each segment's reads.
type segmenter struct {
	opts     Options
	plan     *Plan
	segments int64
	fileEnds map[string]int64 // end of the last tensor of each file: aligned reads stop there
}

func rowStrides(lengths []int64, elem int64) []int64 {
	out := make([]int64, len(lengths))
	for d := len(lengths) - 1; d >= 0; d-- {
		out[d] = elem
		elem *= lengths[d]
	}
	return out
}

func tooMany(what string, n, limit int64) error {
	return &ValidationError{Errors: []FieldError{{"/tensors", fmt.Sprintf("the plan needs more than %d %s (at least %d); split the request or use a layout with longer contiguous runs", limit, what, n)}}}
}

// segment cuts an item into row-major runs of the box that are boxes themselves: fixed indices on
// the dimensions before k, a range along k, whole lengths after it, with k the outermost dimension
// whose one step fits in a segment.
func (s *segmenter) segment(spec *tensorSpec, it *Item) error {
	elem := int64(spec.dtype.Size())
	rank := len(it.Lengths)
	if rank == 0 {
		return s.emit(spec, it, nil, nil, it.Output)
	}
	step := rowStrides(it.Lengths, elem)
	k := 0
	for k < rank-1 && step[k] > s.opts.SegmentBytes {
		k++
	}
	chunk := max(1, s.opts.SegmentBytes/step[k])
	idx := make([]int64, k) // odometer over the dimensions before k
	for {
		var out int64
		for a := range k {
			out += idx[a] * step[a]
		}
		for j := int64(0); j < it.Lengths[k]; j += chunk {
			off := slices.Clone(it.Offsets)
			lens := slices.Clone(it.Lengths)
			for a := range k {
				off[a] += idx[a]
				lens[a] = 1
			}
			off[k] += j
			lens[k] = min(chunk, it.Lengths[k]-j)
			if err := s.emit(spec, it, off, lens, it.Output+out+j*step[k]); err != nil {
				return err
			}
		}
		a := k - 1
		for ; a >= 0; a-- {
			if idx[a]++; idx[a] < it.Lengths[a] {
				break
			}
			idx[a] = 0
		}
		if a < 0 {
			return nil
		}
	}
}

// emit plans one segment, halving it while it would read more than SegmentReadBytes.
func (s *segmenter) emit(spec *tensorSpec, it *Item, off, lens []int64, out int64) error {
	if s.segments++; s.segments > s.opts.MaxReads {
		return tooMany("segments", s.segments, s.opts.MaxReads)
	}
	seg, needed, err := s.build(spec, off, lens, out)
	if err != nil {
		return err
	}
	var spanBytes int64
	for _, r := range seg.Spans {
		spanBytes += r.Length
	}
	if spanBytes > s.opts.SegmentReadBytes {
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
			loBytes, _ := product(lo)
			return s.emit(spec, it, hiOff, hi, out+loBytes*int64(spec.dtype.Size()))
		}
	}
	p := s.plan
	p.NeededBytes += needed
	for _, list := range [][]Read{seg.Direct, seg.Spans} {
		for _, r := range list {
			p.ReadBytes += r.Length
			p.ReadRequests += (r.Length + s.opts.MaxRead - 1) / s.opts.MaxRead
		}
	}
	if p.ReadRequests > s.opts.MaxReads {
		return tooMany("reads", p.ReadRequests, s.opts.MaxReads)
	}
	it.Segments = append(it.Segments, seg)
	return nil
}

// build plans the copies and reads of one segment and returns the source bytes it depends on.
func (s *segmenter) build(spec *tensorSpec, off, lens []int64, out int64) (Segment, int64, error) {
	elem := int64(spec.dtype.Size())
	total, _ := product(lens)
	seg := Segment{Output: out, Bytes: total * elem}
	dstStrides := rowStrides(lens, elem)
	var spans []Read
	var covered, needed int64
	for i := range spec.blocks {
		b := &spec.blocks[i]
		o, l, ok := intersect(off, lens, b.Offsets, b.Lengths)
		if !ok {
			continue
		}
		n, _ := product(l)
		covered += n
		src, dst := b.baseOffset, int64(0)
		for a := range l {
			src += (o[a] - b.Offsets[a]) * b.srcStrides[a]
			dst += (o[a] - off[a]) * dstStrides[a]
		}
		srcElem := int64(b.src.DType.Size())
		if b.nibbles {
			srcElem = 1 // addresses count nibbles
		}
		layout := tensor.Strided{Lengths: l, Src: b.srcStrides, Dst: dstStrides}.Simplify()
		if b.nibbles {
			needed += (touched(layout.Lengths, layout.Src) + 1) / 2
		} else {
			needed += touched(layout.Lengths, layout.Src) * srcElem
		}
		if run, ok := directRun(layout, srcElem, b.pipeline.Identity()); ok && !b.nibbles && run >= s.opts.MaxGap {
			runs, err := s.runs(layout.Lengths[:max(0, len(layout.Lengths)-1)], layout.Src, layout.Dst, src, dst)
			if err != nil {
				return seg, 0, err
			}
			for _, r := range runs {
				seg.Direct = append(seg.Direct, Read{Key: b.src.Key, Version: b.src.Version, Offset: r[0], Length: run, Dst: r[1], Needed: run})
			}
			continue
		}
		seg.Copies = append(seg.Copies, Copy{Pipeline: b.pipeline, Key: b.src.Key, Src: src, Dst: dst, Layout: layout, Nibbles: b.nibbles})
		sp, err := s.spans(layout, src, srcElem)
		if err != nil {
			return seg, 0, err
		}
		if b.nibbles { // nibble ranges to the bytes that hold them
			for i, r := range sp {
				lo, hi := r[0]>>1, (r[0]+r[1]+1)>>1
				sp[i] = [3]int64{lo, hi - lo, (r[2] + 1) / 2}
			}
		}
		spans = append(spans, s.reads(b.src, sp)...)
	}
	if d := spec.deferred; d != nil {
		plan := s.dequantSegment
		switch {
		case d.mx != nil:
			plan = s.mxfp4Segment
		case d.lora != nil:
			plan = s.loraSegment
		}
		n, sp, err := plan(d, off, lens, &seg)
		if err != nil {
			return seg, 0, err
		}
		needed += n
		covered = total
		spans = append(spans, sp...)
	}
	if covered < total {
		seg.Fill = spec.fill
	}
	seg.Spans = coalesce(spans, s.opts)
	return seg, needed, nil
}

// reads turns a tensor's byte ranges (offset, length, needed) into reads, aligned to the cache's
// chunks when the cache is on.
func (s *segmenter) reads(t *checkpoint.Tensor, ranges [][3]int64) []Read {
	out := make([]Read, len(ranges))
	for i, r := range ranges {
		off, end := r[0], r[0]+r[1]
		if a := s.opts.Align; a > 0 {
			off, end = off/a*a, min((end+a-1)/a*a, s.fileEnds[t.Key])
		}
		out[i] = Read{Key: t.Key, Version: t.Version, Offset: off, Length: end - off, Needed: r[2]}
	}
	return out
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

// runs enumerates the (source, destination) offsets of every index of the given outer dimensions.
func (s *segmenter) runs(lengths, src, dst []int64, srcAt, dstAt int64) ([][2]int64, error) {
	count, _ := product(lengths)
	if count > s.opts.MaxReads {
		return nil, tooMany("reads", count, s.opts.MaxReads)
	}
	out := make([][2]int64, 0, count)
	idx := make([]int64, len(lengths))
	for {
		out = append(out, [2]int64{srcAt, dstAt})
		d := len(lengths) - 1
		for ; d >= 0; d-- {
			idx[d]++
			srcAt += src[d]
			dstAt += dst[d]
			if idx[d] < lengths[d] {
				break
			}
			srcAt -= src[d] * lengths[d]
			dstAt -= dst[d] * lengths[d]
			idx[d] = 0
		}
		if d < 0 {
			return out, nil
		}
	}
}

// worthMerging is the cost model: reading a gap costs its bytes, another request costs MaxGap
// bytes, and no merged read may exceed MaxOverread times what it needs.
func worthMerging(opts Options, gap, extent, needed int64) bool {
	return gap <= opts.MaxGap && (opts.MaxOverread == 0 || extent <= opts.MaxOverread*needed)
}

// spans returns the byte ranges (offset, length, needed) of the file a copy touches, merging
// along dimensions, smallest source stride first, while the cost model says so.
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
	for i, d := range outer {
		lengths[i], strides[i] = l.Lengths[d], l.Src[d]
	}
	starts, err := s.runs(lengths, strides, make([]int64, len(outer)), src, 0)
	if err != nil {
		return nil, err
	}
	out := make([][3]int64, len(starts))
	for i, st := range starts {
		out[i] = [3]int64{st[0], extent, min(extent, needed)}
	}
	return out, nil
}

// coalesce sorts reads by file and offset and merges those that overlap, and those the cost model
// says are cheaper read as one.
func coalesce(reads []Read, opts Options) []Read {
	if len(reads) == 0 {
		return nil
	}
	slices.SortFunc(reads, func(a, b Read) int {
		if a.Key != b.Key {
			if a.Key < b.Key {
				return -1
			}
			return 1
		}
		return int(min(max(a.Offset-b.Offset, -1), 1))
	})
	out := []Read{reads[0]}
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

// SplitReads cuts a read into requests of at most maxRead bytes.
func SplitReads(r Read, maxRead int64) []Read {
	var out []Read
	for done := int64(0); done < r.Length || len(out) == 0; done += maxRead {
		part := r
		part.Offset += done
		part.Dst += done
		part.Length = min(maxRead, r.Length-done)
		out = append(out, part)
	}
	return out
}
