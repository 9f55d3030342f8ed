package tensor

import (
	"encoding/binary"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
)

// allCodes is every code of a 1- or 2-byte dtype, little-endian, in order.
func allCodes(size int) []byte {
	b := make([]byte, size<<(8*size))
	for i := range 1 << (8 * size) {
		b[i*size] = byte(i)
		if size == 2 {
			b[i*size+1] = byte(i >> 8)
		}
	}
	return b
}

// randomOps is a chain of up to four post ops with operands that reach the corners: NaN, ±inf,
// ±0, subnormals, values that overflow the narrow dtypes, and casts between the floats.
func randomOps(r *rand.Rand) []Op {
	values := []float64{math.NaN(), math.Inf(1), math.Inf(-1), 0, math.Copysign(0, -1), 1e-40, 3e-8, 0.1, 0.5,
		1, -1, 3, 1000, 65504, 70000, 1e30, -2.5}
	casts := []DType{F32, BF16, F16, F8E4M3, F8E5M2, F64}
	var ops []Op
	for range r.IntN(5) {
		switch k := OpKind(1 + r.IntN(5)); k {
		case OpCast:
			ops = append(ops, Op{Kind: k, DType: casts[r.IntN(len(casts))]})
		case OpMul, OpAdd:
			v := values[r.IntN(len(values))]
			if r.IntN(2) == 0 {
				v = r.NormFloat64() * math.Pow(10, float64(r.IntN(9)-4))
			}
			ops = append(ops, Op{Kind: k, Value: v})
		default:
			ops = append(ops, Op{Kind: k})
		}
	}
	return ops
}

// The table gives, for every source code, the bytes the batch path gives, bit for bit (NaN
// payloads, signed zeros, rounding), over random chains from every 1- and 2-byte float (and
// the integers), contiguous, strided and misaligned.
func TestLUTMatchesBatchPath(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	srcs := []DType{BF16, F16, F8E4M3, F8E5M2, F8E8M0, U8, I8, BOOL, I16, U16}
	dsts := []DType{BF16, F16, F32, F8E4M3, F8E5M2, I16, U8}
	checked := map[[2]DType]int{}
	for iter := 0; iter < 400; iter++ {
		src, dst := srcs[iter%len(srcs)], dsts[r.IntN(len(dsts))]
		ops := randomOps(r)
		if iter%7 == 0 {
			ops = nil
		}
		p, err := NewPipeline(src, ops, dst)
		if err != nil {
			continue
		}
		if p.lut == nil {
			if !p.identity && !p.fastBF16ToF32 {
				t.Fatalf("%v %v %v has no table", src, ops, dst)
			}
			continue
		}
		in, out := src.Size(), dst.Size()
		codes := allCodes(in)
		n := len(codes) / in
		want := make([]byte, n*out)
		p.runBatches(want, out, codes, in, n)
		got := make([]byte, n*out)
		// Enough elements to build the table (looked up directly: a vector kernel may run the
		// contiguous codes of its chain without it).
		if !p.lut.run(p, got, out, codes, in, n) || p.lut.table.Load() == nil {
			t.Fatalf("%v %v %v: %d elements did not build the table", src, ops, dst, n)
		}
		if i := firstDiff(got, want); i >= 0 {
			t.Fatalf("%v %v %v: code %d gives %x, the batch path %x", src, ops, dst, i/out,
				got[i/out*out:][:out], want[i/out*out:][:out])
		}
		// Every third code, into every other destination element, the source and the destination
		// off their alignment (the batch path then runs them).
		for _, shift := range []int{0, 1} {
			m := n / 3
			srcBuf := make([]byte, shift+(m-1)*3*in+in)[shift:]
			for i := range m {
				copy(srcBuf[3*i*in:], codes[3*i*in:][:in])
			}
			dstBuf := make([]byte, shift+2*m*out)[shift:]
			p.Run(dstBuf, 2*out, srcBuf, 3*in, m)
			for i := range m {
				if g, w := dstBuf[2*i*out:][:out], want[3*i*out:][:out]; !slices.Equal(g, w) {
					t.Fatalf("%v %v %v shift %d: code %d strided gives %x, want %x", src, ops, dst, shift, 3*i, g, w)
				}
			}
		}
		checked[[2]DType{src, dst}]++
	}
	if len(checked) < 30 {
		t.Errorf("only %d dtype pairs checked: %v", len(checked), checked)
	}
}

