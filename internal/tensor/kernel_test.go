package tensor

import (
	"math/rand/v2"
	"slices"
	"testing"
)

func TestSimplifyMergesContiguousDims(t *testing.T) {
	// A row-major 4x8 F32 copy is one run of 32 elements.
	s := Strided{Lengths: []int64{4, 8}, Src: []int64{32, 4}, Dst: []int64{32, 4}}.Simplify()
	if !slices.Equal(s.Lengths, []int64{32}) || s.Src[0] != 4 || s.Dst[0] != 4 {
		t.Errorf("row-major copy: %+v", s)
	}
	// A transpose keeps both dims.
	s = Strided{Lengths: []int64{3, 2}, Src: []int64{4, 12}, Dst: []int64{8, 4}}.Simplify()
	if len(s.Lengths) != 2 {
		t.Errorf("transpose: %+v", s)
	}
	// Length-one dims vanish; a slab of whole rows inside a wider destination merges.
	s = Strided{Lengths: []int64{1, 5, 1, 6}, Src: []int64{0, 12, 99, 2}, Dst: []int64{0, 12, 7, 2}}.Simplify()
	if !slices.Equal(s.Lengths, []int64{30}) {
		t.Errorf("slab: %+v", s)
	}
}

// Copy against an element-by-element walk, over random strides, over one buffer or split buffers.
func TestCopyMatchesElementwise(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for iter := range 500 {
		dims := r.IntN(4)
		s := Strided{}
		for range dims {
			s.Lengths = append(s.Lengths, 1+r.Int64N(5))
		}
		// Destination row-major; source strides random multiples of the element (0 = broadcast).
		size := int64(2)
		dstStride := size
		s.Dst = make([]int64, dims)
		s.Src = make([]int64, dims)
		for d := dims - 1; d >= 0; d-- {
			s.Dst[d] = dstStride
			dstStride *= s.Lengths[d]
			s.Src[d] = size * r.Int64N(7)
		}
		var span int64 = size
		for d := range dims {
			span += (s.Lengths[d] - 1) * s.Src[d]
		}
		src := make([]byte, span+100)
		for i := range src {
			src[i] = byte(r.IntN(256))
		}
		const off = 1000
		want := make([]byte, dstStride)
		var walk func(d int, so, do int64)
		walk = func(d int, so, do int64) {
			if d == dims {
				copy(want[do:do+size], src[so:so+size])
				return
			}
			for i := range s.Lengths[d] {
				walk(d+1, so+i*s.Src[d], do+i*s.Dst[d])
			}
		}
		walk(0, 0, 0)
		p, _ := NewPipeline(BF16, nil, BF16)
		for _, source := range []Source{BytesSource{Off: off, Data: src}, splitSource(off, src, 3)} {
			got := make([]byte, dstStride)
			if err := Copy(p, got, source, off, s.Simplify()); err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(got, want) {
				t.Fatalf("iter %d %+v: got %v want %v", iter, s, got, want)
			}
		}
	}
}

// splitSource cuts a buffer into pieces of a few whole elements, so runs cross buffers and Copy
// falls back to element lookups.
func splitSource(off int64, data []byte, elems int) Source {
	var parts multiSource
	n := 2 * elems
	for i := 0; i < len(data); i += n {
		parts = append(parts, BytesSource{Off: off + int64(i), Data: data[i:min(len(data), i+n)]})
	}
	return parts
}

type multiSource []BytesSource

func (m multiSource) Slice(off, n int64) []byte {
	for _, p := range m {
		if b := p.Slice(off, n); b != nil {
			return b
		}
	}
	return nil
}

func TestFill(t *testing.T) {
	b := make([]byte, 11)
	Fill(b, []byte{1, 2})
	if !slices.Equal(b, []byte{1, 2, 1, 2, 1, 2, 1, 2, 1, 2, 1}) {
		t.Errorf("%v", b)
	}
}

