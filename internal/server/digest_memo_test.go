package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// memoServer serves st in 256 KiB segments, counting its metrics into the reader it returns.
func memoServer(t *testing.T, st store.Store) (string, sdkmetric.Reader) {
	t.Helper()
	reader := sdkmetric.NewManualReader()
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 256 << 10
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{Catalog: checkpoint.New(st), Executor: executor.New(st, mem, executor.Config{}),
		Budget: mem, Planner: opts, Limits: server.Limits{MaxBodyBytes: 1 << 20},
		Meter: sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader))})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL, reader
}

// digestLookups is the shardsrv.digest.lookups counter: hits and misses.
func digestLookups(t *testing.T, reader sdkmetric.Reader) (hits, misses int64) {
	t.Helper()
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			sum, ok := m.Data.(metricdata.Sum[int64])
			if !ok || m.Name != "shardsrv.digest.lookups" {
				continue
			}
			for _, dp := range sum.DataPoints {
				switch result, _ := dp.Attributes.Value("result"); result.AsString() {
				case "hit":
					hits += dp.Value
				case "miss":
					misses += dp.Value
				}
			}
		}
	}
	return hits, misses
}

// readTwice posts req twice: the first response must trail the body's digest, the second carry it
// as a header field with an exact Content-Length, not chunked, and the same bytes. It returns them.
func readTwice(t *testing.T, url, what string, req api.ShardRequest) []byte {
	t.Helper()
	res, first := postShards(t, url, req)
	if field, trailed := sentDigest(res); res.StatusCode != 200 || !trailed || field != reprDigest(first) {
		t.Fatalf("%s, the first read: %d, Repr-Digest %q trailed %v, %s", what, res.StatusCode, field, trailed,
			first[:min(len(first), 200)])
	}
	res, again := postShards(t, url, req)
	field, trailed := sentDigest(res)
	switch {
	case res.StatusCode != 200 || !bytes.Equal(again, first):
		t.Errorf("%s, the second read: %d, the same bytes %v", what, res.StatusCode, bytes.Equal(again, first))
	case trailed || field != reprDigest(first):
		t.Errorf("%s, the second read: Repr-Digest %q trailed %v, want the first's as a header", what, field, trailed)
	case res.ContentLength != int64(len(again)) || len(res.TransferEncoding) > 0 || res.Header.Get("Trailer") != "":
		t.Errorf("%s, the second read: Content-Length %d for %d bytes, Transfer-Encoding %v, Trailer %q", what,
			res.ContentLength, len(again), res.TransferEncoding, res.Header.Get("Trailer"))
	}
	return first
}

// A request for the body of an earlier one — the same request over files at the same versions —
// gets its digest as a header; one that differs from it in any part the body is made of (the
// tensor, the box, a conversion, a post op, the format) is streamed and hashed anew. The metric
// counts each.
func TestDigestMemoKeysEveryPartOfTheBody(t *testing.T) {
	dir := t.TempDir()
	const rows, cols = 64, 1024
	w, v := pattern(rows*cols*2, 3), pattern(rows*cols*2, 9)
	writeCheckpoint(t, &harness{put: localPut(t, dir)}, "m",
		safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{rows, cols}, Data: w},
		safetensors.TensorData{Name: "v", DType: "BF16", Shape: []int64{rows, cols}, Data: v})
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	url, reader := memoServer(t, st)

	base := api.TensorRequest{Name: "w", Dtype: api.BF16, Shape: []int64{rows, cols}, Boxes: whole(rows, cols),
		Blocks: copyOf("w", rows, cols)}
	other := base
	other.Name, other.Blocks = "v", copyOf("v", rows, cols)
	half := base
	half.Boxes = []api.Box{{Offsets: []int64{rows / 2, 0}, Lengths: []int64{rows / 2, cols}}}
	widened := base
	widened.Dtype = api.F32
	doubled := base
	doubled.Blocks = copyOf("w", rows, cols)
	value := 2.0
	(*doubled.Blocks)[0].Post = &[]api.PostOp{{Op: "mul", Value: &value}}
	safetensorsFormat := api.Safetensors
	variants := []struct {
		name string
		req  api.ShardRequest
	}{
		{"the base", shardReq("m", base)},
		{"another tensor", shardReq("m", other)},
		{"another box", shardReq("m", half)},
		{"a conversion", shardReq("m", widened)},
		{"a post op", shardReq("m", doubled)},
		{"the safetensors format", api.ShardRequest{Checkpoint: "m", Tensors: []api.TensorRequest{base},
			Format: &safetensorsFormat}},
	}
	streamed := map[string]string{} // body → the variant that streamed it
	for i, c := range variants {
		body := readTwice(t, url, c.name, c.req)
		if before, seen := streamed[string(body)]; seen {
			t.Errorf("%s streams the body of %s: the variant tests nothing", c.name, before)
		}
		streamed[string(body)] = c.name
		if want := [][]byte{w, v}; i < len(want) && !bytes.Equal(body, want[i]) {
			t.Errorf("%s: the body is not the tensor's bytes", c.name)
		}
	}
	if hits, misses := digestLookups(t, reader); hits != int64(len(variants)) || misses != int64(len(variants)) {
		t.Errorf("shardsrv.digest.lookups: %d hits, %d misses; want %d each", hits, misses, len(variants))
	}
	// A client that declines the digest is not counted: it asks for none.
	postShards(t, url, shardReq("m", base), declined...)
	if hits, misses := digestLookups(t, reader); hits+misses != 2*int64(len(variants)) {
		t.Errorf("a declined request was counted: %d hits, %d misses", hits, misses)
	}
}

