package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
	"strconv"
	"strings"
)

// OpKind names a post op of docs/numerics.md.
type OpKind uint8

// The post ops.
const (
	OpNeg OpKind = iota + 1
	OpMul
	OpAdd
	OpExp
	OpCast
)

var opNames = map[string]OpKind{"neg": OpNeg, "mul": OpMul, "add": OpAdd, "exp": OpExp, "cast": OpCast}

// ParseOpKind reads an op name of the wire contract.
func ParseOpKind(name string) (OpKind, bool) {
	k, ok := opNames[name]
	return k, ok
}

func (k OpKind) String() string {
	for n, v := range opNames {
		if v == k {
			return n
		}
	}
	return fmt.Sprintf("OpKind(%d)", uint8(k))
}

// Op is one elementwise post op: Value is the operand of mul and add, DType the target of cast.
type Op struct {
	Kind  OpKind
	Value float64
	DType DType
}

// PipelineError says which step of a pipeline is impossible: Op is the index of the post op, or -1
// for the final conversion into the destination dtype.
type PipelineError struct {
	Op  int
	Msg string
}

func (e *PipelineError) Error() string { return e.Msg }

// kind is how values are held while a pipeline works on them.
type kind uint8

const (
	kindF32 kind = iota // F16, BF16, F32 and decoded FP8, rounded to the working dtype after each op
	kindF64
	kindI64 // signed integers
	kindU64 // unsigned integers and BOOL
)

func kindOf(d DType) kind {
	switch {
	case d == F64:
		return kindF64
	case d.IsFloat():
		return kindF32
	case d.isSigned():
		return kindI64
	}
	return kindU64
}

type step struct {
	final bool // the conversion into the destination dtype, whose encoder rounds by itself
	op    OpKind
	to    DType   // working dtype after the step
	round DType   // for kindF32 steps: the dtype results are rounded to
	v32   float32 // operand rounded to the working dtype
	v64   float64
}

// Pipeline moves elements of one dtype into another through post ops: it decodes the source
// value, applies each op in the working dtype, and converts the result as PyTorch's copy_ does.
// A Pipeline is immutable and safe for concurrent use.
type Pipeline struct {
	src, dst DType
	steps    []step // the ops, then a cast to dst
	identity bool   // same dtype and no ops: a byte copy
	fast     func(dst []byte, dstStride int, src []byte, srcStride int, n int)
	// Conversions the word kernels do without any op in between.
	fastBF16ToF32, fastF32ToBF16, fastE4M3ToBF16 bool
	lut                                          *lut // the chain's lookup table (lut.go), nil when it has none
}

// NewPipeline checks src → ops → dst against docs/numerics.md and compiles it.
func NewPipeline(src DType, ops []Op, dst DType) (*Pipeline, error) {
	// BOOL is never a plain copy: a checkpoint byte other than 0 or 1 still goes out as 1.
	p := &Pipeline{src: src, dst: dst, identity: src == dst && len(ops) == 0 && src != BOOL}
	work := src
	if work.decodesToF32() {
		work = F32 // no arithmetic in FP8
	}
	for i, op := range ops {
		switch op.Kind {
		case OpNeg, OpMul, OpAdd, OpExp:
			if !work.IsFloat() {
				return nil, &PipelineError{
					i,
					fmt.Sprintf(
						"%s needs a float working dtype, the values are %s here: cast them first",
						op.Kind,
						work,
					),
				}
			}
			s := step{op: op.Kind, to: work, round: work, v64: op.Value}
			if work != F64 {
				s.v32 = roundTo(work, float32(op.Value))
			}
			p.steps = append(p.steps, s)
		case OpCast:
			if !op.DType.valid() {
				return nil, &PipelineError{i, "cast needs a dtype"}
			}
			if !CanConvert(work, op.DType) {
				return nil, &PipelineError{
					i,
					fmt.Sprintf(
						"cannot cast %s to %s: only float to float, integer or BOOL to float, and lossless integer widening are allowed",
						work,
						op.DType,
					),
				}
			}
			p.steps = append(p.steps, step{op: OpCast, to: op.DType, round: op.DType})
			work = op.DType
			if work.decodesToF32() {
				work = F32
			}
		default:
			return nil, &PipelineError{i, fmt.Sprintf("unknown op %d", op.Kind)}
		}
	}
	if !p.identity && !CanConvert(work, dst) {
		return nil, &PipelineError{
			-1,
			fmt.Sprintf(
				"cannot convert %s to %s: only float to float, integer or BOOL to float, and lossless integer widening are allowed",
				work,
				dst,
			),
		}
	}
	p.steps = append(p.steps, step{op: OpCast, to: dst, round: dst, final: true})
	if len(ops) == 0 {
		p.fast = fastPaths[[2]DType{src, dst}]
		p.fastBF16ToF32 = src == BF16 && dst == F32
		p.fastF32ToBF16 = src == F32 && dst == BF16
		p.fastE4M3ToBF16 = src == F8E4M3 && dst == BF16
	}
	if !p.identity && !p.fastBF16ToF32 { // widening BF16 is a shift, faster than a lookup
		p.lut = lutFor(src, ops, dst)
	}
	return p, nil
}

