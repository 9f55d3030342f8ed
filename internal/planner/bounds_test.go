package planner

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"runtime"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// bigCheckpoint holds BF16 tensors of the given shapes, back to back in one file from byte 1024.
func bigCheckpoint(shapes map[string][]int64) *checkpoint.Checkpoint {
	ck := &checkpoint.Checkpoint{Name: "ck", Tensors: map[string]*checkpoint.Tensor{}}
	off := int64(1024)
	names := make([]string, 0, len(shapes))
	for n := range shapes {
		names = append(names, n)
	}
	sort.Strings(names)
	for _, name := range names {
		n := int64(2)
		for _, d := range shapes[name] {
			n *= d
		}
		ck.Tensors[name] = &checkpoint.Tensor{Key: "ck/model.safetensors", Version: "v1", Tensor: safetensors.Tensor{
			Name: name, DTypeName: "BF16", DType: tensor.BF16, Shape: shapes[name], Begin: off, End: off + n}}
		off += n
	}
	return ck
}

func oneBlock(name string, shape []int64, block api.Block) *api.ShardRequest {
	blocks := []api.Block{block}
	return &api.ShardRequest{Checkpoint: "ck", Tensors: []api.TensorRequest{{Name: name, Dtype: api.BF16, Shape: shape,
		Boxes: []api.Box{{Offsets: make([]int64, len(shape)), Lengths: shape}}, Blocks: &blocks}}}
}

// checkBounds: every read is at most MaxOverread times the bytes it needs, so the plan reads at
// most MaxOverread times its NeededBytes (no F4 sources here), and gather reads are sorted and
// disjoint per file, as the executor's span lookup assumes.
func checkBounds(t *testing.T, p *Plan, opts Options) {
	t.Helper()
	opts = opts.withDefaults()
	r := opts.MaxOverread
	var requests int64
	for _, it := range p.Items {
		requests += int64(len(it.Rectangle))
		checkLaidOut(t, it.Rectangle, min(opts.MaxRead, opts.SegmentReadBytes), r)
		if it.Rectangle != nil {
			var held int64
			for _, rd := range it.Rectangle {
				held += rd.Length
			}
			if held > opts.RegionBytes {
				t.Fatalf("item %s shares a rectangle of %d bytes, more than %d", it.StoredName, held, opts.RegionBytes)
			}
		}
		for _, seg := range it.Segments {
			requests += int64(len(seg.Direct) + len(seg.Spans))
			if it.Rectangle != nil && len(seg.Spans) > 0 {
				t.Fatalf("a segment of %s reads spans of its own beside its item's rectangle", it.StoredName)
			}
			checkLaidOut(t, seg.Spans, opts.MaxRead, r)
			var spanBytes int64
			for _, rd := range seg.Spans {
				spanBytes += rd.Length
			}
			if spanBytes > opts.SegmentReadBytes && seg.Bytes > int64(it.DType.Size()) {
				t.Fatalf("a segment of %s reads %d bytes of spans, more than %d, and was not halved", it.StoredName,
					spanBytes, opts.SegmentReadBytes)
			}
			for _, rd := range seg.Direct {
				if rd.Length > opts.MaxRead {
					t.Fatalf("read %+v: longer than the read size %d", rd, opts.MaxRead)
				}
				checkAmplification(t, rd, r)
			}
		}
	}
	if requests != p.ReadRequests {
		t.Fatalf("the plan counts %d read requests and holds %d reads", p.ReadRequests, requests)
	}
	if p.ReadBytes > r*p.NeededBytes {
		t.Fatalf("the plan reads %d bytes, more than %d times the %d it needs", p.ReadBytes, r, p.NeededBytes)
	}
}

// checkLaidOut checks reads laid out in one buffer: in file order, each landing right after the one
// before, none longer than size, and every run of them that continues in the file (the parts of
// one span, cut to the read size, may need none of their bytes) at most r times what it needs.
func checkLaidOut(t *testing.T, reads []Read, size, r int64) {
	t.Helper()
	var span Read
	for i, rd := range reads {
		if rd.Length > size || rd.Length <= 0 {
			t.Fatalf("read %+v: longer than the read size %d, or empty", rd, size)
		}
		if i == 0 {
			if rd.Dst != 0 {
				t.Fatalf("the first read lands at %d of its buffer, not at 0", rd.Dst)
			}
			span = rd
			continue
		}
		last := reads[i-1]
		if last.Dst+last.Length != rd.Dst {
			t.Fatalf("read %+v does not land right after %+v", rd, last)
		}
		switch {
		case last.Key == rd.Key && last.Offset+last.Length == rd.Offset: // the next part of a span
			span.Length += rd.Length
			span.Needed += rd.Needed
		case last.Key > rd.Key || last.Key == rd.Key && last.Offset+last.Length > rd.Offset:
			t.Fatalf("reads %+v and %+v are out of order or overlap", last, rd)
		default:
			checkAmplification(t, span, r)
			span = rd
		}
	}
	if len(reads) > 0 {
		checkAmplification(t, span, r)
	}
}

