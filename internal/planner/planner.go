// Package planner turns a shard request and a resolved checkpoint into a plan: it validates the
// request (docs/contract.md, with a JSON pointer per error), cuts every box into segments of bounded size
// produced in output order, intersects each segment with the blocks, and turns each overlap into a
// strided copy and the byte ranges of the file it reads, coalesced across small gaps and split
// when long. It is pure: no I/O, no clocks, the same plan for the same inputs.
//
// Every plan is bounded before it is built: the body by MaxOutputBytes, the bytes read by
// MaxOverread times the bytes needed, and segments, reads and copies by MaxReads, each counted
// before the memory for it is taken. Blocks are indexed, so a box meets only the blocks it
// overlaps, and planning stops soon after its context is cancelled.
package planner

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"slices"
	"sort"
	"strconv"
	"unsafe"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/bytesize"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// Options are the planner's cost model and bounds. A field left at zero takes DefaultOptions'
// value, but MaxGap and Align, whose zero is none, and NoPieces.
type Options struct {
	// SegmentBytes bounds the output bytes produced at once; the executor holds a few segments
	// (0: DefaultOptions').
	SegmentBytes int64
	// SegmentReadBytes bounds the bytes one segment reads; a segment over it is cut smaller (0:
	// DefaultOptions').
	SegmentReadBytes int64
	// RegionBytes bounds a box's rectangle: the source bytes its segments share (a transpose's
	// rows), read once for all of them and held until the last is produced (Item.Rectangle; 0:
	// DefaultOptions').
	RegionBytes int64
	// MaxGap is what one more read request costs, in bytes: two byte runs closer than this are read
	// as one, gap included (0: none, runs are never merged across a gap).
	MaxGap int64
	// MaxRead is the store's read size: the plan cuts longer reads into requests of at most this
	// many bytes, which the executor issues in parallel as they are (0: DefaultOptions').
	MaxRead int64
	// MaxReads refuses (422) a plan with more reads, segments or copies (block overlaps) than
	// this (0: DefaultMaxReads). Each is counted before it is allocated.
	MaxReads int64
	// MaxOverread caps every read, merged or aligned, at this many times the bytes it needs
	// (0: DefaultMaxOverread), so a sparse layout does not read a whole file to save requests and
	// no plan reads more than MaxOverread times its NeededBytes (about twice that for packed F4
	// sources, whose nibbles round out to bytes).
	MaxOverread int64
	// MaxOutputBytes refuses (422) a request whose response body would be longer (0:
	// DefaultMaxOutputBytes).
	MaxOutputBytes int64
	// MaxPlanBytes refuses (422) a request whose plan would hold more memory than this (0:
	// DefaultMaxPlanBytes), checked as the plan grows, so a server can reserve this much of its
	// memory budget before planning and keep Plan.MemoryBytes of it while the plan lives.
	MaxPlanBytes int64
	// Align rounds gather reads out to multiples of this many bytes (the cache's chunks, 0: off),
	// so overlapping requests of different clients read the same chunks; a read is aligned only
	// when that keeps it within MaxOverread.
	Align int64
	// NoPieces leaves Item.Pieces empty: they only feed the plan report (/v1/plan), and a table of
	// a million blocks makes a million of them (false: the pieces are kept).
	NoPieces bool
}

// The defaults of the bounds.
const (
	DefaultMaxReads       = 1 << 20
	DefaultMaxOverread    = 16
	DefaultMaxOutputBytes = 1 << 40 // 1 TiB: no real shard is near it
	DefaultMaxPlanBytes   = 256 << 20
)

