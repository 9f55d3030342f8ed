#include "textflag.h"

// func transpose16AVX2(dst *uint64, dstRow int, src *uint16, srcRow int, colBlocks, rowBlocks int)
// Transposes rowBlocks × 8 source rows (srcRow bytes apart) of colBlocks × 16 16-bit elements into
// colBlocks × 16 destination rows (dstRow bytes apart) of rowBlocks × 8 elements. Each step loads
// 8 rows of 16 elements, one per Y register, whose two 128-bit lanes are two 8 × 8 blocks: the
// unpacks work within lanes, so three rounds of them (words, dwords, qwords) transpose both
// blocks at once, and the low lanes are destination rows 0-7, the high lanes rows 8-15.
TEXT ·transpose16AVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), R13
	MOVQ dstRow+8(FP), DX
	MOVQ src+16(FP), R12
	MOVQ srcRow+24(FP), R8
	MOVQ rowBlocks+40(FP), AX
	LEAQ (R8)(R8*2), R9   // 3 source rows
	LEAQ (DX)(DX*2), R10  // 3 destination rows
	MOVQ DX, R11
	SHLQ $4, R11          // 16 destination rows

rows:
	TESTQ AX, AX
	JZ done
	MOVQ R12, SI
	MOVQ R13, DI
	MOVQ colBlocks+32(FP), CX

cols:
	TESTQ CX, CX
	JZ nextRows
	VMOVDQU (SI), Y0
	VMOVDQU (SI)(R8*1), Y1
	VMOVDQU (SI)(R8*2), Y2
	VMOVDQU (SI)(R9*1), Y3
	LEAQ (SI)(R8*4), BX
	VMOVDQU (BX), Y4
	VMOVDQU (BX)(R8*1), Y5
	VMOVDQU (BX)(R8*2), Y6
	VMOVDQU (BX)(R9*1), Y7

	// Words of row pairs: Y8 = x00 x10 x01 x11 x02 x12 x03 x13 (per lane), and so on.
	VPUNPCKLWD Y1, Y0, Y8
	VPUNPCKHWD Y1, Y0, Y9
	VPUNPCKLWD Y3, Y2, Y10
	VPUNPCKHWD Y3, Y2, Y11
	VPUNPCKLWD Y5, Y4, Y12
	VPUNPCKHWD Y5, Y4, Y13
	VPUNPCKLWD Y7, Y6, Y14
	VPUNPCKHWD Y7, Y6, Y15

	// Dwords of those: Y0 = x00 x10 x20 x30 x01 x11 x21 x31, and so on.
	VPUNPCKLDQ Y10, Y8, Y0
	VPUNPCKHDQ Y10, Y8, Y1
	VPUNPCKLDQ Y11, Y9, Y2
	VPUNPCKHDQ Y11, Y9, Y3
	VPUNPCKLDQ Y14, Y12, Y4
	VPUNPCKHDQ Y14, Y12, Y5
	VPUNPCKLDQ Y15, Y13, Y6
	VPUNPCKHDQ Y15, Y13, Y7

	// Qwords: Y8 + j holds destination row j (low lane) and row 8 + j (high lane).
	VPUNPCKLQDQ Y4, Y0, Y8
	VPUNPCKHQDQ Y4, Y0, Y9
	VPUNPCKLQDQ Y5, Y1, Y10
	VPUNPCKHQDQ Y5, Y1, Y11
	VPUNPCKLQDQ Y6, Y2, Y12
	VPUNPCKHQDQ Y6, Y2, Y13
	VPUNPCKLQDQ Y7, Y3, Y14
	VPUNPCKHQDQ Y7, Y3, Y15

	VMOVDQU X8, (DI)
	VMOVDQU X9, (DI)(DX*1)
	VMOVDQU X10, (DI)(DX*2)
	VMOVDQU X11, (DI)(R10*1)
	LEAQ (DI)(DX*4), BX
	VMOVDQU X12, (BX)
	VMOVDQU X13, (BX)(DX*1)
	VMOVDQU X14, (BX)(DX*2)
	VMOVDQU X15, (BX)(R10*1)
	LEAQ (DI)(DX*8), BX
	VEXTRACTI128 $1, Y8, (BX)
	VEXTRACTI128 $1, Y9, (BX)(DX*1)
	VEXTRACTI128 $1, Y10, (BX)(DX*2)
	VEXTRACTI128 $1, Y11, (BX)(R10*1)
	LEAQ (BX)(DX*4), BX
	VEXTRACTI128 $1, Y12, (BX)
	VEXTRACTI128 $1, Y13, (BX)(DX*1)
	VEXTRACTI128 $1, Y14, (BX)(DX*2)
	VEXTRACTI128 $1, Y15, (BX)(R10*1)

	ADDQ $32, SI
	ADDQ R11, DI
	DECQ CX
	JMP cols