// fastPaths are fused loops where they measured faster than the batches (kernel_bench_test.go).
var fastPaths = map[[2]DType]func(dst []byte, dstStride int, src []byte, srcStride int, n int){
	{F32, BF16}: func(dst []byte, ds int, src []byte, ss int, n int) {
		for i := range n {
			binary.LittleEndian.PutUint16(
				dst[i*ds:],
				BF16FromF32(math.Float32frombits(binary.LittleEndian.Uint32(src[i*ss:]))),
			)
		}
	},
}

// batchLen is how many elements one pass of the pipeline works on; the scratch lives on the stack.
const batchLen = 256

type batch struct {
	f32 [batchLen]float32
	f64 [batchLen]float64
	i64 [batchLen]int64
	u64 [batchLen]uint64
}

// Run converts n elements: element i is read at src[i*srcStride:] and written at dst[i*dstStride:].
func (p *Pipeline) Run(dst []byte, dstStride int, src []byte, srcStride int, n int) {
	size := p.src.Size()
	if p.identity && srcStride == size && dstStride == size {
		copy(dst[:n*size], src[:n*size])
		return
	}
	if p.wordKernel(dst, dstStride, src, srcStride, n) {
		return
	}
	if p.identity {
		copyElements(dst, dstStride, src, srcStride, n, size)
		return
	}
	if p.lut != nil && p.lut.run(p, dst, dstStride, src, srcStride, n) {
		return
	}
	if p.fast != nil {
		p.fast(dst, dstStride, src, srcStride, n)
		return
	}
	p.runBatches(dst, dstStride, src, srcStride, n)
}

// runBatches is Run by decode, steps and encode, batchLen elements at a time.
func (p *Pipeline) runBatches(dst []byte, dstStride int, src []byte, srcStride int, n int) {
	var b batch
	for n > 0 {
		m := min(n, batchLen)
		k := decode(&b, p.src, src, srcStride, m)
		for _, s := range p.steps {
			k = s.apply(&b, k, m)
		}
		encode(&b, p.dst, dst, dstStride, m)
		n -= m
		src = src[min(len(src), m*srcStride):]
		dst = dst[min(len(dst), m*dstStride):]
	}
}

// Identity reports a pipeline that only copies bytes.
func (p *Pipeline) Identity() bool { return p.identity }

func copyElements(dst []byte, dstStride int, src []byte, srcStride int, n, size int) {
	switch size {
	case 1:
		for i := range n {
			dst[i*dstStride] = src[i*srcStride]
		}
	case 2:
		for i := range n {
			binary.LittleEndian.PutUint16(dst[i*dstStride:], binary.LittleEndian.Uint16(src[i*srcStride:]))
		}
	case 4:
		for i := range n {
			binary.LittleEndian.PutUint32(dst[i*dstStride:], binary.LittleEndian.Uint32(src[i*srcStride:]))
		}
	default:
		for i := range n {
			binary.LittleEndian.PutUint64(dst[i*dstStride:], binary.LittleEndian.Uint64(src[i*srcStride:]))
		}
	}
}

func decode(b *batch, d DType, src []byte, stride, n int) kind {
	le := binary.LittleEndian
	switch d {
	case F32:
		for i := range n {
			b.f32[i] = math.Float32frombits(le.Uint32(src[i*stride:]))
		}
	case BF16:
		for i := range n {
			b.f32[i] = math.Float32frombits(uint32(le.Uint16(src[i*stride:])) << 16)
		}
	case F16:
		for i := range n {
			b.f32[i] = F32FromF16(le.Uint16(src[i*stride:]))
		}
	case F8E4M3:
		for i := range n {
			b.f32[i] = e4m3Table[src[i*stride]]
		}
	case F8E5M2:
		for i := range n {
			b.f32[i] = e5m2Table[src[i*stride]]
		}
	case F8E8M0:
		for i := range n {
			b.f32[i] = E8M0Scale(src[i*stride])
		}
	case F64:
		for i := range n {
			b.f64[i] = math.Float64frombits(le.Uint64(src[i*stride:]))
		}
	case I8:
		for i := range n {
			b.i64[i] = int64(int8(src[i*stride]))
		}
	case I16:
		for i := range n {
			b.i64[i] = int64(int16(le.Uint16(src[i*stride:])))
		}
	case I32:
		for i := range n {
			b.i64[i] = int64(int32(le.Uint32(src[i*stride:])))
		}
	case I64:
		for i := range n {
			b.i64[i] = int64(le.Uint64(src[i*stride:]))
		}
	case BOOL:
		for i := range n {
			b.u64[i] = 0
			if src[i*stride] != 0 {
				b.u64[i] = 1
			}
		}
	case U8:
		for i := range n {
			b.u64[i] = uint64(src[i*stride])
		}
	case U16:
		for i := range n {
			b.u64[i] = uint64(le.Uint16(src[i*stride:]))
		}
	case U32:
		for i := range n {
			b.u64[i] = uint64(le.Uint32(src[i*stride:]))
		}
	case U64:
		for i := range n {
			b.u64[i] = le.Uint64(src[i*stride:])
		}
	}
	return kindOf(d)
}