// The word kernels and tables give the same bytes as the byte-wise loops, aligned or not, NaNs included.
func TestWordKernelsMatchByteLoops(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, pair := range [][2]DType{{BF16, F32}, {F32, BF16}, {F8E4M3, BF16}, {BF16, BF16}, {F32, F32}, {I16, I16}} {
		p, _ := NewPipeline(pair[0], nil, pair[1])
		generic := *p
		generic.fastBF16ToF32, generic.fastF32ToBF16, generic.fastE4M3ToBF16, generic.identity = false, false, false, false
		generic.fast, generic.lut = nil, nil
		for _, shift := range []int{0, 1, 2} {
			for _, step := range []int{1, 2, 3} {
				n := 1 + r.IntN(1000)
				ss, ds := step*pair[0].Size(), pair[1].Size()
				raw := make([]byte, shift+(n-1)*ss+pair[0].Size())
				for i := range raw {
					raw[i] = byte(r.IntN(256))
				}
				src := raw[shift:]
				want, got := make([]byte, n*ds), make([]byte, n*ds)
				if pair[0] == pair[1] { // a copy keeps every byte, NaN payloads included
					copyElements(want, ds, src, ss, n, ds)
				} else {
					generic.Run(want, ds, src, ss, n)
				}
				p.Run(got, ds, src, ss, n)
				if !slices.Equal(got, want) {
					t.Fatalf("%v shift %d step %d: word kernel differs", pair, shift, step)
				}
			}
		}
	}
}

// everyOther16 (the vector kernel where the CPU has one, then the word loop) gives the byte
// loop's bytes for every length and alignment around the vector block.
func TestEveryOther16MatchesTheByteLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for n := range 200 {
		for _, shift := range []int{0, 1, 2, 3} {
			raw := make([]byte, shift+4*n)
			for i := range raw {
				raw[i] = byte(r.IntN(256))
			}
			src := raw[shift:]
			want, got, words := make([]byte, 2*n), make([]byte, 2*n), make([]byte, 2*n)
			copyElements(want, 2, src, 4, n, 2)
			everyOther16(got, src)
			everyOther16Words(words, src)
			if !slices.Equal(got, want) || !slices.Equal(words, want) {
				t.Fatalf("%d elements, shift %d: every other element differs from the byte loop", n, shift)
			}
		}
	}
}

// E4M3 to BF16 (the vector kernel where the CPU has one, the batch path for the rest) gives the
// batch path's bytes for every code at every place of a vector block, for every length around
// the block and any alignment.
func TestE4M3ToBF16MatchesTheBatchPath(t *testing.T) {
	p, _ := NewPipeline(F8E4M3, nil, BF16)
	codes := make([]byte, 256+15)
	for i := range codes {
		codes[i] = byte(i * 7) // every code, at every place mod 16
	}
	for n := range len(codes) {
		for _, shift := range []int{0, 1, 3} {
			raw := make([]byte, shift+n)
			copy(raw[shift:], codes)
			src := raw[shift:]
			want, got := make([]byte, 2*n+shift), make([]byte, 2*n+shift)
			p.runBatches(want[shift:], 2, src, 1, n)
			p.Run(got[shift:], 2, src, 1, n)
			if !slices.Equal(got, want) {
				t.Fatalf("%d codes, shift %d: differs from the batch path", n, shift)
			}
		}
	}
}

// BF16 to F32 (the vector kernel where the CPU has one, then the word loop) gives the word loop's
// bytes for every length around the vector block.
func TestBF16ToF32MatchesTheWordLoop(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	p, _ := NewPipeline(BF16, nil, F32)
	for n := range 200 {
		src := make([]byte, 2*n)
		for i := range src {
			src[i] = byte(r.IntN(256))
		}
		want, got := make([]byte, 4*n), make([]byte, 4*n)
		if n > 0 {
			bf16ToF32Words(view[uint32](want), view[uint16](src), 1)
		}
		p.Run(got, 4, src, 2, n)
		if !slices.Equal(got, want) {
			t.Fatalf("%d elements: differs from the word loop", n)
		}
	}
}
