package planner

import (
	"encoding/json"
	"errors"
	"slices"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// testCheckpoint is an in-memory catalog entry: "a" F32 [8,8], "b" BF16 [4,4,4], "s" an I64 scalar,
// "w" BF16 [16,32], all in one file whose data starts at byte 128.
func testCheckpoint() *checkpoint.Checkpoint {
	ck := &checkpoint.Checkpoint{Name: "ck", Tensors: map[string]*checkpoint.Tensor{}}
	off := int64(128)
	for _, t := range []struct {
		name  string
		dtype tensor.DType
		shape []int64
	}{
		{"a", tensor.F32, []int64{8, 8}},
		{"b", tensor.BF16, []int64{4, 4, 4}},
		{"s", tensor.I64, nil},
		{"w", tensor.BF16, []int64{16, 32}},
		// Sources of the completions and of packed F4 blocks, after the others so their offsets stay.
		{"q", tensor.F8E4M3, []int64{8, 8}},
		{"qs", tensor.F32, []int64{2, 2}},
		{"mb", tensor.U8, []int64{4, 2, 16}},
		{"ms", tensor.U8, []int64{4, 2}},
		{"f4", tensor.F4, []int64{8, 8}},
		{"la", tensor.BF16, []int64{2, 8}},
		{"lb", tensor.BF16, []int64{8, 2}},
	} {
		n := int64(t.dtype.Size())
		for _, d := range t.shape {
			n *= d
		}
		ck.Tensors[t.name] = &checkpoint.Tensor{Key: "ck/model.safetensors", Version: "v1", Tensor: safetensors.Tensor{
			Name: t.name, DTypeName: t.dtype.String(), DType: t.dtype, Shape: t.shape, Begin: off, End: off + n}}
		off += n
	}
	return ck
}

func fileEnd(ck *checkpoint.Checkpoint) int64 {
	var end int64
	for _, t := range ck.Tensors {
		end = max(end, t.End)
	}
	return end
}

// checkInvariants: the body is tiled in order by items and segments, no read leaves the file, and
// every kernel finds all its source bytes in the spans its segment reads.
func checkInvariants(t *testing.T, p *Plan, ck *checkpoint.Checkpoint) {
	t.Helper()
	pos := int64(len(p.Header))
	end := fileEnd(ck)
	for _, it := range p.Items {
		if it.Output != pos {
			t.Fatalf("item %s starts at %d, want %d", it.StoredName, it.Output, pos)
		}
		for _, seg := range it.Segments {
			if seg.Output != pos {
				t.Fatalf("segment of %s starts at %d, want %d", it.StoredName, seg.Output, pos)
			}
			pos += seg.Bytes
			for _, list := range [][]Read{seg.Direct, seg.Spans, it.Rectangle} {
				for _, r := range list {
					if r.Offset < 128 || r.Offset+r.Length > end || r.Length <= 0 {
						t.Fatalf("read %+v leaves the data of the file [128, %d)", r, end)
					}
				}
			}
			for _, r := range seg.Direct {
				if r.Dst < 0 || r.Dst+r.Length > seg.Bytes {
					t.Fatalf("direct read %+v lands outside its segment of %d bytes", r, seg.Bytes)
				}
			}
			reads := seg.Spans
			if it.Rectangle != nil {
				reads = it.Rectangle
			}
			files := SpanFiles(reads, make([]byte, bufferBytes(reads)))
			out := make([]byte, seg.Bytes)
			for _, k := range seg.Kernels {
				if err := k.Run(out, files); err != nil {
					t.Fatalf("%v: %v", k, err)
				}
			}
		}
		if pos != it.Output+it.Bytes {
			t.Fatalf("segments of %s cover %d bytes, the box has %d", it.StoredName, pos-it.Output, it.Bytes)
		}
	}
	if pos != p.BodyBytes {
		t.Fatalf("items end at %d, the body has %d bytes", pos, p.BodyBytes)
	}
}

// checkInvariantsFor checks that items and segments tile the body in order.
func checkInvariantsFor(t *testing.T, p *Plan) {
	t.Helper()
	pos := int64(len(p.Header))
	for _, it := range p.Items {
		for _, seg := range it.Segments {
			if seg.Output != pos {
				t.Fatalf("segment at %d, want %d", seg.Output, pos)
			}
			pos += seg.Bytes
		}
	}
	if pos != p.BodyBytes {
		t.Fatalf("segments end at %d, body %d", pos, p.BodyBytes)
	}
}

var fuzzSeeds = []string{
	`{"checkpoint":"ck","tensors":[{"name":"f","dtype":"F32","shape":[8,4],"boxes":[{"offsets":[0,0],"lengths":[8,4]}],` +
		`"blocks":[{"offsets":[0,0],"lengths":[8,4],"source":"f4","base":[0,1],"coeff":[[1,0],[0,2]]}]}]}`,
	`{"checkpoint":"ck","tensors":[{"name":"d","dtype":"BF16","shape":[8,8],"boxes":[{"offsets":[2,1],"lengths":[5,6]}],` +
		`"deferred":{"op":"fp8_block_dequant","sources":["q","qs"],"params":{"block":[4,4]}}}]}`,
	`{"checkpoint":"ck","tensors":[{"name":"m","dtype":"F32","shape":[4,64],"boxes":[{"offsets":[1,8],` +
		`"lengths":[2,40]}],"deferred":{"op":"mxfp4_dequant","sources":["mb","ms"]}}]}`,
	`{"checkpoint":"ck","tensors":[{"name":"l","dtype":"F32","shape":[8,8],"boxes":[{"offsets":[3,0],"lengths":[4,8]}],` +
		`"deferred":{"op":"lora_merge","sources":["a","la","lb"],"params":{"alpha":2}}}]}`,
	`{"checkpoint":"ck","tensors":[{"name":"t","dtype":"F32","shape":[8,8],"boxes":[{"offsets":[2,0],"lengths":[3,8]}],` +
		`"blocks":[{"offsets":[0,0],"lengths":[8,8],"source":"a","base":[0,0],"coeff":[[0,1],[1,0]]}]}]}`,
	`{"checkpoint":"ck","format":"safetensors","tensors":[{"name":"t","dtype":"BF16","shape":[4,4],"fill":1.5,` +
		`"boxes":[{"offsets":[0,0],"lengths":[4,4]},{"offsets":[1,1],"lengths":[2,2]}],"blocks":[{"offsets":[0,0],` +
		`"lengths":[2,4],"source":"b","base":[1,0,0],"coeff":[[0,0],[1,0],[0,1]],"post":[{"op":"mul","value":2}]}]}]}`,
	`{"checkpoint":"ck","tensors":[{"name":"s","dtype":"F64","shape":[],"boxes":[{"offsets":[],"lengths":[]}],` +
		`"blocks":[{"offsets":[],"lengths":[],"source":"s","base":[],"coeff":[]}]}]}`,
	`{"checkpoint":"ck","tensors":[{"name":"r","dtype":"F32","shape":[2,16],"boxes":[{"offsets":[0,0],` +
		`"lengths":[2,16]}],"blocks":[{"offsets":[0,0],"lengths":[2,16],"source":"a","base":[0,0],"coeff":[[2,0],[0,0]]}]}]}`,
	`{"checkpoint":"ck","tensors":[{"name":"w","dtype":"F32","shape":[4,2,8],"boxes":[{"offsets":[1,0,0],` +
		`"lengths":[3,2,8]}],"blocks":[{"offsets":[0,0,0],"lengths":[4,2,8],"source":"a","base":[0,0],` +
		`"coeff":[[2,1,0],[0,0,1]]}]}]}`,
	// a transpose of w, whole and a box inside it (read amplification)
	`{"checkpoint":"ck","tensors":[{"name":"tt","dtype":"BF16","shape":[32,16],"boxes":[{"offsets":[0,0],` +
		`"lengths":[32,16]},{"offsets":[3,2],"lengths":[20,9]}],` +
		`"blocks":[{"offsets":[0,0],"lengths":[32,16],"source":"w","base":[0,0],"coeff":[[0,1],[1,0]]}]}]}`,
	manyBlocksSeed(),
}

// manyBlocksSeed is a request of many blocks (planning time): 32 column blocks widened
// to F32, and a 4x4 grid of transposed 2x2 blocks with one missing and a fill, in the safetensors
// format.
func manyBlocksSeed() string {
	id, tr := [][]int64{{1, 0}, {0, 1}}, [][]int64{{0, 1}, {1, 0}}
	var cols, grid []api.Block
	for j := range int64(32) {
		cols = append(
			cols,
			api.Block{Offsets: []int64{0, j}, Lengths: []int64{2, 1}, Source: "w", Base: []int64{3, j}, Coeff: id},
		)
	}
	for i := range int64(4) {
		for j := range int64(4) {
			if i != 2 || j != 1 {
				grid = append(
					grid,
					api.Block{
						Offsets: []int64{2 * i, 2 * j},
						Lengths: []int64{2, 2},
						Source:  "w",
						Base:    []int64{2 * j, 2*i + 8},
						Coeff:   tr,
					},
				)
			}
		}
	}
	fill, format := json.Number("-1"), api.Safetensors
	body, _ := json.Marshal(api.ShardRequest{Checkpoint: "ck", Format: &format, Tensors: []api.TensorRequest{
		{
			Name:  "c",
			Dtype: api.F32,
			Shape: []int64{2, 32},
			Boxes: []api.Box{
				{Offsets: []int64{0, 0}, Lengths: []int64{2, 32}},
				{Offsets: []int64{1, 5}, Lengths: []int64{1, 20}},
			},
			Blocks: &cols,
		},
		{
			Name:  "g",
			Dtype: api.BF16,
			Shape: []int64{8, 8},
			Fill:  &fill,
			Boxes: []api.Box{
				{Offsets: []int64{0, 0}, Lengths: []int64{8, 8}},
				{Offsets: []int64{3, 1}, Lengths: []int64{4, 6}},
			},
			Blocks: &grid,
		},
	}})
	return string(body)
}

func FuzzPlan(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s), int64(64), int64(16))
	}
	ck := testCheckpoint()
	f.Fuzz(func(t *testing.T, body []byte, segment, gap int64) {
		var req api.ShardRequest
		if json.Unmarshal(body, &req) != nil {
			return
		}
		opts := Options{
			SegmentBytes:     1 + abs(segment)%4096,
			SegmentReadBytes: 1 + abs(segment)%8192,
			MaxGap:           abs(gap) % 512,
			MaxRead:          1 + abs(gap)%1024,
			MaxReads:         1 << 14,
		}
		p, err := New(&req, ck, opts)
		if err != nil {
			var verr *ValidationError
			if !errors.As(err, &verr) || len(verr.Errors) == 0 {
				t.Fatalf("a refused request must be a ValidationError with errors: %v", err)
			}
			return
		}
		checkBounds(t, p, opts)
		if p.BodyBytes > 1<<20 {
			return
		}
		checkInvariants(t, p, ck)
		if p.BodyBytes <= 1<<14 {
			checkValues(t, &req, ck, p)
		}
	})
}