func checkAmplification(t *testing.T, rd Read, r int64) {
	t.Helper()
	if rd.Needed > rd.Length || rd.Needed <= 0 || rd.Length > r*rd.Needed {
		t.Fatalf("read %+v: more than %d times the %d bytes it needs", rd, r, rd.Needed)
	}
}

// A full transpose of a 256 MiB BF16 tensor planned 4.39 TB of reads (runs 32 KiB
// apart merged across the 64 KiB gap, again in every segment). With the local store's options
// (DefaultOptions, which cmd/shardsrv gives a directory) and with S3's, it reads its bytes once.
func TestTransposeReadsItsBytesOnce(t *testing.T) {
	ck := bigCheckpoint(map[string][]int64{"w": {8192, 16384}})
	req := oneBlock(
		"t",
		[]int64{16384, 8192},
		api.Block{Offsets: []int64{0, 0}, Lengths: []int64{16384, 8192}, Source: "w",
			Base: []int64{0, 0}, Coeff: [][]int64{{0, 1}, {1, 0}}},
	)
	s3 := DefaultOptions()
	s3.MaxGap, s3.MaxRead, s3.SegmentBytes, s3.SegmentReadBytes, s3.MaxOverread, s3.Align =
		1<<20, 8<<20, 16<<20, 32<<20, 16, 8<<20
	for name, opts := range map[string]Options{"local": DefaultOptions(), "s3": s3} {
		p, err := New(req, ck, opts)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		if p.NeededBytes != 256<<20 || float64(p.ReadBytes) > 1.1*float64(p.BodyBytes) {
			t.Errorf(
				"%s: the transpose needs %d bytes and reads %d, %.1f× its %d bytes (want ≤ 1.1×)",
				name,
				p.NeededBytes,
				p.ReadBytes,
				float64(p.ReadBytes)/float64(p.BodyBytes),
				p.BodyBytes,
			)
		}
		checkBounds(t, p, opts)
		t.Logf(
			"%s: read %.3f× the output in %d requests",
			name,
			float64(p.ReadBytes)/float64(p.BodyBytes),
			p.ReadRequests,
		)
	}
}

// No read, merged or aligned, is more than MaxOverread times what it needs: a sparse gather (one
// element in 64 of each row) under a cost model that would merge everything, and the cache's
// alignment, which rounded a 2-byte read to a whole chunk.
func TestEveryReadIsBoundedByMaxOverread(t *testing.T) {
	ck := bigCheckpoint(map[string][]int64{"w": {256, 4096}})
	sparse := oneBlock("t", []int64{64, 64}, api.Block{Offsets: []int64{0, 0}, Lengths: []int64{64, 64}, Source: "w",
		Base: []int64{0, 0}, Coeff: [][]int64{{1, 0}, {0, 64}}})
	point := oneBlock(
		"t",
		[]int64{1},
		api.Block{
			Offsets: []int64{0},
			Lengths: []int64{1},
			Source:  "w",
			Base:    []int64{7, 100},
			Coeff:   [][]int64{{0}, {0}},
		},
	)
	for _, r := range []int64{0, 1, 3, 16} {
		for _, align := range []int64{0, 4096, 8 << 20} {
			opts := DefaultOptions()
			opts.MaxGap, opts.MaxOverread, opts.Align = 1<<20, r, align
			for _, req := range []*api.ShardRequest{sparse, point} {
				p, err := New(req, ck, opts)
				if err != nil {
					t.Fatal(err)
				}
				checkBounds(t, p, opts)
			}
		}
	}
}

// columns is one box over n column blocks of a [2, n] BF16 tensor, each block a column of w.
func columns(n int64) (*api.ShardRequest, *checkpoint.Checkpoint) {
	ck := bigCheckpoint(map[string][]int64{"w": {2, n}})
	blocks := make([]api.Block, n)
	id := [][]int64{{1, 0}, {0, 1}}
	for j := range n {
		blocks[j] = api.Block{
			Offsets: []int64{0, j},
			Lengths: []int64{2, 1},
			Source:  "w",
			Base:    []int64{0, j},
			Coeff:   id,
		}
	}
	return &api.ShardRequest{
		Checkpoint: "ck",
		Tensors: []api.TensorRequest{{Name: "t", Dtype: api.BF16, Shape: []int64{2, n},
			Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: []int64{2, n}}}, Blocks: &blocks}},
	}, ck
}

