package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// The fuzz server's limits: small enough that any input is cheap, so the fuzzer can tell a cost
// that is not bounded from one that is merely large.
const (
	fuzzMaxOutput = 8 << 20   // --max-output-bytes: every 200 from /v1/shards is at most this long
	fuzzMaxPlan   = 16 << 20  // --max-plan-bytes
	fuzzMemory    = 128 << 20 // --memory-bytes
	fuzzMaxBody   = 1 << 20   // --max-body-bytes
	// fuzzHeapCap is the most the fuzzing process's heap may hold in use after an input: the server's
	// budget (memory and one plan per stream slot), a body and its decoded request, and the fuzzer's
	// own corpus and coverage state, with room to spare. A request whose cost escapes the budget
	// (a 1 GB plan of a hostile request) is far above it.
	fuzzHeapCap = 768 << 20
)

// fuzzEnv is an in-process server over a local store holding the example checkpoint (qwen2-moe-tiny,
// with config.json, for layout requests) and "m", a checkpoint of small tensors of many dtypes
// and the sources of every deferred op.
type fuzzEnv struct {
	url    string
	client *http.Client
	panics atomic.Pointer[string] // the first panic other than http.ErrAbortHandler
	aborts atomic.Int64           // streams aborted after their headers
}

func fuzzCheckpoint() []safetensors.TensorData {
	w8 := make([]byte, 64)
	for i := range w8 {
		w8[i] = byte(i*37 + 1)
	}
	blocks := make([]byte, 2*3*1*16)
	for i := range blocks {
		blocks[i] = byte(i * 29)
	}
	return []safetensors.TensorData{
		{Name: "a", DType: "F32", Shape: []int64{4, 3}, Data: f32(arange(0, 12)...)},
		{Name: "n", DType: "BF16", Shape: []int64{3}, Data: bf16(0.5, 1.5, 2.5)},
		{Name: "step", DType: "I64", Shape: []int64{}, Data: []byte{7, 0, 0, 0, 0, 0, 0, 0}},
		{Name: "i", DType: "I32", Shape: []int64{2}, Data: []byte{1, 0, 0, 0, 0xff, 0xff, 0xff, 0xff}},
		{Name: "w8", DType: "F8_E4M3", Shape: []int64{8, 8}, Data: w8},
		{Name: "s8", DType: "F32", Shape: []int64{2, 2}, Data: f32(1, 2, 3, 4)},
		{Name: "e8", DType: "F8_E8M0", Shape: []int64{4}, Data: []byte{127, 128, 0, 255}},
		{Name: "blk", DType: "U8", Shape: []int64{2, 3, 1, 16}, Data: blocks},
		{Name: "scl", DType: "U8", Shape: []int64{2, 3, 1}, Data: []byte{127, 0, 254, 255, 128, 1}},
		{Name: "W", DType: "BF16", Shape: []int64{4, 6}, Data: bf16(arange(0, 24)...)},
		{Name: "A", DType: "F32", Shape: []int64{2, 6}, Data: f32(arange(1, 12)...)},
		{Name: "B", DType: "BF16", Shape: []int64{4, 2}, Data: bf16(arange(-4, 8)...)},
		{Name: "big", DType: "BF16", Shape: []int64{256, 512}, Data: pattern(256*512*2, 3)},
	}
}