// RegisterFlags registers the planner's flags on fs; their defaults are o's values.
func (o *Options) RegisterFlags(fs *flag.FlagSet) {
	fs.Var(bytesize.Value{P: &o.SegmentBytes}, "segment-bytes", "output `SIZE` produced at once per stream")
	fs.Var(bytesize.Value{P: &o.SegmentReadBytes}, "segment-read-bytes",
		"most bytes (`SIZE`) one segment reads into gather buffers; bigger segments are cut")
	fs.Var(bytesize.Value{P: &o.RegionBytes}, "region-bytes",
		"most source bytes (`SIZE`) the segments of one box share, read once and held while they are produced "+
			"(the rows a transpose or a strided box covers)")
	fs.Var(bytesize.Value{P: &o.MaxGap}, "max-gap",
		"what one more read request costs, in bytes (`SIZE`): runs closer than this are read as one")
	fs.Var(bytesize.Value{P: &o.MaxRead}, "max-read", "reads longer than this `SIZE` are split into parallel requests")
	fs.Int64Var(
		&o.MaxReads,
		"max-reads",
		o.MaxReads,
		"refuse (422) a request whose plan needs more reads or segments than this",
	)
	fs.Int64Var(
		&o.MaxOverread,
		"max-overread",
		o.MaxOverread,
		"a read (merged across gaps or aligned to cache chunks) may be at most this many times the bytes "+
			"it needs, on every store",
	)
	fs.Var(
		bytesize.Value{P: &o.MaxOutputBytes},
		"max-output-bytes",
		"largest response body (`SIZE`) a request may ask for (422 above)",
	)
	fs.Var(bytesize.Value{P: &o.MaxPlanBytes}, "max-plan-bytes",
		"most memory (`SIZE`) one plan may take while it is built and streamed, charged to --memory-bytes (422 above)")
}

// Validate reports options no plan can be made with: negative ones (zero is the default, or for
// MaxGap and Align none).
func (o *Options) Validate() error {
	if o.SegmentBytes < 0 || o.SegmentReadBytes < 0 || o.RegionBytes < 0 || o.MaxRead < 0 || o.MaxReads < 0 ||
		o.MaxGap < 0 || o.MaxOverread < 0 || o.MaxOutputBytes < 0 || o.MaxPlanBytes < 0 || o.Align < 0 {
		return errors.New("the planner's sizes and counts must not be negative")
	}
	return nil
}

// DefaultOptions suit a local disk: 4 MiB segments reading at most 8 MiB (a gathered one and the
// one before it, waiting to be written, fit the executor's 16 MiB a stream; direct ones are sent
// from the file and hold nothing), boxes sharing at most 64 MiB of source rows (a 4096 × 8192
// BF16 transpose), 64 KiB of gap worth a request, 16 MiB reads, no read more than 16 times what
// it needs, at most 1 Mi reads, a 1 TiB body and a 256 MiB plan.
func DefaultOptions() Options {
	return Options{SegmentBytes: 4 << 20, SegmentReadBytes: 8 << 20, RegionBytes: 64 << 20, MaxGap: 64 << 10,
		MaxRead:  16 << 20,
		MaxReads: DefaultMaxReads, MaxOverread: DefaultMaxOverread, MaxOutputBytes: DefaultMaxOutputBytes,
		MaxPlanBytes: DefaultMaxPlanBytes}
}

// ObjectStoreOptions suit object stores (S3 and kin). A request costs about 1 MiB of transfer
// (10-20 ms at 50-100 MB/s per connection), so gaps up to that are read through. Direct runs are
// read into buffers ahead of the writer, a segment a request: 4 MiB segments put four ranged
// GETs in flight within the executor's 16 MiB a stream, sixteen while the memory budget is idle
// (docs/performance.md measured 8 MiB reads against the emulators: no better but for Azurite).
func ObjectStoreOptions() Options {
	o := DefaultOptions()
	o.MaxGap, o.MaxRead = 1<<20, 4<<20
	return o
}

// withDefaults fills the bounds left at zero, so no Options value plans without them.
func (o Options) withDefaults() Options {
	d := DefaultOptions()
	if o.SegmentBytes <= 0 {
		o.SegmentBytes = d.SegmentBytes
	}
	if o.SegmentReadBytes <= 0 {
		o.SegmentReadBytes = d.SegmentReadBytes
	}
	if o.RegionBytes <= 0 {
		o.RegionBytes = d.RegionBytes
	}
	if o.MaxRead <= 0 {
		o.MaxRead = d.MaxRead
	}
	if o.MaxReads <= 0 {
		o.MaxReads = d.MaxReads
	}
	if o.MaxOverread <= 0 {
		o.MaxOverread = d.MaxOverread
	}
	if o.MaxOutputBytes <= 0 {
		o.MaxOutputBytes = d.MaxOutputBytes
	}
	if o.MaxPlanBytes <= 0 {
		o.MaxPlanBytes = d.MaxPlanBytes
	}
	o.MaxGap, o.Align = max(o.MaxGap, 0), max(o.Align, 0)
	return o
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
	// NeededBytes, ReadBytes and ReadRequests are the plan summary of docs/contract.md.
	NeededBytes  int64
	ReadBytes    int64
	ReadRequests int64
	// MemoryBytes is about how much memory the plan itself holds (items, pieces, segments,
	// copies, reads, header, the blocks' conversions), for the server to charge to its memory
	// budget while the plan lives.
	MemoryBytes int64
	pipelines   int64 // the part of it the conversions with post ops take
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
	// Rectangle, when set, is what the item's segments read instead of spans of their own: byte
	// ranges of files laid out in one buffer (Dst) as a segment's spans are, cut to the store's
	// read size, read once before the first segment and held until the last (SpanFiles finds a
	// kernel's bytes in it). The planner shares them when the segments would read the same or
	// interleaved bytes (a transpose's source rows) in many more requests.
	Rectangle []Read
}

