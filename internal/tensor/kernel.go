package tensor

import "fmt"

// Strided is a box walked in destination row-major order: for each dimension its length, and the
// byte distance one step along it moves in the source and in the destination. Steps are never
// negative; a zero source stride broadcasts.
type Strided struct {
	Lengths []int64
	Src     []int64
	Dst     []int64
}

// Simplify drops dimensions of length one and merges each dimension into the one outside it when
// both source and destination are contiguous across the pair, as NumPy's and PyTorch's iterators
// do: a row-major copy becomes one run, a transpose keeps two dimensions.
func (s Strided) Simplify() Strided { return s.SimplifyInto(Strided{}) }

// SimplifyInto is Simplify written into out's slices, which must be empty: a caller that gives them
// the capacity (three times the rank) simplifies without allocating.
func (s Strided) SimplifyInto(out Strided) Strided {
	for i, n := range s.Lengths {
		if n == 1 {
			continue
		}
		last := len(out.Lengths) - 1
		if last >= 0 && out.Src[last] == s.Src[i]*n && out.Dst[last] == s.Dst[i]*n {
			out.Lengths[last] *= n
			out.Src[last], out.Dst[last] = s.Src[i], s.Dst[i]
			continue
		}
		out.Lengths = append(out.Lengths, n)
		out.Src = append(out.Src, s.Src[i])
		out.Dst = append(out.Dst, s.Dst[i])
	}
	return out
}

// Source holds the source bytes a copy reads: Slice returns the n bytes at file offset off when one
// buffer holds them all, and nil otherwise.
type Source interface {
	Slice(off, n int64) []byte
}

// Copy runs p over every element of s (simplified), reading from src at file offset srcOff and
// writing into dst. Each innermost run is one call of p.Run when one buffer holds the run's source
// bytes, so a contiguous copy is a single copy() and a stride is a tight loop; a transpose is
// walked in tiles (tile.go).
func Copy(p *Pipeline, dst []byte, src Source, srcOff int64, s Strided) error {
	srcSize, dstSize := int64(p.src.Size()), int64(p.dst.Size())
	dims := len(s.Lengths)
	if dims == 0 { // a single element
		s = Strided{Lengths: []int64{1}, Src: []int64{srcSize}, Dst: []int64{dstSize}}
		dims = 1
	}
	if j := tiledDim(s, srcSize); j >= 0 {
		return copyTiled(p, dst, src, srcOff, s, j)
	}
	inner := dims - 1
	n, ss, ds := s.Lengths[inner], s.Src[inner], s.Dst[inner]
	return walkRuns(s, func(srcAt, dstAt int64) error {
		return copyRun(p, dst[dstAt:], src, srcOff+srcAt, n, ss, ds)
	})
}

// copyRun runs p over n elements, the first at file offset at: one call of p.Run when one buffer
// holds all their source bytes, else one per element.
func copyRun(p *Pipeline, dst []byte, src Source, at, n, ss, ds int64) error {
	size := int64(p.src.Size())
	if b := src.Slice(at, (n-1)*ss+size); b != nil {
		p.Run(dst, int(ds), b, int(ss), int(n))
		return nil
	}
	for i := range n { // the run's elements lie in different buffers
		b := src.Slice(at+i*ss, size)
		if b == nil {
			return fmt.Errorf("source bytes at offset %d were not read", at+i*ss)
		}
		p.Run(dst[i*ds:], int(ds), b, int(ss), 1)
	}
	return nil
}

// walkRuns calls run with the source and destination offsets of every innermost run of s (at
// least one dimension), advancing an odometer over the outer dimensions.
func walkRuns(s Strided, run func(srcAt, dstAt int64) error) error {
	inner := len(s.Lengths) - 1
	var o Odometer
	o.Reset(s.Lengths[:inner], s.Src[:inner], s.Dst[:inner], 0, 0)
	for {
		if err := run(o.Src, o.Dst); err != nil {
			return err
		}
		if !o.Next() {
			return nil
		}
	}
}

// Odometer steps through every index of a box in row-major order (the last dimension fastest),
// carrying two offsets along: Src and Dst move by the strides of the dimension that steps. It is
// the one index-stepping loop of the service: the copy kernel walks its runs with it, the planner
// its segments and read runs. The zero value is ready for Reset; Reset reuses Index.
//
//	o.Reset(lengths, src, dst, srcAt, dstAt)
//	for ok := true; ok; ok = o.Next() {
//		use(o.Index, o.Src, o.Dst)
//	}
type Odometer struct {
	Index    []int64 // the current index, one entry per dimension
	Src, Dst int64   // the offsets at Index
	lengths  []int64
	src, dst []int64
}

// Reset starts at index zero of a box of these lengths, each at least one (no dimensions: a
// single index), with offsets srcAt and dstAt; src and dst hold a stride per dimension.
func (o *Odometer) Reset(lengths, src, dst []int64, srcAt, dstAt int64) {
	if cap(o.Index) < len(lengths) {
		o.Index = make([]int64, len(lengths))
	}
	o.Index = o.Index[:len(lengths)]
	clear(o.Index)
	o.lengths, o.src, o.dst = lengths, src, dst
	o.Src, o.Dst = srcAt, dstAt
}

// Next steps to the following index and reports whether there is one; after the last it returns
// false with Index back at zero.
func (o *Odometer) Next() bool {
	for d := len(o.lengths) - 1; d >= 0; d-- {
		o.Index[d]++
		o.Src += o.src[d]
		o.Dst += o.dst[d]
		if o.Index[d] < o.lengths[d] {
			return true
		}
		o.Src -= o.src[d] * o.lengths[d]
		o.Dst -= o.dst[d] * o.lengths[d]
		o.Index[d] = 0
	}
	return false
}

// Fill writes pattern (one encoded element) over all of dst.
func Fill(dst, pattern []byte) {
	if len(dst) == 0 {
		return
	}
	n := copy(dst, pattern)
	for n < len(dst) {
		n += copy(dst[n:], dst[:n])
	}
}

// BytesSource is a Source over one buffer that starts at file offset Off.
type BytesSource struct {
	Off  int64
	Data []byte
}

// Slice implements Source.
func (b BytesSource) Slice(off, n int64) []byte {
	if off < b.Off || off+n > b.Off+int64(len(b.Data)) {
		return nil
	}
	return b.Data[off-b.Off : off-b.Off+n]
}
