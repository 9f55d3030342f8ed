package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/api/layout"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

const prefetchUsage = `Usage: shardsrv prefetch --checkpoint NAME [--layout vllm --tp N --rank R|all ...]
       shardsrv prefetch --request FILE

Warms the server's cache (POST /v1/prefetch) with what a shard request reads, an engine's ranks,
or with --checkpoint alone every file of the checkpoint: each chunk is filled on the replica that
owns it, so when the server runs as several replicas sharing one cache (docs/cluster.md) every
replica then serves it without reading storage again — run it before a scale-out of the pods that
load the model. Nothing is downloaded here. The work is sent a batch of tensors at a time, with a
progress bar on a terminal; at the end it prints what was filled, how long it took, and how the
chunks are spread over the replicas.

Examples:
  shardsrv prefetch --server http://shardsrv:8080 --checkpoint llama-3-8b
  shardsrv prefetch --checkpoint llama-3-8b --layout vllm --tp 8 --rank all
  shardsrv layout --checkpoint llama-3-8b --tp 8 --rank 3 | shardsrv prefetch --request -
`

// prefetchBatches is about how many requests one table is cut into, so the bar moves.
const prefetchBatches = 16

// prefetchCmd: shardsrv prefetch --checkpoint NAME [--layout ...] | --request FILE
func prefetchCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("prefetch", prefetchUsage, stderr)
	var cf clientFlags
	cf.register(fs)
	reqPath := fs.String("request", "", "shard request `FILE` (JSON; - for stdin)")
	ckpt := fs.String("checkpoint", "", "checkpoint `NAME` on the server: with --layout its ranks, alone all of it")
	var lf layoutFlags
	lf.register(fs, "layout", "", "with --layout: the TP `RANK` to warm, or all")
	if err := parse(fs, args); err != nil {
		return err
	}
	if (*reqPath == "") == (*ckpt == "") || (*reqPath != "" && lf.engine != "") {
		return errors.New("prefetch: give --checkpoint NAME (with --layout or alone) or --request FILE " +
			"(see 'shardsrv prefetch -h')")
	}
	ctx := context.Background()
	c, err := cf.client()
	if err != nil {
		return err
	}
	tables, err := prefetchTables(ctx, c, *reqPath, *ckpt, &lf)
	if err != nil {
		return err
	}
	var total int64
	for _, t := range tables {
		plan, err := c.Plan(ctx, &t)
		if err != nil {
			return err
		}
		total += plan.Summary.ReadBytes
	}
	// Alone, --checkpoint ends with the whole checkpoint: headers, and tensors no table can name.
	if *reqPath == "" && lf.engine == "" {
		tables = append(tables, api.ShardRequest{Checkpoint: *ckpt})
	}
	start := time.Now()
	b := newBar(stderr)
	progress := b.progress()
	sum := api.PrefetchResponse{Checkpoint: tables[0].Checkpoint}
	owners := map[string]*api.PrefetchOwner{}
	for _, t := range tables {
		batches := [][]api.TensorRequest{nil} // the whole checkpoint, in one request
		if len(t.Tensors) > 0 {
			batches = slices.Collect(slices.Chunk(t.Tensors, (len(t.Tensors)+prefetchBatches-1)/prefetchBatches))
		}
		for _, batch := range batches {
			req := t
			req.Tensors = batch
			if err := prefetchOne(ctx, c, &req, &sum, owners); err != nil {
				b.end()
				return err
			}
			if progress != nil {
				progress(min(sum.Bytes, total), total)
			}
		}
	}
	if progress != nil {
		progress(total, total)
	}
	b.end()
	took := time.Since(start)
	fmt.Fprintf(stdout, "prefetched %s of %s in %d chunks in %.2fs: %s filled from storage in %d chunks, "+
		"the rest was cached\n", sum.Checkpoint, size(sum.Bytes), sum.Chunks, took.Seconds(), size(sum.FilledBytes),
		sum.FilledChunks)
	for _, name := range slices.Sorted(maps.Keys(owners)) {
		o := owners[name]
		fmt.Fprintf(stdout, "  %s: %d chunks, %s (%s filled)\n", name, o.Chunks, size(o.Bytes), size(o.FilledBytes))
	}
	return nil
}

// prefetchTables are the explicit tables to warm: the request's (its layout expanded), each rank's
// layout, or every tensor of the checkpoint whole.
func prefetchTables(ctx context.Context, c *api.Client, reqPath, ckpt string, lf *layoutFlags) (
	[]api.ShardRequest, error) {
	switch {
	case reqPath != "":
		req, err := readRequest(reqPath)
		if err != nil {
			return nil, err
		}
		if req.Layout == nil {
			return []api.ShardRequest{*req}, nil
		}
		table, err := c.Layout(ctx, req.Checkpoint, *req.Layout)
		return []api.ShardRequest{{Checkpoint: req.Checkpoint, Tensors: table.Tensors}}, err
	case lf.engine != "":
		ranks, err := lf.ranks(true)
		if err != nil {
			return nil, err
		}
		var out []api.ShardRequest
		for _, r := range ranks {
			table, err := c.Layout(ctx, ckpt, lf.layout(r))
			if err != nil {
				return nil, err
			}
			out = append(out, api.ShardRequest{Checkpoint: ckpt, Tensors: table.Tensors})
		}
		return out, nil
	}
	list, err := c.Tensors(ctx, ckpt)
	if err != nil {
		return nil, err
	}
	shapes := layout.ShapesOf(list)
	whole := api.ShardRequest{Checkpoint: ckpt}
	for _, t := range list.Tensors {
		// Packed FP4 is never a destination; the whole-checkpoint request at the end covers it.
		if d, ok := tensor.ParseDType(t.Dtype); ok && d != tensor.F4 {
			tr, err := layout.Replicated(shapes, t.Name, t.Name, api.DType(t.Dtype))
			if err != nil {
				return nil, err
			}
			whole.Tensors = append(whole.Tensors, tr)
		}
	}
	if len(whole.Tensors) == 0 {
		return nil, nil
	}
	return []api.ShardRequest{whole}, nil
}

// prefetchOne sends one prefetch and adds its answer to sum and owners.
func prefetchOne(ctx context.Context, c *api.Client, req *api.ShardRequest, sum *api.PrefetchResponse,
	owners map[string]*api.PrefetchOwner) error {
	resp, err := c.Prefetch(ctx, req)
	if err != nil {
		return err
	}
	sum.Chunks += resp.Chunks
	sum.Bytes += resp.Bytes
	sum.FilledChunks += resp.FilledChunks
	sum.FilledBytes += resp.FilledBytes
	for _, o := range resp.Owners {
		if owners[o.Owner] == nil {
			owners[o.Owner] = &api.PrefetchOwner{Owner: o.Owner}
		}
		owners[o.Owner].Chunks += o.Chunks
		owners[o.Owner].Bytes += o.Bytes
		owners[o.Owner].FilledBytes += o.FilledBytes
	}
	return nil
}