nextRows:
	LEAQ (R12)(R8*8), R12
	ADDQ $16, R13
	DECQ AX
	JMP rows

done:
	VZEROUPPER
	RET

// func transpose32AVX2(dst *uint64, dstRow int, src *uint32, srcRow int, colBlocks, rowBlocks int)
// Transposes rowBlocks × 8 source rows (srcRow bytes apart) of colBlocks × 8 32-bit elements into
// colBlocks × 8 destination rows (dstRow bytes apart) of rowBlocks × 8 elements. Each step is one
// 8 × 8 block, a source row per Y register: two rounds of unpacks (dwords, qwords) within lanes
// leave the low lanes 4 × 4 blocks of destination rows 0-3, the high lanes of rows 4-7, each stored
// where it goes.
TEXT ·transpose32AVX2(SB), NOSPLIT, $0-48
	MOVQ dst+0(FP), R13
	MOVQ dstRow+8(FP), DX
	MOVQ src+16(FP), R12
	MOVQ srcRow+24(FP), R8
	MOVQ rowBlocks+40(FP), AX
	LEAQ (R8)(R8*2), R9   // 3 source rows
	LEAQ (DX)(DX*2), R10  // 3 destination rows
	MOVQ DX, R11
	SHLQ $3, R11          // 8 destination rows

rows32:
	TESTQ AX, AX
	JZ done32
	MOVQ R12, SI
	MOVQ R13, DI
	MOVQ colBlocks+32(FP), CX

cols32:
	TESTQ CX, CX
	JZ nextRows32
	VMOVDQU (SI), Y0
	VMOVDQU (SI)(R8*1), Y1
	VMOVDQU (SI)(R8*2), Y2
	VMOVDQU (SI)(R9*1), Y3
	LEAQ (SI)(R8*4), BX
	VMOVDQU (BX), Y4
	VMOVDQU (BX)(R8*1), Y5
	VMOVDQU (BX)(R8*2), Y6
	VMOVDQU (BX)(R9*1), Y7

	// Dwords of row pairs: Y8 = x00 x10 x01 x11 | x04 x14 x05 x15, and so on.
	VPUNPCKLDQ Y1, Y0, Y8
	VPUNPCKHDQ Y1, Y0, Y9
	VPUNPCKLDQ Y3, Y2, Y10
	VPUNPCKHDQ Y3, Y2, Y11
	VPUNPCKLDQ Y5, Y4, Y12
	VPUNPCKHDQ Y5, Y4, Y13
	VPUNPCKLDQ Y7, Y6, Y14
	VPUNPCKHDQ Y7, Y6, Y15

	// Qwords: Y0 = x00 x10 x20 x30 | x04 x14 x24 x34; Y0 + j holds the first half of destination
	// rows j and 4 + j, Y4 + j their second half.
	VPUNPCKLQDQ Y10, Y8, Y0
	VPUNPCKHQDQ Y10, Y8, Y1
	VPUNPCKLQDQ Y11, Y9, Y2
	VPUNPCKHQDQ Y11, Y9, Y3
	VPUNPCKLQDQ Y14, Y12, Y4
	VPUNPCKHQDQ Y14, Y12, Y5
	VPUNPCKLQDQ Y15, Y13, Y6
	VPUNPCKHQDQ Y15, Y13, Y7

	VMOVDQU X0, (DI)
	VMOVDQU X4, 16(DI)
	VMOVDQU X1, (DI)(DX*1)
	VMOVDQU X5, 16(DI)(DX*1)
	VMOVDQU X2, (DI)(DX*2)
	VMOVDQU X6, 16(DI)(DX*2)
	VMOVDQU X3, (DI)(R10*1)
	VMOVDQU X7, 16(DI)(R10*1)
	LEAQ (DI)(DX*4), BX
	VEXTRACTI128 $1, Y0, (BX)
	VEXTRACTI128 $1, Y4, 16(BX)
	VEXTRACTI128 $1, Y1, (BX)(DX*1)
	VEXTRACTI128 $1, Y5, 16(BX)(DX*1)
	VEXTRACTI128 $1, Y2, (BX)(DX*2)
	VEXTRACTI128 $1, Y6, 16(BX)(DX*2)
	VEXTRACTI128 $1, Y3, (BX)(R10*1)
	VEXTRACTI128 $1, Y7, 16(BX)(R10*1)

	ADDQ $32, SI
	ADDQ R11, DI
	DECQ CX
	JMP cols32

nextRows32:
	LEAQ (R12)(R8*8), R12
	ADDQ $32, R13
	DECQ AX
	JMP rows32

done32:
	VZEROUPPER
	RET