// All 256 FP8 codes decode through the table, and through Copy (a vector kernel where there is
// one), to what the batch path gives (NaN included).
func TestFP8DecodesAllCodes(t *testing.T) {
	codes := allCodes(1)
	for _, src := range []DType{F8E4M3, F8E5M2} {
		for _, dst := range []DType{BF16, F16, F32} {
			p, _ := NewPipeline(src, nil, dst)
			out := dst.Size()
			want, got := make([]byte, 256*out), make([]byte, 256*out)
			p.runBatches(want, out, codes, 1, 256)
			if err := Copy(p, got, BytesSource{Data: codes}, 0, Strided{Lengths: []int64{256}, Src: []int64{1},
				Dst: []int64{int64(out)}}); err != nil {
				t.Fatal(err)
			}
			table := make([]byte, 256*out)
			if !p.lut.run(p, table, out, codes, 1, 256) || !slices.Equal(table, want) || !slices.Equal(got, want) {
				t.Errorf("%v → %v: the table differs from the batch path", src, dst)
			}
		}
	}
	// E4M3 0x38 is 1, 0x7F NaN: BF16 0x3F80 and the canonical 0x7FC0.
	p, _ := NewPipeline(F8E4M3, nil, BF16)
	got := make([]byte, 4)
	p.Run(got, 2, []byte{0x38, 0x7F}, 1, 2)
	if a, b := binary.LittleEndian.Uint16(got), binary.LittleEndian.Uint16(got[2:]); a != 0x3F80 || b != 0x7FC0 {
		t.Errorf("E4M3 1 and NaN gave %#x %#x", a, b)
	}
}

// Small runs never build a table; once a chain has run over as many elements as the table has
// entries (across its pipelines) it is built once, and concurrent runs all get the same bytes.
func TestLUTBuiltLazilyOnce(t *testing.T) {
	ops := []Op{{Kind: OpMul, Value: 1.0078125}, {Kind: OpAdd, Value: -0.3}} // a chain no other test uses
	p1, _ := NewPipeline(BF16, ops, F16)
	p2, _ := NewPipeline(BF16, ops, F16)
	if p1.lut != p2.lut {
		t.Fatal("two pipelines of one chain have two tables")
	}
	codes := allCodes(2)
	want := make([]byte, len(codes))
	p1.runBatches(want, 2, codes, 2, len(codes)/2)
	got := make([]byte, len(codes))
	for i := 0; i < 1<<16-1000; i += 1000 { // just under 65,536 elements, through both pipelines
		[]*Pipeline{p1, p2}[i/1000%2].Run(got[2*i:], 2, codes[2*i:], 2, 1000)
	}
	if p1.lut.table.Load() != nil {
		t.Fatal("the table was built before the chain ran over 65,536 elements")
	}
	var wg sync.WaitGroup
	outs := make([][]byte, 4)
	for g := range outs {
		wg.Go(func() {
			outs[g] = make([]byte, len(codes))
			for i := 0; i < len(codes)/2; i += 4096 {
				p2.Run(outs[g][2*i:], 2, codes[2*i:], 2, 4096)
			}
		})
	}
	wg.Wait()
	if p1.lut.table.Load() == nil {
		t.Fatal("the table was not built")
	}
	for g, out := range outs {
		if i := firstDiff(out, want); i >= 0 {
			t.Fatalf("goroutine %d: code %d differs", g, i/2)
		}
	}
}
