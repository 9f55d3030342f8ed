// Package layout holds engine-agnostic builders for clients that write their own tables, one
// tensor at a time: replicated tensors, column- and row-parallel splits, q/k/v fused per KV group
// (the interleave of Megatron, torchtitan and hyper_parallel), gate and up fused rank-major,
// stacked MoE experts with an expert-parallel split, and the RoPE permutation between Hugging Face
// and Meta layouts. Builders take the checkpoint's tensor shapes (GET /v1/tensors) and describe
// the whole destination tensor, with the boxes of one rank.
//
// An engine's own rules (vLLM's rank-major QKV, its gate_up_proj and padded vocabulary, every
// architecture's names) are the server's alone: send it a layout (api.ShardRequest.Layout), or
// ask POST /v1/layouts (Client.Layout) for the table it expands to, and edit that.
package layout

import (
	"fmt"

	"github.com/shardsrv/shardsrv/api"
)

// Shapes are a checkpoint's tensor shapes by name.
type Shapes map[string][]int64

// ShapesOf reads a tensor listing.
func ShapesOf(list *api.TensorList) Shapes {
	s := Shapes{}
	for _, t := range list.Tensors {
		s[t.Name] = t.Shape
	}
	return s
}

// Rank is a position in a parallel group: Index of Size.
type Rank struct{ Size, Index int64 }

func (r Rank) check(what string, n int64) error {
	if r.Size < 1 || r.Index < 0 || r.Index >= r.Size {
		return fmt.Errorf("layout: rank %d of %d is not a rank", r.Index, r.Size)
	}
	if n%r.Size != 0 {
		return fmt.Errorf("layout: %s (%d) does not split evenly over %d ranks", what, n, r.Size)
	}
	return nil
}

func (s Shapes) shape(name string, rank int) ([]int64, error) {
	sh, ok := s[name]
	if !ok {
		return nil, fmt.Errorf("layout: the checkpoint has no tensor %q", name)
	}
	if rank >= 0 && len(sh) != rank {
		return nil, fmt.Errorf("layout: %q has shape %v, not %d-d", name, sh, rank)
	}
	return sh, nil
}

func identity(n int) [][]int64 {
	c := make([][]int64, n)
	for i := range c {
		c[i] = make([]int64, n)
		c[i][i] = 1
	}
	return c
}

// rowBlock copies rows [at, at+n) of a 2-d source to destination rows starting at dst.
func rowBlock(src string, dst, at, n, cols int64) api.Block {
	return api.Block{
		Offsets: []int64{dst, 0},
		Lengths: []int64{n, cols},
		Source:  src,
		Base:    []int64{at, 0},
		Coeff:   identity(2),
	}
}

func tensor(name string, dtype api.DType, shape []int64, blocks []api.Block, boxes ...api.Box) api.TensorRequest {
	return api.TensorRequest{Name: name, Dtype: dtype, Shape: shape, Boxes: boxes, Blocks: &blocks}
}

// Replicated is a copy of a checkpoint tensor that every rank holds whole.
func Replicated(s Shapes, src, dst string, dtype api.DType) (api.TensorRequest, error) {
	sh, err := s.shape(src, -1)
	if err != nil {
		return api.TensorRequest{}, err
	}
	block := api.Block{
		Offsets: make([]int64, len(sh)),
		Lengths: sh,
		Source:  src,
		Base:    make([]int64, len(sh)),
		Coeff:   identity(len(sh)),
	}
	return tensor(dst, dtype, sh, []api.Block{block}, api.Box{Offsets: make([]int64, len(sh)), Lengths: sh}), nil
}

// split is a copy of a checkpoint tensor of which the rank holds the dim-th slab.
func split(s Shapes, src, dst string, dtype api.DType, dim int, r Rank) (api.TensorRequest, error) {
	t, err := Replicated(s, src, dst, dtype)
	if err != nil {
		return t, err
	}
	if dim >= len(t.Shape) {
		return t, fmt.Errorf("layout: %q has no dimension %d to split", src, dim)
	}
	if err := r.check(src+" dimension", t.Shape[dim]); err != nil {
		return t, err
	}
	box := &t.Boxes[0]
	box.Lengths = append([]int64(nil), t.Shape...)
	box.Lengths[dim] = t.Shape[dim] / r.Size
	box.Offsets[dim] = r.Index * box.Lengths[dim]
	return t, nil
}

