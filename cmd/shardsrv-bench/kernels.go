package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// kernelScenarios times the gather kernels alone, each alternated with copy() of its output size.
func kernelScenarios(r *report) {
	const out = 64 << 20
	src := randomBytes(2*out, 9)
	dst := make([]byte, out)
	copyOf := func(n int64) func() { return func() { copy(dst[:n], src[:n]) } }
	kernel := func(from, to tensor.DType, ops []tensor.Op, s tensor.Strided) func() {
		p, err := tensor.NewPipeline(from, ops, to)
		must(err)
		in := tensor.BytesSource{Data: src}
		return func() { must(tensor.Copy(p, dst, in, 0, s.Simplify())) }
	}
	const rowBytes = 8192 // 4096 BF16 per row
	rows := int64(out / rowBytes)
	const side = 4096 // a 4096 x 4096 BF16 transpose is 32 MiB
	var rowsOf []row
	for _, k := range []struct {
		name  string
		run   func()
		bytes int64
		goal  string
	}{
		{"strided rows (every other 8 KiB row)", kernel(tensor.BF16, tensor.BF16, nil,
			tensor.Strided{Lengths: []int64{rows, 4096}, Src: []int64{2 * rowBytes, 2}, Dst: []int64{rowBytes, 2}}),
			out, "(goal ≥ 0.5×)"},
		{"strided elements (every other BF16)", kernel(tensor.BF16, tensor.BF16, nil,
			tensor.Strided{Lengths: []int64{out / 2}, Src: []int64{4}, Dst: []int64{2}}), out, goalEveryOther},
		{"BF16 → F32 (converting)", kernel(tensor.BF16, tensor.F32, nil,
			tensor.Strided{Lengths: []int64{out / 4}, Src: []int64{2}, Dst: []int64{4}}), out, "(goal ≥ 0.5×)"},
		{"F8_E4M3 → BF16 (converting)", kernel(tensor.F8E4M3, tensor.BF16, nil,
			tensor.Strided{Lengths: []int64{out / 2}, Src: []int64{1}, Dst: []int64{2}}), out, goalE4M3},
		{"post ops: mul 0.5, add 1 in BF16", kernel(tensor.BF16, tensor.BF16,
			[]tensor.Op{{Kind: tensor.OpMul, Value: 0.5}, {Kind: tensor.OpAdd, Value: 1}},
			tensor.Strided{Lengths: []int64{out / 2}, Src: []int64{2}, Dst: []int64{2}}), out, goalPost},
		{"transpose 4096 × 4096 BF16 (32 MiB)", kernel(tensor.BF16, tensor.BF16, nil,
			tensor.Strided{Lengths: []int64{side, side}, Src: []int64{2, 2 * side}, Dst: []int64{2 * side, 2}}),
			2 * side * side, goalTranspose},
	} {
		ds := interleaved(copyOf(k.bytes), k.run)
		rowsOf = append(rowsOf, vsCopy(k.name, k.bytes, ds[0], ds[1], k.goal))
	}
	r.add("Gather kernels in isolation (output GB/s, one core, in memory; each row alternated with copy() of "+
		"its output size)", rowsOf...)
	executorKernels(r, copyOf)
}

// vsCopy is a kernel's row: its throughput, and in the note the copy() timed beside it and the ratio.
func vsCopy(what string, bytes int64, base, ds []time.Duration, goal string) row {
	return row{what, throughput(bytes, ds), fmt.Sprintf("%.2f× copy() %s; copy() beside it: %s",
		ratio(base, ds), goal, throughput(bytes, base))}
}

// The kernels' goals against copy().
const (
	goalTranspose  = "(goal ≥ 0.25×)"
	goalPost       = "(goal ≥ 0.25×)"
	goalEveryOther = "(goal ≥ 0.5×)"
	goalE4M3       = "(goal ≥ 0.3×)"
)

