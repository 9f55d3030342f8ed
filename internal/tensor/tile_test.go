package tensor

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// reference is p without any of its fast paths: bytes copied as they are when p only copies, else
// the batch path, one element at a time.
func reference(p *Pipeline) func(dst []byte, ds int, src []byte, ss int, n int) {
	return func(dst []byte, ds int, src []byte, ss int, n int) {
		if p.identity {
			copyElements(dst, ds, src, ss, n, p.src.Size())
			return
		}
		for i := range n {
			p.runBatches(dst[i*ds:], ds, src[i*ss:], ss, 1)
		}
	}
}

// randomBox is a box of a row-major source tensor of random shape, its dimensions permuted, some
// broadcast, some large enough for several tiles, written row-major into a destination with
// padding between rows; it returns the box, the source bytes it reads and the destination size.
func randomBox(r *rand.Rand, size, dstSize int64) (s Strided, srcBytes, dstBytes int64) {
	rank := 1 + r.IntN(4)
	shape := make([]int64, rank)
	budget := int64(1 << 17)
	for d := range shape {
		shape[d] = 1 + r.Int64N(6)
		if r.IntN(3) == 0 { // past a tile, and its edge
			shape[d] = 1 + r.Int64N(min(700, budget))
		}
		budget = max(1, budget/shape[d])
	}
	strides := make([]int64, rank) // the source, row-major
	srcBytes = size
	for d := rank - 1; d >= 0; d-- {
		strides[d] = srcBytes
		srcBytes *= shape[d]
	}
	perm := r.Perm(rank)
	s.Lengths, s.Src, s.Dst = make([]int64, rank), make([]int64, rank), make([]int64, rank)
	for i, d := range perm {
		s.Lengths[i], s.Src[i] = shape[d], strides[d]
		if r.IntN(8) == 0 {
			s.Src[i] = 0
		}
	}
	dstBytes = dstSize
	for d := rank - 1; d >= 0; d-- {
		s.Dst[d] = dstBytes
		dstBytes *= s.Lengths[d]
		if r.IntN(4) == 0 { // a box inside a wider destination
			dstBytes += dstSize * r.Int64N(3)
		}
	}
	return s, srcBytes, dstBytes
}

// randomSource holds data at file offset off in one buffer, shifted off its alignment, or cut into
// pieces of random sizes (runs and tiles across pieces fall back to element lookups).
func randomSource(r *rand.Rand, off int64, data []byte, size int64) Source {
	switch r.IntN(3) {
	case 0:
		return BytesSource{Off: off, Data: data}
	case 1:
		shifted := make([]byte, len(data)+1)[1:]
		copy(shifted, data)
		return BytesSource{Off: off, Data: shifted}
	}
	var parts multiSource
	for i := int64(0); i < int64(len(data)); {
		n := size * (1 + r.Int64N(int64(len(data))/size/3+1))
		parts = append(parts, BytesSource{Off: off + i, Data: data[i:min(int64(len(data)), i+n)]})
		i += n
	}
	return parts
}

// Copy against an element-by-element walk of the reference pipeline, over random boxes of every
// element size (transposes, broadcasts, ranks 1 to 4), converting or not, over whole, misaligned and
// split buffers.
func TestCopyTiledMatchesElementwise(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	pipelines := [][2]DType{{U8, U8}, {BF16, BF16}, {F32, F32}, {F64, F64}, {BF16, F32}, {F32, BF16},
		{F8E4M3, BF16}, {F16, F32}, {I8, I64}, {F64, F16}, {BOOL, BOOL}}
	tiled := 0
	for iter := range 400 {
		pair := pipelines[iter%len(pipelines)]
		p, err := NewPipeline(pair[0], nil, pair[1])
		if err != nil {
			t.Fatal(err)
		}
		size, dstSize := int64(pair[0].Size()), int64(pair[1].Size())
		s, srcBytes, dstBytes := randomBox(r, size, dstSize)
		data := make([]byte, srcBytes)
		for i := range data {
			data[i] = byte(r.Uint32())
		}
		want := make([]byte, dstBytes)
		for i := range want {
			want[i] = 0xA5
		}
		got := slices.Clone(want)
		ref := reference(p)
		var o Odometer
		for o.Reset(s.Lengths, s.Src, s.Dst, 0, 0); ; {
			ref(want[o.Dst:], int(dstSize), data[o.Src:], int(size), 1)
			if !o.Next() {
				break
			}
		}
		const off = 1 << 20
		simple := s.Simplify()
		if len(simple.Lengths) > 0 && tiledDim(simple, size) >= 0 {
			tiled++
		}
		if err := Copy(p, got, randomSource(r, off, data, size), off, simple); err != nil {
			t.Fatal(err)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("iter %d %v→%v %+v: byte %d is %#x, want %#x", iter, pair[0], pair[1], s, i, got[i], want[i])
		}
	}
	if tiled < 100 {
		t.Errorf("only %d of the boxes were tiled", tiled)
	}
}

func firstDiff(a, b []byte) int {
	for i := range a {
		if a[i] != b[i] {
			return i
		}
	}
	return -1
}

// Every tile shape a 4096 × 4096 BF16 transpose and its neighbours cut, past the scratch sizes.
func TestTransposeSquare(t *testing.T) {
	for _, n := range []int64{1, 3, 129, 300} {
		p, _ := NewPipeline(BF16, nil, BF16)
		data := make([]byte, 2*n*n)
		for i := range data {
			data[i] = byte(i*7 + i>>8)
		}
		got := make([]byte, 2*n*n)
		s := Strided{Lengths: []int64{n, n}, Src: []int64{2, 2 * n}, Dst: []int64{2 * n, 2}}
		if err := Copy(p, got, BytesSource{Data: data}, 0, s.Simplify()); err != nil {
			t.Fatal(err)
		}
		for i := range n {
			for j := range n {
				g, w := got[2*(i*n+j):][:2], data[2*(j*n+i):][:2]
				if !slices.Equal(g, w) {
					t.Fatalf("%d × %d: [%d][%d] is %v, want %v", n, n, i, j, g, w)
				}
			}
		}
	}
}

func ExampleCopy_transpose() {
	p, _ := NewPipeline(U8, nil, U8)
	src := BytesSource{Data: []byte{1, 2, 3, 4, 5, 6}} // 2 × 3, row-major
	dst := make([]byte, 6)
	_ = Copy(p, dst, src, 0, Strided{Lengths: []int64{3, 2}, Src: []int64{1, 3}, Dst: []int64{2, 1}})
	fmt.Println(dst)
	// Output: [1 4 2 5 3 6]
}
