package planner

import (
	"bytes"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// within is a source that holds the bytes of data from start and before end only.
type within struct {
	tensor.BytesSource
	start, end int64
}

func (b within) Slice(off, n int64) []byte {
	if off < b.start || off+n > b.end {
		return nil
	}
	return b.BytesSource.Slice(off, n)
}

// A strided copy's bands, each given only the source bytes from its Start to its End, write
// together what the whole copy writes, and end in the order they come in: random views (permuted,
// stepped, broadcast dimensions) of random sources, converted or not, cut into bands of random
// sizes.
func TestBandsWriteWhatTheCopyWritesFromBytesBeforeTheirEnds(t *testing.T) {
	pairs := [][2]tensor.DType{{tensor.BF16, tensor.BF16}, {tensor.BF16, tensor.F32}, {tensor.F8E4M3, tensor.BF16},
		{tensor.F32, tensor.F32}, {tensor.U8, tensor.U8}}
	cut := 0
	for seed := range uint64(500) {
		r := rand.New(rand.NewPCG(seed, 7))
		from, to := pairs[r.IntN(len(pairs))][0], pairs[r.IntN(len(pairs))][1]
		if !tensor.CanConvert(from, to) {
			from = to
		}
		p, err := tensor.NewPipeline(from, nil, to)
		if err != nil {
			t.Fatal(err)
		}
		in, out := int64(from.Size()), int64(to.Size())
		rank := 1 + r.IntN(3)
		lengths := make([]int64, rank)
		for d := range lengths {
			lengths[d] = 1 + r.Int64N(40)
		}
		// The source is the lengths in another order, row-major, each dimension walked with a
		// step of 1 or 2, or broadcast.
		order := r.Perm(rank)
		src, dst := make([]int64, rank), make([]int64, rank)
		stride := in
		for k := rank - 1; k >= 0; k-- {
			d := order[k]
			step := []int64{0, 1, 1, 2}[r.IntN(4)]
			src[d] = stride * step
			stride *= lengths[d] * max(step, 1)
		}
		stride = out
		for d := rank - 1; d >= 0; d-- {
			dst[d] = stride
			stride *= lengths[d]
		}
		const begin = 100
		extent := begin + in
		for d := range lengths {
			extent += (lengths[d] - 1) * src[d]
		}
		data := make([]byte, extent)
		for i := range data {
			data[i] = byte(r.IntN(256))
		}
		layout := tensor.Strided{Lengths: lengths, Src: src, Dst: dst}.Simplify()
		c := &stridedCopy{pipeline: p, source: &checkpoint.Tensor{Key: "f", Tensor: safetensors.Tensor{DType: from}},
			src: begin, layout: layout}
		whole := tensor.BytesSource{Data: data}
		want := make([]byte, stride)
		if err := c.Run(want, func(string) tensor.Source { return whole }); err != nil {
			t.Fatal(err)
		}
		size := 1 + r.Int64N(512)
		bands := c.Bands(size, nil)
		if len(bands) > 1 {
			cut++
		}
		if bands[0].Start != begin {
			t.Fatalf("seed %d: the first band of %v starts at %d, not at the copy's first byte %d", seed, layout,
				bands[0].Start, begin)
		}
		got := make([]byte, stride)
		for i, b := range bands {
			if b.Key != "f" || i > 0 && b.End < bands[i-1].End {
				t.Fatalf("seed %d: band %d of %v ends at %s@%d, after one at %d", seed, i, layout, b.Key, b.End,
					bands[max(i-1, 0)].End)
			}
			if err := b.Kernel.Run(got, func(string) tensor.Source { return within{whole, b.Start, b.End} }); err != nil {
				t.Fatalf("seed %d: band %d of %v (bands of %d bytes): %v", seed, i, layout, size, err)
			}
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("seed %d: the %d bands of %v (of %d bytes) wrote other bytes than the copy", seed, len(bands),
				layout, size)
		}
	}
	if cut < 100 {
		t.Errorf("only %d of 500 copies were cut into bands", cut)
	}
}

// A copy whose source fits one band is itself; one that does not is cut into parts in order.
func TestBandsOfASmallCopyIsTheCopy(t *testing.T) {
	p, _ := tensor.NewPipeline(tensor.BF16, nil, tensor.BF16)
	c := &stridedCopy{pipeline: p, source: &checkpoint.Tensor{Key: "f", Tensor: safetensors.Tensor{DType: tensor.BF16}},
		src: 10, layout: tensor.Strided{Lengths: []int64{64}, Src: []int64{4}, Dst: []int64{2}}}
	if bands := c.Bands(256, nil); len(bands) != 1 || bands[0].Kernel != c || bands[0].End != 10+63*4+2 {
		t.Errorf("a copy reading 254 bytes in bands of 256: %+v", bands)
	}
	if bands := c.Bands(64, nil); len(bands) != 4 || !slices.IsSortedFunc(bands, func(a, b Band) int {
		return int(a.End - b.End)
	}) {
		t.Errorf("a copy reading 254 bytes in bands of 64: %d bands", len(bands))
	}
}
