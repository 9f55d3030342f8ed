package server_test

import (
	"bytes"
	"context"
	"sync"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/api/layout"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// One Llama-3-8B attention layer (q 4096×4096, k and v 1024×4096, BF16) on S3, served with the
// object-store cache defaults: what one client's TP=8 fused-QKV rank costs, and what a fleet's.
func TestChunksFitTheReads(t *testing.T) {
	const hidden, kv, tp = 4096, 1024, 8
	chunk := cache.ObjectStoreConfig().ChunkBytes
	c := newS3ClusterChunk(t, 1, chunk)
	const p = "model.layers.0.self_attn."
	var file bytes.Buffer
	safetensors.Write(&file, []safetensors.TensorData{
		{Name: p + "q_proj.weight", DType: "BF16", Shape: []int64{hidden, hidden}, Data: pattern(hidden*hidden*2, 1)},
		{Name: p + "k_proj.weight", DType: "BF16", Shape: []int64{kv, hidden}, Data: pattern(kv*hidden*2, 2)},
		{Name: p + "v_proj.weight", DType: "BF16", Shape: []int64{kv, hidden}, Data: pattern(kv*hidden*2, 3)},
	}, nil)
	c.g.Put(t, c.bucket, "layer/model.safetensors", file.Bytes())
	shapes := layout.Shapes{p + "q_proj.weight": {hidden, hidden}, p + "k_proj.weight": {kv, hidden},
		p + "v_proj.weight": {kv, hidden}}
	// One KV head a rank: each rank's KV group, [q_r; k_r; v_r], is also vLLM's rank-major rank r.
	rank := func(r int64) *api.ShardRequest {
		tr, err := layout.InterleavedQKV(shapes, p+"q_proj.weight", p+"k_proj.weight", p+"v_proj.weight",
			p+"qkv_proj.weight", api.BF16, 128, layout.Rank{Size: tp, Index: r})
		if err != nil {
			t.Fatal(err)
		}
		return &api.ShardRequest{Checkpoint: "layer", Tensors: []api.TensorRequest{tr}}
	}
	cl := api.NewClient(c.replicas[0].srv.URL)
	plan, err := cl.Plan(context.Background(), rank(3)) // the catalog reads the header here
	if err != nil {
		t.Fatal(err)
	}
	needed := plan.Summary.NeededBytes
	fetchAll := func(reqs ...*api.ShardRequest) {
		var wg sync.WaitGroup
		for _, req := range reqs {
			wg.Go(func() {
				if _, err := cl.FetchBytes(context.Background(), req); err != nil {
					t.Error(err)
				}
			})
		}
		wg.Wait()
	}
	gets, before := c.proxy.Traffic()
	fetchAll(rank(3))
	gets1, one := c.proxy.Traffic()
	var same []*api.ShardRequest
	for range 32 {
		same = append(same, rank(5))
	}
	fetchAll(same...)
	_, identical := c.proxy.Traffic()
	var all []*api.ShardRequest
	for r := range int64(tp) {
		all = append(all, rank(r))
	}
	fetchAll(all...)
	_, fleet := c.proxy.Traffic()
	amp := float64(one-before) / float64(needed)
	union := float64(fleet-before) / float64(file.Len())
	t.Logf("one client's rank: %.3f× the %d MiB it needs, in %d requests; 32 identical clients: %.3f×; "+
		"the 8 ranks together: %.3f× the layer", amp, needed>>20, gets1-gets, float64(identical-one)/float64(needed),
		union)
	// Three regions (q, k, v), whole chunks long, that do not start on one cost a chunk more each:
	// within the goal of 1.25×.
	limit := min(1.25, float64(needed+3*chunk)/float64(needed))
	if amp > limit || float64(identical-one) > limit*float64(needed) || union > 1.1 {
		t.Errorf("read amplification: one client %.3f×, 32 identical %.3f× (at most %.3f× with %d KiB chunks); "+
			"the fleet %.3f× the union (goal ≤ 1.1×)", amp, float64(identical-one)/float64(needed), limit, chunk>>10,
			union)
	}
}
