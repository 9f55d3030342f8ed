// Command planlimits measures the planner on hostile requests: a full transpose
// of a 256 MiB BF16 tensor (read amplification), one box over N column blocks of a [2, N] tensor
// (planning time), one-element boxes over as many blocks, a grid of one-element blocks, and a
// 2-byte source broadcast into a huge tensor (plan memory). It prints one line per scenario; run
// it without -race:
//
//	go run ./cmd/shardsrv-bench/planlimits [-blocks 1048576] [-timeout 60s]
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"runtime"
	"runtime/pprof"
	"strings"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

var (
	blockCounts = flag.String("blocks", "10000,20000,50000,1048576", "column-block counts of the [2, N] scenario")
	pointBoxes  = flag.Int("points", 100000, "one-element boxes (and blocks) of the point scenario")
	timeout     = flag.Duration("timeout", 60*time.Second, "give up on a scenario after this long")
	gridSide    = flag.Int64("grid", 1024, "side of the grid scenario: side x side one-element transposed blocks")
	only        = flag.String("only", "", "comma-separated scenarios: transpose,columns,points,grid,broadcast,cancel")
	cpuProfile  = flag.String("cpuprofile", "", "write a CPU profile of the run to this file")
)

func want(s string) bool { return *only == "" || strings.Contains(","+*only+",", ","+s+",") }

func ckpt(tensors ...*checkpoint.Tensor) *checkpoint.Checkpoint {
	ck := &checkpoint.Checkpoint{Name: "ck", Tensors: map[string]*checkpoint.Tensor{}}
	off := int64(1024)
	for _, t := range tensors {
		n := int64(t.DType.Size())
		for _, d := range t.Shape {
			n *= d
		}
		t.Key, t.Version, t.Begin, t.End = "ck/model.safetensors", "v1", off, off+n
		off += n
		ck.Tensors[t.Name] = t
	}
	return ck
}

func bf16(name string, shape ...int64) *checkpoint.Tensor {
	return &checkpoint.Tensor{
		Tensor: safetensors.Tensor{Name: name, DType: tensor.BF16, DTypeName: "BF16", Shape: shape},
	}
}

// localOptions are the options cmd/shardsrv gives a directory store with default flags.
func localOptions() planner.Options { return planner.DefaultOptions() }

type outcome struct {
	plan  *planner.Plan
	err   error
	took  time.Duration
	alloc uint64
}

// plan runs planner.New in a goroutine and gives up (leaving it running) after the timeout.
func plan(ctx context.Context, req *api.ShardRequest, ck *checkpoint.Checkpoint, opts planner.Options) outcome {
	runtime.GC()
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	done := make(chan outcome, 1)
	start := time.Now()
	go func() {
		p, err := newPlan(ctx, req, ck, opts)
		var after runtime.MemStats
		runtime.ReadMemStats(&after)
		done <- outcome{plan: p, err: err, took: time.Since(start), alloc: after.TotalAlloc - before.TotalAlloc}
	}()
	select {
	case o := <-done:
		return o
	case <-time.After(*timeout):
		return outcome{err: fmt.Errorf("still planning after %v", *timeout), took: *timeout}
	}
}

func segments(p *planner.Plan) (n int) {
	for _, it := range p.Items {
		n += len(it.Segments)
	}
	return n
}

func report(name string, o outcome) {
	if o.err != nil {
		fmt.Printf("%-28s %9.3fs  alloc %8.1f MB  refused: %v\n", name, o.took.Seconds(), float64(o.alloc)/1e6, o.err)
		return
	}
	p := o.plan
	fmt.Printf(
		"%-28s %9.3fs  alloc %8.1f MB  segments %d  output %d  needed %d  read %d (%.3fx output)  "+
			"requests %d  plan memory %s\n",
		name,
		o.took.Seconds(),
		float64(o.alloc)/1e6,
		segments(p),
		p.BodyBytes,
		p.NeededBytes,
		p.ReadBytes,
		float64(p.ReadBytes)/float64(p.BodyBytes),
		p.ReadRequests,
		memoryBytes(p),
	)
}

func identity(rank int) [][]int64 {
	c := make([][]int64, rank)
	for i := range c {
		c[i] = make([]int64, rank)
		c[i][i] = 1
	}
	return c
}