func abs(x int64) int64 {
	if x < 0 {
		return -(x + 1)
	}
	return x
}

func TestSeedsPlanAndHoldInvariants(t *testing.T) {
	for _, s := range fuzzSeeds {
		var req api.ShardRequest
		if err := json.Unmarshal([]byte(s), &req); err != nil {
			t.Fatal(err)
		}
		for _, seg := range []int64{1, 7, 64, 1 << 20} {
			opts := Options{SegmentBytes: seg, SegmentReadBytes: seg, MaxGap: 8, MaxRead: 16, MaxReads: 1 << 20}
			p, err := New(&req, testCheckpoint(), opts)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			checkInvariants(t, p, testCheckpoint())
			checkBounds(t, p, opts)
			checkValues(t, &req, testCheckpoint(), p)
		}
	}
}

func TestDirectAxes(t *testing.T) {
	cases := []struct {
		coeff   [][]int64
		lengths []int64
		post    bool
		want    bool
	}{
		{[][]int64{{1, 0}, {0, 1}}, []int64{3, 4}, false, true},  // plain copy
		{[][]int64{{0, 1}, {1, 0}}, []int64{3, 2}, false, true},  // transpose
		{[][]int64{{1, 0}, {0, 1}}, []int64{3, 4}, true, false},  // post ops gather
		{[][]int64{{2, 0}, {0, 1}}, []int64{3, 4}, false, false}, // stride
		{[][]int64{{2, 0}, {0, 1}}, []int64{1, 4}, false, true},  // a stride along a length-one dim does not matter
		{[][]int64{{0, 0}, {0, 1}}, []int64{3, 4}, false, false}, // broadcast
		{[][]int64{{4, 1}}, []int64{3, 4}, false, false},         // reshape: two dims on one source dim
	}
	for _, c := range cases {
		b := blockSpec{Block: &api.Block{Coeff: c.coeff}}
		if c.post {
			b.Post = &[]api.PostOp{{Op: "neg"}}
		}
		if got := directAxes(&b, c.lengths); got != c.want {
			t.Errorf("directAxes(%v, %v, post=%v) = %v", c.coeff, c.lengths, c.post, got)
		}
	}
}

