package tensor

import (
	"math/rand/v2"
	"testing"
)

// Kernel throughput in isolation, for development (make bench reports the end-to-end numbers). Every
// benchmark writes benchOut bytes through Copy from buffers larger than the CPU caches, so its MB/s
// divided by BenchmarkCopy32MiB's, taken in the same run, is its ratio to copy().
const benchOut = 32 << 20

// benchInput is n bytes of BF16 values spread like weights (normal, σ 0.02), so table lookups touch
// as many entries as real tensors do rather than one.
func benchInput(n int) []byte {
	r := rand.New(rand.NewPCG(5, 6))
	b := make([]byte, n)
	for i := 0; i+1 < n; i += 2 {
		h := BF16FromF32(float32(r.NormFloat64() * 0.02))
		b[i], b[i+1] = byte(h), byte(h>>8)
	}
	return b
}

func benchCopy(b *testing.B, from DType, ops []Op, to DType, srcBytes int, s Strided) {
	p, err := NewPipeline(from, ops, to)
	if err != nil {
		b.Fatal(err)
	}
	src := BytesSource{Data: benchInput(srcBytes)}
	dst := benchInput(benchOut) // touched, so no page faults are timed
	s = s.Simplify()
	if err := Copy(p, dst, src, 0, s); err != nil { // the steady state: a chain's table is built once a process
		b.Fatal(err)
	}
	b.SetBytes(benchOut)
	for b.Loop() {
		if err := Copy(p, dst, src, 0, s); err != nil {
			b.Fatal(err)
		}
	}
}

// contiguous is a row-major run of benchOut bytes of dtype to.
func contiguous(from, to DType) Strided {
	n := int64(benchOut / to.Size())
	return Strided{Lengths: []int64{n}, Src: []int64{int64(from.Size())}, Dst: []int64{int64(to.Size())}}
}

func BenchmarkCopy32MiB(b *testing.B) {
	in, out := benchInput(benchOut), benchInput(benchOut)
	b.SetBytes(benchOut)
	for b.Loop() {
		copy(out, in)
	}
}

func BenchmarkTranspose4096BF16(b *testing.B) {
	const side = 4096 // 4096 × 4096 BF16 is benchOut bytes
	benchCopy(b, BF16, nil, BF16, benchOut,
		Strided{Lengths: []int64{side, side}, Src: []int64{2, 2 * side}, Dst: []int64{2 * side, 2}})
}

func BenchmarkTranspose4096F32ToBF16(b *testing.B) {
	const side = 4096
	benchCopy(b, F32, nil, BF16, 2*benchOut,
		Strided{Lengths: []int64{side, side}, Src: []int64{4, 4 * side}, Dst: []int64{2 * side, 2}})
}

func BenchmarkPostOpsMulAddBF16(b *testing.B) {
	benchCopy(b, BF16, []Op{{Kind: OpMul, Value: 0.5}, {Kind: OpAdd, Value: 1}}, BF16, benchOut, contiguous(BF16, BF16))
}

func BenchmarkEveryOtherBF16(b *testing.B) {
	benchCopy(b, BF16, nil, BF16, 2*benchOut,
		Strided{Lengths: []int64{benchOut / 2}, Src: []int64{4}, Dst: []int64{2}})
}

func BenchmarkE4M3ToBF16(b *testing.B) {
	benchCopy(b, F8E4M3, nil, BF16, benchOut/2, contiguous(F8E4M3, BF16))
}

func BenchmarkBF16ToF32(b *testing.B) {
	benchCopy(b, BF16, nil, F32, benchOut/2, contiguous(BF16, F32))
}
func BenchmarkF32ToBF16(b *testing.B) {
	benchCopy(b, F32, nil, BF16, 2*benchOut, contiguous(F32, BF16))
}
func BenchmarkF16ToF32(b *testing.B) { benchCopy(b, F16, nil, F32, benchOut/2, contiguous(F16, F32)) }
