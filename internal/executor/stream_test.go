package executor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// localCheckpoint writes tensors into checkpoint "ck" of a local store in a temporary directory.
func localCheckpoint(t *testing.T, tensors ...safetensors.TensorData) (*store.Local, *checkpoint.Checkpoint) {
	t.Helper()
	var file bytes.Buffer
	safetensors.Write(&file, tensors, nil)
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "ck"), 0o755)
	os.WriteFile(filepath.Join(dir, "ck", "model.safetensors"), file.Bytes(), 0o644)
	st, _ := store.NewLocal(dir)
	t.Cleanup(func() { st.Close() })
	ck, err := checkpoint.New(st).Open(context.Background(), "ck")
	if err != nil {
		t.Fatal(err)
	}
	return st, ck
}

// copyPlan stores an 8 MiB U8 tensor and plans all of it, straight, in segments of segBytes.
func copyPlan(t *testing.T, segBytes int64) (*store.Local, *planner.Plan, []byte) {
	const n = 8 << 20
	data := make([]byte, n)
	for i := range data {
		data[i] = byte(i*7 + i>>16)
	}
	st, ck := localCheckpoint(t, safetensors.TensorData{Name: "w", DType: "U8", Shape: []int64{n}, Data: data})
	blocks := []api.Block{{Offsets: []int64{0}, Lengths: []int64{n}, Source: "w", Base: []int64{0},
		Coeff: [][]int64{{1}}}}
	req := &api.ShardRequest{Checkpoint: "ck", Tensors: []api.TensorRequest{{Name: "w", Dtype: api.U8,
		Shape: []int64{n}, Boxes: []api.Box{{Offsets: []int64{0}, Lengths: []int64{n}}}, Blocks: &blocks}}}
	opts := planner.DefaultOptions()
	opts.SegmentBytes = segBytes
	p, err := planner.New(req, ck, opts)
	if err != nil {
		t.Fatal(err)
	}
	return st, p, data
}

// stalled waits until a stream that nobody reads holds exactly most bytes of the budget — what it
// takes at most is also what it holds once its producer blocks — and fails the test the moment it
// holds more. It
// waits without a deadline (the test's timeout ends a stream that never gets there), so a slow
// machine only makes it slower, never wrong.
func stalled(t *testing.T, name string, mem *budget.Budget, most int64) {
	t.Helper()
	for {
		held := mem.Held()
		if held > most {
			t.Errorf("%s: a stalled stream holds %d bytes, want at most %d", name, held, most)
			return
		}
		if held == most {
			return
		}
		time.Sleep(time.Millisecond)
	}
}

// A stream whose writer stalls reads ahead only while its segments fit StreamBytes — or, while
// the budget is idle, readAheadGrowth (4) times it, for segments read into memory; sent from the
// file, a segment holds no buffer of its own: none by sendfile, the 256 KiB it is copied through
// otherwise, and a hashing stream one more, which its hasher may lag behind the writer by. File
// sections do not grow.
func TestStreamHoldsAtMostStreamBytes(t *testing.T) {
	local, plan, data := copyPlan(t, 1<<20)
	for _, c := range []struct {
		name        string
		store       store.Store
		most, grown int64
		to          executor.Output
	}{
		{"buffered", struct{ store.Store }{local}, 1 << 20, 4 << 20, executor.Output{}}, // one 1 MiB segment, or four
		{"file sections, copied", local, 4 * 256 << 10, 4 * 256 << 10, executor.Output{}},
		{"file sections, copied and hashed", local, (4 + 1) * 256 << 10, (4 + 1) * 256 << 10, // and the lag
			executor.Output{Hash: sha256.New()}}, // reset for each run
		{"file sections by sendfile", local, 0, 0, executor.Output{Sendfile: true}}, // the window does not reach the copied end yet
	} {
		for _, busy := range []bool{false, true} {
			name := fmt.Sprintf("%s, budget busy %v", c.name, busy)
			if c.to.Hash != nil {
				c.to.Hash.Reset()
			}
			mem := budget.New(budget.Config{Bytes: 1 << 30})
			var pressure int64 // another request's, holding half the budget
			most := c.grown
			if busy {
				pressure, most = mem.Bytes()/2, c.most
				mem.Acquire(context.Background(), pressure)
			}
			e := executor.New(c.store, mem,
				executor.Config{Window: 4, StreamBytes: 1 << 20, SocketBytes: 512 << 10})
			stream, err := e.Stream(context.Background(), plan, c.to)
			if err != nil {
				t.Fatal(err)
			}
			stalled(t, name, mem, pressure+most)
			var body bytes.Buffer
			_, err = stream.WriteTo(readFromBuffer{&body})
			if err != nil || !bytes.Equal(body.Bytes()[len(plan.Header):], data) {
				t.Errorf("%s: %v, or other bytes than the file's", name, err)
			}
			if want := sha256.Sum256(body.Bytes()); c.to.Hash != nil && !bytes.Equal(stream.Sum(), want[:]) {
				t.Errorf("%s: the stream's hash is not the SHA-256 of its body", name)
			}
			stream.Close()
			// WriteTo (or the hasher after it) gave back each segment once it was written, and Close
			// has nothing left to drain.
			if held := mem.Held() - pressure; held != 0 {
				t.Errorf("%s: %d bytes held after the stream closed", name, held)
			}
		}
	}
}

