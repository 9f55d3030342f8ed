package server_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/gorillamux"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/azstore"
	"github.com/shardsrv/shardsrv/internal/azstore/aztest"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/gcsstore"
	"github.com/shardsrv/shardsrv/internal/gcsstore/gcstest"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/server/gen"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

func f32(xs ...float32) []byte {
	out := make([]byte, 4*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint32(out[4*i:], math.Float32bits(x))
	}
	return out
}

func bf16(xs ...float32) []byte {
	out := make([]byte, 2*len(xs))
	for i, x := range xs {
		binary.LittleEndian.PutUint16(out[2*i:], tensor.BF16FromF32(x))
	}
	return out
}

func arange(lo, n int) []float32 {
	out := make([]float32, n)
	for i := range out {
		out[i] = float32(lo + i)
	}
	return out
}

func readF32(b []byte) []float32 {
	out := make([]float32, len(b)/4)
	for i := range out {
		out[i] = math.Float32frombits(binary.LittleEndian.Uint32(b[4*i:]))
	}
	return out
}

// writeCheckpoint writes a single-file checkpoint into the harness's store.
func writeCheckpoint(t *testing.T, h *harness, name string, tensors ...safetensors.TensorData) {
	t.Helper()
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	h.put(name+"/model.safetensors", buf.Bytes())
}

// harness is a live server over a store whose responses are checked against openapi.yaml.
type harness struct {
	t      *testing.T
	put    func(key string, data []byte)
	url    string
	router routers.Router
}

var buckets atomic.Int64

// eachStore runs a test against a server over the local store (alone, cached, and signed under
// --verify required), S3 (versitygw), GCS (fake-gcs-server) and Azure Blob (Azurite).
func eachStore(t *testing.T, opts planner.Options, f func(t *testing.T, h *harness)) {
	t.Run("local", func(t *testing.T) {
		dir := t.TempDir()
		st, err := store.NewLocal(dir)
		if err != nil {
			t.Fatal(err)
		}
		f(t, newHarness(t, opts, st, localPut(t, dir)))
	})
	t.Run("local+cache", func(t *testing.T) {
		dir := t.TempDir()
		local, err := store.NewLocal(dir)
		if err != nil {
			t.Fatal(err)
		}
		// Small, so chunks are evicted and refilled.
		st, err := cache.New(local, cache.Config{Bytes: 1 << 20, ChunkBytes: 4 << 10}, nil)
		if err != nil {
			t.Fatal(err)
		}
		aligned := opts
		aligned.Align = 4 << 10
		f(t, newHarness(t, aligned, st, localPut(t, dir)))
	})
	t.Run("local+verify", func(t *testing.T) {
		st, put, _ := signedLocal(t)
		f(t, newHarness(t, opts, st, put))
	})
	t.Run("s3", func(t *testing.T) {
		g := s3test.Start(t)
		bucket := fmt.Sprintf("bucket-%d", buckets.Add(1))
		g.CreateBucket(t, bucket)
		st, err := s3reader.New(
			context.Background(),
			s3reader.Config{Bucket: bucket, Prefix: "models", Endpoint: g.Endpoint},
		)
		if err != nil {
			t.Fatal(err)
		}
		f(t, newHarness(t, opts, st, func(key string, data []byte) { g.Put(t, bucket, "models/"+key, data) }))
	})
	t.Run("gcs", func(t *testing.T) {
		g := gcstest.Start(t)
		bucket := fmt.Sprintf("bucket-%d", buckets.Add(1))
		g.CreateBucket(t, bucket)
		st, err := gcsstore.New(
			context.Background(),
			gcsstore.Config{Bucket: bucket, Prefix: "models", Endpoint: g.Endpoint},
		)
		if err != nil {
			t.Fatal(err)
		}
		f(t, newHarness(t, opts, st, func(key string, data []byte) { g.Put(t, bucket, "models/"+key, data) }))
	})
	t.Run("azure", func(t *testing.T) {
		a := aztest.Start(t)
		container := fmt.Sprintf("container-%d", buckets.Add(1))
		a.CreateContainer(t, container)
		st, err := azstore.New(
			context.Background(),
			azstore.Config{Account: aztest.Account, Container: container, Prefix: "models", Endpoint: a.Endpoint},
		)
		if err != nil {
			t.Fatal(err)
		}
		f(t, newHarness(t, opts, st, func(key string, data []byte) { a.Put(t, container, "models/"+key, data) }))
	})
}

