package planner

import (
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// mxfp4Dequant is mxfp4_dequant, gpt-oss's expert format as transformers' convert_moe_packed_tensors
// reads it: blocks U8 [..., rows, groups, B] hold 2*B E2M1 values per group, two per byte, the low
// nibble first; scales U8 [..., rows, groups] are E8M0. Value (row, g*2B + i) is
// fp4(nibble i) * 2^(scale[row][g] - 127), computed in float32. With a leading expert dimension
// the result is transposed as transformers does: [experts, groups*2B, rows]. Sources: blocks,
// scales.
type mxfp4Dequant struct{}

func (mxfp4Dequant) sources() int { return 2 }

func (mxfp4Dequant) validate(c *completionCheck) completionSpec {
	for i := range c.t.Deferred.Sources {
		if _, ok := c.source(i); !ok {
			return nil
		}
	}
	b, s := c.sources[0], c.sources[1]
	if b.DType != tensor.U8 || len(b.Shape) < 3 || len(b.Shape) > 4 {
		c.add(c.op("/sources/0"),
			"the blocks must be U8 [experts, rows, groups, bytes] or [rows, groups, bytes], %q is %s %v",
			b.Name, b.DTypeName, b.Shape)
		return nil
	}
	if (s.DType != tensor.U8 && s.DTypeName != "F8_E8M0") || !slices.Equal(s.Shape, b.Shape[:len(b.Shape)-1]) {
		c.add(c.op("/sources/1"), "the scales must be U8 or F8_E8M0 of shape %v, %q is %s %v",
			b.Shape[:len(b.Shape)-1], s.Name, s.DTypeName, s.Shape)
		return nil
	}
	out, err := tensor.NewPipeline(tensor.F32, nil, c.dst)
	if err != nil {
		c.add(c.ptr+"/dtype", "the dequantized float32 values cannot become %s", c.dst)
		return nil
	}
	n := len(b.Shape)
	gb := b.Shape[n-1]
	want := []int64{b.Shape[n-3], b.Shape[n-2] * 2 * gb}
	transposed := n == 4
	if transposed {
		want = []int64{b.Shape[0], b.Shape[2] * 2 * gb, b.Shape[1]}
	}
	if !slices.Equal(c.t.Shape, want) {
		c.add(c.ptr+"/shape", "the dequantized shape of %v blocks is %v", b.Shape, want)
		return nil
	}
	return &mxfp4Spec{blocks: b, scales: s, rows: b.Shape[n-3], groups: b.Shape[n-2], groupBytes: gb,
		transposed: transposed, out: out, outSize: int64(c.dst.Size())}
}

type mxfp4Spec struct {
	blocks, scales *checkpoint.Tensor
	rows, groups   int64 // per expert
	groupBytes     int64 // B
	transposed     bool
	out            *tensor.Pipeline // float32 to the destination dtype
	outSize        int64
}

func (m *mxfp4Spec) kernel(off, lens []int64) Kernel {
	k := &mxfp4Box{mxfp4Spec: m, ne: 1}
	if m.transposed {
		k.e0, k.ne, k.c0, k.nc, k.r0, k.nr = off[0], lens[0], off[1], lens[1], off[2], lens[2]
	} else {
		k.r0, k.nr, k.c0, k.nc = off[0], lens[0], off[1], lens[1]
	}
	return k
}

// mxfp4Box computes a box in result coordinates: experts [e0, e0+ne) (0 and 1 without an expert
// dimension), rows [r0, r0+nr), columns [c0, c0+nc).
type mxfp4Box struct {
	*mxfp4Spec
	e0, ne, r0, nr, c0, nc int64
}

// Sources are the block bytes and the scales of the box's rows and groups.
func (k *mxfp4Box) Sources(dst []Region) []Region {
	rows, groups, gb := k.rows, k.groups, k.groupBytes
	first := k.c0 / (2 * gb)
	ng := (k.c0+k.nc-1)/(2*gb) - first + 1
	row0 := k.e0*rows + k.r0
	return append(dst,
		region(k.blocks, k.blocks.Begin+(row0*groups+first)*gb, 1,
			[]int64{k.ne, k.nr, ng * gb}, []int64{rows * groups * gb, groups * gb, 1}),
		region(k.scales, k.scales.Begin+row0*groups+first, 1,
			[]int64{k.ne, k.nr, ng}, []int64{rows * groups, groups, 1}))
}

// Run writes the box, row-major in result order, in the destination dtype.
func (k *mxfp4Box) Run(seg []byte, files Files) error {
	blocks, scales := files(k.blocks.Key), files(k.scales.Key)
	out, gb := k.outSize, k.groupBytes
	vals := 2 * gb
	first, last := k.c0/vals, (k.c0+k.nc-1)/vals
	tmp := make([]byte, 4*k.nc)
	for e := k.e0; e < k.e0+k.ne; e++ {
		for r := k.r0; r < k.r0+k.nr; r++ {
			row := e*k.rows + r
			b := blocks.Slice(k.blocks.Begin+(row*k.groups+first)*gb, (last-first+1)*gb)
			s := scales.Slice(k.scales.Begin+row*k.groups+first, last-first+1)
			if b == nil || s == nil {
				return fmt.Errorf("the plan did not read row %d of an MXFP4 tensor", row)
			}
			for c := range k.nc {
				col := k.c0 + c
				byteAt := (col/vals-first)*gb + (col%vals)/2
				code := b[byteAt] & 0xF
				if col%2 == 1 {
					code = b[byteAt] >> 4
				}
				v := tensor.F32FromF4(code) * tensor.E8M0Scale(s[col/vals-first])
				binary.LittleEndian.PutUint32(tmp[4*c:], math.Float32bits(v))
			}
			if k.transposed { // result [e][c][r]: this row is a column of the box
				at := ((e-k.e0)*k.nc*k.nr + (r - k.r0)) * out
				k.out.Run(seg[at:], int(k.nr*out), tmp, 4, int(k.nc))
			} else {
				k.out.Run(seg[(r-k.r0)*k.nc*out:], int(out), tmp, 4, int(k.nc))
			}
		}
	}
	return nil
}

func (k *mxfp4Box) String() string {
	return fmt.Sprintf("mxfp4_dequant blocks=%s scales=%s experts=[%d, %d) rows=[%d, %d) cols=[%d, %d)", k.blocks.Name,
		k.scales.Name, k.e0, k.e0+k.ne, k.r0, k.r0+k.nr, k.c0, k.c0+k.nc)
}