// ColumnParallel splits a linear layer's weight [out, in] by output features (rows).
func ColumnParallel(s Shapes, src, dst string, dtype api.DType, tp Rank) (api.TensorRequest, error) {
	return split(s, src, dst, dtype, 0, tp)
}

// RowParallel splits a linear layer's weight [out, in] by input features (columns).
func RowParallel(s Shapes, src, dst string, dtype api.DType, tp Rank) (api.TensorRequest, error) {
	return split(s, src, dst, dtype, 1, tp)
}

// Heads describes attention: the head dimension and, read off the shapes, the head counts.
type Heads struct {
	Q, KV, Dim, Hidden int64
}

// AttentionHeads reads q and k projection shapes ([heads*dim, hidden]).
func AttentionHeads(s Shapes, q, k string, headDim int64) (Heads, error) {
	qs, err := s.shape(q, 2)
	if err != nil {
		return Heads{}, err
	}
	ks, err := s.shape(k, 2)
	if err != nil {
		return Heads{}, err
	}
	if headDim <= 0 || qs[0]%headDim != 0 || ks[0]%headDim != 0 || qs[1] != ks[1] {
		return Heads{}, fmt.Errorf("layout: %v and %v are not whole heads of %d", qs, ks, headDim)
	}
	return Heads{Q: qs[0] / headDim, KV: ks[0] / headDim, Dim: headDim, Hidden: qs[1]}, nil
}

// InterleavedQKV fuses q, k and v per KV group as Megatron, torchtitan and hyper_parallel hold
// them: each group's query heads, then its k head, then its v head. Rank r holds kv/tp groups.
func InterleavedQKV(s Shapes, q, k, v, dst string, dtype api.DType, headDim int64, tp Rank) (api.TensorRequest, error) {
	h, err := AttentionHeads(s, q, k, headDim)
	if err != nil {
		return api.TensorRequest{}, err
	}
	if err := tp.check("KV groups", h.KV); err != nil {
		return api.TensorRequest{}, err
	}
	perGroup := h.Q / h.KV
	group := (perGroup + 2) * h.Dim
	var blocks []api.Block
	for g := range h.KV {
		blocks = append(blocks,
			rowBlock(q, g*group, g*perGroup*h.Dim, perGroup*h.Dim, h.Hidden),
			rowBlock(k, g*group+perGroup*h.Dim, g*h.Dim, h.Dim, h.Hidden),
			rowBlock(v, g*group+(perGroup+1)*h.Dim, g*h.Dim, h.Dim, h.Hidden))
	}
	groups := h.KV / tp.Size
	return tensor(dst, dtype, []int64{h.KV * group, h.Hidden}, blocks,
		api.Box{Offsets: []int64{tp.Index * groups * group, 0}, Lengths: []int64{groups * group, h.Hidden}}), nil
}

func gateUpShapes(s Shapes, gate, up string, tp Rank) (inter, hidden int64, err error) {
	gs, err := s.shape(gate, 2)
	if err != nil {
		return 0, 0, err
	}
	us, err := s.shape(up, 2)
	if err != nil {
		return 0, 0, err
	}
	if gs[0] != us[0] || gs[1] != us[1] {
		return 0, 0, fmt.Errorf("layout: gate %v and up %v differ", gs, us)
	}
	return gs[0], gs[1], tp.check("intermediate size", gs[0])
}

// GateUpPerRank fuses gate and up as Megatron's linear_fc1 at TP > 1: the global tensor is
// rank-major [gate_0; up_0; gate_1; up_1; ...] and rank r holds one box.
func GateUpPerRank(s Shapes, gate, up, dst string, dtype api.DType, tp Rank) (api.TensorRequest, error) {
	inter, hidden, err := gateUpShapes(s, gate, up, tp)
	if err != nil {
		return api.TensorRequest{}, err
	}
	per := inter / tp.Size
	var blocks []api.Block
	for r := range tp.Size {
		blocks = append(
			blocks,
			rowBlock(gate, 2*r*per, r*per, per, hidden),
			rowBlock(up, (2*r+1)*per, r*per, per, hidden),
		)
	}
	return tensor(
		dst,
		dtype,
		[]int64{2 * inter, hidden},
		blocks,
		api.Box{Offsets: []int64{2 * tp.Index * per, 0}, Lengths: []int64{2 * per, hidden}},
	), nil
}

