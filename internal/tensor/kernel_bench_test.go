package tensor

import "testing"

// Kernel throughput in isolation, for development (make bench reports the end-to-end numbers).
func benchRun(b *testing.B, src, dst DType, srcStride, n int) {
	p, _ := NewPipeline(src, nil, dst)
	in := make([]byte, n*srcStride)
	out := make([]byte, n*dst.Size())
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		p.Run(out, dst.Size(), in, srcStride, n)
	}
}

func BenchmarkCopyBF16(b *testing.B)    { benchRun(b, BF16, BF16, 2, 1<<20) }
func BenchmarkStridedBF16(b *testing.B) { benchRun(b, BF16, BF16, 4, 1<<20) }
func BenchmarkBF16ToF32(b *testing.B)   { benchRun(b, BF16, F32, 2, 1<<20) }
func BenchmarkF32ToBF16(b *testing.B)   { benchRun(b, F32, BF16, 4, 1<<20) }
func BenchmarkF16ToF32(b *testing.B)    { benchRun(b, F16, F32, 2, 1<<20) }
func BenchmarkE4M3ToBF16(b *testing.B)  { benchRun(b, F8E4M3, BF16, 1, 1<<20) }
func BenchmarkBuiltinCopy2MiB(b *testing.B) {
	in, out := make([]byte, 2<<20), make([]byte, 2<<20)
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		copy(out, in)
	}
}

func BenchmarkPostOpsBF16(b *testing.B) {
	p, _ := NewPipeline(BF16, []Op{{Kind: OpMul, Value: 0.5}, {Kind: OpAdd, Value: 1}}, BF16)
	in, out := make([]byte, 2<<20), make([]byte, 2<<20)
	b.SetBytes(int64(len(out)))
	for b.Loop() {
		p.Run(out, 2, in, 2, 1<<20)
	}
}