// A file rewritten in place (the same inode, a new mtime) is a new version: the next request for
// it misses the memo and trails the digest of the new bytes, and the one after finds that.
func TestDigestMemoMissesAFileRewrittenInPlace(t *testing.T) {
	dir := t.TempDir()
	before, after := pattern(1<<20, 1), pattern(1<<20, 2)
	req, path := u8File(t, dir, before)
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	url, _ := memoServer(t, st)
	if got := readTwice(t, url, "before", req); !bytes.Equal(got, before) {
		t.Fatal("the body is not the file's tensor")
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, []safetensors.TensorData{{Name: "w", DType: "U8", Shape: []int64{1 << 20},
		Data: after}}, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	f, err := os.OpenFile(path, os.O_WRONLY, 0) // in place: the same inode, the same size
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteAt(buf.Bytes(), 0); err != nil {
		t.Fatal(err)
	}
	f.Close()
	later := time.Now().Add(time.Hour)
	if err := os.Chtimes(path, later, later); err != nil {
		t.Fatal(err)
	}
	if got := readTwice(t, url, "after", req); !bytes.Equal(got, after) {
		t.Error("the body after the rewrite is not the new bytes")
	}
}

// toggledStore fails every read past the header while fail is set.
type toggledStore struct {
	store.Store
	fail atomic.Bool
}

func (s *toggledStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if s.fail.Load() && off > 1<<10 {
		return store.ErrChanged
	}
	return s.Store.ReadAt(ctx, key, version, p, off)
}

// A stream cut short — a read failing after the headers, or a client that hung up — leaves no
// digest in the memo: the next request for the body is hashed and trailed.
func TestDigestMemoKeepsNothingOfAnAbortedStream(t *testing.T) {
	dir := t.TempDir()
	data := pattern(32<<20, 5)
	req, _ := u8File(t, dir, data)
	local, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	st := &toggledStore{Store: local} // a store.Store only: every segment is read into buffers
	url, reader := memoServer(t, st)

	st.fail.Store(true)
	res, body := postShardsCutShort(t, url, req)
	if res.StatusCode != 200 || int64(len(body)) >= shardLength(t, res) {
		t.Fatalf("a failing read: %d, %d bytes; want a 200 cut short", res.StatusCode, len(body))
	}
	st.fail.Store(false)
	// A client that reads a little of a body far larger than the sockets' buffers and hangs up.
	hangUp, err := smallWindowClient.Post(url+"/v1/shards", "application/json", bytes.NewReader(requestJSON(req)))
	if err != nil || hangUp.StatusCode != 200 {
		t.Fatalf("%v %v", hangUp, err)
	}
	if _, err := io.ReadFull(hangUp.Body, make([]byte, 1<<20)); err != nil {
		t.Fatal(err)
	}
	hangUp.Body.Close()
	if got := readTwice(t, url, "after the aborted streams", req); !bytes.Equal(got, data) {
		t.Error("the body is not the file's tensor")
	}
	if hits, misses := digestLookups(t, reader); hits != 1 || misses != 3 {
		t.Errorf("shardsrv.digest.lookups: %d hits, %d misses; want 1 and 3", hits, misses)
	}
}

// postShardsCutShort is postShards for a body the server cuts short: the read's error is expected.
func postShardsCutShort(t *testing.T, url string, req api.ShardRequest) (*http.Response, []byte) {
	t.Helper()
	res, err := http.Post(url+"/v1/shards", "application/json", bytes.NewReader(requestJSON(req)))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err == nil {
		t.Errorf("a body cut short read without an error (%d bytes)", len(body))
	}
	return res, body
}

func requestJSON(req api.ShardRequest) []byte {
	raw, _ := json.Marshal(req)
	return raw
}