// grid is one box over an n x n grid of 1x1 blocks of an [n, n] tensor, transposing w, the blocks
// listed column by column: they vary along both dimensions, so they take the hierarchy.
func grid(n int64) (*api.ShardRequest, *checkpoint.Checkpoint) {
	ck := bigCheckpoint(map[string][]int64{"w": {n, n}})
	var blocks []api.Block
	for j := range n {
		for i := range n {
			blocks = append(
				blocks,
				api.Block{
					Offsets: []int64{i, j},
					Lengths: []int64{1, 1},
					Source:  "w",
					Base:    []int64{j, i},
					Coeff:   [][]int64{{0, 1}, {1, 0}},
				},
			)
		}
	}
	return &api.ShardRequest{
		Checkpoint: "ck",
		Tensors: []api.TensorRequest{{Name: "t", Dtype: api.BF16, Shape: []int64{n, n},
			Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: []int64{n, n}}}, Blocks: &blocks}},
	}, ck
}

// points gives the request n one-element boxes, one per block.
func points(req *api.ShardRequest, n int64) {
	var boxes []api.Box
	for j := range n {
		boxes = append(boxes, api.Box{Offsets: []int64{j % 2, j}, Lengths: []int64{1, 1}})
	}
	req.Tensors[0].Boxes = boxes
}

func work(t *testing.T, req *api.ShardRequest, ck *checkpoint.Checkpoint) (*Plan, int64) {
	t.Helper()
	c := newChecker(context.Background())
	p, err := newPlan(c, req, ck, DefaultOptions().withDefaults())
	if err != nil {
		t.Fatal(err)
	}
	return p, c.work
}

// One box over N column blocks once took 12.5 s at N = 50k (every block against every block,
// twice), and one-element boxes met every block. Planning is near-linear: the work
// (index nodes, blocks, runs visited) grows about as N log N, never as N², and 64 Ki blocks plan
// in well under a second without the race detector (1 Mi in about 1 s on a 2-core VM).
func TestManyBlocksPlanInNearLinearTime(t *testing.T) {
	for name, build := range map[string]func(n int64) (*api.ShardRequest, *checkpoint.Checkpoint){
		"columns": columns,
		"points": func(n int64) (*api.ShardRequest, *checkpoint.Checkpoint) {
			req, ck := columns(n)
			points(req, n)
			return req, ck
		},
		"grid": func(n int64) (*api.ShardRequest, *checkpoint.Checkpoint) { return grid(int64(isqrt(n))) },
	} {
		t.Run(name, func(t *testing.T) {
			small, large := int64(1<<12), int64(1<<14)
			req, ck := build(small)
			_, w1 := work(t, req, ck)
			req, ck = build(large)
			start := time.Now()
			p, w2 := work(t, req, ck)
			took := time.Since(start)
			// N log N grows 4.7× from 4 Ki to 16 Ki; N² would grow 16×.
			if ratio := float64(w2) / float64(w1); ratio > 6 {
				t.Errorf("4× the blocks took %.1f× the work (%d → %d): not near-linear", ratio, w1, w2)
			}
			if p.NeededBytes != p.BodyBytes || p.ReadBytes != p.BodyBytes {
				t.Errorf("needed %d, read %d, body %d", p.NeededBytes, p.ReadBytes, p.BodyBytes)
			}
			t.Logf("%d blocks: work %d, %v", large, w2, took)
		})
	}
}

func isqrt(n int64) int64 {
	r := int64(1)
	for (r+1)*(r+1) <= n {
		r++
	}
	return r
}