// StackedExperts stacks per-expert tensors into [experts, ...] (torchtitan's grouped experts);
// parts lists each expert's sources stacked along dim 1 (gate then up, say).
// Rank r of the expert-parallel group holds experts [r*E/ep, (r+1)*E/ep).
func StackedExperts(s Shapes, parts [][]string, dst string, dtype api.DType, ep Rank) (api.TensorRequest, error) {
	experts := int64(len(parts))
	if err := ep.check("experts", experts); err != nil {
		return api.TensorRequest{}, err
	}
	var rows, cols int64
	var blocks []api.Block
	for e, srcs := range parts {
		var at int64
		for _, src := range srcs {
			sh, err := s.shape(src, 2)
			if err != nil {
				return api.TensorRequest{}, err
			}
			if cols != 0 && sh[1] != cols {
				return api.TensorRequest{}, fmt.Errorf("layout: %q has %d columns, other experts %d", src, sh[1], cols)
			}
			cols = sh[1]
			blocks = append(
				blocks,
				api.Block{Offsets: []int64{int64(e), at, 0}, Lengths: []int64{1, sh[0], sh[1]}, Source: src,
					Base: []int64{0, 0}, Coeff: [][]int64{{0, 1, 0}, {0, 0, 1}}},
			)
			at += sh[0]
		}
		if e > 0 && at != rows {
			return api.TensorRequest{}, fmt.Errorf("layout: expert %d has %d rows, expert 0 has %d", e, at, rows)
		}
		rows = at
	}
	per := experts / ep.Size
	return tensor(dst, dtype, []int64{experts, rows, cols}, blocks,
		api.Box{Offsets: []int64{ep.Index * per, 0, 0}, Lengths: []int64{per, rows, cols}}), nil
}

// RoPE directions.
const (
	HFToMeta = iota // rotate-half (Hugging Face) rows to interleaved pairs (Meta, torchtitan)
	MetaToHF
)

// RoPEPermute reorders the rows of a q or k projection between the Hugging Face and the Meta
// layouts (docs/references.md §2): HF[h*D + t*D/2 + j] = Meta[h*D + 2j + t]. The rank holds it whole.
func RoPEPermute(s Shapes, src, dst string, dtype api.DType, headDim int64, direction int) (api.TensorRequest, error) {
	sh, err := s.shape(src, 2)
	if err != nil {
		return api.TensorRequest{}, err
	}
	if headDim%2 != 0 || sh[0]%headDim != 0 {
		return api.TensorRequest{}, fmt.Errorf("layout: %v is not whole heads of an even dimension %d", sh, headDim)
	}
	heads, half := sh[0]/headDim, headDim/2
	var blocks []api.Block
	for h := range heads {
		if direction == HFToMeta {
			for j := range half { // Meta rows h*D+2j, +1 come from HF rows h*D+j and h*D+D/2+j
				blocks = append(
					blocks,
					api.Block{Offsets: []int64{h*headDim + 2*j, 0}, Lengths: []int64{2, sh[1]}, Source: src,
						Base: []int64{h*headDim + j, 0}, Coeff: [][]int64{{half, 0}, {0, 1}}},
				)
			}
			continue
		}
		for t := range int64(2) { // HF rows h*D+t*D/2+j come from Meta rows h*D+2j+t
			blocks = append(
				blocks,
				api.Block{Offsets: []int64{h*headDim + t*half, 0}, Lengths: []int64{half, sh[1]}, Source: src,
					Base: []int64{h*headDim + t, 0}, Coeff: [][]int64{{2, 0}, {0, 1}}},
			)
		}
	}
	return tensor(dst, dtype, sh, blocks, api.Box{Offsets: []int64{0, 0}, Lengths: sh}), nil
}
