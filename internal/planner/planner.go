// Package planner turns a shard request and a resolved checkpoint into a plan: it validates the
// request (DESIGN §2, with a JSON pointer per error), cuts every box into segments of bounded size
// produced in output order, intersects each segment with the blocks, and turns each overlap into a
// strided copy and the byte ranges of the file it reads, coalesced across small gaps and split
// when long. It is pure: no I/O, no clocks, the same plan for the same inputs.
package planner

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strconv"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// Options are the planner's cost model and bounds.
type Options struct {
	// SegmentBytes bounds the output bytes produced at once; the executor holds a few segments.
	SegmentBytes int64
	// SegmentReadBytes bounds the bytes one segment reads; a segment over it is cut smaller.
	SegmentReadBytes int64
	// MaxGap is what one more read request costs, in bytes: two byte runs closer than this are read
	// as one, gap included.
	MaxGap int64
	// MaxRead splits longer reads into parallel requests.
	MaxRead int64
	// MaxReads refuses (422) a plan with more reads or segments than this.
	MaxReads int64
	// MaxOverread caps a merged read at this many times the bytes it needs (0: no cap), so a
	// sparse layout does not read a whole file to save requests.
	MaxOverread int64
	// Align rounds gather reads out to multiples of this many bytes (the cache's chunks, 0: off),
	// so overlapping requests of different clients read the same chunks.
	Align int64
}

// DefaultOptions suit a local disk: 8 MiB segments, 64 KiB of gap worth a request, 16 MiB reads.
func DefaultOptions() Options {
	return Options{SegmentBytes: 8 << 20, SegmentReadBytes: 16 << 20, MaxGap: 64 << 10, MaxRead: 16 << 20, MaxReads: 1 << 20}
}

// Plan is a validated request, ready to execute.
type Plan struct {
	Checkpoint string
	Format     api.ShardRequestFormat
	// Header is the safetensors header that starts the body (empty for raw).
	Header []byte
	// Items are the boxes in body order.
	Items []Item
	// BodyBytes is the exact Content-Length.
	BodyBytes int64
	// NeededBytes, ReadBytes and ReadRequests are the plan summary of DESIGN §2.
	NeededBytes  int64
	ReadBytes    int64
	ReadRequests int64
}

// Item is one box of one tensor, as it appears in the body.
type Item struct {
	Tensor     int // index in the request
	Box        int
	Name       string // the tensor's name
	StoredName string // its name in the safetensors format: Name, or Name#box with several boxes
	DType      tensor.DType
	Offsets    []int64
	Lengths    []int64
	Output     int64 // offset in the body
	Bytes      int64
	Pieces     []Piece
	Segments   []Segment
}

// Piece is the part of one block inside a box, for the plan report.
type Piece struct {
	Block   int
	Source  string
	Offsets []int64
	Lengths []int64
	// Direct is the seed's _direct_axes: every varying dimension walks a source dimension of its
	// own with step 1 and no post op applies.
	Direct bool
}

// Segment is a contiguous part of the body that is also a box of the destination tensor.
type Segment struct {
	Output int64 // offset in the body
	Bytes  int64
	// Fill is the encoded fill element to write over the segment first, nil when blocks cover it.
	Fill []byte
	// Direct reads land straight in the segment buffer at Dst.
	Direct []Read
	// Spans are read into buffers the Copies and Dequants gather from.
	Spans    []Read
	Copies   []Copy
	Dequants []Dequant
	MXFP4s   []MXFP4
	LoRAs    []LoRA
}

// LoRA computes one box of a merged LoRA weight; the box is all of the segment.
type LoRA struct {
	Kernel           *tensor.LoRA
	WKey, AKey, BKey string
	Region           tensor.LoRARegion
}

// MXFP4 computes one box of an MXFP4-dequantized tensor from the span buffers; the box is all of
// the segment.
type MXFP4 struct {
	Kernel               *tensor.MXFP4
	BlocksKey, ScalesKey string
	Region               tensor.MXRegion
}

// Dequant computes one box of a block-dequantized tensor from the span buffers.
type Dequant struct {
	Kernel              *tensor.BlockDequant
	WeightKey, ScaleKey string
	Region              tensor.Region // the box, which is all of the segment
}

// Read is one byte range of a file.
type Read struct {
	Key     string
	Version string
	Offset  int64
	Length  int64
	Dst     int64 // offset in the segment buffer, for direct reads
	// Needed is how many of the bytes the plan uses; the rest are gaps read to save requests.
	Needed int64
}

// Copy moves one block overlap from the span buffers into the segment buffer.
type Copy struct {
	Pipeline *tensor.Pipeline
	Key      string
	Src      int64 // file offset of the overlap's first element (in nibbles when Nibbles)
	Dst      int64 // offset in the segment buffer
	Layout   tensor.Strided
	// Nibbles: the source is packed F4; Src and the layout's source strides count half bytes.
	Nibbles bool
}