// executorKernels runs the same conversions end to end through the planner and the executor — a
// plan over a local file in the page cache, its segments read, converted and written out, in
// order — each alternated with copyOf its output size.
func executorKernels(r *report, copyOf func(bytes int64) func()) {
	const side, n = 4096, 16 << 20 // a 4096 x 4096 BF16 matrix; 16 Mi elements (32 MiB of BF16)
	dir, err := os.MkdirTemp(scratch, "kernels-")
	must(err)
	must(os.MkdirAll(filepath.Join(dir, "k"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "k", "model.safetensors"), safetensorsFile(
		safetensors.TensorData{Name: "t", DType: "BF16", Shape: []int64{side, side},
			Data: randomBytes(2*side*side, 11)},
		safetensors.TensorData{Name: "x", DType: "BF16", Shape: []int64{2 * n}, Data: randomBytes(4*n, 12)},
		safetensors.TensorData{Name: "f", DType: "F8_E4M3", Shape: []int64{n}, Data: randomBytes(n, 13)},
	), 0o644))
	local, err := store.NewLocal(dir)
	must(err)
	defer local.Close()
	ck, err := checkpoint.New(local).Open(context.Background(), "k")
	must(err)
	mem := budget.New(budget.Config{Bytes: budget.DefaultBytes, AdmitWait: time.Second})
	ex := executor.New(local, mem, executor.Config{Window: executor.DefaultWindow})
	through := func(req api.ShardRequest) func() {
		plan, err := planner.New(&req, ck, planner.DefaultOptions())
		must(err)
		return func() {
			stream, err := ex.Stream(context.Background(), plan, executor.Output{})
			must(err)
			_, err = stream.WriteTo(io.Discard)
			stream.Close()
			must(err)
		}
	}
	one := func(dtype api.DType, shape []int64, b api.Block) api.ShardRequest {
		b.Offsets, b.Lengths = make([]int64, len(shape)), shape
		return api.ShardRequest{Checkpoint: "k", Tensors: []api.TensorRequest{{Name: "out", Dtype: dtype,
			Shape: shape, Boxes: []api.Box{{Offsets: make([]int64, len(shape)), Lengths: shape}},
			Blocks: &[]api.Block{b}}}}
	}
	half, unit := 0.5, 1.0
	var rowsOf []row
	for _, k := range []struct {
		name string
		req  api.ShardRequest
		goal string
	}{
		{"transpose 4096 × 4096 BF16", one("BF16", []int64{side, side},
			api.Block{Source: "t", Base: []int64{0, 0}, Coeff: []api.Index{{0, 1}, {1, 0}}}), goalTranspose},
		{"BF16 mul 0.5, add 1", one("BF16", []int64{n}, api.Block{Source: "x", Base: []int64{0},
			Coeff: []api.Index{{1}}, Post: &[]api.PostOp{{Op: api.Mul, Value: &half}, {Op: api.Add, Value: &unit}}}),
			goalPost},
		{"every other BF16 element", one("BF16", []int64{n},
			api.Block{Source: "x", Base: []int64{0}, Coeff: []api.Index{{2}}}), goalEveryOther},
		{"F8_E4M3 → BF16", one("BF16", []int64{n}, api.Block{Source: "f", Base: []int64{0}, Coeff: []api.Index{{1}}}),
			goalE4M3},
	} {
		ds := interleaved(copyOf(2*n), through(k.req))
		base, kernel := ds[0], ds[1]
		if k.goal == goalEveryOther {
			r.goal(goal{"every other BF16 element, end to end (executor)", throughput(2*n, kernel),
				"copy() alternated with it: " + throughput(2*n, base), fmt.Sprintf("%.2f×", ratio(base, kernel)),
				"≥ 0.5×"})
		}
		rowsOf = append(rowsOf, vsCopy(k.name+" (32 MiB out)", 2*n, base, kernel, k.goal))
	}
	r.add("The same kernels end to end through the executor (a plan over a local file in the page cache, "+
		"read, converted and written in order; default segments; each row alternated with copy() of its output "+
		"size)", rowsOf...)
}

// controlPlaneScenario decodes and plans a DeepSeek-V3-sized table: 61 layers x 3 stacked expert
// matrices of 256 experts, each expert a block (46,848 blocks), for one of 8 expert-parallel ranks.
func controlPlaneScenario(r *report) {
	const layers, experts, inter, hid = 61, 256, 2048, 7168
	ck := &checkpoint.Checkpoint{Name: "deepseek", Tensors: map[string]*checkpoint.Tensor{}}
	var off int64 = 1 << 20
	var req api.ShardRequest
	req.Checkpoint = "deepseek"
	for l := range layers {
		for _, m := range []struct {
			name       string
			rows, cols int64
		}{{"gate_proj", inter, hid}, {"up_proj", inter, hid}, {"down_proj", hid, inter}} {
			var blocks []api.Block
			for e := range int64(experts) {
				name := fmt.Sprintf("model.layers.%d.mlp.experts.%d.%s.weight", l, e, m.name)
				size := m.rows * m.cols
				ck.Tensors[name] = &checkpoint.Tensor{
					Key: fmt.Sprintf("deepseek/model-%05d.safetensors", l),
					Tensor: safetensors.Tensor{
						Name:      name,
						DTypeName: "F8_E4M3",
						DType:     tensor.F8E4M3,
						Shape:     []int64{m.rows, m.cols},
						Begin:     off,
						End:       off + size,
					},
				}
				off += size
				blocks = append(
					blocks,
					api.Block{Offsets: []int64{e, 0, 0}, Lengths: []int64{1, m.rows, m.cols}, Source: name,
						Base: []int64{0, 0}, Coeff: [][]int64{{0, 1, 0}, {0, 0, 1}}},
				)
			}
			req.Tensors = append(
				req.Tensors,
				api.TensorRequest{Name: fmt.Sprintf("layers.%d.experts.%s", l, m.name), Dtype: api.F8E4M3,
					Shape: []int64{
						experts,
						m.rows,
						m.cols,
					}, Boxes: []api.Box{{Offsets: []int64{0, 0, 0}, Lengths: []int64{experts / 8, m.rows, m.cols}}}, Blocks: &blocks},
			)
		}
	}
	body, _ := json.Marshal(req)
	decode := timed(func() {
		var got api.ShardRequest
		dec := json.NewDecoder(bytes.NewReader(body))
		dec.DisallowUnknownFields()
		must(dec.Decode(&got))
	})
	opts := planner.ObjectStoreOptions() // what serve plans an s3:// request with
	opts.Align = cache.ObjectStoreConfig().ChunkBytes
	var plan *planner.Plan
	planning := timed(func() {
		var err error
		plan, err = planner.New(&req, ck, opts)
		must(err)
	})
	segments := 0
	for _, it := range plan.Items {
		segments += len(it.Segments)
	}
	r.add(
		fmt.Sprintf(
			"Control plane: a DeepSeek-V3-sized table (%d tensors, %d blocks, a %.1f MB request), one EP=8 rank",
			len(req.Tensors),
			layers*3*experts,
			float64(len(body))/1e6,
		),
		row{"request decode (strict JSON into the wire types)", p50(decode), "goal ≤ 1 s"},
		row{
			"plan (validation, segments, reads)",
			p50(planning),
			fmt.Sprintf(
				"goal ≤ 1 s; %d segments, %.1f GB of reads in %d requests",
				segments,
				float64(plan.ReadBytes)/1e9,
				plan.ReadRequests,
			),
		},
	)
}
