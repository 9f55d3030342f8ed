package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync/atomic"
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

// An 8 MiB file rewritten in place (same size, same header) while it is served: every 200 body
// is one version whole. 409s and aborted streams are the honest answers to a file that changed.
func TestInPlaceRewriteNeverServesTwoVersions(t *testing.T) {
	const n = 8 << 20
	dir := t.TempDir()
	versions := make([][]byte, 2)
	for v, fill := range []byte{0x11, 0x22} {
		var f bytes.Buffer
		safetensors.Write(
			&f,
			[]safetensors.TensorData{{Name: "w", DType: "U8", Shape: []int64{n}, Data: bytes.Repeat([]byte{fill}, n)}},
			nil,
		)
		versions[v] = f.Bytes()
	}
	path := filepath.Join(dir, "m", "model.safetensors")
	os.MkdirAll(filepath.Dir(path), 0o755)
	os.WriteFile(path, versions[0], 0o644)
	st, _ := store.NewLocal(dir)
	opts := planner.DefaultOptions() // one 8 MiB read per body: the longest window for a write to land in
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{Catalog: checkpoint.New(st), Planner: opts,
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
		Executor: executor.New(st, mem, executor.Config{Window: 2}),
		Budget:   mem,
	})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()

	var stop atomic.Bool
	done := make(chan struct{})
	go func() { // the writer: open, rewrite in 256 KiB writes, close, pause; then the other version
		defer close(done)
		for i := 1; !stop.Load(); i++ {
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			src := versions[i%2]
			for off := 0; off < len(src); off += 256 << 10 {
				f.WriteAt(src[off:min(len(src), off+256<<10)], int64(off))
			}
			f.Close()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	defer func() { stop.Store(true); <-done }()

	raw, _ := json.Marshal(
		shardReq(
			"m",
			api.TensorRequest{Name: "w", Dtype: api.U8, Shape: []int64{n}, Boxes: whole(n), Blocks: copyOf("w", n)},
		),
	)
	whole0, whole1 := versions[0][len(versions[0])-n:], versions[1][len(versions[1])-n:]
	statuses := map[int]int{}
	mixed, short := 0, 0
	buf := make([]byte, n)
	for range 200 {
		res, err := http.Post(ts.URL+"/v1/shards", "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		body := buf[:0]
		var rerr error
		if res.StatusCode == 200 {
			body = buf[:min(int64(len(buf)), shardLength(t, res))]
			_, rerr = io.ReadFull(res.Body, body)
		}
		res.Body.Close()
		statuses[res.StatusCode]++
		if res.StatusCode == 409 {
			time.Sleep(2 * time.Millisecond) // as a client backs off
		}
		switch {
		case res.StatusCode != 200:
		case rerr != nil || len(body) != n:
			short++ // aborted after the headers: the client knows
		case !bytes.Equal(body, whole0) && !bytes.Equal(body, whole1):
			mixed++
		}
	}
	t.Logf(
		"200 requests: statuses %v, %d aborted streams, %d whole 200 bodies with bytes of both versions",
		statuses,
		short,
		mixed,
	)
	if mixed > 0 {
		t.Errorf("%d responses were 200, whole, and mixed two versions of the file", mixed)
	}
	for status, count := range statuses {
		if status != 200 && status != 409 {
			t.Errorf("%d responses were %d; want 200 or 409", count, status)
		}
	}
}