// apply runs one step over the batch held in kind k and returns the kind it leaves the values in.
func (s step) apply(b *batch, k kind, n int) kind {
	if s.op != OpCast {
		if k == kindF64 {
			applyF64(s, b.f64[:n])
		} else {
			applyF32(s, b.f32[:n])
		}
		return k
	}
	to := kindOf(s.to)
	switch {
	case k == kindF32 && to == kindF32:
		if s.round != F32 && !s.final {
			for i, x := range b.f32[:n] {
				b.f32[i] = roundTo(s.round, x)
			}
		}
	case k == kindF32 && to == kindF64:
		for i, x := range b.f32[:n] {
			b.f64[i] = float64(x)
		}
	case k == kindF64 && to == kindF32: // through float32 first, as c10's narrow types are built
		for i, x := range b.f64[:n] {
			b.f32[i] = roundTo(s.round, float32(x))
		}
	case k == kindI64 && to == kindF32:
		for i, x := range b.i64[:n] {
			b.f32[i] = roundTo(s.round, float32(x))
		}
	case k == kindI64 && to == kindF64:
		for i, x := range b.i64[:n] {
			b.f64[i] = float64(x)
		}
	case k == kindU64 && to == kindF32:
		for i, x := range b.u64[:n] {
			b.f32[i] = roundTo(s.round, float32(x))
		}
	case k == kindU64 && to == kindF64:
		for i, x := range b.u64[:n] {
			b.f64[i] = float64(x)
		}
	case k == kindU64 && to == kindI64: // BOOL to a signed integer
		for i, x := range b.u64[:n] {
			b.i64[i] = int64(x)
		}
	}
	return to
}

func applyF32(s step, xs []float32) {
	v := s.v32
	// The common cases get loops of their own, so the op and the rounding inline.
	switch {
	case s.op == OpNeg:
		for i, x := range xs {
			xs[i] = -x
		}
	case s.op == OpMul && s.round == BF16:
		for i, x := range xs {
			xs[i] = bf16Round(x * v)
		}
	case s.op == OpAdd && s.round == BF16:
		for i, x := range xs {
			xs[i] = bf16Round(x + v)
		}
	case s.op == OpMul && s.round == F32:
		for i, x := range xs {
			xs[i] = x * v
		}
	case s.op == OpAdd && s.round == F32:
		for i, x := range xs {
			xs[i] = x + v
		}
	default:
		for i, x := range xs {
			switch s.op {
			case OpMul:
				x *= v
			case OpAdd:
				x += v
			case OpExp:
				x = float32(math.Exp(float64(x)))
			}
			xs[i] = roundTo(s.round, x)
		}
	}
}

// bf16Round is roundTo(BF16, f), small enough to inline: nearest even, NaN made canonical.
func bf16Round(f float32) float32 { return F32FromBF16(BF16FromF32(f)) }

func applyF64(s step, xs []float64) {
	switch s.op {
	case OpNeg:
		for i, x := range xs {
			xs[i] = -x
		}
	case OpMul:
		for i, x := range xs {
			xs[i] = x * s.v64
		}
	case OpAdd:
		for i, x := range xs {
			xs[i] = x + s.v64
		}
	case OpExp:
		for i, x := range xs {
			xs[i] = math.Exp(x)
		}
	}
}

