package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// fp4Values are the OCP E2M1 values by code, sign in bit 3.
var fp4Values = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// F32FromF4 decodes an OCP E2M1 value from the low nibble of code (sign in bit 3).
func F32FromF4(code uint8) float32 { return fp4Values[code&0xF] }

// E8M0Scale decodes an OCP E8M0 scale: 2^(s-127), with 0xFF the NaN.
func E8M0Scale(s uint8) float32 {
	if s == 0xFF {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(s)-127)) // 2^-127 is a float32 subnormal: exact
}

// CopyNibbles is Copy for a packed F4 source: srcOff and the source strides count nibbles (element
// e of the file is nibble 2*Begin+e), each value is decoded to float32, and p (built from F32)
// applies the post ops and the conversion.
func CopyNibbles(p *Pipeline, dst []byte, src Source, srcOff int64, s Strided) error {
	dstSize := int64(p.dst.Size())
	if len(s.Lengths) == 0 {
		s = Strided{Lengths: []int64{1}, Src: []int64{1}, Dst: []int64{dstSize}}
	}
	inner := len(s.Lengths) - 1
	n, ss, ds := s.Lengths[inner], s.Src[inner], s.Dst[inner]
	tmp := make([]byte, 4*min(n, batchLen))
	return walkRuns(s, func(srcAt, dstAt int64) error {
		for done := int64(0); done < n; done += batchLen {
			m := min(n-done, batchLen)
			for i := range m {
				a := srcOff + srcAt + (done+i)*ss
				b := src.Slice(a>>1, 1)
				if b == nil {
					return fmt.Errorf("source nibble %d was not read", a)
				}
				binary.LittleEndian.PutUint32(tmp[4*i:], math.Float32bits(fp4Values[(b[0]>>(4*(a&1)))&0xF]))
			}
			p.Run(dst[dstAt+done*ds:], int(ds), tmp, 4, int(m))
		}
		return nil
	})
}
