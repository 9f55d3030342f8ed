package tensor

import (
	"encoding/binary"
	"fmt"
	"math"
)

// fp4Values are the OCP E2M1 values by code, sign in bit 3.
var fp4Values = [16]float32{0, 0.5, 1, 1.5, 2, 3, 4, 6, float32(math.Copysign(0, -1)), -0.5, -1, -1.5, -2, -3, -4, -6}

// E8M0Scale decodes an OCP E8M0 scale: 2^(s-127), with 0xFF the NaN.
func E8M0Scale(s uint8) float32 {
	if s == 0xFF {
		return float32(math.NaN())
	}
	return float32(math.Ldexp(1, int(s)-127)) // 2^-127 is a float32 subnormal: exact
}

// MXFP4 is mxfp4_dequant, gpt-oss's expert format as transformers' convert_moe_packed_tensors
// reads it: blocks U8 [..., rows, groups, B] hold 2*B E2M1 values per group, two per byte, the low
// nibble first; scales U8 [..., rows, groups] are E8M0. Value (row, g*2B + i) is
// fp4(nibble i) * 2^(scale[row][g] - 127), computed in float32. With a leading expert dimension
// the result is transposed as transformers does: [experts, groups*2B, rows].
type MXFP4 struct {
	GroupBytes int64 // B
	Transposed bool
	Out        *Pipeline // F32 to the destination dtype
}

// MXRegion is where a box of the result lies: the files' offsets of blocks[0...] and scales[0...],
// the source sizes, and the box in result coordinates (expert, column, row) or (row, column).
type MXRegion struct {
	BlocksOff, ScalesOff int64
	Rows, Groups         int64 // per expert
	E0, NE               int64 // experts (0 and 1 without an expert dimension)
	R0, NR, C0, NC       int64
}

// Run writes the box, row-major in result order, in the destination dtype.
func (m *MXFP4) Run(dst []byte, blocks, scales Source, g MXRegion) error {
	out := int64(m.Out.dst.Size())
	gb := m.GroupBytes
	vals := 2 * gb
	first, last := g.C0/vals, (g.C0+g.NC-1)/vals
	tmp := make([]byte, 4*g.NC)
	for e := g.E0; e < g.E0+g.NE; e++ {
		for r := g.R0; r < g.R0+g.NR; r++ {
			row := e*g.Rows + r
			b := blocks.Slice(g.BlocksOff+(row*g.Groups+first)*gb, (last-first+1)*gb)
			s := scales.Slice(g.ScalesOff+row*g.Groups+first, last-first+1)
			if b == nil || s == nil {
				return fmt.Errorf("the plan did not read row %d of an MXFP4 tensor", row)
			}
			for c := range g.NC {
				col := g.C0 + c
				byteAt := (col/vals-first)*gb + (col%vals)/2
				code := b[byteAt] & 0xF
				if col%2 == 1 {
					code = b[byteAt] >> 4
				}
				v := fp4Values[code] * E8M0Scale(s[col/vals-first])
				binary.LittleEndian.PutUint32(tmp[4*c:], math.Float32bits(v))
			}
			if m.Transposed { // result [e][c][r]: this row is a column of the box
				at := ((e-g.E0)*g.NC*g.NR + (r - g.R0)) * out
				m.Out.Run(dst[at:], int(g.NR*out), tmp, 4, int(g.NC))
			} else {
				m.Out.Run(dst[(r-g.R0)*g.NC*out:], int(out), tmp, 4, int(g.NC))
			}
		}
	}
	return nil
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
