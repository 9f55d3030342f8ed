package tensor

import (
	"math"
	"math/bits"
)

// CheckedMul is a*b for the non-negative sizes and counts of shapes and byte ranges; ok is false
// when either is negative or the product passes int64, so an overflow is refused, never wrapped.
// The planner and the safetensors reader both size tensors with it.
func CheckedMul(a, b int64) (p int64, ok bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > math.MaxInt64 {
		return 0, false
	}
	return int64(lo), true
}

// CheckedProduct is the product of xs (1 for none) by CheckedMul: an element count, or a byte
// count with the element size among xs.
func CheckedProduct(xs ...int64) (int64, bool) {
	p := int64(1)
	for _, x := range xs {
		var ok bool
		if p, ok = CheckedMul(p, x); !ok {
			return 0, false
		}
	}
	return p, true
}
