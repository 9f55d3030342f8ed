package planner

import (
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// transpose4096 is a whole 4096 × 4096 BF16 tensor transposed, and its checkpoint.
func transpose4096() (*api.ShardRequest, *checkpoint.Checkpoint) {
	const side = 4096
	ck := &checkpoint.Checkpoint{Name: "t", Tensors: map[string]*checkpoint.Tensor{"t": {
		Key: "t/model.safetensors", Version: "v1", Tensor: safetensors.Tensor{Name: "t", DTypeName: "BF16",
			DType: tensor.BF16, Shape: []int64{side, side}, Begin: 88, End: 88 + 2*side*side}}}}
	shape := []int64{side, side}
	blocks := []api.Block{{Offsets: []int64{0, 0}, Lengths: shape, Source: "t", Base: []int64{0, 0},
		Coeff: [][]int64{{0, 1}, {1, 0}}}}
	return &api.ShardRequest{Checkpoint: "t", Tensors: []api.TensorRequest{{Name: "t", Dtype: api.BF16,
		Shape: shape, Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: shape}}, Blocks: &blocks}}}, ck
}

// A transpose that fits --region-bytes reads one rectangle, in --segment-read-bytes requests, and
// is cut into --segment-bytes segments: none is halved for reads it does not make.
func TestTransposeSharesARectangleInWholeSegments(t *testing.T) {
	req, ck := transpose4096()
	opts := DefaultOptions()
	p, err := New(req, ck, opts)
	if err != nil {
		t.Fatal(err)
	}
	it := p.Items[0]
	if want := p.BodyBytes / opts.SegmentBytes; int64(len(it.Segments)) != want || p.ReadRequests != 4 ||
		p.ReadBytes != p.NeededBytes {
		t.Errorf("%d segments, %d reads of %d bytes (%d needed); want %d segments and 4 reads of what is needed",
			len(it.Segments), p.ReadRequests, p.ReadBytes, p.NeededBytes, want)
	}
	checkBounds(t, p, opts)
}

// BenchmarkPlanTranspose4096BF16 plans a whole 4096 × 4096 BF16 tensor transposed: the plan the
// bench's transpose scenario serves, 131,072 source row pieces of 256 bytes before they share a
// rectangle.
func BenchmarkPlanTranspose4096BF16(b *testing.B) {
	req, ck := transpose4096()
	for b.Loop() {
		p, err := New(req, ck, DefaultOptions())
		if err != nil {
			b.Fatal(err)
		}
		if p.ReadRequests != 4 {
			b.Fatalf("%d reads, want the rectangle's 4", p.ReadRequests)
		}
	}
}
