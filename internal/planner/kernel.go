package planner

import (
	"fmt"
	"slices"
	"sort"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// A Kernel writes part of a segment from source bytes: a strided copy of a block overlap, or a
// box of a completion. The planner emits each segment's kernels and plans the reads of the
// regions their Sources name; the executor reads them and runs the kernels in order, all alike.
type Kernel interface {
	// Sources appends the regions of source tensors the kernel reads to dst.
	Sources(dst []Region) []Region
	// Run writes the kernel's output into the segment buffer seg from the bytes read for it.
	Run(seg []byte, files Files) error
	// String describes the kernel in one line, for plan dumps and tests.
	String() string
}

// Bander is a kernel that can run in parts as its source bytes arrive, so a part reads bytes
// read a moment before, still in the cache, and a kernel need not wait for all of its reads.
type Bander interface {
	// Bands appends to dst the parts of the kernel that read about size source bytes each, in
	// the order of the file offsets their bytes end at. Together they write what Run writes.
	Bands(size int64, dst []Band) []Band
}

// Band is a part of a kernel that reads bytes of file Key from offset Start and before End only.
type Band struct {
	Key        string
	Start, End int64
	Kernel     Kernel
}

// Files finds a file's bytes, by store key, among those read for a segment.
type Files func(key string) tensor.Source

// Region is a strided part of one source tensor: the file offset of its first element and, per
// dimension, a length and a byte stride. With Nibbles the tensor is packed F4 and Start and the
// strides count half bytes. The planner reads a region as it is given: simplify it first.
type Region struct {
	Tensor  *checkpoint.Tensor
	Start   int64
	Lengths []int64
	Strides []int64
	Elem    int64 // bytes of one element (1 with Nibbles)
	Nibbles bool
}

// region is a Region with its length-one dimensions dropped and each dimension merged into the
// one outside it where the source is contiguous across the pair, as completions read them.
func region(t *checkpoint.Tensor, start, elem int64, lengths, strides []int64) Region {
	s := tensor.Strided{Lengths: lengths, Src: strides, Dst: make([]int64, len(lengths))}.Simplify()
	return Region{Tensor: t, Start: start, Lengths: s.Lengths, Strides: s.Src, Elem: elem}
}

// stridedCopy moves one block overlap (or consecutive overlaps fused) from the read buffers into
// the segment buffer through the block's conversion.
type stridedCopy struct {
	pipeline *tensor.Pipeline
	source   *checkpoint.Tensor
	src      int64 // file offset of the overlap's first element (in nibbles when nibbles)
	dst      int64 // offset in the segment buffer
	layout   tensor.Strided
	// nibbles: the source is packed F4; src and the layout's source strides count half bytes.
	nibbles bool
}

func (c *stridedCopy) Sources(dst []Region) []Region {
	elem := int64(c.source.DType.Size())
	if c.nibbles {
		elem = 1
	}
	return append(dst, Region{Tensor: c.source, Start: c.src, Lengths: c.layout.Lengths, Strides: c.layout.Src,
		Elem: elem, Nibbles: c.nibbles})
}

func (c *stridedCopy) Run(seg []byte, files Files) error {
	copyFn := tensor.Copy
	if c.nibbles {
		copyFn = tensor.CopyNibbles
	}
	if err := copyFn(c.pipeline, seg[c.dst:], files(c.source.Key), c.src, c.layout); err != nil {
		return fmt.Errorf("the plan did not read what a copy needs: %w", err)
	}
	return nil
}

// Bands cuts the copy along the dimension that strides furthest in the source: each part's
// bytes then end after the part's before it. A copy of nibbles is one part.
func (c *stridedCopy) Bands(size int64, dst []Band) []Band {
	l := c.layout
	elem := int64(c.source.DType.Size())
	extent := elem // from the first source byte to the last, plus one
	cut := -1
	for d := range l.Lengths {
		extent += (l.Lengths[d] - 1) * l.Src[d]
		if l.Src[d] > 0 && (cut < 0 || l.Src[d] > l.Src[cut]) {
			cut = d
		}
	}
	if c.nibbles || cut < 0 || l.Lengths[cut]*l.Src[cut] <= size {
		start, end := c.src, c.src+extent
		if c.nibbles {
			start, end = c.src/2, (c.src+extent+1)/2
		}
		return append(dst, Band{Key: c.source.Key, Start: start, End: end, Kernel: c})
	}
	rows, step := l.Lengths[cut], l.Src[cut]
	per := max(1, size/step)
	for at := int64(0); at < rows; at += per {
		part := tensor.Strided{Lengths: slices.Clone(l.Lengths), Src: l.Src, Dst: l.Dst}
		part.Lengths[cut] = min(per, rows-at)
		sub := &stridedCopy{pipeline: c.pipeline, source: c.source, src: c.src + at*step, dst: c.dst + at*l.Dst[cut],
			layout: part.Simplify()}
		dst = append(dst, Band{Key: c.source.Key, Start: sub.src, End: sub.src + extent - (rows-part.Lengths[cut])*step,
			Kernel: sub})
	}
	return dst
}

func (c *stridedCopy) String() string {
	unit, conv := "", "as is"
	if c.nibbles {
		unit = " nibbles"
	}
	if !c.pipeline.Identity() {
		conv = "converted"
	}
	return fmt.Sprintf("copy %s %s@%d%s -> %d lengths %v src %v dst %v %s", c.source.DTypeName, c.source.Name,
		c.src-c.base(), unit, c.dst, c.layout.Lengths, c.layout.Src, c.layout.Dst, conv)
}

// base is the file offset of the source tensor's first element, in the unit of src.
func (c *stridedCopy) base() int64 {
	if c.nibbles {
		return 2 * c.source.Begin
	}
	return c.source.Begin
}

// SpanFiles is how kernels find their source bytes in buf once reads have landed there at their
// Dst: a segment's Spans in its gather buffer, or its item's Rectangle in the item's.
func SpanFiles(reads []Read, buf []byte) Files {
	return func(key string) tensor.Source { return spanSource{reads: reads, buf: buf, key: key} }
}

// spanSource finds a file's bytes among a segment's span reads, sorted by file and offset.
type spanSource struct {
	reads []Read
	buf   []byte
	key   string
}

func (s spanSource) Slice(off, n int64) []byte {
	i := sort.Search(len(s.reads), func(i int) bool {
		r := &s.reads[i]
		return r.Key > s.key || r.Key == s.key && r.Offset+r.Length > off
	})
	if i == len(s.reads) || s.reads[i].Key != s.key || off < s.reads[i].Offset {
		return nil
	}
	first := &s.reads[i]
	at := first.Dst + off - first.Offset
	// The bytes lie in buf as one run as far as the reads after the first continue it in the file
	// and in buf (the parts of one span).
	end := first.Offset + first.Length
	for j := i + 1; end < off+n && j < len(s.reads); j++ {
		r := &s.reads[j]
		if r.Key != s.key || r.Offset != end || r.Dst != first.Dst+end-first.Offset {
			break
		}
		end += r.Length
	}
	if off+n > end {
		return nil
	}
	return s.buf[at : at+n]
}
