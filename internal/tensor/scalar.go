package tensor

import (
	"math"

	"github.com/x448/float16"
)

// BF16FromF32 rounds to nearest even as c10::BFloat16 does: overflow goes to ±inf, and every NaN
// becomes the canonical 0x7FC0.
func BF16FromF32(f float32) uint16 {
	if f != f {
		return 0x7FC0
	}
	u := math.Float32bits(f)
	return uint16((u + 0x7FFF + (u>>16)&1) >> 16)
}

// F32FromBF16 is exact.
func F32FromBF16(b uint16) float32 { return math.Float32frombits(uint32(b) << 16) }

// F16FromF32 rounds to nearest even; overflow goes to ±inf.
func F16FromF32(f float32) uint16 { return float16.Fromfloat32(f).Bits() }

// F32FromF16 is exact.
func F32FromF16(h uint16) float32 { return float16.Frombits(h).Float32() }

// E4M3FromF32 encodes OCP FP8 E4M3 ("fn": no infinities, NaN = S.1111.111) with round to nearest
// even and no saturation: |x| >= 480 after rounding, ±inf and NaN all become NaN with the sign kept.
// It is c10's fp8e4m3fn_from_fp32_value, bit for bit.
func E4M3FromF32(f float32) uint8 {
	const (
		overflow   = 1087 << 20 // 480.0: the first value that rounds past 448
		denormMask = 141 << 23
	)
	bits := math.Float32bits(f)
	sign := bits & 0x80000000
	bits ^= sign
	var out uint32
	switch {
	case bits >= overflow:
		out = 0x7F
	case bits < 121<<23: // below 2^-6: a subnormal, rounded by an add that aligns the mantissa
		out = math.Float32bits(math.Float32frombits(bits)+math.Float32frombits(denormMask)) - denormMask
	default:
		mantOdd := (bits >> 20) & 1
		bits = bits - (127-7)<<23 + 0x7FFFF + mantOdd // rebias the exponent, round to nearest even
		out = bits >> 20
	}
	return uint8(out | sign>>24)
}

// E5M2FromF32 encodes OCP FP8 E5M2 (IEEE-like) with round to nearest even and no saturation:
// overflow goes to ±inf, NaN stays NaN. It is c10's fp8e5m2_from_fp32_value, bit for bit.
func E5M2FromF32(f float32) uint8 {
	const (
		f32Inf     = 255 << 23
		overflow   = 143 << 23 // 65536.0
		denormMask = 134 << 23
	)
	bits := math.Float32bits(f)
	sign := bits & 0x80000000
	bits ^= sign
	var out uint32
	switch {
	case bits >= overflow:
		out = 0x7C
		if bits > f32Inf {
			out = 0x7F
		}
	case bits < 113<<23:
		out = math.Float32bits(math.Float32frombits(bits)+math.Float32frombits(denormMask)) - denormMask
	default:
		mantOdd := (bits >> 21) & 1
		bits = bits - (127-15)<<23 + 0xFFFFF + mantOdd
		out = bits >> 21
	}
	return uint8(out | sign>>24)
}

var e4m3Table, e5m2Table = func() (e4, e5 [256]float32) {
	for i := range 256 {
		b := uint8(i)
		exp, mant := int(b>>3)&0xF, float64(b&7)
		var v float64
		switch {
		case exp == 15 && b&7 == 7:
			v = math.NaN()
		case exp == 0:
			v = mant * math.Ldexp(1, -9)
		default:
			v = (1 + mant/8) * math.Ldexp(1, exp-7)
		}
		if b&0x80 != 0 {
			v = -v
		}
		e4[i] = float32(v)
		e5[i] = F32FromF16(uint16(b) << 8) // E5M2 is the top byte of an F16
	}
	return
}()

// F32FromE4M3 is exact.
func F32FromE4M3(b uint8) float32 { return e4m3Table[b] }

// F32FromE5M2 is exact.
func F32FromE5M2(b uint8) float32 { return e5m2Table[b] }

// roundTo rounds a float32 to the values representable in a float dtype of at most 32 bits, so that
// arithmetic "in BF16" is float32 arithmetic followed by this.
func roundTo(d DType, f float32) float32 {
	switch d {
	case BF16:
		return F32FromBF16(BF16FromF32(f))
	case F16:
		return F32FromF16(F16FromF32(f))
	case F8E4M3:
		return F32FromE4M3(E4M3FromF32(f))
	case F8E5M2:
		return F32FromE5M2(E5M2FromF32(f))
	}
	return f
}