// blockingStore holds every ReadAt until the test lets it through, and counts the reads begun.
type blockingStore struct {
	store.Store
	mu      sync.Mutex
	begun   int
	changed chan struct{} // a token whenever begun changes
	pass    chan struct{} // a token lets one read through
}

func newBlockingStore(s store.Store) *blockingStore {
	return &blockingStore{Store: s, changed: make(chan struct{}, 1), pass: make(chan struct{})}
}

func (b *blockingStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	b.mu.Lock()
	b.begun++
	b.mu.Unlock()
	select {
	case b.changed <- struct{}{}:
	default:
	}
	select {
	case <-b.pass:
	case <-ctx.Done():
		return ctx.Err()
	}
	return b.Store.ReadAt(ctx, key, version, p, off)
}

// settle waits until exactly want reads have begun, and fails the test the moment more have.
func (b *blockingStore) settle(t *testing.T, what string, want int) {
	t.Helper()
	for {
		b.mu.Lock()
		n := b.begun
		b.mu.Unlock()
		if n > want {
			t.Fatalf("%s: %d reads begun, want %d", what, n, want)
		}
		if n == want {
			return
		}
		<-b.changed
	}
}

// A stream of buffered segments (an object store's) reads readAheadGrowth (4) times its window
// ahead while less than half of the budget is held; once another request holds more, it starts
// nothing past its window until its writer has written the extra, and grows again once the budget
// is idle again.
func TestReadAheadGrowsWhileTheBudgetIsIdle(t *testing.T) {
	local, plan, data := copyPlan(t, 256<<10) // 32 segments, one read each
	blocking := newBlockingStore(local)
	mem := budget.New(budget.Config{Bytes: 1 << 30})
	e := executor.New(struct{ store.Store }{blocking}, mem,
		executor.Config{Window: 2, StreamBytes: 512 << 10}) // two segments; grown, eight
	stream, err := e.Stream(context.Background(), plan, executor.Output{})
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	blocking.settle(t, "idle budget: eight in flight", 8)

	pressure := mem.Bytes() / 2
	mem.Acquire(context.Background(), pressure)
	var body bytes.Buffer
	written := make(chan error, 1)
	go func() {
		_, err := stream.WriteTo(&body)
		written <- err
	}()
	// The eight grown segments are read and written; while the budget is busy the stream starts
	// only what its window of two holds.
	passed := 0
	let := func(n int) {
		for range n {
			blocking.pass <- struct{}{}
		}
		passed += n
	}
	let(8)
	blocking.settle(t, "busy budget: two in flight", passed+2)
	mem.Release(pressure)
	let(2) // both read and written, in whichever order let through: the producer looks at the budget again
	blocking.settle(t, "idle again: eight in flight", passed+8)

	go let(32 - passed)
	if err := <-written; err != nil || !bytes.Equal(body.Bytes()[len(plan.Header):], data) {
		t.Fatalf("%v, or other bytes than the file's", err)
	}
}

// readFromBuffer takes file sections by ReadFrom, as a socket does.
type readFromBuffer struct{ b *bytes.Buffer }

func (r readFromBuffer) Write(p []byte) (int, error)           { return r.b.Write(p) }
func (r readFromBuffer) ReadFrom(src io.Reader) (int64, error) { return r.b.ReadFrom(src) }

// countingStore is a store that records the length of every ReadAt it passes on.
type countingStore struct {
	store.Store
	mu    sync.Mutex
	reads []int64
}

func (c *countingStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	c.mu.Lock()
	c.reads = append(c.reads, int64(len(p)))
	c.mu.Unlock()
	return c.Store.ReadAt(ctx, key, version, p, off)
}

