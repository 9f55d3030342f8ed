package server_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
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

// failingStore fails every read at or past the file offset from with err; the header is read at
// offset 0. Which reads fail is a matter of where they are, not of the order in which a stream's
// read-ahead happens to issue them.
type failingStore struct {
	store.Store
	from int64
	err  error
}

func (f *failingStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if off >= f.from {
		return f.err
	}
	return f.Store.ReadAt(ctx, key, version, p, off)
}

// failingServer serves a 256 KiB tensor in 16 segments of 16 KiB from a store whose reads fail at
// and past the file offset from (1: every read of data).
func failingServer(t *testing.T, from int64, err error) (string, api.ShardRequest) {
	dir := t.TempDir()
	data := make([]byte, 64*1024*4)
	for i := range data {
		data[i] = byte(i)
	}
	writeCheckpoint(
		t,
		&harness{put: localPut(t, dir)},
		"m",
		safetensors.TensorData{Name: "w", DType: "F32", Shape: []int64{64, 1024}, Data: data},
	)
	local, _ := store.NewLocal(dir)
	st := &failingStore{Store: local, from: from, err: err}
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 16 << 10 // 16 segments
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{
		Catalog:  checkpoint.New(st),
		Executor: executor.New(st, mem, executor.Config{Window: 2}),
		Budget:   mem,
		Planner:  opts,
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
	})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL, shardReq(
		"m",
		api.TensorRequest{
			Name:   "w",
			Dtype:  api.F32,
			Shape:  []int64{64, 1024},
			Boxes:  whole(64, 1024),
			Blocks: copyOf("w", 64, 1024),
		},
	)
}

func post(t *testing.T, url string, req api.ShardRequest) (*http.Response, []byte, error) {
	raw, _ := json.Marshal(req)
	body := strings.NewReader(string(raw))
	res, err := http.Post(url+"/v1/shards", "application/json", body)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	return res, b, err
}

func TestFailureBeforeHeadersIsAProblem(t *testing.T) {
	for _, c := range []struct {
		err    error
		status int
	}{{store.ErrChanged, 409}, {errors.New("connection refused"), 502}, {context.DeadlineExceeded, 504}} {
		url, req := failingServer(t, 1, c.err)
		res, body, err := post(t, url, req)
		if err != nil || res.StatusCode != c.status || !strings.Contains(string(body), `"status":`) {
			t.Errorf("%v: %d %s %v, want a %d problem", c.err, res.StatusCode, body, err, c.status)
		}
	}
}

func TestFailureAfterHeadersAbortsTheConnection(t *testing.T) {
	url, req := failingServer(t, 128<<10, store.ErrChanged) // the first segment is read, the second half not
	res, body, err := post(t, url, req)
	if res.StatusCode != 200 {
		t.Fatalf("status %d", res.StatusCode)
	}
	if err == nil || int64(len(body)) >= shardLength(t, res) || res.Trailer.Get("Repr-Digest") != "" {
		t.Fatalf(
			"the client got %d of %d bytes, err %v and trailers %v; want a short body, an error and no digest",
			len(body),
			shardLength(t, res),
			err,
			res.Trailer,
		)
	}
}
