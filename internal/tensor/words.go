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

// word is what view can see a buffer as.
type word interface {
	~uint8 | ~uint16 | ~uint32 | ~uint64
}

// view is b as words of type T, as many as fit.
func view[T word](b []byte) []T {
	var w T
	return unsafe.Slice((*T)(unsafe.Pointer(unsafe.SliceData(b))), uintptr(len(b))/unsafe.Sizeof(w))
}

// wordKernel runs a pipeline's common cases over words; it reports false when it cannot.
func (p *Pipeline) wordKernel(dst []byte, ds int, src []byte, ss int, n int) bool {
	size := p.src.Size()
	switch {
	case p.identity && size == 2 && ss == 4 && ds == 2:
		if len(src) < 4*n-2 || len(dst) < 2*n {
			return false
		}
		everyOther16(dst[:2*n], src)
	case p.identity && (size == 2 || size == 4) && ss%size == 0 && ds == size && aligned(src, uintptr(size)) &&
		aligned(dst, uintptr(size)):
		if len(src) < (n-1)*ss+size || len(dst) < size*n {
			return false
		}
		if size == 2 {
			gather(view[uint16](dst)[:n], view[uint16](src), ss/2)
		} else {
			gather(view[uint32](dst)[:n], view[uint32](src), ss/4)
		}
	case p.fastBF16ToF32 && ss%2 == 0 && ds == 4 && aligned(src, 2) && aligned(dst, 4):
		if len(src) < (n-1)*ss+2 || len(dst) < 4*n {
			return false
		}
		done := 0
		if ss == 2 {
			done = bf16ToF32Vector(dst[:4*n], src[:2*n])
		}
		bf16ToF32Words(view[uint32](dst)[done:n], view[uint16](src)[done*ss/2:], ss/2)
	case p.fastF32ToBF16 && ss%4 == 0 && ds == 2 && aligned(src, 4) && aligned(dst, 2):
		if len(src) < (n-1)*ss+4 || len(dst) < 2*n {
			return false
		}
		s, d, step := view[uint32](src), view[uint16](dst)[:n], ss/4
		for i := range d {
			d[i] = BF16FromF32(math.Float32frombits(s[i*step]))
		}
	case p.fastE4M3ToBF16 && ss == 1 && ds == 2 && len(src) >= n && len(dst) >= 2*n:
		done := e4m3ToBF16Vector(dst[:2*n], src[:n])
		if done == 0 { // no vector kernel, or too few codes for it: the lookup table's
			return false
		}
		p.runBatches(dst[2*done:], 2, src[done:], 1, n-done)
	default:
		return false
	}
	return true
}

// bf16ToF32Words widens every step-th BF16 of s into d: the portable loop, and the reference the
// vector kernel is tested against.
func bf16ToF32Words(d []uint32, s []uint16, step int) {
	for i := range d {
		d[i] = uint32(s[i*step]) << 16
	}
}

// gather copies every step-th word of s into d.
func gather[T word](d, s []T, step int) {
	for i := range d {
		d[i] = s[i*step]
	}
}

// everyOther16 copies every other 16-bit element of src into dst (len(dst)/2 of them): it picks
// the halves of 64-bit words, sixteen elements a round, whatever the alignment.
func everyOther16(dst, src []byte) {
	done := everyOther16Vector(dst, src)
	everyOther16Words(dst[done:], src[2*done:])
}

// everyOther16Words is everyOther16 over 64-bit words: the portable loop, and the reference the
// vector one is tested against.
func everyOther16Words(dst, src []byte) {
	le := binary.LittleEndian
	pick := func(s []byte) uint64 { // elements 0, 2, 4 and 6 of s
		w0, w1 := le.Uint64(s), le.Uint64(s[8:])
		return w0&0xFFFF | w0>>16&0xFFFF0000 | (w1&0xFFFF)<<32 | (w1>>16&0xFFFF0000)<<32
	}
	for len(dst) >= 32 && len(src) >= 64 {
		s, d := src[:64], dst[:32]
		le.PutUint64(d, pick(s))
		le.PutUint64(d[8:], pick(s[16:]))
		le.PutUint64(d[16:], pick(s[32:]))
		le.PutUint64(d[24:], pick(s[48:]))
		dst, src = dst[32:], src[64:]
	}
	for i := 0; i < len(dst); i += 2 {
		dst[i], dst[i+1] = src[2*i], src[2*i+1]
	}
}