func newFuzzEnv(f *testing.F) *fuzzEnv {
	dir := filepath.Join(f.TempDir(), "store")
	if _, err := example.Generate(dir); err != nil {
		f.Fatal(err)
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, fuzzCheckpoint(), map[string]string{"format": "pt"}); err != nil {
		f.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "m"), 0o755)
	if err := os.WriteFile(filepath.Join(dir, "m", "model.safetensors"), buf.Bytes(), 0o644); err != nil {
		f.Fatal(err)
	}
	st, err := store.NewLocal(dir)
	if err != nil {
		f.Fatal(err)
	}
	opts := planner.DefaultOptions()
	opts.SegmentBytes, opts.SegmentReadBytes = 256<<10, 512<<10
	opts.MaxOutputBytes, opts.MaxPlanBytes = fuzzMaxOutput, fuzzMaxPlan
	mem := budget.New(budget.Config{Bytes: fuzzMemory, AdmitWait: time.Second})
	srv := server.New(server.Config{
		Catalog:  checkpoint.New(st),
		Executor: executor.New(st, mem, executor.Config{Window: 2}),
		Budget:   mem,
		Planner:  opts,
		Limits: server.Limits{
			MaxBodyBytes:   fuzzMaxBody,
			MaxStreams:     4,
			MaxBlocks:      100_000,
			RequestTimeout: 30 * time.Second, // a hang guard: a -race run under load took over 5 s to stream one seed
			BodyTimeout:    5 * time.Second,
		},
	})
	e := &fuzzEnv{client: &http.Client{Timeout: 60 * time.Second}}
	h := srv.Handler()
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer func() {
			if v := recover(); v != nil {
				if v == http.ErrAbortHandler {
					e.aborts.Add(1)
				} else {
					msg := fmt.Sprintf("%v\n%s", v, debug.Stack())
					e.panics.CompareAndSwap(nil, &msg)
				}
				panic(v)
			}
		}()
		h.ServeHTTP(w, r)
	}))
	ts.Config.ErrorLog = nil
	f.Cleanup(ts.Close)
	e.url = ts.URL
	return e
}

