#include "textflag.h"

// func everyOther16AVX2(dst, src *byte, blocks int)
// Each block: the low words of 16 dwords (64 bytes of src) masked, packed to 16 words, and the
// packed lanes put back in order (VPACKUSDW packs within 128-bit lanes).
TEXT ·everyOther16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ blocks+16(FP), CX
	VPCMPEQD Y2, Y2, Y2
	VPSRLD $16, Y2, Y2 // 0x0000FFFF in every dword

loop:
	TESTQ CX, CX
	JZ done
	VPAND (SI), Y2, Y0
	VPAND 32(SI), Y2, Y1
	VPACKUSDW Y1, Y0, Y0
	VPERMQ $0xD8, Y0, Y0
	VMOVDQU Y0, (DI)
	ADDQ $64, SI
	ADDQ $32, DI
	DECQ CX
	JMP loop

done:
	VZEROUPPER
	RET

// The BF16 of the E4M3 subnormals m × 2⁻⁹, m = 0..7, in both 128-bit lanes (VPSHUFB looks up
// within each).
DATA e4m3Subnormals<>+0(SB)/8, $0x3BC03B803B000000
DATA e4m3Subnormals<>+8(SB)/8, $0x3C603C403C203C00
GLOBL e4m3Subnormals<>(SB), RODATA|NOPTR, $16

// func e4m3ToBF16AVX2(dst, src *byte, blocks int)
// Each block: 16 E4M3 codes (16 bytes of src) to 16 BF16 (32 bytes of dst). The magnitude
// e.mmm of a normal code shifted into BF16's fields, plus the exponent bias difference (120 << 7),
// is its BF16; a subnormal's (e = 0) is looked up; the sign goes on top, and S.1111.111 is NaN.
TEXT ·e4m3ToBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ blocks+16(FP), CX
	MOVL $0x007F007F, AX
	MOVD AX, X15
	VPBROADCASTD X15, Y15 // the magnitude's bits; the NaN's magnitude
	MOVL $0x3C003C00, AX
	MOVD AX, X14
	VPBROADCASTD X14, Y14 // 120 << 7
	MOVL $0x02020202, AX
	MOVD AX, X13
	VPBROADCASTD X13, Y13 // a code m to the byte indexes 2m, 2m+1 of its word ...
	MOVL $0x01000100, AX
	MOVD AX, X12
	VPBROADCASTD X12, Y12 // ... with the high byte's one added
	VBROADCASTI128 e4m3Subnormals<>(SB), Y11
	MOVL $0x00080008, AX
	MOVD AX, X10
	VPBROADCASTD X10, Y10 // the first normal magnitude
	MOVL $0x7FC07FC0, AX
	MOVD AX, X9
	VPBROADCASTD X9, Y9 // NaN
	MOVL $0x00800080, AX
	MOVD AX, X8
	VPBROADCASTD X8, Y8 // the sign

loop:
	TESTQ CX, CX
	JZ done
	VPMOVZXBW (SI), Y0
	VPAND Y0, Y15, Y1
	VPSLLW $4, Y1, Y2
	VPADDW Y2, Y14, Y2
	VPMULLW Y1, Y13, Y3
	VPADDW Y3, Y12, Y3
	VPSHUFB Y3, Y11, Y3
	VPCMPGTW Y1, Y10, Y4
	VPBLENDVB Y4, Y3, Y2, Y2
	VPAND Y0, Y8, Y5
	VPSLLW $8, Y5, Y5
	VPOR Y5, Y2, Y2
	VPCMPEQW Y1, Y15, Y4
	VPBLENDVB Y4, Y9, Y2, Y2
	VMOVDQU Y2, (DI)
	ADDQ $16, SI
	ADDQ $32, DI
	DECQ CX
	JMP loop

done:
	VZEROUPPER
	RET

// func bf16ToF32AVX2(dst, src *byte, blocks int)
// Each block: 16 BF16 (32 bytes of src) to 16 F32 (64 bytes of dst), each zero-extended to 32
// bits and shifted into the high half.
TEXT ·bf16ToF32AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ blocks+16(FP), CX

loop:
	TESTQ CX, CX
	JZ done
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPSLLD $16, Y0, Y0
	VPSLLD $16, Y1, Y1
	VMOVDQU Y0, (DI)
	VMOVDQU Y1, 32(DI)
	ADDQ $32, SI
	ADDQ $64, DI
	DECQ CX
	JMP loop

done:
	VZEROUPPER
	RET
