package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// A data file replaced under the same key, its index untouched, with the cache warm: the next
// request (the catalog revalidates on every Open here) serves the new bytes, never the old
// version's cached chunks.
func TestAReplacedShardIsServedNewUnderAWarmCache(t *testing.T) {
	g := s3test.Start(t)
	g.CreateBucket(t, "fresh")
	s3, err := s3reader.New(context.Background(), s3reader.Config{Bucket: "fresh", Endpoint: g.Endpoint})
	if err != nil {
		t.Fatal(err)
	}
	st, err := cache.New(s3, cache.Config{Bytes: 64 << 20, ChunkBytes: 4 << 10}, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := planner.DefaultOptions()
	opts.Align = 4 << 10
	h := newHarness(t, opts, st, func(key string, data []byte) { g.Put(t, "fresh", key, data) })
	shard := func(name string, data []float32) {
		var buf bytes.Buffer
		if err := safetensors.Write(&buf, []safetensors.TensorData{{Name: name, DType: "F32",
			Shape: []int64{int64(len(data))}, Data: f32(data...)}}, nil); err != nil {
			t.Fatal(err)
		}
		h.put("m/"+name+".safetensors", buf.Bytes())
	}
	index, _ := json.Marshal(map[string]any{"weight_map": map[string]string{
		"a": "a.safetensors", "b": "b.safetensors"}})
	h.put("m/model.safetensors.index.json", index)
	shard("a", arange(0, 1024))
	shard("b", arange(0, 1024))
	req := shardReq("m", api.TensorRequest{Name: "b", Dtype: api.F32, Shape: []int64{1024}, Boxes: whole(1024),
		Blocks: copyOf("b", 1024)})
	for range 2 { // the second is served from the cache
		if res := h.do("POST", "/v1/shards", req); res.status != http.StatusOK ||
			!bytes.Equal(res.body, f32(arange(0, 1024)...)) {
			t.Fatalf("before the replacement: %d", res.status)
		}
	}
	shard("b", arange(5000, 1024))
	if res := h.do("POST", "/v1/shards", req); res.status != http.StatusOK ||
		!bytes.Equal(res.body, f32(arange(5000, 1024)...)) {
		t.Errorf("after b was replaced: %d, first values %v; want the new bytes", res.status,
			readF32(res.body)[:min(4, len(res.body)/4)])
	}
}