func TestCoalesce(t *testing.T) {
	reads := []Read{
		{Key: "b", Offset: 0, Length: 4},
		{Key: "a", Offset: 100, Length: 10},
		{Key: "a", Offset: 0, Length: 10},
		{Key: "a", Offset: 15, Length: 5},
		{Key: "a", Offset: 5, Length: 2},
	}
	for i := range reads {
		reads[i].Needed = reads[i].Length
	}
	got := coalesce(slices.Clone(reads), Options{MaxGap: 5})
	want := []Read{
		{Key: "a", Offset: 0, Length: 20, Needed: 15},
		{Key: "a", Offset: 100, Length: 10, Needed: 10},
		{Key: "b", Offset: 0, Length: 4, Needed: 4},
	}
	if !slices.Equal(got, want) {
		t.Errorf("coalesce = %+v", got)
	}
	// With no over-read allowed, the 5-byte gap after [0, 10) is not worth it.
	got = coalesce(slices.Clone(reads), Options{MaxGap: 5, MaxOverread: 1})
	if len(got) != 4 {
		t.Errorf("coalesce with an over-read cap = %+v", got)
	}
	parts := splitRead(nil, Read{Offset: 10, Length: 25, Dst: 3, Needed: 15}, 10)
	want = []Read{{Offset: 10, Length: 10, Dst: 3, Needed: 10}, {Offset: 20, Length: 10, Dst: 13, Needed: 5},
		{Offset: 30, Length: 5, Dst: 23}}
	if !slices.Equal(parts, want) {
		t.Errorf("splitRead = %+v", parts)
	}
}