// New validates req against ck and plans it.
func New(req *api.ShardRequest, ck *checkpoint.Checkpoint, opts Options) (*Plan, error) {
	specs, verr := validate(req, ck)
	if verr != nil {
		return nil, verr
	}
	p := &Plan{Checkpoint: req.Checkpoint, Format: api.Raw}
	if req.Format != nil {
		p.Format = *req.Format
	}
	for _, spec := range specs {
		for b, box := range spec.boxes {
			name := spec.name
			if len(spec.boxes) > 1 {
				name += "#" + strconv.Itoa(b)
			}
			n, _ := product(box.Lengths)
			p.Items = append(p.Items, Item{Tensor: spec.index, Box: b, Name: spec.name, StoredName: name, DType: spec.dtype,
				Offsets: box.Offsets, Lengths: box.Lengths, Bytes: n * int64(spec.dtype.Size())})
		}
	}
	if p.Format == api.Safetensors {
		if err := p.layoutSafetensors(req, ck.Name); err != nil {
			return nil, err
		}
	}
	pos := int64(len(p.Header))
	for i := range p.Items {
		var ok bool
		p.Items[i].Output = pos
		if pos, ok = add(pos, p.Items[i].Bytes); !ok {
			return nil, &ValidationError{Errors: []FieldError{{"/tensors", "the response would be larger than this service can address"}}}
		}
	}
	p.BodyBytes = pos
	pl := &segmenter{opts: opts, plan: p, fileEnds: map[string]int64{}}
	for _, t := range ck.Tensors {
		pl.fileEnds[t.Key] = max(pl.fileEnds[t.Key], t.End)
	}
	for i := range p.Items {
		it := &p.Items[i]
		spec := specByIndex(specs, it.Tensor)
		it.Pieces = pieces(spec, it)
		if err := pl.segment(spec, it); err != nil {
			return nil, err
		}
	}
	return p, nil
}

func specByIndex(specs []tensorSpec, index int) *tensorSpec {
	i := sort.Search(len(specs), func(i int) bool { return specs[i].index >= index })
	return &specs[i]
}

func pieces(spec *tensorSpec, it *Item) []Piece {
	var out []Piece
	if d := spec.deferred; d != nil {
		return []Piece{{Block: -1, Source: d.weight.Name, Offsets: it.Offsets, Lengths: it.Lengths}}
	}
	for _, b := range spec.blocks {
		off, l, ok := intersect(it.Offsets, it.Lengths, b.Offsets, b.Lengths)
		if !ok {
			continue
		}
		out = append(out, Piece{Block: b.index, Source: b.Source, Offsets: off, Lengths: l, Direct: directAxes(&b, l)})
	}
	return out
}

// directAxes is the seed's _direct_axes: true when no post op applies and every destination
// dimension longer than one walks a source dimension of its own with step 1.
func directAxes(b *blockSpec, lengths []int64) bool {
	if b.Post != nil && len(*b.Post) > 0 {
		return false
	}
	used := map[int]bool{}
	for a, n := range lengths {
		if n == 1 {
			continue
		}
		walked := -1
		for s, row := range b.Coeff {
			if row[a] != 0 {
				if walked >= 0 {
					return false
				}
				walked = s
			}
		}
		if walked < 0 || b.Coeff[walked][a] != 1 || used[walked] {
			return false
		}
		used[walked] = true
	}
	return true
}

// layoutSafetensors orders the items for the safetensors format and builds its header. Items are
// ordered by descending element size (stable), as the reference writer does, so every tensor's
// data is aligned to its element size.
func (p *Plan) layoutSafetensors(req *api.ShardRequest, ckpt string) error {
	slices.SortStableFunc(p.Items, func(a, b Item) int { return b.DType.Size() - a.DType.Size() })
	type placement struct {
		Tensor  string  `json:"tensor"`
		Offsets []int64 `json:"offsets"`
		Shape   []int64 `json:"shape"`
	}
	boxes := map[string]placement{}
	entries := make([]safetensors.Entry, len(p.Items))
	var off int64
	for i, it := range p.Items {
		if _, dup := boxes[it.StoredName]; dup || it.StoredName == "__metadata__" {
			return &ValidationError{Errors: []FieldError{{fmt.Sprintf("/tensors/%d/name", it.Tensor),
				fmt.Sprintf("the safetensors name %q of this box is taken by another tensor or reserved", it.StoredName)}}}
		}
		boxes[it.StoredName] = placement{Tensor: it.Name, Offsets: it.Offsets, Shape: req.Tensors[it.Tensor].Shape}
		entries[i] = safetensors.Entry{Name: it.StoredName, DType: it.DType.String(), Shape: it.Lengths, DataOffsets: [2]int64{off, off + it.Bytes}}
		off += it.Bytes
	}
	placements, _ := json.Marshal(boxes)
	p.Header = safetensors.EncodeHeader(entries, map[string]string{
		"format": "pt", "shardsrv.checkpoint": ckpt, "shardsrv.boxes": string(placements),
	})
	return nil
}