// encode stores the batch, already cast to d, into dst.
func encode(b *batch, d DType, dst []byte, stride, n int) {
	le := binary.LittleEndian
	switch d {
	case F32:
		for i := range n {
			le.PutUint32(dst[i*stride:], math.Float32bits(b.f32[i]))
		}
	case BF16:
		for i := range n {
			le.PutUint16(dst[i*stride:], BF16FromF32(b.f32[i]))
		}
	case F16:
		for i := range n {
			le.PutUint16(dst[i*stride:], F16FromF32(b.f32[i]))
		}
	case F8E4M3:
		for i := range n {
			dst[i*stride] = E4M3FromF32(b.f32[i])
		}
	case F8E5M2:
		for i := range n {
			dst[i*stride] = E5M2FromF32(b.f32[i])
		}
	case F64:
		for i := range n {
			le.PutUint64(dst[i*stride:], math.Float64bits(b.f64[i]))
		}
	case I8:
		for i := range n {
			dst[i*stride] = byte(b.i64[i])
		}
	case I16:
		for i := range n {
			le.PutUint16(dst[i*stride:], uint16(b.i64[i]))
		}
	case I32:
		for i := range n {
			le.PutUint32(dst[i*stride:], uint32(b.i64[i]))
		}
	case I64:
		for i := range n {
			le.PutUint64(dst[i*stride:], uint64(b.i64[i]))
		}
	case BOOL, U8:
		for i := range n {
			dst[i*stride] = byte(b.u64[i])
		}
	case U16:
		for i := range n {
			le.PutUint16(dst[i*stride:], uint16(b.u64[i]))
		}
	case U32:
		for i := range n {
			le.PutUint32(dst[i*stride:], uint32(b.u64[i]))
		}
	case U64:
		for i := range n {
			le.PutUint64(dst[i*stride:], b.u64[i])
		}
	}
}

// EncodeFill converts a fill, a JSON number literal, to one element of d. Floats round as the
// float64 the literal names would be copied (through float32 for the narrow types). Integers and
// BOOL need an integer literal in range, read exactly, so the whole I64 and U64 range is open
// (a float64 is not exact past 2^53).
func EncodeFill(d DType, literal string) ([]byte, error) {
	if d == F8E8M0 {
		return nil, fmt.Errorf("a fill of %s is not supported", d)
	}
	out := make([]byte, d.Size())
	var b batch
	switch kindOf(d) {
	case kindF64, kindF32:
		v, err := strconv.ParseFloat(literal, 64)
		if err != nil {
			return nil, fmt.Errorf("fill %s is not a number %s holds", literal, d)
		}
		if kindOf(d) == kindF64 {
			b.f64[0] = v
		} else {
			b.f32[0] = roundTo(d, float32(v))
		}
	default:
		neg, mag, ok := parseInteger(literal)
		if !ok || mag > intLimit(d, neg) {
			return nil, fmt.Errorf("fill %s is not a value of %s", literal, d)
		}
		if neg {
			mag = -mag // two's complement
		}
		if kindOf(d) == kindI64 {
			b.i64[0] = int64(mag)
		} else {
			b.u64[0] = mag
		}
	}
	encode(&b, d, out, 0, 1)
	return out, nil
}

// intLimit is the largest magnitude an integer dtype holds on one side of zero.
func intLimit(d DType, neg bool) uint64 {
	bits := uint(8 * d.Size())
	switch {
	case d == BOOL:
		if neg {
			return 0
		}
		return 1
	case d.isSigned() && neg:
		return 1 << (bits - 1)
	case d.isSigned():
		return 1<<(bits-1) - 1
	case neg:
		return 0
	}
	return math.MaxUint64 >> (64 - bits)
}

// parseInteger reads a JSON number literal exactly: whether it is negative and its magnitude, and
// ok when it is an integer (1e3 and 2.50e1 are; 0.5 is not) whose magnitude fits in 64 bits. It
// never builds a number from the exponent alone, so 1e999999999 costs nothing.
func parseInteger(lit string) (neg bool, mag uint64, ok bool) {
	s, neg := strings.CutPrefix(lit, "-")
	mant, expStr, _ := strings.Cut(strings.ToLower(s), "e")
	intPart, frac, _ := strings.Cut(mant, ".")
	exp, _ := strconv.ParseInt(expStr, 10, 64) // clamped to ±MaxInt64 when out of range
	if expStr == "" {
		exp = 0
	}
	exp = max(min(exp, 1<<32), -(1<<32)) - int64(len(frac))
	digits := strings.TrimLeft(intPart+frac, "0")
	if digits == "" {
		return neg, 0, true
	}
	trimmed := strings.TrimRight(digits, "0")
	exp += int64(len(digits) - len(trimmed))
	digits = trimmed
	if exp < 0 || int64(len(digits))+exp > 20 { // a fraction, or more than 20 digits: past 2^64
		return neg, 0, false
	}
	mag, err := strconv.ParseUint(digits+strings.Repeat("0", int(exp)), 10, 64)
	return neg, mag, err == nil
}
