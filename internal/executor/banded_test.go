package executor_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"io"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
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
// brute-force ones: every other BF16 element, BF16 widened to F32, and a 2048 × 2048 BF16
// transpose in one segment; each with the file read straight into place and, slowly, through a
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
	} {
		opts := planner.DefaultOptions()
		if c.segBytes > 0 {
			opts.SegmentBytes = c.segBytes
		}
		plan, err := planner.New(c.req, ck, opts)
		if err != nil {
			t.Fatal(err)
		}
		if plan.Items[0].Rectangle != nil {
			t.Fatalf("%s: the plan shares a rectangle: its segments have no spans to band", c.name)
		}
		for _, slow := range []bool{false, true} {
			counted := &sectionsCounted{Local: local, slow: slow}
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
