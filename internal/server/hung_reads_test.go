package server_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

func fifoServer(t *testing.T, st store.Store, requestTimeout time.Duration) string {
	opts := planner.DefaultOptions()
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{Catalog: checkpoint.New(st), Planner: opts,
		Executor: executor.New(st, mem, executor.Config{Window: 2}),
		Budget:   mem,
		Limits:   server.Limits{RequestTimeout: requestTimeout, MaxBodyBytes: 1 << 20}})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

// An indexed file replaced by a FIFO after the catalog read its header: opening a FIFO for
// reading waits for a writer, so the store must refuse it before: a problem, at once.
func TestAFIFOInPlaceOfAFileFailsFast(t *testing.T) {
	dir := t.TempDir()
	os.MkdirAll(filepath.Join(dir, "m"), 0o755)
	var f bytes.Buffer
	safetensors.Write(
		&f,
		[]safetensors.TensorData{{Name: "w", DType: "U8", Shape: []int64{16}, Data: make([]byte, 16)}},
		nil,
	)
	shard := filepath.Join(dir, "m", "model-00001-of-00001.safetensors")
	os.WriteFile(shard, f.Bytes(), 0o644)
	os.WriteFile(
		filepath.Join(dir, "m", "model.safetensors.index.json"),
		[]byte(`{"weight_map":{"w":"model-00001-of-00001.safetensors"}}`),
		0o644,
	)
	st, _ := store.NewLocal(dir)
	// The request time-out is an hour: a problem before postShards gives up is the store's refusal.
	url := fifoServer(t, st, time.Hour)
	if r, err := http.Get(url + "/v1/tensors?checkpoint=m"); err != nil || r.StatusCode != 200 {
		t.Fatalf("the catalog reads the checkpoint: %v %v", r, err)
	}
	os.Remove(shard)
	if err := syscall.Mkfifo(shard, 0o644); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	t.Cleanup(func() { // never leave a reader blocked on the FIFO behind
		if w, err := os.OpenFile(shard, os.O_WRONLY|syscall.O_NONBLOCK, 0); err == nil {
			w.Close()
		}
	})
	req := shardReq(
		"m",
		api.TensorRequest{Name: "w", Dtype: api.U8, Shape: []int64{16}, Boxes: whole(16), Blocks: copyOf("w", 16)},
	)
	for i := range 2 { // the first finds the FIFO under the cached catalog; the second resolves again
		res, body := postShards(t, url, req)
		if res.StatusCode < 400 || !strings.Contains(res.Header.Get("Content-Type"), "problem+json") {
			t.Errorf("request %d for a FIFO: %d %s; want a problem", i, res.StatusCode, body)
		}
		if strings.Contains(string(body), dir) {
			t.Errorf("the problem names a local path: %s", body)
		}
	}
}

// hangingStore serves headers and never returns from a data read, whatever its context says: a
// hung mount.
type hangingStore struct {
	store.Store
	release chan struct{}
}

func (h *hangingStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if off > 0 {
		<-h.release
	}
	return h.Store.ReadAt(ctx, key, version, p, off)
}

// A read that never returns does not hold the request past its timeout: the executor waits on its
// results and on the request's context.
func TestAReadThatNeverReturnsEndsAtTheTimeout(t *testing.T) {
	dir := t.TempDir()
	writeCheckpoint(
		t,
		&harness{put: localPut(t, dir)},
		"m",
		safetensors.TensorData{Name: "w", DType: "U8", Shape: []int64{16}, Data: make([]byte, 16)},
	)
	local, _ := store.NewLocal(dir)
	st := &hangingStore{Store: local, release: make(chan struct{})}
	t.Cleanup(func() { close(st.release) })
	url := fifoServer(t, st, 300*time.Millisecond)
	req := shardReq(
		"m",
		api.TensorRequest{Name: "w", Dtype: api.U8, Shape: []int64{16}, Boxes: whole(16), Blocks: copyOf("w", 16)},
	)
	if res, body := postShards(t, url, req); res.StatusCode != http.StatusGatewayTimeout {
		t.Errorf("a hung read: %d %s; want a 504 at the 300 ms request timeout", res.StatusCode, body)
	}
}