// Reads are every read the item makes: its rectangle's, then each segment's direct and span reads.
func (it *Item) Reads() []Read {
	reads := slices.Clone(it.Rectangle)
	for _, seg := range it.Segments {
		reads = append(reads, seg.Direct...)
		reads = append(reads, seg.Spans...)
	}
	return reads
}

// Piece is the part of one block inside a box, for the plan report.
type Piece struct {
	Block   int
	Source  string
	Offsets []int64
	Lengths []int64
	// Direct is hyper_parallel's _direct_axes (docs/references.md §1): every varying dimension walks a source
	// dimension of its
	// own with step 1 and no post op applies.
	Direct bool
}

// Segment is a contiguous part of the body that is also a box of the destination tensor.
type Segment struct {
	Output int64 // offset in the body
	Bytes  int64
	// Fill is the encoded fill element to write over the segment first, nil when blocks cover it.
	// It is not a kernel: it must be written before the direct reads land in the buffer.
	Fill []byte
	// Direct reads land straight in the segment buffer at Dst.
	Direct []Read
	// Spans are read into the segment's gather buffer at Dst, which the kernels read from
	// (SpanFiles): byte ranges of files sorted by file and offset, laid out one after another,
	// a range longer than the store's read size cut into reads that follow on in file and buffer.
	Spans []Read
	// Kernels write the rest of the segment from the spans, in order: strided copies of block
	// overlaps, or the one box of a completion.
	Kernels []Kernel
}

// Read is one byte range of a file.
type Read struct {
	Key     string
	Version string
	Offset  int64
	Length  int64
	Dst     int64 // offset in the buffer it lands in: the segment's (direct reads) or its gather buffer
	// Needed is how many of the bytes the plan uses; the rest are gaps read to save requests.
	Needed int64
}

// New validates req against ck and plans it.
func New(req *api.ShardRequest, ck *checkpoint.Checkpoint, opts Options) (*Plan, error) {
	return NewContext(context.Background(), req, ck, opts)
}

// NewContext is New, stopping soon (well within 100 ms) after ctx is done with ctx's error.
// Otherwise the error is a *ValidationError: 400 when its Schema is set, else 422.
func NewContext(ctx context.Context, req *api.ShardRequest, ck *checkpoint.Checkpoint, opts Options) (*Plan, error) {
	c := newChecker(ctx)
	p, err := newPlan(c, req, ck, opts.withDefaults())
	if err != nil {
		return nil, err
	}
	return p, nil
}

