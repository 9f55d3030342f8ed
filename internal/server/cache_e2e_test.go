package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

const chunk = 64 << 10

// cachedServer serves a BF16 tensor "w" of rows x cols through the cache over a counting store.
func cachedServer(t *testing.T, rows, cols int64) (string, *storetest.Counting, []byte) {
	dir := t.TempDir()
	data := pattern(int(rows*cols*2), 3)
	writeCheckpoint(
		t,
		&harness{put: localPut(t, dir)},
		"m",
		safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{rows, cols}, Data: data},
	)
	local, _ := store.NewLocal(dir)
	counting := storetest.NewCounting(local)
	c, err := cache.New(counting, cache.Config{Bytes: 64 << 20, ChunkBytes: chunk}, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := planner.DefaultOptions()
	opts.Align = chunk
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{
		Catalog:  checkpoint.New(c),
		Executor: executor.New(c, mem, executor.Config{Window: 4}),
		Budget:   mem,
		Planner:  opts,
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
	})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	if res, err := http.Get(ts.URL + "/v1/tensors?checkpoint=m"); err == nil { // warm the catalog
		res.Body.Close()
	}
	counting.Reset()
	return ts.URL, counting, data
}

func concurrently(t *testing.T, url string, reqs []api.ShardRequest) [][]byte {
	out := make([][]byte, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() {
			raw, _ := json.Marshal(req)
			res, err := http.Post(url+"/v1/shards", "application/json", bytes.NewReader(raw))
			if err != nil {
				t.Error(err)
				return
			}
			defer res.Body.Close()
			out[i], err = io.ReadAll(res.Body)
			if err != nil || res.StatusCode != 200 {
				t.Errorf("client %d: %d %v", i, res.StatusCode, err)
			}
		})
	}
	wg.Wait()
	return out
}

func headerLen(rows, cols int64) int64 {
	var buf bytes.Buffer
	safetensors.Write(
		&buf,
		[]safetensors.TensorData{
			{Name: "w", DType: "BF16", Shape: []int64{rows, cols}, Data: make([]byte, rows*cols*2)},
		},
		nil,
	)
	return int64(buf.Len()) - rows*cols*2
}

func TestThirtyTwoClientsReadTheShardOnce(t *testing.T) {
	const rows, cols = 512, 1024
	url, counting, data := cachedServer(t, rows, cols)
	slab := api.TensorRequest{Name: "w", Dtype: api.BF16, Shape: []int64{rows, cols}, Blocks: copyOf("w", rows, cols),
		Boxes: []api.Box{{Offsets: []int64{128, 0}, Lengths: []int64{256, cols}}}}
	reqs := make([]api.ShardRequest, 32)
	for i := range reqs {
		reqs[i] = shardReq("m", slab)
	}
	for i, body := range concurrently(t, url, reqs) {
		if !bytes.Equal(body, data[128*cols*2:384*cols*2]) {
			t.Fatalf("client %d got other bytes", i)
		}
	}
	start := headerLen(rows, cols) + 128*cols*2
	end := start + 256*cols*2
	aligned := (end+chunk-1)/chunk*chunk - start/chunk*chunk
	if counting.Bytes() != aligned {
		t.Errorf(
			"storage read %d bytes for 32 clients; the shard is %d bytes, %d chunk-aligned",
			counting.Bytes(),
			end-start,
			aligned,
		)
	}
}

func TestEightRowParallelRanksReadTheTensorAboutOnce(t *testing.T) {
	const rows, cols, tp = 1024, 2048, 8
	url, counting, data := cachedServer(t, rows, cols)
	var reqs []api.ShardRequest
	for r := range int64(tp) {
		reqs = append(
			reqs,
			shardReq(
				"m",
				api.TensorRequest{
					Name:   "w",
					Dtype:  api.BF16,
					Shape:  []int64{rows, cols},
					Blocks: copyOf("w", rows, cols),
					Boxes:  []api.Box{{Offsets: []int64{0, r * cols / tp}, Lengths: []int64{rows, cols / tp}}},
				},
			),
		)
	}
	for r, body := range concurrently(t, url, reqs) {
		for i := range int64(rows) {
			lo := (i*cols + int64(r)*cols/tp) * 2
			if !bytes.Equal(body[i*cols/tp*2:(i+1)*cols/tp*2], data[lo:lo+cols/tp*2]) {
				t.Fatalf("rank %d row %d differs", r, i)
			}
		}
	}
	size := int64(rows * cols * 2)
	if got := counting.Bytes(); float64(got) > 1.1*float64(size) {
		t.Errorf("8 ranks read %d bytes from storage, %.2f× the tensor (goal ≤ 1.1×)", got, float64(got)/float64(size))
	}
}
