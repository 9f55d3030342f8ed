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