// The 50k-column request above reads its 2 rows in 2 reads: the column copies are fused. Its
// work is bounded in TestManyBlocksPlanInNearLinearTime, counted rather than timed.
func TestFiftyThousandColumnBlocks(t *testing.T) {
	req, ck := columns(50000)
	p, err := New(req, ck, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	if p.ReadRequests > 2 || len(p.Items[0].Pieces) != 50000 {
		t.Errorf("%d reads, %d pieces", p.ReadRequests, len(p.Items[0].Pieces))
	}
}

// countdown is a context that is cancelled at its n-th look.
type countdown struct {
	context.Context
	n, looks int
}

func (c *countdown) Err() error {
	if c.looks++; c.looks >= c.n {
		return context.Canceled
	}
	return nil
}

// Planning looks at its context every checkEvery units of work at most and stops at the first
// look that finds it done, in every phase (validation, indexing, overlaps, pieces, segments).
func TestPlanningStopsAtTheFirstLookAfterCancel(t *testing.T) {
	req, ck := grid(128)
	c := newChecker(context.Background())
	if _, err := newPlan(c, req, ck, DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	if c.checks < 20 {
		t.Fatalf("%d looks for %d units of work", c.checks, c.work)
	}
	for _, n := range []int{1, 2, 3, c.checks / 4, c.checks / 2, c.checks - 1} {
		ctx := &countdown{Context: context.Background(), n: n}
		p, err := NewContext(ctx, req, ck, DefaultOptions())
		if !errors.Is(err, context.Canceled) || p != nil {
			t.Fatalf("cancelled at look %d of %d: %v", n, c.checks, err)
		}
		if ctx.looks != n {
			t.Errorf("cancelled at look %d, planning looked %d times", n, ctx.looks)
		}
	}
}

// cancelAt is a real cancellable context that planning's look number at cancels, just before
// the look reads it: a cancellation that lands mid-planning at a known point, however slowly the
// machine runs.
type cancelAt struct {
	context.Context
	cancel    context.CancelFunc
	at, looks int
}

func (c *cancelAt) Err() error {
	if c.looks++; c.looks == c.at {
		c.cancel()
	}
	return c.Context.Err()
}

// A real cancellation in the middle of planning a quarter of a million blocks stops planning at
// the look that finds it, in whichever phase it lands. Planning looks every checkEvery units of
// work (well under 100 ms), so promptly is held here in looks, which a loaded machine cannot
// change, rather than in wall time, which it can.
func TestCancelledPlanningReturnsPromptly(t *testing.T) {
	if testing.Short() {
		t.Skip("plans a quarter of a million blocks")
	}
	req, ck := columns(1 << 17)
	points(req, 1<<17)
	whole := newChecker(context.Background())
	if _, err := newPlan(whole, req, ck, DefaultOptions()); err != nil {
		t.Fatal(err)
	}
	for _, at := range []int{1, whole.checks / 10, whole.checks / 2, whole.checks - 1} {
		ctx, cancel := context.WithCancel(context.Background())
		real := &cancelAt{Context: ctx, cancel: cancel, at: at}
		p, err := NewContext(real, req, ck, DefaultOptions())
		cancel()
		if !errors.Is(err, context.Canceled) || p != nil {
			t.Fatalf("cancelled at look %d of %d: %v", at, whole.checks, err)
		}
		if real.looks != at {
			t.Errorf("cancelled at look %d of %d: planning looked %d times", at, whole.checks, real.looks)
		}
	}
}

func allocated(f func()) uint64 {
	var a, b runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&a)
	f()
	runtime.ReadMemStats(&b)
	return b.TotalAlloc - a.TotalAlloc
}

func broadcast(n int64) *api.ShardRequest {
	return oneBlock(
		"t",
		[]int64{n},
		api.Block{Offsets: []int64{0}, Lengths: []int64{n}, Source: "s", Base: []int64{0}, Coeff: [][]int64{{0}}},
	)
}

// A 330-byte request broadcasting a 2-byte source into a BF16 [2^42] tensor once built 2^20
// segments (a 67 MB plan). 8 TiB is past MaxOutputBytes (1 TiB by default): refused
// at the box, before anything is built.
func TestTwoBytesIntoEightTiBIsRefused(t *testing.T) {
	ck := bigCheckpoint(map[string][]int64{"s": {1}})
	var err error
	n := allocated(func() { _, err = New(broadcast(1<<42), ck, DefaultOptions()) })
	var verr *ValidationError
	if !errors.As(err, &verr) || verr.Schema || verr.Errors[0].Pointer != "/tensors/0/boxes/0" {
		t.Fatalf("got %v, want a 422 at /tensors/0/boxes/0", err)
	}
	if n > 64<<10 {
		t.Errorf("refusing took %d bytes", n)
	}
	if DefaultOptions().MaxOutputBytes != 1<<40 {
		t.Errorf("the default output cap is %d", DefaultOptions().MaxOutputBytes)
	}
	// The cap is the body's length: 1000 bytes fit 1000, 1002 do not.
	opts := DefaultOptions()
	opts.MaxOutputBytes = 1000
	if _, err := New(broadcast(500), ck, opts); err != nil {
		t.Error(err)
	}
	if _, err := New(broadcast(501), ck, opts); !errors.As(err, &verr) {
		t.Errorf("1002 bytes over a 1000-byte cap: %v", err)
	}
}

// Segments are counted before any is built: past MaxReads the request is refused having
// allocated next to nothing (it used to build MaxReads segments first).
func TestSegmentsAreCountedBeforeTheyAreBuilt(t *testing.T) {
	ck := bigCheckpoint(map[string][]int64{"s": {1}})
	opts := DefaultOptions()
	opts.MaxOutputBytes, opts.MaxReads, opts.SegmentBytes = 1<<50, 1<<14, 4096
	var err error
	n := allocated(func() { _, err = New(broadcast(1<<30), ck, opts) })
	var verr *ValidationError
	if !errors.As(err, &verr) || verr.Schema || verr.Errors[0].Pointer != "/tensors/0" {
		t.Fatalf("got %v, want a 422 at /tensors/0", err)
	}
	if n > 256<<10 {
		t.Errorf("refusing took %d bytes", n)
	}
}

// MemoryBytes is about what the plan holds, and a plan that would hold more than MaxPlanBytes is
// refused as it grows.
func TestPlanMemoryIsMeasuredAndCapped(t *testing.T) {
	ck := bigCheckpoint(map[string][]int64{"s": {1}})
	opts := DefaultOptions()
	opts.SegmentBytes = 4096
	req := broadcast(1 << 24) // 32 MiB of output: 8192 segments
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	p, err := New(req, ck, opts)
	if err != nil {
		t.Fatal(err)
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	live := int64(after.HeapAlloc) - int64(before.HeapAlloc)
	if p.MemoryBytes < live/2 || p.MemoryBytes > 2*live {
		t.Errorf("MemoryBytes %d, the plan holds %d", p.MemoryBytes, live)
	}
	t.Logf("MemoryBytes %d, live heap %d", p.MemoryBytes, live)
	runtime.KeepAlive(p)
	opts.MaxPlanBytes = p.MemoryBytes / 2
	var verr *ValidationError
	if _, err := New(req, ck, opts); !errors.As(err, &verr) || verr.Errors[0].Pointer != "/tensors/0" {
		t.Errorf("a plan over MaxPlanBytes: %v", err)
	}
	// Pieces count too; NoPieces drops them.
	creq, cck := columns(4096)
	with, err := New(creq, cck, DefaultOptions())
	if err != nil {
		t.Fatal(err)
	}
	opts = DefaultOptions()
	opts.NoPieces = true
	without, err := New(creq, cck, opts)
	if err != nil {
		t.Fatal(err)
	}
	if len(without.Items[0].Pieces) != 0 || with.MemoryBytes < without.MemoryBytes+4096*int64(pieceSize) {
		t.Errorf("pieces: %d bytes with, %d without", with.MemoryBytes, without.MemoryBytes)
	}
}

// Copies, reads and pieces count against MaxReads before they are allocated.
func TestCopiesAndPiecesCountAgainstMaxReads(t *testing.T) {
	req, ck := grid(64)
	opts := DefaultOptions()
	opts.MaxReads = 1000 // 4096 blocks in one segment
	var verr *ValidationError
	if _, err := New(req, ck, opts); !errors.As(err, &verr) || verr.Schema {
		t.Errorf("4096 pieces over a limit of 1000: %v", err)
	}
	opts.NoPieces = true
	if _, err := New(req, ck, opts); !errors.As(err, &verr) || verr.Schema {
		t.Errorf("4096 copies over a limit of 1000: %v", err)
	}
}

// The first block that overlaps an earlier one is named, with the earlier one, whatever the
// layout takes (the line index or the hierarchy).
func TestOverlapsNameTheFirstBlock(t *testing.T) {
	req, ck := columns(1000)
	blocks := *req.Tensors[0].Blocks
	blocks[700].Offsets = []int64{0, 300} // a copy of column 300
	_, err := New(req, ck, DefaultOptions())
	var verr *ValidationError
	if !errors.As(err, &verr) || verr.Errors[0].Pointer != "/tensors/0/blocks/700" ||
		!strings.HasPrefix(verr.Errors[0].Detail, "overlaps block 300:") {
		t.Errorf("got %v", err)
	}
	req, ck = grid(40)
	blocks = *req.Tensors[0].Blocks
	blocks[900].Lengths = []int64{2, 2} // reaches into 901, 940 and 941
	_, err = New(req, ck, DefaultOptions())
	if !errors.As(err, &verr) || verr.Errors[0].Pointer != "/tensors/0/blocks/901" ||
		!strings.HasPrefix(verr.Errors[0].Detail, "overlaps block 900:") {
		t.Errorf("got %v", err)
	}
}

// The index finds exactly the blocks a box meets: random boxes over random disjoint tables,
// against testing every block.
func TestIndexFindsTheBlocksABoxMeets(t *testing.T) {
	for seed := range 40 {
		rank := 1 + seed%4
		var blocks []blockSpec
		// a grid with random cuts along each dimension, some cells dropped
		cuts := make([][]int64, rank)
		for d := range rank {
			cuts[d] = []int64{0}
			for x := int64(0); x < 20; {
				x += 1 + int64((seed*7+d*13+int(x)*5)%4)
				cuts[d] = append(cuts[d], x)
			}
		}
		idx := make([]int, rank)
		for cell := 0; ; cell++ {
			off, lens := make([]int64, rank), make([]int64, rank)
			for d := range rank {
				off[d], lens[d] = cuts[d][idx[d]], cuts[d][idx[d]+1]-cuts[d][idx[d]]
			}
			if cell%5 != seed%5 {
				blocks = append(blocks, blockSpec{index: len(blocks), Block: &api.Block{Offsets: off, Lengths: lens}})
			}
			d := rank - 1
			for ; d >= 0; d-- {
				if idx[d]++; idx[d] < len(cuts[d])-1 {
					break
				}
				idx[d] = 0
			}
			if d < 0 {
				break
			}
		}
		if seed%3 == 0 { // only one dimension varies: the line index
			for i := range blocks {
				for d := 1; d < rank; d++ {
					blocks[i].Offsets[d], blocks[i].Lengths[d] = 0, 3
				}
			}
			seen := map[int64]bool{}
			blocks = slices.DeleteFunc(blocks, func(b blockSpec) bool {
				dup := seen[b.Offsets[0]]
				seen[b.Offsets[0]] = true
				return dup
			})
			for i := range blocks {
				blocks[i].index = i
			}
		}
		c := newChecker(context.Background())
		x := newBlockIndex(blocks, c)
		if seed%3 == 0 && !x.line {
			t.Fatalf("seed %d: a one-dimensional table did not get the line index", seed)
		}
		if x.anyOverlap(c) {
			t.Fatalf("seed %d: disjoint blocks reported overlapping", seed)
		}
		if !x.line && len(blocks) > 1 { // one more block, over a corner of another: they overlap
			o := blocks[len(blocks)/2]
			more := append(
				slices.Clone(blocks),
				blockSpec{
					index: len(blocks),
					Block: &api.Block{Offsets: o.Offsets, Lengths: slices.Repeat([]int64{1}, rank)},
				},
			)
			if !newBlockIndex(more, c).anyOverlap(c) {
				t.Fatalf("seed %d: an overlap went unseen", seed)
			}
		}
		for q := range 200 {
			off, lens := make([]int64, rank), make([]int64, rank)
			for d := range rank {
				off[d] = int64((q*31 + d*17 + seed) % 25)
				lens[d] = 1 + int64((q*7+d*3+seed)%9)
			}
			got := x.query(off, lens, nil, c)
			var want []int32
			for i, b := range blocks {
				meets := true
				for d := range rank {
					meets = meets && b.Offsets[d] < off[d]+lens[d] && off[d] < b.Offsets[d]+b.Lengths[d]
				}
				if meets {
					want = append(want, int32(i))
				}
			}
			if !slices.Equal(got, want) {
				t.Fatalf("seed %d, box %v+%v: got %v, want %v", seed, off, lens, got, want)
			}
		}
	}
}

// execute runs a plan as the executor does, over file bytes.
func execute(t *testing.T, p *Plan, file []byte) []byte {
	t.Helper()
	body := make([]byte, p.BodyBytes)
	copy(body, p.Header)
	for _, it := range p.Items {
		shared := SpanFiles(it.Rectangle, gather(it.Rectangle, file))
		for _, seg := range it.Segments {
			out := body[seg.Output : seg.Output+seg.Bytes]
			if seg.Fill != nil {
				tensor.Fill(out, seg.Fill)
			}
			for _, r := range seg.Direct {
				copy(out[r.Dst:r.Dst+r.Length], file[r.Offset:r.Offset+r.Length])
			}
			files := SpanFiles(seg.Spans, gather(seg.Spans, file))
			if it.Rectangle != nil {
				files = shared
			}
			for _, k := range seg.Kernels {
				if err := k.Run(out, files); err != nil {
					t.Fatalf("%v: %v", k, err)
				}
			}
		}
	}
	return body
}

// gather reads reads laid out in one buffer from file bytes.
func gather(reads []Read, file []byte) []byte {
	if len(reads) == 0 {
		return nil
	}
	last := reads[len(reads)-1]
	buf := make([]byte, last.Dst+last.Length)
	for _, r := range reads {
		copy(buf[r.Dst:r.Dst+r.Length], file[r.Offset:r.Offset+r.Length])
	}
	return buf
}

// checkValues executes a plan over made-up file bytes and compares every element of every box
// with the block formula evaluated element by element: source[base + coeff @ (x - offsets)],
// through the block's conversion, or the fill.
func checkValues(t *testing.T, req *api.ShardRequest, ck *checkpoint.Checkpoint, p *Plan) {
	t.Helper()
	specs, err := validate(req, ck, newChecker(context.Background()))
	if err != nil {
		t.Fatal(err)
	}
	file := make([]byte, fileEnd(ck))
	for i := range file {
		file[i] = byte(i*37 + 11)
	}
	body := execute(t, p, file)
	for _, it := range p.Items {
		spec := specByIndex(specs, it.Tensor)
		if spec.deferred != nil {
			continue
		}
		elem := int64(spec.dtype.Size())
		n, _ := tensor.CheckedProduct(it.Lengths...)
		x := make([]int64, len(it.Lengths))
		want := make([]byte, elem)
		for e := range n {
			rem := e
			for d := len(x) - 1; d >= 0; d-- {
				x[d] = it.Offsets[d] + rem%it.Lengths[d]
				rem /= it.Lengths[d]
			}
			copy(want, spec.fill)
			for _, b := range spec.blocks {
				inside := true
				for d := range x {
					inside = inside && x[d] >= b.Offsets[d] && x[d] < b.Offsets[d]+b.Lengths[d]
				}
				if !inside {
					continue
				}
				at, stride := int64(0), int64(1)
				for s := len(b.src.Shape) - 1; s >= 0; s-- {
					idx := b.Base[s]
					for a := range x {
						idx += b.Coeff[s][a] * (x[a] - b.Offsets[a])
					}
					at += idx * stride
					stride *= b.src.Shape[s]
				}
				if b.nibbles { // packed F4, the low nibble first, decoded to float32 by E2M1's rule
					code := file[b.src.Begin+at/2] >> (4 * (at % 2)) & 0xF
					b.pipeline.Run(
						want,
						int(elem),
						binary.LittleEndian.AppendUint32(nil, math.Float32bits(e2m1(code))),
						4,
						1,
					)
					continue
				}
				size := int64(b.src.DType.Size())
				off := b.src.Begin + at*size
				b.pipeline.Run(want, int(elem), file[off:off+size], int(size), 1)
			}
			got := body[it.Output+e*elem : it.Output+(e+1)*elem]
			if !slices.Equal(got, want) {
				t.Fatalf("%s element %v: got %x, want %x", it.StoredName, x, got, want)
			}
		}
	}
}

// Fused copies (consecutive blocks one step apart) give the bytes the blocks say, across segment
// sizes that cut the fused runs anywhere.
func TestFusedCopiesKeepTheValues(t *testing.T) {
	reqs := map[string]func() (*api.ShardRequest, *checkpoint.Checkpoint){
		"columns": func() (*api.ShardRequest, *checkpoint.Checkpoint) { return columns(96) },
		"grid":    func() (*api.ShardRequest, *checkpoint.Checkpoint) { return grid(12) },
		"points": func() (*api.ShardRequest, *checkpoint.Checkpoint) {
			req, ck := columns(40)
			points(req, 40)
			return req, ck
		},
	}
	for i, seed := range fuzzSeeds {
		reqs[fmt.Sprint("seed ", i)] = func() (*api.ShardRequest, *checkpoint.Checkpoint) {
			var req api.ShardRequest
			if err := json.Unmarshal([]byte(seed), &req); err != nil {
				t.Fatal(err)
			}
			return &req, testCheckpoint()
		}
	}
	for name, build := range reqs {
		for _, seg := range []int64{2, 6, 64, 1 << 20} {
			for _, gap := range []int64{0, 64} {
				req, ck := build()
				opts := Options{SegmentBytes: seg, SegmentReadBytes: 2 * seg, MaxGap: gap, MaxRead: 16}
				p, err := New(req, ck, opts)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				checkValues(t, req, ck, p)
				checkBounds(t, p, opts)
			}
		}
	}
}

func ExampleNewContext() {
	req, ck := columns(3)
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	p, err := NewContext(ctx, req, ck, DefaultOptions())
	fmt.Println(p.BodyBytes, p.ReadRequests, err)
	// Output: 12 1 <nil>
}

// Random tables of equal cells that all follow one affine map (so consecutive blocks fuse), in
// one to three dimensions, over random boxes and options: every plan holds its invariants, its
// bounds and the values the blocks say.
func TestRandomAffineTablesKeepTheirValues(t *testing.T) {
	ck := testCheckpoint()
	r := rand.New(rand.NewPCG(15, 2))
	planned := 0
	for iter := range 400 {
		rank := 1 + r.IntN(3)
		shape, step := make([]int64, rank), make([]int64, rank)
		for d := range rank {
			shape[d] = 1 + r.Int64N(9)
			step[d] = 1 + r.Int64N(shape[d])
		}
		src := ck.Tensors[[]string{"w", "a", "b"}[r.IntN(3)]]
		srank := len(src.Shape)
		base := make([]int64, srank)
		coeff := make([][]int64, srank)
		for s := range coeff {
			coeff[s] = make([]int64, rank)
		}
		for a := range rank {
			if s := r.IntN(srank + 1); s < srank {
				coeff[s][a] = 1 + r.Int64N(2)
			}
		}
		for s := range srank { // shrink the map until it stays inside the source
			for {
				reach := int64(0)
				for a := range rank {
					reach += coeff[s][a] * (shape[a] - 1)
				}
				if reach < src.Shape[s] {
					base[s] = r.Int64N(src.Shape[s] - reach)
					break
				}
				for a := range rank {
					if coeff[s][a] > 0 {
						coeff[s][a]--
						break
					}
				}
			}
		}
		var fill *json.Number
		if r.IntN(3) == 0 {
			f := json.Number(strconv.Itoa(r.IntN(5)))
			fill = &f
		}
		var blocks []api.Block
		cell := make([]int64, rank)
		for {
			off, lens := make([]int64, rank), make([]int64, rank)
			for a := range rank {
				off[a], lens[a] = cell[a]*step[a], min(step[a], shape[a]-cell[a]*step[a])
			}
			b := slices.Clone(base)
			for s := range srank {
				for a := range rank {
					b[s] += coeff[s][a] * off[a]
				}
			}
			if fill == nil || r.IntN(4) > 0 {
				blocks = append(blocks, api.Block{Offsets: off, Lengths: lens, Source: src.Name, Base: b, Coeff: coeff})
			}
			a := rank - 1
			for ; a >= 0; a-- {
				if cell[a]++; cell[a]*step[a] < shape[a] {
					break
				}
				cell[a] = 0
			}
			if a < 0 {
				break
			}
		}
		var boxes []api.Box
		for range 1 + r.IntN(3) {
			off, lens := make([]int64, rank), make([]int64, rank)
			for a := range rank {
				off[a] = r.Int64N(shape[a])
				lens[a] = 1 + r.Int64N(shape[a]-off[a])
			}
			boxes = append(boxes, api.Box{Offsets: off, Lengths: lens})
		}
		dtype := []api.DType{api.BF16, api.F32, api.F64}[r.IntN(3)]
		req := &api.ShardRequest{
			Checkpoint: "ck",
			Tensors: []api.TensorRequest{
				{Name: "t", Dtype: dtype, Shape: shape, Fill: fill, Boxes: boxes, Blocks: &blocks},
			},
		}
		opts := Options{
			SegmentBytes:     1 + r.Int64N(256),
			SegmentReadBytes: 1 + r.Int64N(512),
			MaxGap:           r.Int64N(64),
			MaxRead:          1 + r.Int64N(64),
			MaxOverread:      r.Int64N(4),
			Align:            r.Int64N(3) * 16,
		}
		p, err := New(req, ck, opts)
		if err != nil {
			var verr *ValidationError
			if !errors.As(err, &verr) {
				t.Fatalf("case %d: %v", iter, err)
			}
			continue // a BF16 source cast to an integer, say
		}
		planned++
		checkInvariants(t, p, ck)
		checkBounds(t, p, opts)
		checkValues(t, req, ck, p)
	}
	if planned < 300 {
		t.Errorf("only %d of 400 random tables planned", planned)
	}
}

// e2m1 decodes an OCP FP4 (E2M1) code: a sign, two exponent bits (bias 1), one mantissa bit.
func e2m1(code uint8) float32 {
	e, m := float64(code>>1&3), float64(code&1)
	v := m / 2 // subnormal
	if e > 0 {
		v = (1 + m/2) * math.Pow(2, e-1)
	}
	if code&8 != 0 {
		v = -v
	}
	return float32(v)
}
