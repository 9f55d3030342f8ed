package vllmref

import (
	"encoding/binary"
	"fmt"
	"math"

	"github.com/x448/float16"
)

// Tensor is one tensor: DType in safetensors spelling ("BF16", "F16", "F32", "F8_E4M3", ...),
// Data little-endian and row-major.
type Tensor struct {
	DType string
	Shape []int64
	Data  []byte
}

// ElemSize is the size in bytes of one element of a safetensors dtype.
func ElemSize(dtype string) int64 {
	switch dtype {
	case "BOOL", "U8", "I8", "F8_E4M3", "F8_E5M2":
		return 1
	case "BF16", "F16", "I16", "U16":
		return 2
	case "F32", "I32", "U32":
		return 4
	case "F64", "I64", "U64":
		return 8
	}
	panic(Refusal("unknown dtype " + dtype))
}

func numel(shape []int64) int64 {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	return n
}

// rowBytes is the byte size of one index along dimension 0.
func rowBytes(t Tensor) int64 { return numel(t.Shape[1:]) * ElemSize(t.DType) }

func (t Tensor) check() {
	if int64(len(t.Data)) != numel(t.Shape)*ElemSize(t.DType) {
		panic(Refusal(fmt.Sprintf("tensor of shape %v %s holds %d bytes", t.Shape, t.DType, len(t.Data))))
	}
}

// NarrowRows is torch's t.narrow(0, start, n): rows [start, start+n) of t. Like torch it refuses a
// range outside the tensor.
func NarrowRows(t Tensor, start, n int64, what string) Tensor {
	t.check()
	if start < 0 || n < 0 || start+n > t.Shape[0] {
		panic(Refusal(fmt.Sprintf("%s: narrow(0, %d, %d) is outside a dimension of %d", what, start, n, t.Shape[0])))
	}
	rb := rowBytes(t)
	shape := append([]int64{n}, t.Shape[1:]...)
	data := append([]byte(nil), t.Data[start*rb:(start+n)*rb]...)
	return Tensor{DType: t.DType, Shape: shape, Data: data}
}

// NarrowCols is t.narrow(1, start, n) of a 2-D tensor, copied row by row.
func NarrowCols(t Tensor, start, n int64, what string) Tensor {
	t.check()
	if len(t.Shape) != 2 {
		panic(Refusal(fmt.Sprintf("%s: column slice of a %d-D tensor", what, len(t.Shape))))
	}
	if start < 0 || n < 0 || start+n > t.Shape[1] {
		panic(Refusal(fmt.Sprintf("%s: narrow(1, %d, %d) is outside a dimension of %d", what, start, n, t.Shape[1])))
	}
	es := ElemSize(t.DType)
	rows, cols := t.Shape[0], t.Shape[1]
	out := make([]byte, 0, rows*n*es)
	for r := int64(0); r < rows; r++ {
		rowStart := (r*cols + start) * es
		out = append(out, t.Data[rowStart:rowStart+n*es]...)
	}
	return Tensor{DType: t.DType, Shape: []int64{rows, n}, Data: out}
}

// CatRows is torch.cat(ts, dim=0).
func CatRows(ts ...Tensor) Tensor {
	out := Tensor{DType: ts[0].DType, Shape: append([]int64{0}, ts[0].Shape[1:]...)}
	for _, t := range ts {
		t.check()
		if t.DType != out.DType || fmt.Sprint(t.Shape[1:]) != fmt.Sprint(out.Shape[1:]) {
			panic(Refusal(fmt.Sprintf("cannot concatenate %s%v to %s%v", t.DType, t.Shape, out.DType, out.Shape)))
		}
		out.Shape[0] += t.Shape[0]
		out.Data = append(out.Data, t.Data...)
	}
	return out
}

// Stack is torch.stack(ts, dim=0); the caller never passes an empty list.
func Stack(ts []Tensor) Tensor {
	out := Tensor{DType: ts[0].DType, Shape: append([]int64{int64(len(ts))}, ts[0].Shape...)}
	for _, t := range ts {
		t.check()
		if t.DType != out.DType || fmt.Sprint(t.Shape) != fmt.Sprint(ts[0].Shape) {
			panic(Refusal("cannot stack tensors of different shapes"))
		}
		out.Data = append(out.Data, t.Data...)
	}
	return out
}