func newPlan(c *checker, req *api.ShardRequest, ck *checkpoint.Checkpoint, opts Options) (*Plan, error) {
	if c.tick(checkEvery) {
		return nil, c.err
	}
	specs, err := validate(req, ck, c)
	if err != nil {
		return nil, err
	}
	p := &Plan{Checkpoint: req.Checkpoint, Format: api.Raw}
	if req.Format != nil {
		p.Format = *req.Format
	}
	boxes := 0
	for _, spec := range specs {
		boxes += len(spec.boxes)
	}
	p.Items = make([]Item, 0, boxes)
	for _, spec := range specs {
		for b, box := range spec.boxes {
			name := spec.name
			if len(spec.boxes) > 1 {
				name += "#" + strconv.Itoa(b)
			}
			if c.tick(1) {
				return nil, c.err
			}
			n, _ := tensor.CheckedProduct(box.Lengths...)
			p.Items = append(
				p.Items,
				Item{Tensor: spec.index, Box: b, Name: spec.name, StoredName: name, DType: spec.dtype,
					Offsets: box.Offsets, Lengths: box.Lengths, Bytes: n * int64(spec.dtype.Size())},
			)
		}
	}
	if p.Format == api.Safetensors {
		if err := p.layoutSafetensors(req, ck.Name); err != nil {
			return nil, err
		}
	}
	// The body's length, and the segments counted before any is built: a small request cannot
	// make a huge plan.
	pl := &segmenter{opts: opts, plan: p, c: c, ck: ck}
	for _, spec := range specs {
		p.pipelines += spec.pipelineBytes
	}
	pl.mem = int64(unsafe.Sizeof(Plan{})) + int64(len(p.Header)) + int64(len(p.Items))*itemSize + p.pipelines
	pos := int64(len(p.Header))
	var segments int64
	for i := range p.Items {
		var ok bool
		it := &p.Items[i]
		if c.tick(1) {
			return nil, c.err
		}
		it.Output = pos
		if pos, ok = add(pos, it.Bytes); !ok || pos > opts.MaxOutputBytes {
			detail := fmt.Sprintf(
				"with this box the response would be more than %d bytes, the most this server sends in one response; "+
					"split the request",
				opts.MaxOutputBytes,
			)
			return nil, &ValidationError{
				Total:  1,
				Errors: []FieldError{{fmt.Sprintf("/tensors/%d/boxes/%d", it.Tensor, it.Box), detail}},
			}
		}
		pl.mem += 16 * int64(len(it.Lengths))
		n, ok := pl.count(it.Lengths, int64(it.DType.Size()))
		if segments += n; !ok || segments > opts.MaxReads || segments < 0 {
			pl.tensor = it.Tensor
			return nil, pl.tooMany("segments", max(segments, n), opts.MaxReads)
		}
		if pl.mem+segments*segmentSize > opts.MaxPlanBytes { // each segment takes at least that
			pl.tensor = it.Tensor
			return nil, pl.charge(segments * segmentSize)
		}
	}
	p.BodyBytes = pos
	for i := range p.Items {
		it := &p.Items[i]
		spec := specByIndex(specs, it.Tensor)
		if it.Pieces, err = pl.piecesOf(spec, it); err != nil {
			return nil, err
		}
		if err := pl.segmentAndShare(spec, it); err != nil {
			return nil, err
		}
	}
	if c.err != nil { // a loop that noticed the cancellation without returning it
		return nil, c.err
	}
	p.MemoryBytes = p.memory()
	return p, nil
}

const (
	itemSize    = int64(unsafe.Sizeof(Item{}))
	pieceSize   = int64(unsafe.Sizeof(Piece{}))
	segmentSize = int64(unsafe.Sizeof(Segment{}))
	readSize    = int64(unsafe.Sizeof(Read{}))
	copySize    = int64(unsafe.Sizeof(stridedCopy{}))
	kernelSize  = int64(unsafe.Sizeof(Kernel(nil)))
	// completionSize bounds a completion's kernel: a pointer to its spec and a box of a few
	// dimensions.
	completionSize = 128
)

// memory estimates the bytes a plan holds: its structs and the arrays they point to (strings
// are shared with the checkpoint and the request).
func (p *Plan) memory() int64 {
	n := int64(unsafe.Sizeof(Plan{})) + int64(cap(p.Header)) + int64(cap(p.Items))*itemSize + p.pipelines
	for i := range p.Items {
		it := &p.Items[i]
		n += 8*int64(cap(it.Offsets)+cap(it.Lengths)) + piecesMemory(it.Pieces) + int64(cap(it.Rectangle))*readSize
		n += int64(cap(it.Segments)-len(it.Segments)) * segmentSize
		for j := range it.Segments {
			n += segmentMemory(&it.Segments[j])
		}
	}
	return n
}

func piecesMemory(pieces []Piece) int64 {
	n := int64(cap(pieces)) * pieceSize
	for _, pc := range pieces {
		n += 8 * int64(cap(pc.Offsets)+cap(pc.Lengths))
	}
	return n
}

func segmentMemory(seg *Segment) int64 {
	n := segmentSize + int64(len(seg.Fill)) + int64(cap(seg.Direct)+cap(seg.Spans))*readSize
	n += int64(cap(seg.Kernels)) * kernelSize
	for _, k := range seg.Kernels {
		if c, ok := k.(*stridedCopy); ok { // the copies of a segment share one array
			n += copySize + 8*int64(cap(c.layout.Lengths)+cap(c.layout.Src)+cap(c.layout.Dst))
		} else {
			n += completionSize
		}
	}
	return n
}