// The executor has no read size of its own to get wrong (a zero one once split reads forever): it
// issues the plan's reads as they are, which the planner cut to its MaxRead.
func TestReadsAreThePlans(t *testing.T) {
	local, _, data := copyPlan(t, 1<<20)
	ck, err := checkpoint.New(local).Open(context.Background(), "ck")
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(data))
	blocks := []api.Block{{Offsets: []int64{0}, Lengths: []int64{n / 2}, Source: "w", Base: []int64{0},
		Coeff: [][]int64{{2}}}} // every other byte: read into a gather buffer
	req := &api.ShardRequest{Checkpoint: "ck", Tensors: []api.TensorRequest{{Name: "w", Dtype: api.U8,
		Shape: []int64{n / 2}, Boxes: []api.Box{{Offsets: []int64{0}, Lengths: []int64{n / 2}}}, Blocks: &blocks}}}
	for _, direct := range []bool{false, true} {
		if direct {
			blocks[0].Lengths, blocks[0].Coeff = []int64{n}, [][]int64{{1}}
			req.Tensors[0].Shape, req.Tensors[0].Boxes[0].Lengths = []int64{n}, []int64{n}
		}
		opts := planner.DefaultOptions()
		opts.MaxRead = 100 << 10
		plan, err := planner.New(req, ck, opts)
		if err != nil {
			t.Fatal(err)
		}
		counted := &countingStore{Store: local} // not a Sectioner: every segment is read
		stream, err := executor.New(counted, budget.New(budget.Config{Bytes: 1 << 30}), executor.Config{}).Stream(context.Background(), plan, executor.Output{})
		if err != nil {
			t.Fatal(err)
		}
		var body bytes.Buffer
		_, err = stream.WriteTo(&body)
		stream.Close()
		want := data
		if !direct {
			want = make([]byte, n/2)
			for i := range want {
				want[i] = data[2*i]
			}
		}
		if err != nil || !bytes.Equal(body.Bytes()[len(plan.Header):], want) {
			t.Fatalf("direct %v: %v, or other bytes than the file's", direct, err)
		}
		if int64(len(counted.reads)) != plan.ReadRequests {
			t.Errorf("direct %v: %d reads, the plan has %d", direct, len(counted.reads), plan.ReadRequests)
		}
		for _, l := range counted.reads {
			if l > opts.MaxRead {
				t.Fatalf("direct %v: a read of %d bytes, more than the plan's read size %d", direct, l, opts.MaxRead)
			}
		}
	}
}

// The rule of docs/contract.md for blocks /v1/plan calls direct: a transpose or another
// permutation reads its source extent (first byte to last) in at most ceil(extent /
// --segment-read-bytes) requests, whatever the segments, and the body is the brute-force
// transpose.
func TestDirectPermutationsReadTheirExtentInFewRequests(t *testing.T) {
	const rows, cols = 256, 512 // BF16
	data := make([]byte, 2*rows*cols)
	for i := range data {
		data[i] = byte(i*13 + i>>9)
	}
	local, ck := localCheckpoint(t, safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{rows, cols},
		Data: data})
	begin := ck.Tensors["w"].Begin
	for _, c := range []struct{ off, lens []int64 }{
		{[]int64{0, 0}, []int64{cols, rows}},    // the whole tensor
		{[]int64{64, 100}, []int64{128, 100}},   // a box of it
		{[]int64{3, 7}, []int64{cols - 5, 201}}, // unaligned
	} {
		for _, segBytes := range []int64{4 << 10, 16 << 10, 1 << 20} {
			shape := []int64{cols, rows}
			blocks := []api.Block{{Offsets: []int64{0, 0}, Lengths: shape, Source: "w", Base: []int64{0, 0},
				Coeff: [][]int64{{0, 1}, {1, 0}}}}
			req := &api.ShardRequest{Checkpoint: "ck", Tensors: []api.TensorRequest{{Name: "t", Dtype: api.BF16,
				Shape: shape, Boxes: []api.Box{{Offsets: c.off, Lengths: c.lens}}, Blocks: &blocks}}}
			opts := planner.DefaultOptions()
			opts.SegmentBytes, opts.SegmentReadBytes = segBytes, 64<<10
			plan, err := planner.New(req, ck, opts)
			if err != nil {
				t.Fatal(err)
			}
			counted := &countingStore{Store: local}
			// A budget smaller than the rectangle: its segments must not wait on the budget it holds.
			stream, err := executor.New(counted, budget.New(budget.Config{Bytes: segBytes << 2}),
				executor.Config{}).Stream(context.Background(), plan, executor.Output{})
			if err != nil {
				t.Fatal(err)
			}
			var body bytes.Buffer
			_, err = stream.WriteTo(&body)
			stream.Close()
			want := make([]byte, 0, 2*c.lens[0]*c.lens[1])
			for i := c.off[0]; i < c.off[0]+c.lens[0]; i++ {
				for j := c.off[1]; j < c.off[1]+c.lens[1]; j++ {
					want = append(want, data[2*(j*cols+i):2*(j*cols+i)+2]...)
				}
			}
			if err != nil || !bytes.Equal(body.Bytes()[len(plan.Header):], want) {
				t.Fatalf("box %v+%v, segments of %d: %v, or not the transpose", c.off, c.lens, segBytes, err)
			}
			// The source extent: rows [off[1], off[1]+lens[1]), columns [off[0], off[0]+lens[0]).
			first := begin + 2*(c.off[1]*cols+c.off[0])
			last := begin + 2*((c.off[1]+c.lens[1]-1)*cols+c.off[0]+c.lens[0])
			most := (last - first + opts.SegmentReadBytes - 1) / opts.SegmentReadBytes
			if n := int64(len(counted.reads)); n > most || n != plan.ReadRequests {
				t.Errorf("box %v+%v, segments of %d: %d reads (the plan says %d), at most %d", c.off, c.lens, segBytes,
					n, plan.ReadRequests, most)
			}
		}
	}
}