func localPut(t *testing.T, dir string) func(string, []byte) {
	return func(key string, data []byte) {
		os.MkdirAll(filepath.Dir(filepath.Join(dir, key)), 0o755)
		if err := os.WriteFile(filepath.Join(dir, key), data, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func newHarness(t *testing.T, opts planner.Options, st store.Store, put func(string, []byte)) *harness {
	t.Helper()
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{
		Catalog:  checkpoint.New(st),
		Executor: executor.New(st, mem, executor.Config{Window: 3}),
		Budget:   mem,
		Planner:  opts,
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
	})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	spec, err := gen.GetSwagger()
	if err != nil {
		t.Fatal(err)
	}
	spec.Servers = openapi3.Servers{{URL: ts.URL}}
	router, err := gorillamux.NewRouter(spec)
	if err != nil {
		t.Fatal(err)
	}
	return &harness{t: t, put: put, url: ts.URL, router: router}
}

type response struct {
	status  int
	header  http.Header
	body    []byte
	problem api.Problem
}

// do sends a request and validates the response against the spec.
func (h *harness) do(method, path string, body any) response {
	h.t.Helper()
	var rd io.Reader
	var raw []byte
	switch b := body.(type) {
	case nil:
	case string:
		raw = []byte(b)
	default:
		raw, _ = json.Marshal(b)
	}
	if raw != nil {
		rd = bytes.NewReader(raw)
	}
	req, _ := http.NewRequest(method, h.url+path, rd)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatal(err)
	}
	defer res.Body.Close()
	out := response{status: res.StatusCode, header: res.Header}
	out.body, err = readBody(res)
	if err != nil {
		h.t.Fatalf("%s %s: reading the body: %v", method, path, err)
	}
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		json.Unmarshal(out.body, &out.problem)
	}
	checkDigest(h.t, res, out.body)
	h.validate(req, raw, res, out.body)
	return out
}

// readBody reads a response's body into one buffer of the length it announces (Content-Length, or
// Shard-Length when chunked; trusted up to 1 GiB), not a growing one: under the race detector
// every copy of a large body costs.
func readBody(res *http.Response) ([]byte, error) {
	n := res.ContentLength
	if s, err := strconv.ParseInt(res.Header.Get("Shard-Length"), 10, 64); err == nil {
		n = s
	}
	buf := bytes.NewBuffer(make([]byte, 0, min(max(n, 0), 1<<30)+bytes.MinRead))
	_, err := buf.ReadFrom(res.Body)
	return buf.Bytes(), err
}

func (h *harness) validate(req *http.Request, reqBody []byte, res *http.Response, body []byte) {
	h.t.Helper()
	route, params, err := h.router.FindRoute(req)
	if err != nil {
		if res.StatusCode == http.StatusNotFound || res.StatusCode == http.StatusMethodNotAllowed {
			return // not a route of the spec, answered as such
		}
		h.t.Fatalf("%s %s is not in openapi.yaml: %v", req.Method, req.URL.Path, err)
	}
	if ct := res.Header.Get("Content-Type"); res.StatusCode == http.StatusOK &&
		(ct == "application/octet-stream" || ct == "application/vnd.safetensors") {
		// openapi.yaml's binary bodies are {type: string, format: binary}, which any bytes satisfy:
		// the validator checks the status, headers and content type without copying the body.
		body = nil
	}
	req.Body = io.NopCloser(bytes.NewReader(reqBody))
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{ExcludeRequestBody: true}}
	err = openapi3filter.ValidateResponse(context.Background(), &openapi3filter.ResponseValidationInput{
		RequestValidationInput: in, Status: res.StatusCode, Header: res.Header, Body: io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true},
	})
	if err != nil {
		h.t.Errorf("%s %s: response %d does not match openapi.yaml: %v", req.Method, req.URL.Path, res.StatusCode, err)
	}
}

func init() {
	openapi3filter.RegisterBodyDecoder("application/octet-stream", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("application/vnd.safetensors", openapi3filter.FileBodyDecoder)
}

func rowsBlock(src string, start, rows, cols, dstRow int64) api.Block {
	return api.Block{
		Offsets: []int64{dstRow, 0},
		Lengths: []int64{rows, cols},
		Source:  src,
		Base:    []int64{start, 0},
		Coeff:   [][]int64{{1, 0}, {0, 1}},
	}
}

func shardReq(ckpt string, tensors ...api.TensorRequest) api.ShardRequest {
	return api.ShardRequest{Checkpoint: ckpt, Tensors: tensors}
}

func whole(shape ...int64) []api.Box {
	return []api.Box{{Offsets: make([]int64, len(shape)), Lengths: shape}}
}
