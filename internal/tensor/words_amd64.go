package tensor

import "golang.org/x/sys/cpu"

var hasAVX2 = cpu.X86.HasAVX2

// everyOther16AVX2 writes blocks × 32 bytes of dst: the even 16-bit elements of blocks × 64
// bytes of src.
//
//go:noescape
func everyOther16AVX2(dst, src *byte, blocks int)

// everyOther16Vector does what it can of everyOther16 with AVX2, 16 elements a step, and returns
// the bytes of dst it wrote.
func everyOther16Vector(dst, src []byte) int {
	blocks := min(len(dst)/32, len(src)/64)
	if !hasAVX2 || blocks == 0 {
		return 0
	}
	everyOther16AVX2(&dst[0], &src[0], blocks)
	return blocks * 32
}

// e4m3ToBF16AVX2 converts blocks × 16 E4M3 codes of src to BF16 in dst.
//
//go:noescape
func e4m3ToBF16AVX2(dst, src *byte, blocks int)

// e4m3ToBF16Vector converts what it can of src (E4M3 codes) into dst (BF16) with AVX2, 16 a step,
// and returns how many it converted.
func e4m3ToBF16Vector(dst, src []byte) int {
	blocks := min(len(dst)/32, len(src)/16)
	if !hasAVX2 || blocks == 0 {
		return 0
	}
	e4m3ToBF16AVX2(&dst[0], &src[0], blocks)
	return blocks * 16
}

// bf16ToF32AVX2 widens blocks × 16 BF16 of src to F32 in dst.
//
//go:noescape
func bf16ToF32AVX2(dst, src *byte, blocks int)

// bf16ToF32Vector widens what it can of src (BF16) into dst (F32) with AVX2, 16 a step, and
// returns how many it widened.
func bf16ToF32Vector(dst, src []byte) int {
	blocks := min(len(dst)/64, len(src)/32)
	if !hasAVX2 || blocks == 0 {
		return 0
	}
	bf16ToF32AVX2(&dst[0], &src[0], blocks)
	return blocks * 16
}
