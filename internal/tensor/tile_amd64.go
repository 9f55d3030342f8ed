package tensor

// transpose16AVX2 moves rowBlocks × 8 source rows, srcRow bytes apart, of colBlocks × 16 16-bit
// elements from src to colBlocks × 16 rows of dst, dstRow bytes apart, transposed.
//
//go:noescape
func transpose16AVX2(dst *uint64, dstRow int, src *uint16, srcRow int, colBlocks, rowBlocks int)

// pack4Vector does what it can of pack4 with AVX2, 8 × 16 elements a step, and returns the
// corner it packed: elements a < va of the rows b < vb.
func pack4Vector(w []uint64, rw int64, s []uint16, sb, na, nb int64) (va, vb int64) {
	va, vb = na/16*16, nb/8*8
	if !hasAVX2 || va == 0 || vb == 0 {
		return 0, 0
	}
	// The kernel reads and writes nothing past these.
	_, _ = s[va-1+(vb-1)*sb], w[(va-1)*rw+(vb-1)/4]
	transpose16AVX2(&w[0], int(8*rw), &s[0], int(2*sb), int(va/16), int(vb/8))
	return va, vb
}

// transpose32AVX2 moves rowBlocks × 8 source rows, srcRow bytes apart, of colBlocks × 8 32-bit
// elements from src to colBlocks × 8 rows of dst, dstRow bytes apart, transposed.
//
//go:noescape
func transpose32AVX2(dst *uint64, dstRow int, src *uint32, srcRow int, colBlocks, rowBlocks int)

// pack2Vector does what it can of pack2 with AVX2, 8 × 8 elements a step, and returns the corner
// it packed: elements a < va of the rows b < vb.
func pack2Vector(w []uint64, rw int64, s []uint32, sb, na, nb int64) (va, vb int64) {
	va, vb = na/8*8, nb/8*8
	if !hasAVX2 || va == 0 || vb == 0 {
		return 0, 0
	}
	// The kernel reads and writes nothing past these.
	_, _ = s[va-1+(vb-1)*sb], w[(va-1)*rw+(vb-1)/2]
	transpose32AVX2(&w[0], int(8*rw), &s[0], int(4*sb), int(va/8), int(vb/8))
	return va, vb
}
