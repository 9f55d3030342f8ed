package executor_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"os"
	"path/filepath"
	"slices"
	"sync/atomic"
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

// sectionsCounted is the local store, counting its reads and its sections; slow, its sections
// write through a plain writer (no ReadFrom), in pieces with a pause after each.
type sectionsCounted struct {
	*store.Local
	slow            bool
	reads, sections atomic.Int64
}

type slowSection struct{ store.Section }

func (s slowSection) WriteTo(w io.Writer) (int64, error) { return s.Section.WriteTo(slowWriter{w}) }

type slowWriter struct{ w io.Writer }

func (s slowWriter) Write(p []byte) (int, error) {
	time.Sleep(50 * time.Microsecond)
	return s.w.Write(p)
}

func (s *sectionsCounted) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	s.reads.Add(1)
	return s.Local.ReadAt(ctx, key, version, p, off)
}

func (s *sectionsCounted) Section(ctx context.Context, key, version string, ranges []store.Range) (store.Section, error) {
	s.sections.Add(1)
	sec, err := s.Local.Section(ctx, key, version, ranges)
	if err != nil || !s.slow {
		return sec, err
	}
	return slowSection{sec}, nil
}

// Gathers from local files read their spans in bands through one section of the file each, with
// the kernels run on each band as it arrives — several bands each here — and the bodies are the
// brute-force ones: every other BF16 element, BF16 widened to F32, a 2048 × 2048 BF16 transpose
// in one segment, rows far apart (reads with gaps), every other element from each of two files;
// each with the file read straight into place and, slowly, through a
// plain writer, so that the kernels run while the reads are still coming in.
func TestBandedGathersFromLocalFilesAreTheBruteForceBodies(t *testing.T) {
	const n, side = 1 << 20, 2048 // BF16 elements of x; t is side × side BF16
	x, tr := make([]byte, 2*n), make([]byte, 2*side*side)
	for i := range x {
		x[i] = byte(i*31 + i>>11)
	}
	for i := range tr {
		tr[i] = byte(i*17 + i>>10)
	}
	local, ck := localCheckpoint(t, safetensors.TensorData{Name: "x", DType: "BF16", Shape: []int64{n}, Data: x},
		safetensors.TensorData{Name: "t", DType: "BF16", Shape: []int64{side, side}, Data: tr})
	one := func(dtype api.DType, shape []int64, b api.Block) *api.ShardRequest {
		b.Offsets, b.Lengths = make([]int64, len(shape)), shape
		return &api.ShardRequest{Checkpoint: "ck", Tensors: []api.TensorRequest{{Name: "out", Dtype: dtype,
			Shape: shape, Boxes: []api.Box{{Offsets: make([]int64, len(shape)), Lengths: shape}},
			Blocks: &[]api.Block{b}}}}
	}
	everyOther := make([]byte, 0, n)
	for i := 0; i < 2*n; i += 4 {
		everyOther = append(everyOther, x[i], x[i+1])
	}
	widened := make([]byte, 0, 2*n)
	for i := 0; i < 2*n; i += 2 {
		widened = append(widened, 0, 0, x[i], x[i+1])
	}
	var rows []byte
	for r := range 8 {
		rows = append(rows, widened[r*4*131072:][:4*32768]...)
	}
	// The same every other element of the first half of x from each of two files of a checkpoint.
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "two"), 0o755)
	for _, f := range []string{"a", "b"} {
		var file bytes.Buffer
		safetensors.Write(&file, []safetensors.TensorData{{Name: f, DType: "BF16", Shape: []int64{n / 2},
			Data: x[:n]}}, nil)
		os.WriteFile(filepath.Join(dir, "two", f+".safetensors"), file.Bytes(), 0o644)
	}
	os.WriteFile(filepath.Join(dir, "two", "model.safetensors.index.json"),
		[]byte(`{"weight_map":{"a":"a.safetensors","b":"b.safetensors"}}`), 0o644)
	two, _ := store.NewLocal(dir)
	defer two.Close()
	ckTwo, err := checkpoint.New(two).Open(context.Background(), "two")
	if err != nil {
		t.Fatal(err)
	}
	half := []int64{n / 4}
	twoFiles := &api.ShardRequest{Checkpoint: "two", Tensors: []api.TensorRequest{{Name: "out", Dtype: api.BF16,
		Shape: []int64{n / 2}, Boxes: []api.Box{{Offsets: []int64{0}, Lengths: []int64{n / 2}}}, Blocks: &[]api.Block{
			{Offsets: []int64{0}, Lengths: half, Source: "a", Base: []int64{0}, Coeff: [][]int64{{2}}},
			{Offsets: half, Lengths: half, Source: "b", Base: []int64{0}, Coeff: [][]int64{{2}}}}}}}
	transposed := make([]byte, 0, len(tr))
	for i := range side {
		for j := range side {
			transposed = binary.LittleEndian.AppendUint16(transposed, binary.LittleEndian.Uint16(tr[2*(j*side+i):]))
		}
	}
	transpose := one("BF16", []int64{side, side}, api.Block{Source: "t", Base: []int64{0, 0},
		Coeff: [][]int64{{0, 1}, {1, 0}}})
	for _, c := range []struct {
		name     string
		req      *api.ShardRequest
		segBytes int64
		want     []byte
	}{
		{"every other BF16", one("BF16", []int64{n / 2}, api.Block{Source: "x", Base: []int64{0},
			Coeff: [][]int64{{2}}}), 0, everyOther},
		{"BF16 to F32", one("F32", []int64{n}, api.Block{Source: "x", Base: []int64{0}, Coeff: [][]int64{{1}}}),
			0, widened},
		{"transpose", transpose, 8 << 20, transposed}, // one segment: no rectangle to share
		// Rows of 64 KiB 256 KiB apart: reads with gaps the window slides over.
		{"every fourth row, widened", one("F32", []int64{8, 32768}, api.Block{Source: "x", Base: []int64{0},
			Coeff: [][]int64{{131072, 1}}}), 0, rows},
		{"every other BF16 of two files", twoFiles, 0, slices.Concat(everyOther[:n/2], everyOther[:n/2])},
	} {
		opts := planner.DefaultOptions()
		if c.segBytes > 0 {
			opts.SegmentBytes = c.segBytes
		}
		from, at := ck, local
		if c.req == twoFiles {
			from, at = ckTwo, two
		}
		plan, err := planner.New(c.req, from, opts)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Items[0].Rectangle != nil {
			t.Fatalf("%s: the plan shares a rectangle: its segments have no spans to band", c.name)
		}
		for _, slow := range []bool{false, true} {
			counted := &sectionsCounted{Local: at, slow: slow}
			stream, err := executor.New(counted, budget.New(budget.Config{Bytes: 1 << 30}), executor.Config{}).
				Stream(context.Background(), plan, executor.Output{})
			if err != nil {
				t.Fatal(err)
			}
			var body bytes.Buffer
			_, err = stream.WriteTo(&body)
			stream.Close()
			if err != nil || !bytes.Equal(body.Bytes()[len(plan.Header):], c.want) {
				t.Fatalf("%s (slow %v): %v, or not the brute-force body", c.name, slow, err)
			}
			if counted.reads.Load() != 0 || counted.sections.Load() == 0 {
				t.Errorf("%s (slow %v): %d reads and %d sections, want sections only", c.name, slow,
					counted.reads.Load(), counted.sections.Load())
			}
		}
	}
}
