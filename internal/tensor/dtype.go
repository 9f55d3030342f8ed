// Package tensor holds shardsrv's numerics: the dtypes of the wire contract (docs/numerics.md), their
// conversions with the normative rounding, the elementwise post ops, and the strided copy kernel
// the executor uses to move a box of a checkpoint tensor into the output.
package tensor

import "fmt"

// DType is an element type, named as safetensors spells it.
type DType uint8

// The dtypes of docs/numerics.md. The zero value is invalid so a forgotten field never passes as BOOL.
const (
	BOOL DType = iota + 1
	U8
	I8
	U16
	I16
	U32
	I32
	U64
	I64
	F16
	BF16
	F32
	F64
	F8E4M3
	F8E5M2
	// F8E8M0 is the OCP MX scale format (2^(s-127), 0xFF is NaN): a source dtype, read as float32;
	// nothing converts to it but itself.
	F8E8M0
	// F4 is OCP E2M1, two values a byte, the lower nibble first: a source dtype read as float32.
	// Its elements are half a byte, so Size reports 0 and the planner addresses it in nibbles.
	F4
)

var dtypeNames = [...]string{
	BOOL: "BOOL", U8: "U8", I8: "I8", U16: "U16", I16: "I16", U32: "U32", I32: "I32", U64: "U64",
	I64: "I64", F16: "F16", BF16: "BF16", F32: "F32", F64: "F64",
	F8E4M3: "F8_E4M3", F8E5M2: "F8_E5M2", F8E8M0: "F8_E8M0", F4: "F4",
}

var dtypeSizes = [...]int{
	BOOL: 1, U8: 1, I8: 1, U16: 2, I16: 2, U32: 4, I32: 4, U64: 8, I64: 8,
	F16: 2, BF16: 2, F32: 4, F64: 8, F8E4M3: 1, F8E5M2: 1, F8E8M0: 1, F4: 0,
}

// AllDTypes lists the dtypes of docs/numerics.md, in declaration order (F8E8M0, a source-only extension,
// is not among them).
var AllDTypes = []DType{BOOL, U8, I8, U16, I16, U32, I32, U64, I64, F16, BF16, F32, F64, F8E4M3, F8E5M2}

// ParseDType reads a safetensors dtype name.
func ParseDType(name string) (DType, bool) {
	for d, n := range dtypeNames {
		if n == name && n != "" {
			return DType(d), true
		}
	}
	return 0, false
}

func (d DType) valid() bool { return d >= BOOL && d <= F4 }

// String is the safetensors name.
func (d DType) String() string {
	if !d.valid() {
		return fmt.Sprintf("DType(%d)", uint8(d))
	}
	return dtypeNames[d]
}

// Size is the element size in bytes.
func (d DType) Size() int {
	if !d.valid() {
		return 0
	}
	return dtypeSizes[d]
}

// IsFloat reports a floating-point dtype (FP8 included).
func (d DType) IsFloat() bool {
	switch d {
	case F16, BF16, F32, F64, F8E4M3, F8E5M2, F8E8M0, F4:
		return true
	}
	return false
}

// IsFP8 reports one of the 8-bit float formats of the contract.
func (d DType) IsFP8() bool { return d == F8E4M3 || d == F8E5M2 }

// decodesToF32 reports the byte formats no arithmetic runs in: they are decoded to F32 first.
func (d DType) decodesToF32() bool { return d.IsFP8() || d == F8E8M0 || d == F4 }

// isSigned reports a signed integer dtype.
func (d DType) isSigned() bool { return d == I8 || d == I16 || d == I32 || d == I64 }

// CanConvert reports whether a value of dtype from may be converted to dtype to under the rules of
// docs/numerics.md: float to float, integer or BOOL to float, integer to integer only when lossless (same
// dtype, wider of the same signedness, BOOL to any integer), BOOL to BOOL. Nothing goes to BOOL or
// from float to integer.
func CanConvert(from, to DType) bool {
	if !from.valid() || !to.valid() {
		return false
	}
	switch {
	case to == F4: // nothing is written as packed F4
		return false
	case from == to:
		return true
	case to == F8E8M0:
		return false
	case to.IsFloat():
		return true
	case to == BOOL || from.IsFloat():
		return false
	case from == BOOL:
		return true
	case from.isSigned() == to.isSigned():
		return to.Size() > from.Size()
	}
	return false
}