func TestTooManyReadsIsRefused(t *testing.T) {
	var req api.ShardRequest
	json.Unmarshal([]byte(fuzzSeeds[0]), &req)
	_, err := New(
		&req,
		testCheckpoint(),
		Options{SegmentBytes: 4, SegmentReadBytes: 4, MaxGap: 0, MaxRead: 4, MaxReads: 5},
	)
	var verr *ValidationError
	if !errors.As(err, &verr) || verr.Schema {
		t.Errorf("got %v, want a 422", err)
	}
}

// A TP=8 rank of a Llama-3-8B-shaped fused QKV reads each source row slab once, in few requests.
func TestFusedQKVReadsOnlyItsRows(t *testing.T) {
	ck := &checkpoint.Checkpoint{Name: "ck", Tensors: map[string]*checkpoint.Tensor{}}
	off := int64(1024)
	for _, n := range []struct {
		name string
		rows int64
	}{{"q", 4096}, {"k", 1024}, {"v", 1024}} {
		size := n.rows * 4096 * 2
		ck.Tensors[n.name] = &checkpoint.Tensor{
			Key: "ck/f",
			Tensor: safetensors.Tensor{
				Name:      n.name,
				DType:     tensor.BF16,
				DTypeName: "BF16",
				Shape:     []int64{n.rows, 4096},
				Begin:     off,
				End:       off + size,
			},
		}
		off += size
	}
	const tp, rank = 8, 3
	q, kv := int64(4096/tp), int64(1024/tp)
	per := q + 2*kv
	var blocks []api.Block
	for r := range int64(tp) {
		for _, b := range []struct {
			src        string
			dst, n, at int64
		}{{"q", r * per, q, r * q}, {"k", r*per + q, kv, r * kv}, {"v", r*per + q + kv, kv, r * kv}} {
			blocks = append(
				blocks,
				api.Block{
					Offsets: []int64{b.dst, 0},
					Lengths: []int64{b.n, 4096},
					Source:  b.src,
					Base:    []int64{b.at, 0},
					Coeff:   [][]int64{{1, 0}, {0, 1}},
				},
			)
		}
	}
	req := api.ShardRequest{
		Checkpoint: "ck",
		Tensors: []api.TensorRequest{{Name: "qkv", Dtype: api.BF16, Shape: []int64{tp * per, 4096},
			Boxes: []api.Box{{Offsets: []int64{rank * per, 0}, Lengths: []int64{per, 4096}}}, Blocks: &blocks}},
	}
	opts := DefaultOptions()
	opts.MaxGap = 1 << 20 // S3-like
	p, err := New(&req, ck, opts)
	if err != nil {
		t.Fatal(err)
	}
	if p.NeededBytes != per*4096*2 || p.ReadBytes != p.NeededBytes || p.ReadRequests != 3 {
		t.Errorf(
			"needed %d read %d in %d requests; want %d bytes in 3 requests",
			p.NeededBytes,
			p.ReadBytes,
			p.ReadRequests,
			per*4096*2,
		)
	}
}

