package tensor

import (
	"encoding/binary"
	"math"
	"unsafe"
)

// The word kernels view byte buffers as arrays of 16- or 32-bit words, so the compiler drops the
// per-element bounds checks and byte shuffles. That is right only on little-endian machines and
// for aligned buffers; the callers check both and fall back to the byte-wise loops.
var littleEndian = binary.NativeEndian.Uint16([]byte{1, 0}) == 1

func aligned(b []byte, size uintptr) bool {
	return littleEndian && len(b) > 0 && uintptr(unsafe.Pointer(unsafe.SliceData(b)))%size == 0
}

func words16(b []byte, n int) []uint16 {
	return unsafe.Slice((*uint16)(unsafe.Pointer(unsafe.SliceData(b))), n)
}
func words32(b []byte, n int) []uint32 {
	return unsafe.Slice((*uint32)(unsafe.Pointer(unsafe.SliceData(b))), n)
}

// wordKernel runs a pipeline's common cases over words; it reports false when it cannot.
func (p *Pipeline) wordKernel(dst []byte, ds int, src []byte, ss int, n int) bool {
	switch {
	case p.identity && p.src.Size() == 2 && ss%2 == 0 && ds == 2 && aligned(src, 2) && aligned(dst, 2):
		if len(src) < (n-1)*ss+2 || len(dst) < 2*n {
			return false
		}
		s, d, step := words16(src, (n-1)*ss/2+1), words16(dst, n), ss/2
		for i := range d {
			d[i] = s[i*step]
		}
	case p.identity && p.src.Size() == 4 && ss%4 == 0 && ds == 4 && aligned(src, 4) && aligned(dst, 4):
		if len(src) < (n-1)*ss+4 || len(dst) < 4*n {
			return false
		}
		s, d, step := words32(src, (n-1)*ss/4+1), words32(dst, n), ss/4
		for i := range d {
			d[i] = s[i*step]
		}
	case p.fastBF16ToF32 && ss%2 == 0 && ds == 4 && aligned(src, 2) && aligned(dst, 4):
		if len(src) < (n-1)*ss+2 || len(dst) < 4*n {
			return false
		}
		s, d, step := words16(src, (n-1)*ss/2+1), words32(dst, n), ss/2
		for i := range d {
			d[i] = uint32(s[i*step]) << 16
		}
	case p.fastF32ToBF16 && ss%4 == 0 && ds == 2 && aligned(src, 4) && aligned(dst, 2):
		if len(src) < (n-1)*ss+4 || len(dst) < 2*n {
			return false
		}
		s, d, step := words32(src, (n-1)*ss/4+1), words16(dst, n), ss/4
		for i := range d {
			d[i] = BF16FromF32(math.Float32frombits(s[i*step]))
		}
	case p.fastE4M3ToBF16 && ds == 2 && aligned(dst, 2):
		if len(src) < (n-1)*ss+1 || len(dst) < 2*n {
			return false
		}
		d := words16(dst, n)
		for i := range d {
			d[i] = e4m3BF16[src[i*ss]]
		}
	default:
		return false
	}
	return true
}

// e4m3BF16 maps every E4M3 code to its BF16 bits; every E4M3 value is exact in BF16.
var e4m3BF16 = func() (t [256]uint16) {
	for i, f := range e4m3Table {
		t[i] = BF16FromF32(f) // exact, and NaN becomes BF16's canonical 0x7FC0
	}
	return
}()