// PadRows appends zero rows up to total rows.
func PadRows(t Tensor, total int64) Tensor {
	t.check()
	if t.Shape[0] > total {
		panic(Refusal(fmt.Sprintf("padRows: %d rows do not fit in %d", t.Shape[0], total)))
	}
	out := Tensor{DType: t.DType, Shape: append([]int64{total}, t.Shape[1:]...)}
	out.Data = append(append([]byte(nil), t.Data...), make([]byte, (total-t.Shape[0])*rowBytes(t))...)
	return out
}

// filledF32 is an F32 tensor of one value (torch.empty(...) then scale[:] = value).
func filledF32(value float32, shape ...int64) Tensor {
	t := Tensor{DType: "F32", Shape: shape, Data: make([]byte, 4*numel(shape))}
	for i := int64(0); i < numel(shape); i++ {
		binary.LittleEndian.PutUint32(t.Data[4*i:], math.Float32bits(value))
	}
	return t
}

// copyRowsInto is dst.narrow(0, start, src.rows).copy_(src), refusing a range outside dst.
func copyRowsInto(dst *Tensor, start int64, src Tensor, what string) {
	if start < 0 || start+src.Shape[0] > dst.Shape[0] || rowBytes(src) != rowBytes(*dst) || src.DType != dst.DType {
		panic(
			Refusal(fmt.Sprintf("%s: cannot copy %v rows into rows [%d,...) of %v", what, src.Shape, start, dst.Shape)),
		)
	}
	copy(dst.Data[start*rowBytes(*dst):], src.Data)
}

// Convert is param.data.copy_(loaded) into a parameter of another dtype: torch rounds to nearest,
// ties to even. Only the float dtypes the reference meets are handled.
func Convert(t Tensor, to string) Tensor {
	if t.DType == to {
		return t
	}
	n := numel(t.Shape)
	f := make([]float32, n)
	for i := int64(0); i < n; i++ {
		switch t.DType {
		case "F32":
			f[i] = math.Float32frombits(binary.LittleEndian.Uint32(t.Data[4*i:]))
		case "BF16":
			f[i] = math.Float32frombits(uint32(binary.LittleEndian.Uint16(t.Data[2*i:])) << 16)
		case "F16":
			f[i] = float16.Frombits(binary.LittleEndian.Uint16(t.Data[2*i:])).Float32()
		default:
			panic(Refusal(fmt.Sprintf("the reference does not convert %s to %s", t.DType, to)))
		}
	}
	out := Tensor{DType: to, Shape: append([]int64(nil), t.Shape...), Data: make([]byte, n*ElemSize(to))}
	for i, x := range f {
		switch to {
		case "F32":
			binary.LittleEndian.PutUint32(out.Data[4*i:], math.Float32bits(x))
		case "BF16":
			binary.LittleEndian.PutUint16(out.Data[2*i:], bf16RNE(x))
		case "F16":
			binary.LittleEndian.PutUint16(out.Data[2*i:], float16.Fromfloat32(x).Bits())
		default:
			panic(Refusal(fmt.Sprintf("the reference does not convert %s to %s", t.DType, to)))
		}
	}
	return out
}

// bf16RNE rounds a float32 to bfloat16, nearest even (c10::BFloat16's round_to_nearest_even).
func bf16RNE(x float32) uint16 {
	b := math.Float32bits(x)
	if x != x { // NaN stays a quiet NaN
		return 0x7FC0
	}
	return uint16((b + 0x7FFF + (b>>16)&1) >> 16)
}

// CeilDiv is ceil(a / b) for positive b.
func CeilDiv(a, b int64) int64 { return (a + b - 1) / b }

func lcm(a, b int64) int64 {
	x, y := a, b
	for y != 0 {
		x, y = y, x%y
	}
	return a / x * b
}