// check posts body to path and holds the response to the contract: no 5xx but 503 and 504, no
// panic, every error a problem, a 200 whole and as long as it says.
func (e *fuzzEnv) check(t *testing.T, path string, body []byte) {
	req, _ := http.NewRequest("POST", e.url+path, bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	aborts := e.aborts.Load()
	res, err := e.client.Do(req)
	if p := e.panics.Load(); p != nil {
		t.Fatalf("POST %s panicked: %s", path, *p)
	}
	if err != nil {
		t.Fatalf("POST %s: no response: %v", path, err)
	}
	defer res.Body.Close()
	got, err := io.ReadAll(io.LimitReader(res.Body, fuzzMaxOutput+1<<20))
	if p := e.panics.Load(); p != nil {
		t.Fatalf("POST %s panicked: %s", path, *p)
	}
	ct := res.Header.Get("Content-Type")
	switch {
	case res.StatusCode >= 500 && res.StatusCode != 503 && res.StatusCode != 504:
		t.Fatalf("POST %s: %d %s", path, res.StatusCode, truncateForLog(string(got)))
	case res.StatusCode != 200:
		var p api.Problem
		if !strings.HasPrefix(ct, "application/problem+json") || json.Unmarshal(got, &p) != nil ||
			p.Status != res.StatusCode ||
			p.Title == "" {
			t.Fatalf(
				"POST %s: %d is not an application/problem+json problem of that status: Content-Type %q, %s",
				path,
				res.StatusCode,
				ct,
				got[:min(len(got), 300)],
			)
		}
	case err != nil:
		t.Fatalf("POST %s: 200 (Content-Length %d), then the body broke after %d bytes: %v (streams aborted: %d)",
			path, res.ContentLength, len(got), err, e.aborts.Load()-aborts)
	case path == "/v1/shards" && shardLength(t, res) > fuzzMaxOutput:
		t.Fatalf("POST %s: 200 of %d bytes, over --max-output-bytes %d", path, shardLength(t, res), fuzzMaxOutput)
	case path == "/v1/shards":
		checkDigest(t, res, got) // as long as its Shard-Length, and its digest
	case path == "/v1/plan" && (res.ContentLength >= 0 && res.ContentLength != int64(len(got)) ||
		!json.Valid(got) ||
		!strings.HasPrefix(ct, "application/json")):
		t.Fatalf(
			"POST %s: 200 (%q, Content-Length %d) with %d bytes that are not one JSON plan",
			path,
			ct,
			res.ContentLength,
			len(got),
		)
	}
}

// FuzzShardRequest mutates request bodies (the seeds in testdata/fuzz/FuzzShardRequest are valid
// requests of every kind, and a few hostile ones) and sends each to /v1/shards and /v1/plan of an
// in-process server: never a 5xx other than 503 and 504, never a panic, every error a problem,
// every 200 as long as its Shard-Length and trailing its digest, and the heap bounded after every
// input.
func FuzzShardRequest(f *testing.F) {
	if os.Getenv("SHARDSRV_WRITE_FUZZ_SEEDS") != "" {
		writeFuzzSeeds(f)
	}
	e := newFuzzEnv(f)
	f.Fuzz(func(t *testing.T, body []byte) {
		for _, b := range append([][]byte{body}, extremeVariants(body)...) {
			for _, path := range []string{"/v1/shards", "/v1/plan"} {
				e.check(t, path, b)
			}
			if bytes.Contains(b, []byte(`"layout"`)) {
				e.check(t, "/v1/layouts", b)
			}
		}
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		if ms.HeapInuse > fuzzHeapCap {
			runtime.GC() // what is in use, not garbage not yet collected
			runtime.ReadMemStats(&ms)
			if ms.HeapInuse > fuzzHeapCap {
				t.Fatalf(
					"after this input the heap holds %d MiB in use, over %d MiB",
					ms.HeapInuse>>20,
					fuzzHeapCap>>20,
				)
			}
		}
	})
}

// boundaryInts are the integers byte mutations rarely reach and overflows hide behind.
var boundaryInts = []int64{0, -1, 1 << 31, 1 << 62, math.MaxInt64}

// maxExtremeFields bounds how many integer fields of one input get boundary values, so a table of
// thousands of blocks costs a few dozen requests, not thousands.
const maxExtremeFields = 24

// extremeVariants are body (when it is JSON) with boundary integers in place of its integers: each
// integer field of a layout takes every boundary value in turn, and up to maxExtremeFields other
// integer fields, picked by the body's hash, one boundary value each, so across inputs every field
// of every request kind meets every value.
func extremeVariants(body []byte) [][]byte {
	var doc any
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	if dec.Decode(&doc) != nil {
		return nil
	}
	var fields []*json.Number // pointers into doc, in walk order
	var layoutFields []*json.Number
	var walk func(v any, inLayout bool)
	visit := func(slot *any, inLayout bool) {
		if n, ok := (*slot).(json.Number); ok {
			if _, err := n.Int64(); err == nil {
				p := &n
				*slot = p
				fields = append(fields, p)
				if inLayout {
					layoutFields = append(layoutFields, p)
				}
			}
			return
		}
		walk(*slot, inLayout)
	}
	walk = func(v any, inLayout bool) {
		switch v := v.(type) {
		case map[string]any:
			for k, x := range v {
				visit(&x, inLayout || k == "layout")
				v[k] = x
			}
		case []any:
			for i := range v {
				visit(&v[i], inLayout)
			}
		}
	}
	walk(doc, false)
	h := fnv.New64a()
	h.Write(body)
	seed := h.Sum64()
	var out [][]byte
	emit := func(n *json.Number, value int64) {
		orig := *n
		*n = json.Number(strconv.FormatInt(value, 10))
		if b, err := json.Marshal(doc); err == nil {
			out = append(out, b)
		}
		*n = orig
	}
	for _, n := range layoutFields {
		for _, v := range boundaryInts {
			emit(n, v)
		}
	}
	for i := range min(len(fields), maxExtremeFields) {
		k := (seed + uint64(i)*0x9e3779b97f4a7c15) % uint64(len(fields))
		emit(fields[k], boundaryInts[(seed>>8+uint64(i))%uint64(len(boundaryInts))])
	}
	return out
}

// fuzzSeeds are the seed corpus: valid requests of every kind the contract has, then hand-made
// mutations of them.
func fuzzSeeds() map[string][]byte {
	s := map[string][]byte{}
	id2 := `[[1,0],[0,1]]`
	add := func(name, body string) { s[name] = []byte(body) }
	add("valid-copy-boxes", `{"checkpoint":"m","tensors":[{"name":"a.t","dtype":"F32","shape":[4,3],
 "boxes":[{"offsets":[1,1],"lengths":[2,2]},{"offsets":[3,0],"lengths":[1,3]}],
 "blocks":[{"offsets":[0,0],"lengths":[4,3],"source":"a","base":[0,0],"coeff":`+id2+`}]}]}`)
	add("valid-safetensors-scalar", `{"checkpoint":"m","format":"safetensors","tensors":[
 {"name":"step","dtype":"F64","shape":[],"boxes":[{"offsets":[],"lengths":[]}],"blocks":[{"offsets":[],"lengths":[],`+
		`"source":"step","base":[],"coeff":[]}]},
 {"name":"n","dtype":"BF16","shape":[3],"boxes":[{"offsets":[0],"lengths":[3]}],"blocks":[{"offsets":[0],`+
		`"lengths":[3],"source":"n","base":[0],"coeff":[[1]]}]},
 {"name":"a","dtype":"F32","shape":[4,3],"boxes":[{"offsets":[0,0],"lengths":[1,3]},{"offsets":[2,0],"lengths":[2,3]}],
  "blocks":[{"offsets":[0,0],"lengths":[4,3],"source":"a","base":[0,0],"coeff":`+id2+`}]}]}`)
	add(
		"valid-stride",
		`{"checkpoint":"m","tensors":[{"name":"even","dtype":"BF16","shape":[2,3],"boxes":[{"offsets":[0,0],"lengths":[2,3]}],
 "blocks":[{"offsets":[0,0],"lengths":[2,3],"source":"a","base":[0,0],"coeff":[[2,0],[0,1]]}]}]}`,
	)
	add(
		"valid-transpose",
		`{"checkpoint":"m","tensors":[{"name":"aT","dtype":"F32","shape":[3,4],"boxes":[{"offsets":[0,1],"lengths":[3,3]}],
 "blocks":[{"offsets":[0,0],"lengths":[3,4],"source":"a","base":[0,0],"coeff":[[0,1],[1,0]]}]}]}`,
	)
	add(
		"valid-transpose-big",
		`{"checkpoint":"m","tensors":[{"name":"bigT","dtype":"BF16","shape":[512,256],"boxes":[{"offsets":[0,0],`+
			`"lengths":[512,256]}],
 "blocks":[{"offsets":[0,0],"lengths":[512,256],"source":"big","base":[0,0],"coeff":[[0,1],[1,0]]}]}]}`,
	)
	add(
		"valid-broadcast",
		`{"checkpoint":"m","tensors":[{"name":"nn","dtype":"F32","shape":[4,3],"boxes":[{"offsets":[0,0],"lengths":[4,3]}],
 "blocks":[{"offsets":[0,0],"lengths":[4,3],"source":"n","base":[0],"coeff":[[0,1]]}]}]}`,
	)
	add(
		"valid-reshape",
		`{"checkpoint":"m","tensors":[{"name":"r","dtype":"F32","shape":[2,2,3],"boxes":[{"offsets":[0,0,0],`+
			`"lengths":[2,2,3]}],
 "blocks":[{"offsets":[0,0,0],"lengths":[2,2,3],"source":"a","base":[0,0],"coeff":[[2,1,0],[0,0,1]]}]}]}`,
	)
	add(
		"valid-fill",
		`{"checkpoint":"m","tensors":[{"name":"padded","dtype":"F32","shape":[6],"boxes":[{"offsets":[0],"lengths":[6]}],`+
			`"fill":-1,
 "blocks":[{"offsets":[1],"lengths":[3],"source":"n","base":[0],"coeff":[[1]]}]}]}`,
	)
	add(
		"valid-fill-i64",
		`{"checkpoint":"m","tensors":[{"name":"ids","dtype":"I64","shape":[4],"boxes":[{"offsets":[0],"lengths":[4]}],`+
			`"fill":9007199254740993,
 "blocks":[{"offsets":[3],"lengths":[1],"source":"step","base":[],"coeff":[]}]}]}`,
	)
	add(
		"valid-fill-only",
		`{"checkpoint":"m","tensors":[{"name":"z","dtype":"U64","shape":[2,2],"boxes":[{"offsets":[0,0],"lengths":[2,2]}],`+
			`"fill":18446744073709551615,"blocks":[]}]}`,
	)
	add(
		"valid-post-ops",
		`{"checkpoint":"m","tensors":[{"name":"p","dtype":"BF16","shape":[4,3],"boxes":[{"offsets":[0,0],"lengths":[4,3]}],
 "blocks":[{"offsets":[0,0],"lengths":[2,3],"source":"a","base":[0,0],"coeff":`+id2+`,"post":[{"op":"neg"},`+
			`{"op":"mul","value":0.5},{"op":"add","value":3}]},
  {"offsets":[2,0],"lengths":[2,3],"source":"a","base":[2,0],"coeff":`+id2+`,"post":[{"op":"cast","dtype":"BF16"},`+
			`{"op":"exp"}]}]}]}`,
	)
	add(
		"valid-e8m0",
		`{"checkpoint":"m","tensors":[{"name":"e","dtype":"F32","shape":[4],"boxes":[{"offsets":[0],"lengths":[4]}],
 "blocks":[{"offsets":[0],"lengths":[4],"source":"e8","base":[0],"coeff":[[1]],"post":[{"op":"mul","value":2}]}]}]}`,
	)
	add(
		"valid-int-widen",
		`{"checkpoint":"m","tensors":[{"name":"i","dtype":"I64","shape":[2],"boxes":[{"offsets":[0],"lengths":[2]}],
 "blocks":[{"offsets":[0],"lengths":[2],"source":"i","base":[0],"coeff":[[1]]}]}]}`,
	)
	add(
		"valid-fp8-dequant",
		`{"checkpoint":"m","tensors":[{"name":"w","dtype":"BF16","shape":[8,8],"boxes":[{"offsets":[2,1],"lengths":[4,4]},`+
			`{"offsets":[0,0],"lengths":[8,8]}],
 "deferred":{"op":"fp8_block_dequant","sources":["w8","s8"],"params":{"block":[4,4]}}}]}`,
	)
	add(
		"valid-fp8-block-read",
		`{"checkpoint":"m","tensors":[{"name":"w","dtype":"F32","shape":[8,8],"boxes":[{"offsets":[0,0],"lengths":[8,8]}],
 "blocks":[{"offsets":[0,0],"lengths":[8,8],"source":"w8","base":[0,0],"coeff":`+id2+`,"post":[{"op":"mul",`+
			`"value":0.25}]}]}]}`,
	)
	add("valid-mxfp4", `{"checkpoint":"m","format":"safetensors","tensors":[{"name":"x","dtype":"BF16","shape":[2,32,3],
 "boxes":[{"offsets":[0,0,0],"lengths":[2,32,3]},{"offsets":[1,30,1],"lengths":[1,2,2]}],
 "deferred":{"op":"mxfp4_dequant","sources":["blk","scl"]}}]}`)
	add(
		"valid-lora",
		`{"checkpoint":"m","tensors":[{"name":"merged","dtype":"F32","shape":[4,6],"boxes":[{"offsets":[1,2],`+
			`"lengths":[3,3]}],
 "deferred":{"op":"lora_merge","sources":["W","A","B"],"params":{"alpha":4,"rank":2}}}]}`,
	)
	add(
		"valid-layout-tp2",
		`{"checkpoint":"qwen2-moe-tiny","layout":{"engine":"vllm","tensor_parallel_size":2,"tp_rank":1}}`,
	)
	add(
		"valid-layout-ep",
		`{"checkpoint":"qwen2-moe-tiny","format":"safetensors","layout":{"engine":"vllm","tensor_parallel_size":2,"tp_rank":0,
 "data_parallel_size":2,"dp_rank":1,"enable_expert_parallel":true,"dtype":"F32"}}`,
	)
	add(
		"mut-layout-megatron-on-moe",
		`{"checkpoint":"qwen2-moe-tiny","layout":{"engine":"megatron","tensor_parallel_size":4,"tp_rank":3}}`,
	)
	for name, req := range example.Requests() {
		b, _ := json.Marshal(req)
		s["valid-example-"+name] = b
	}

	// Hand-made mutations: shapes and numbers at the limits, nesting, duplicate keys.
	add(
		"mut-huge-shape",
		`{"checkpoint":"m","tensors":[{"name":"h","dtype":"F32","shape":[9223372036854775807,9223372036854775807],
 "boxes":[{"offsets":[0,0],"lengths":[9223372036854775807,9223372036854775807]}],
 "blocks":[{"offsets":[0,0],"lengths":[9223372036854775807,9223372036854775807],"source":"a","base":[0,0],`+
			`"coeff":[[0,0],[0,0]]}]}]}`,
	)
	add("mut-broadcast-2^42", `{"checkpoint":"m","tensors":[{"name":"b","dtype":"BF16","shape":[4398046511104],
 "boxes":[{"offsets":[0],"lengths":[4398046511104]}],
 "blocks":[{"offsets":[0],"lengths":[4398046511104],"source":"n","base":[0],"coeff":[[0]]}]}]}`)
	add("mut-broadcast-just-over-cap", `{"checkpoint":"m","tensors":[{"name":"b","dtype":"BF16","shape":[4194305],
 "boxes":[{"offsets":[0],"lengths":[4194305]}],
 "blocks":[{"offsets":[0],"lengths":[4194305],"source":"n","base":[0],"coeff":[[0]]}]}]}`)
	add("mut-many-dims", `{"checkpoint":"m","tensors":[{"name":"d","dtype":"U8","shape":[`+strings.Repeat("2,", 63)+`2],
 "boxes":[{"offsets":[`+strings.Repeat("0,", 63)+`0],"lengths":[`+strings.Repeat("2,", 63)+`2]}],"fill":0}]}`)
	add(
		"mut-layout-huge-tp",
		`{"checkpoint":"qwen2-moe-tiny","layout":{"engine":"vllm","tensor_parallel_size":1099511627776,"tp_rank":-1,`+
			`"data_parallel_size":0}}`,
	)
	// TP × DP that wraps to 0 (a division by zero), to −2, or past the ranks with a rank of 2^62.
	add(
		"mut-layout-tp-dp-wraps-to-zero",
		`{"checkpoint":"qwen2-moe-tiny","layout":{"engine":"vllm","tensor_parallel_size":4,`+
			`"data_parallel_size":4611686018427387904,"enable_expert_parallel":true}}`,
	)
	add(
		"mut-layout-tp-dp-wraps-negative",
		`{"checkpoint":"qwen2-moe-tiny","layout":{"engine":"vllm","tensor_parallel_size":2,`+
			`"data_parallel_size":9223372036854775807,"enable_expert_parallel":true}}`,
	)
	add(
		"mut-layout-dp-rank-2^62",
		`{"checkpoint":"qwen2-moe-tiny","layout":{"engine":"vllm","data_parallel_size":4611686018427387905,`+
			`"dp_rank":4611686018427387904,"enable_expert_parallel":true}}`,
	)
	add(
		"mut-numbers-out-of-range",
		`{"checkpoint":"m","tensors":[{"name":"o","dtype":"I64","shape":[1e999],"boxes":[{"offsets":[-9223372036854775809],`+
			`"lengths":[18446744073709551616]}],"fill":1e400}]}`,
	)
	add(
		"mut-fill-overflow",
		`{"checkpoint":"m","tensors":[{"name":"o","dtype":"I8","shape":[2],"boxes":[{"offsets":[0],"lengths":[2]}],`+
			`"fill":-129,"blocks":[]}]}`,
	)
	add(
		"mut-fill-float-into-int",
		`{"checkpoint":"m","tensors":[{"name":"o","dtype":"U64","shape":[2],"boxes":[{"offsets":[0],"lengths":[2]}],`+
			`"fill":1.5e-400}]}`,
	)
	add(
		"mut-post-nan-value",
		`{"checkpoint":"m","tensors":[{"name":"p","dtype":"F32","shape":[3],"boxes":[{"offsets":[0],"lengths":[3]}],
 "blocks":[{"offsets":[0],"lengths":[3],"source":"n","base":[0],"coeff":[[1]],"post":[{"op":"mul","value":1e308},`+
			`{"op":"mul","value":1e308},{"op":"cast","dtype":"F8_E4M3"},{"op":"cast","dtype":"F4"}]}]}]}`,
	)
	add(
		"mut-negative-and-overflowing-offsets",
		`{"checkpoint":"m","tensors":[{"name":"a","dtype":"F32","shape":[4,3],"boxes":[{"offsets":[-1,9223372036854775807],`+
			`"lengths":[2,2]}],
 "blocks":[{"offsets":[9223372036854775806,0],"lengths":[4,3],"source":"a","base":[-5,9223372036854775807],`+
			`"coeff":[[9223372036854775807,0],[0,-1]]}]}]}`,
	)
	add(
		"mut-duplicate-keys",
		`{"checkpoint":"m","checkpoint":"qwen2-moe-tiny","tensors":[{"name":"a","NAME":"b","dtype":"F32","shape":[4,3],
 "boxes":[{"offsets":[0,0],"lengths":[4,3]}],"blocks":[{"offsets":[0,0],"lengths":[4,3],"source":"a","base":[0,0],`+
			`"coeff":`+id2+`}]}]}`,
	)
	add(
		"mut-deep-nesting-array",
		`{"checkpoint":"m","tensors":`+strings.Repeat("[", 20000)+strings.Repeat("]", 20000)+`}`,
	)
	add(
		"mut-deep-nesting-object",
		`{"checkpoint":"m","layout":`+strings.Repeat(`{"engine":`, 5000)+`"vllm"`+strings.Repeat("}", 5000)+`}`,
	)
	add("mut-unclosed-nesting", `{"checkpoint":"m","tensors":[{"name":"a","shape":`+strings.Repeat("[", 100000))
	add(
		"mut-null-everywhere",
		`{"checkpoint":"m","format":null,"layout":null,"tensors":[{"name":null,"dtype":null,"shape":null,"boxes":null,`+
			`"blocks":[null],"fill":null,"deferred":null}]}`,
	)
	add(
		"mut-table-and-layout",
		`{"checkpoint":"qwen2-moe-tiny","layout":{"engine":"vllm"},"tensors":[{"name":"a","dtype":"F32","shape":[1],`+
			`"boxes":[{"offsets":[0],"lengths":[1]}],"fill":0}]}`,
	)
	add(
		"mut-non-utf8-names",
		"{\"checkpoint\":\"m\\udc00\xff\",\"tensors\":[{\"name\":\"\xc3\x28\",\"dtype\":\"F32\",\"shape\":[1],"+
			"\"boxes\":[{\"offsets\":[0],\"lengths\":[1]}],"+
			"\"blocks\":[{\"offsets\":[0],\"lengths\":[1],\"source\":\"a\xfe\",\"base\":[0,0],\"coeff\":[[1],[0]]}]}]}",
	)
	add(
		"mut-path-escape",
		`{"checkpoint":"../../../etc","tensors":[{"name":"a","dtype":"F32","shape":[1],"boxes":[{"offsets":[0],`+
			`"lengths":[1]}],"fill":0}]}`,
	)
	add(
		"mut-deferred-huge-block",
		`{"checkpoint":"m","tensors":[{"name":"w","dtype":"BF16","shape":[8,8],"boxes":[{"offsets":[0,0],"lengths":[8,8]}],
 "deferred":{"op":"fp8_block_dequant","sources":["w8","s8"],"params":{"block":[9223372036854775807,1],"alpha":-1e308,`+
			`"rank":0}}}]}`,
	)
	add(
		"mut-lora-rank-zero",
		`{"checkpoint":"m","tensors":[{"name":"merged","dtype":"F32","shape":[4,6],"boxes":[{"offsets":[0,0],`+
			`"lengths":[4,6]}],
 "deferred":{"op":"lora_merge","sources":["W","A","B"],"params":{"alpha":1e308,"rank":0}}}]}`,
	)
	var boxes, blocks strings.Builder
	for i := range 4000 {
		if i > 0 {
			blocks.WriteByte(',')
		}
		if i < 200 {
			if i > 0 {
				boxes.WriteByte(',')
			}
			fmt.Fprintf(&boxes, `{"offsets":[%d,0],"lengths":[1,1]}`, i%2)
		}
		fmt.Fprintf(&blocks, `{"offsets":[0,%d],"lengths":[2,1],"source":"n","base":[0],"coeff":[[0,0]]}`, i)
	}
	add(
		"mut-many-boxes-and-blocks",
		`{"checkpoint":"m","tensors":[{"name":"x","dtype":"F32","shape":[2,4000],"boxes":[`+
			strings.ReplaceAll(boxes.String(), `[1,1]`, `[1,4000]`)+`],"blocks":[`+blocks.String()+`]}]}`,
	)
	return s
}

// writeFuzzSeeds (SHARDSRV_WRITE_FUZZ_SEEDS=1) rewrites testdata/fuzz/FuzzShardRequest from
// fuzzSeeds, in the corpus file format of go test.
func writeFuzzSeeds(f *testing.F) {
	dir := filepath.Join("testdata", "fuzz", "FuzzShardRequest")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		f.Fatal(err)
	}
	seeds := fuzzSeeds()
	names := make([]string, 0, len(seeds))
	for n := range seeds {
		names = append(names, n)
	}
	slices.Sort(names)
	for _, n := range names {
		if err := os.WriteFile(
			filepath.Join(dir, n),
			fmt.Appendf(nil, "go test fuzz v1\n[]byte(%q)\n", seeds[n]),
			0o644,
		); err != nil {
			f.Fatal(err)
		}
	}
}