// A TP=8 rank of a DeepSeek-V3-shaped FP8 weight (7168 x 18432, scales [56, 144] F32) reads its
// eighth of the weight and the scale rows covering it, not the whole tensor.
func TestFP8DequantRankReadsItsEighth(t *testing.T) {
	const rows, cols = 7168, 18432
	w := &checkpoint.Tensor{
		Key:     "ds/model-00001.safetensors",
		Version: "v",
		Tensor: safetensors.Tensor{Name: "w", DTypeName: "F8_E4M3", DType: tensor.F8E4M3,
			Shape: []int64{rows, cols}, Begin: 4096, End: 4096 + rows*cols},
	}
	s := &checkpoint.Tensor{
		Key:     w.Key,
		Version: "v",
		Tensor: safetensors.Tensor{Name: "s", DTypeName: "F32", DType: tensor.F32,
			Shape: []int64{56, 144}, Begin: w.End, End: w.End + 56*144*4},
	}
	ck := &checkpoint.Checkpoint{Name: "ds", Tensors: map[string]*checkpoint.Tensor{"w": w, "s": s}}
	// S3's cost model without the cache (whose 8 MiB chunks a single cold rank would round to).
	opts := DefaultOptions()
	opts.MaxGap, opts.MaxRead, opts.SegmentBytes, opts.SegmentReadBytes, opts.MaxOverread =
		1<<20, 8<<20, 16<<20, 32<<20, 16
	for rank := range int64(8) {
		req := api.ShardRequest{
			Checkpoint: "ds",
			Tensors: []api.TensorRequest{{Name: "w", Dtype: api.BF16, Shape: []int64{rows, cols},
				Boxes:    []api.Box{{Offsets: []int64{rank * rows / 8, 0}, Lengths: []int64{rows / 8, cols}}},
				Deferred: &api.Deferred{Op: api.Fp8BlockDequant, Sources: []string{"w", "s"}}}},
		}
		p, err := New(&req, ck, opts)
		if err != nil {
			t.Fatal(err)
		}
		eighth := int64(rows * cols / 8)
		scaleRows := int64(56/8) * 144 * 4
		// A scale row two segments share counts for each.
		if p.NeededBytes < eighth+scaleRows || p.NeededBytes > eighth+scaleRows+2*144*4 {
			t.Errorf("rank %d needs %d bytes, want about %d", rank, p.NeededBytes, eighth+scaleRows)
		}
		if p.ReadBytes > p.NeededBytes+1<<20 {
			t.Errorf(
				"rank %d reads %d bytes of a %d-byte weight (%.3f of it)",
				rank,
				p.ReadBytes,
				rows*cols,
				float64(p.ReadBytes)/float64(rows*cols),
			)
		}
		if rank == 3 {
			t.Logf(
				"rank 3 reads %.1f MiB in %d requests: %.4f of the %.1f MiB weight (needed %.1f MiB)",
				float64(p.ReadBytes)/(1<<20),
				p.ReadRequests,
				float64(p.ReadBytes)/float64(rows*cols),
				float64(rows*cols)/(1<<20),
				float64(p.NeededBytes)/(1<<20),
			)
		}
		checkInvariantsFor(t, p)
	}
}

// bufferBytes is the length of the buffer reads are laid out in.
func bufferBytes(reads []Read) int64 {
	if len(reads) == 0 {
		return 0
	}
	return reads[len(reads)-1].Dst + reads[len(reads)-1].Length
}
