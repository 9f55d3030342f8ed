package tensor

import (
	"encoding/binary"
	"math"
	"testing"
)

func bf16Bytes(xs ...float32) []byte {
	out := make([]byte, 2*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint16(out[2*i:], BF16FromF32(x))
	}
	return out
}

func f32s(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// hyper_parallel's test 3: +1 is computed in BF16, then widened to F32.
func TestAddRunsInSourceDTypeBeforeWidening(t *testing.T) {
	src := make([]float32, 10)
	for i := range src {
		src[i] = F32FromBF16(BF16FromF32(float32(-3 + 6*float64(i)/9)))
	}
	p, err := NewPipeline(BF16, []Op{{Kind: OpAdd, Value: 1}}, F32)
	if err != nil {
		t.Fatal(err)
	}
	out := make([]byte, 5*4)
	p.Run(out, 4, bf16Bytes(src...), 4, 5) // every other element
	for i, got := range f32s(out) {
		want := F32FromBF16(BF16FromF32(src[2*i] + 1))
		if got != want {
			t.Errorf("element %d: got %v, want %v", i, got, want)
		}
	}
	// The bf16 rounding is visible: 255 + 1 rounds to 256 exactly, but 257 + 1 would not be 258 in
	// BF16 (258 is representable; 257 is not), so check a value whose sum is not representable.
	p2, _ := NewPipeline(BF16, []Op{{Kind: OpAdd, Value: 1}}, F32)
	out2 := make([]byte, 4)
	p2.Run(out2, 4, bf16Bytes(256), 2, 1)
	if got := f32s(out2)[0]; got != 256 { // 257 rounds to 256 (even) in BF16
		t.Errorf("256+1 in BF16 = %v, want 256", got)
	}
}

func TestOperandIsRoundedToWorkingDType(t *testing.T) {
	// 0.1 in BF16 is 0.10009765625; 1 * that, computed in f32 and rounded to BF16, is the same.
	p, _ := NewPipeline(BF16, []Op{{Kind: OpMul, Value: 0.1}}, F32)
	out := make([]byte, 4)
	p.Run(out, 4, bf16Bytes(1), 2, 1)
	if got := f32s(out)[0]; got != 0.10009765625 {
		t.Errorf("got %v", got)
	}
}

func TestPipelineErrors(t *testing.T) {
	cases := []struct {
		src DType
		ops []Op
		dst DType
		op  int
	}{
		{I32, []Op{{Kind: OpMul, Value: 2}}, F32, 0},
		{BOOL, []Op{{Kind: OpNeg}}, F32, 0},
		{F32, nil, I32, -1},
		{I64, nil, I32, -1},
		{F32, []Op{{Kind: OpCast, DType: I32}}, I32, 0},
		{I32, []Op{{Kind: OpCast, DType: F32}, {Kind: OpExp}, {Kind: OpCast, DType: U8}}, F32, 2},
	}
	for _, c := range cases {
		_, err := NewPipeline(c.src, c.ops, c.dst)
		pe, ok := err.(*PipelineError)
		if !ok || pe.Op != c.op {
			t.Errorf("NewPipeline(%s, %v, %s) = %v, want an error at op %d", c.src, c.ops, c.dst, err, c.op)
		}
	}
}

func TestCastChangesWorkingDType(t *testing.T) {
	// I32 → cast F32 → mul 0.5 → F64: exact halves.
	p, err := NewPipeline(I32, []Op{{Kind: OpCast, DType: F32}, {Kind: OpMul, Value: 0.5}}, F64)
	if err != nil {
		t.Fatal(err)
	}
	src := make([]byte, 8)
	binary.LittleEndian.PutUint32(src, uint32(0xFFFFFFFD)) // -3
	binary.LittleEndian.PutUint32(src[4:], 7)
	out := make([]byte, 16)
	p.Run(out, 8, src, 4, 2)
	a := math.Float64frombits(binary.LittleEndian.Uint64(out))
	b := math.Float64frombits(binary.LittleEndian.Uint64(out[8:]))
	if a != -1.5 || b != 3.5 {
		t.Errorf("got %v %v", a, b)
	}
	// cast to BF16 rounds, the later F32 store keeps the rounded value.
	p, _ = NewPipeline(F32, []Op{{Kind: OpCast, DType: BF16}}, F32)
	f := make([]byte, 4)
	binary.LittleEndian.PutUint32(f, 0x3F808001)
	p.Run(out, 4, f, 4, 1)
	if got := binary.LittleEndian.Uint32(out); got != 0x3F810000 {
		t.Errorf("cast BF16 gave %#x", got)
	}
}

func TestEncodeFill(t *testing.T) {
	if b, err := EncodeFill(BF16, "1"); err != nil || binary.LittleEndian.Uint16(b) != 0x3F80 {
		t.Errorf("BF16 fill 1 = %x %v", b, err)
	}
	if b, err := EncodeFill(I8, "-128"); err != nil || b[0] != 0x80 {
		t.Errorf("I8 fill -128 = %x %v", b, err)
	}
	for _, c := range []struct {
		d DType
		v string
	}{{I8, "128"}, {U8, "-1"}, {I32, "0.5"}, {BOOL, "2"}, {I64, "9223372036854775808"}, {U64, "18446744073709551616"},
		{I64, "1e999999999"}, {F32, "1e999"}} {
		if _, err := EncodeFill(c.d, c.v); err == nil {
			t.Errorf("EncodeFill(%s, %v) accepted", c.d, c.v)
		}
	}
	for _, c := range []struct {
		d    DType
		v    string
		want uint64
	}{
		{I64, "9007199254740993", 9007199254740993},
		{I64, "-9223372036854775808", 1 << 63},
		{U64, "18446744073709551615", 1<<64 - 1},
		{I32, "2.50e1", 25}, {U8, "-0", 0}, {BOOL, "1.0", 1},
	} {
		b, err := EncodeFill(c.d, c.v)
		if err != nil {
			t.Errorf("EncodeFill(%s, %s): %v", c.d, c.v, err)
			continue
		}
		if got := binary.LittleEndian.Uint64(append(b, make([]byte, 8)...)); got != c.want {
			t.Errorf("EncodeFill(%s, %s) = %#x, want %#x", c.d, c.v, got, c.want)
		}
	}
	if b, err := EncodeFill(F8E4M3, "1000"); err != nil || b[0] != 0x7F {
		t.Errorf("E4M3 fill overflow = %x %v", b, err)
	}
}

func TestBF16RoundIsRoundTo(t *testing.T) {
	for i := range uint32(1 << 20) {
		f := math.Float32frombits(i*4099 + i>>3) // spread over the whole bit space, NaNs included
		if a, b := math.Float32bits(bf16Round(f)), math.Float32bits(roundTo(BF16, f)); a != b {
			t.Fatalf("%#08x: bf16Round %#08x, roundTo %#08x", math.Float32bits(f), a, b)
		}
	}
}