func specByIndex(specs []tensorSpec, index int) *tensorSpec {
	i := sort.Search(len(specs), func(i int) bool { return specs[i].index >= index })
	return &specs[i]
}

// piecesOf lists the blocks' parts inside an item, for the plan report; there are no more of
// them than copies, so they count against MaxReads too, before they are allocated.
func (s *segmenter) piecesOf(spec *tensorSpec, it *Item) ([]Piece, error) {
	s.tensor = it.Tensor
	if s.opts.NoPieces {
		return nil, nil
	}
	if d := spec.deferred; d != nil {
		return []Piece{{Block: -1, Source: d.sources[0].Name, Offsets: it.Offsets, Lengths: it.Lengths}}, nil
	}
	s.hits = spec.lookup.query(it.Offsets, it.Lengths, s.hits[:0], s.c)
	if s.c.err != nil {
		return nil, s.c.err
	}
	if s.pieces += int64(len(s.hits)); s.pieces > s.opts.MaxReads {
		return nil, s.tooMany("block pieces", s.pieces, s.opts.MaxReads)
	}
	estimate := (pieceSize + 16*int64(len(it.Offsets))) * int64(len(s.hits))
	if err := s.charge(estimate); err != nil { // before allocating them
		return nil, err
	}
	out := make([]Piece, len(s.hits))
	rank := len(it.Offsets)
	buf := make([]int64, 2*rank*len(s.hits))
	for i, j := range s.hits {
		if s.c.tick(1) {
			return nil, s.c.err
		}
		b := &spec.blocks[j]
		off, l := buf[2*rank*i:2*rank*i+rank:2*rank*i+rank], buf[2*rank*i+rank:2*rank*(i+1):2*rank*(i+1)]
		for d := range rank {
			lo, hi := max(it.Offsets[d], b.Offsets[d]), min(it.Offsets[d]+it.Lengths[d], b.Offsets[d]+b.Lengths[d])
			off[d], l[d] = lo, hi-lo
		}
		out[i] = Piece{Block: b.index, Source: b.Source, Offsets: off, Lengths: l, Direct: directAxes(b, l)}
	}
	s.mem += piecesMemory(out) - estimate
	return out, nil
}

// directAxes is hyper_parallel's _direct_axes (docs/references.md §1): true when no post op applies and every
// destination
// dimension longer than one walks a source dimension of its own with step 1.
func directAxes(b *blockSpec, lengths []int64) bool {
	if b.Post != nil && len(*b.Post) > 0 {
		return false
	}
	var used uint64 // source dimensions walked, for the first 64
	var more []bool // and the rest
	if len(b.Coeff) > 64 {
		more = make([]bool, len(b.Coeff))
	}
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
		if walked < 0 || b.Coeff[walked][a] != 1 {
			return false
		}
		if walked < 64 {
			if used&(1<<walked) != 0 {
				return false
			}
			used |= 1 << walked
		} else {
			if more[walked] {
				return false
			}
			more[walked] = true
		}
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
				fmt.Sprintf(
					"the safetensors name %q of this box is taken by another tensor or reserved",
					it.StoredName,
				)}}}
		}
		boxes[it.StoredName] = placement{Tensor: it.Name, Offsets: it.Offsets, Shape: req.Tensors[it.Tensor].Shape}
		entries[i] = safetensors.Entry{
			Name:        it.StoredName,
			DType:       it.DType.String(),
			Shape:       it.Lengths,
			DataOffsets: [2]int64{off, off + it.Bytes},
		}
		off += it.Bytes
	}
	placements, _ := json.Marshal(boxes)
	meta := map[string]string{"format": "pt", "shardsrv.checkpoint": ckpt, "shardsrv.boxes": string(placements)}
	if l := req.Layout; l != nil { // which engine and release line the table was laid out for
		meta["shardsrv.engine"] = string(l.Engine)
		if l.EngineVersion != nil {
			meta["shardsrv.engine_version"] = *l.EngineVersion
		}
	}
	p.Header = safetensors.EncodeHeader(entries, meta)
	return nil
}