func main() {
	flag.Parse()
	if *cpuProfile != "" {
		f, err := os.Create(*cpuProfile)
		if err != nil {
			panic(err)
		}
		pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	ctx := context.Background()
	if want("transpose") {
		ck := ckpt(bf16("w", 8192, 16384))
		blocks := []api.Block{
			{
				Offsets: []int64{0, 0},
				Lengths: []int64{16384, 8192},
				Source:  "w",
				Base:    []int64{0, 0},
				Coeff:   [][]int64{{0, 1}, {1, 0}},
			},
		}
		req := &api.ShardRequest{
			Checkpoint: "ck",
			Tensors: []api.TensorRequest{{Name: "t", Dtype: api.BF16, Shape: []int64{16384, 8192},
				Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: []int64{16384, 8192}}}, Blocks: &blocks}},
		}
		report("transpose 256 MiB (local)", plan(ctx, req, ck, localOptions()))
		s3 := planner.ObjectStoreOptions() // what serve plans an s3:// request with
		s3.Align = cache.ObjectStoreConfig().ChunkBytes
		report("transpose 256 MiB (s3)", plan(ctx, req, ck, s3))
	}
	if want("columns") {
		for _, f := range strings.Split(*blockCounts, ",") {
			var n int64
			fmt.Sscan(f, &n)
			req, ck := columns(n)
			report(fmt.Sprintf("[2, %d] column blocks", n), plan(ctx, req, ck, localOptions()))
			noPieces(
				func(o planner.Options) { report(fmt.Sprintf("[2, %d] columns, NoPieces", n), plan(ctx, req, ck, o)) },
			)
		}
	}
	if want("points") {
		n := int64(*pointBoxes)
		req, ck := columns(n)
		var boxes []api.Box
		for j := range n {
			boxes = append(boxes, api.Box{Offsets: []int64{j % 2, j}, Lengths: []int64{1, 1}})
		}
		req.Tensors[0].Boxes = boxes
		report(fmt.Sprintf("%d point boxes x blocks", n), plan(ctx, req, ck, localOptions()))
	}
	if want("grid") {
		n := *gridSide
		ck := ckpt(bf16("w", n, n))
		blocks := make([]api.Block, 0, n*n)
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
		req := &api.ShardRequest{
			Checkpoint: "ck",
			Tensors: []api.TensorRequest{{Name: "t", Dtype: api.BF16, Shape: []int64{n, n},
				Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: []int64{n, n}}}, Blocks: &blocks}},
		}
		report(fmt.Sprintf("%dx%d grid of blocks", n, n), plan(ctx, req, ck, localOptions()))
	}
	if want("broadcast") {
		ck := ckpt(bf16("s", 1))
		for _, size := range []int64{1 << 39, 1 << 40, 1 << 42} {
			blocks := []api.Block{
				{Offsets: []int64{0}, Lengths: []int64{size}, Source: "s", Base: []int64{0}, Coeff: [][]int64{{0}}},
			}
			req := &api.ShardRequest{
				Checkpoint: "ck",
				Tensors: []api.TensorRequest{{Name: "t", Dtype: api.BF16, Shape: []int64{size},
					Boxes: []api.Box{{Offsets: []int64{0}, Lengths: []int64{size}}}, Blocks: &blocks}},
			}
			report(fmt.Sprintf("broadcast 2 B -> %d TiB", size*2>>40), plan(ctx, req, ck, localOptions()))
		}
	}
	if want("cancel") {
		cancelScenario()
	}
	pprof.StopCPUProfile()
	os.Exit(0) // do not wait for a planner left running
}

// columns is one box over n column blocks of a [2, n] BF16 tensor, each block a column of w.
func columns(n int64) (*api.ShardRequest, *checkpoint.Checkpoint) {
	ck := ckpt(bf16("w", 2, n))
	blocks := make([]api.Block, n)
	id := identity(2)
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

func newPlan(
	ctx context.Context,
	req *api.ShardRequest,
	ck *checkpoint.Checkpoint,
	opts planner.Options,
) (*planner.Plan, error) {
	return planner.NewContext(ctx, req, ck, opts)
}

func noPieces(f func(planner.Options)) {
	o := planner.DefaultOptions()
	o.NoPieces = true
	f(o)
}

func memoryBytes(p *planner.Plan) string { return fmt.Sprintf("%.1f MB", float64(p.MemoryBytes)/1e6) }

// cancelScenario cancels a 1 Mi-block plan at several points and reports how long planning took
// to return after the cancel.
func cancelScenario() {
	req, ck := columns(1 << 20)
	for _, ms := range []time.Duration{50, 200, 500, 900} {
		after := ms * time.Millisecond
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			_, err := planner.NewContext(ctx, req, ck, planner.DefaultOptions())
			done <- err
		}()
		time.Sleep(after)
		at := time.Now()
		cancel()
		err := <-done
		fmt.Printf(
			"cancel 1 Mi-block plan at %v: returned %v after the cancel (%v)\n",
			after,
			time.Since(at).Round(time.Microsecond),
			errors.Is(err, context.Canceled) || err == nil,
		)
	}
}
