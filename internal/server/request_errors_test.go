package server_test

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// send posts raw bytes with the given headers (name, value, ...).
func postRaw(t *testing.T, url, path string, body []byte, header ...string) (*http.Response, api.Problem) {
	t.Helper()
	req, _ := http.NewRequest("POST", url+path, bytes.NewReader(body))
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, _ := io.ReadAll(res.Body)
	var p api.Problem
	if strings.HasPrefix(res.Header.Get("Content-Type"), "application/problem+json") {
		json.Unmarshal(b, &p)
	}
	return res, p
}

func problemDetail(p api.Problem) string {
	if p.Detail == nil {
		return ""
	}
	return *p.Detail
}

// A checkpoint reached through a symlink out of the store is one the store does not have: 404,
// and the problem names no local path.
func TestSymlinkOutOfTheStoreIs404WithoutPaths(t *testing.T) {
	outside := t.TempDir()
	writeCheckpoint(
		t,
		&harness{put: localPut(t, outside)},
		"secret",
		safetensors.TensorData{Name: "w", DType: "U8", Shape: []int64{4}, Data: make([]byte, 4)},
	)
	dir := t.TempDir()
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "escape"))
	st, _ := store.NewLocal(dir)
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	for _, path := range []string{"/v1/tensors?checkpoint=escape"} {
		res := h.do("GET", path, nil)
		if res.status != 404 || strings.Contains(string(res.body), dir) || strings.Contains(string(res.body), outside) {
			t.Errorf("GET %s: %d %s; want a 404 naming no local path", path, res.status, res.body)
		}
	}
	req := shardReq(
		"escape",
		api.TensorRequest{Name: "w", Dtype: api.U8, Shape: []int64{4}, Boxes: whole(4), Blocks: copyOf("w", 4)},
	)
	if res := h.do("POST", "/v1/shards", req); res.status != 404 || strings.Contains(string(res.body), dir) ||
		strings.Contains(string(res.body), outside) {
		t.Errorf("a shard of it: %d %s; want a 404 naming no local path", res.status, res.body)
	}
}

// Names longer than a store can hold are the client's mistake: 400, not a 502 from the file system.
func TestOverlongCheckpointNamesAre400(t *testing.T) {
	e := opsServer(t, nil)
	for _, name := range []string{strings.Repeat("a", 256), strings.Repeat(strings.Repeat("b", 200)+"/", 6) + "c"} {
		req := e.req
		req.Checkpoint = name
		res, body := e.post(t, "/v1/shards", req)
		if res.StatusCode != 400 || !strings.Contains(string(body), "/checkpoint") {
			t.Errorf("a checkpoint name of %d bytes: %d %s", len(name), res.StatusCode, body)
		}
		if res, err := http.Get(e.url + "/v1/tensors?checkpoint=" + name); err != nil || res.StatusCode != 400 {
			t.Errorf("listing a checkpoint name of %d bytes: %v %v", len(name), res.StatusCode, err)
		}
	}
}

// A key twice in one object is ambiguous (encoding/json would keep the last): 400, with a
// pointer to it. Keys match as encoding/json matches them to fields, regardless of case.
func TestDuplicateKeysAre400(t *testing.T) {
	e := opsServer(t, func(c *server.Config, st store.Store) { c.Limits.MaxBodyBytes = 16 << 20 })
	good, _ := json.Marshal(e.req)
	for _, c := range []struct{ body, pointer string }{
		{strings.Replace(string(good), `"checkpoint":"m"`, `"checkpoint":"m","checkpoint":"m"`, 1), "/checkpoint"},
		{strings.Replace(string(good), `"base":[0,0]`, `"base":[0,0],"base":[0,0]`, 1), "/tensors/0/blocks/0/base"},
		{strings.Replace(string(good), `"name":"w"`, `"name":"w","NAME":"w"`, 1), "/tensors/0/NAME"},
		{strings.Replace(string(good), `"name":"w"`, `"name":"w","n\u0061me":"w"`, 1), "/tensors/0/name"},
	} {
		if c.body == string(good) {
			t.Fatalf("the replacement for %s did not apply", c.pointer)
		}
		for _, path := range []string{"/v1/shards", "/v1/plan"} {
			res, p := postRaw(t, e.url, path, []byte(c.body), "Content-Type", "application/json")
			if res.StatusCode != 400 || p.Errors == nil || len(*p.Errors) != 1 || (*p.Errors)[0].Pointer != c.pointer {
				t.Errorf("%s with a duplicate at %s: %d %+v", path, c.pointer, res.StatusCode, p)
			}
		}
	}
	// A large body is scanned whole: 20,000 blocks, each with its keys.
	req := e.req
	blocks := make([]api.Block, 20_000)
	for i := range blocks {
		blocks[i] = api.Block{
			Offsets: []int64{int64(i % 1024), 0},
			Lengths: []int64{1, 1},
			Source:  "w",
			Base:    []int64{0, 0},
			Coeff:   [][]int64{{1, 0}, {0, 1}},
		}
	}
	req.Tensors = []api.TensorRequest{e.req.Tensors[0]}
	req.Tensors[0].Blocks = &blocks
	raw, _ := json.Marshal(req)
	raw = bytes.Replace(raw, []byte(`"source":"w"}]`), []byte(`"source":"w","source":"w"}]`), 1) // only the last block
	res, p := postRaw(t, e.url, "/v1/plan", raw, "Content-Type", "application/json")
	if res.StatusCode != 400 || p.Errors == nil || (*p.Errors)[0].Pointer != "/tensors/0/blocks/19999/source" {
		t.Errorf("a duplicate in the last of 20,000 blocks: %d %+v", res.StatusCode, p)
	}
}

// Bodies are JSON: a declared type other than JSON is 415; gzip is decoded, with the body limit
// applied to what it decodes to; other codings are 415.
func TestContentTypeAndEncoding(t *testing.T) {
	e := opsServer(t, nil) // MaxBodyBytes 1 MiB
	good, _ := json.Marshal(e.req)
	for ct, want := range map[string]int{
		"application/json": 200, "application/json; charset=utf-8": 200, "Application/JSON": 200,
		"application/vnd.shardsrv+json": 200, "": 200,
		"application/x-www-form-urlencoded": 415, "text/plain": 415, "application/json; charset=latin1": 415,
		"application/octet-stream": 415, "json": 415,
	} {
		var header []string
		if ct != "" {
			header = []string{"Content-Type", ct}
		}
		if res, p := postRaw(t, e.url, "/v1/plan", good, header...); res.StatusCode != want ||
			(want == 415 &&
				!strings.Contains(problemDetail(p), "application/json") &&
				!strings.Contains(problemDetail(p), "UTF-8")) {
			t.Errorf("Content-Type %q: %d %+v, want %d", ct, res.StatusCode, p, want)
		}
	}
	var gz bytes.Buffer
	zw := gzip.NewWriter(&gz)
	zw.Write(good)
	zw.Close()
	if res, p := postRaw(
		t,
		e.url,
		"/v1/plan",
		gz.Bytes(),
		"Content-Type", "application/json",
		"Content-Encoding", "gzip",
	); res.StatusCode != 200 {
		t.Errorf("a gzip body: %d %+v", res.StatusCode, p)
	}
	var bomb bytes.Buffer // 2 MiB of spaces after the JSON decode past the 1 MiB limit; 2 KiB on the wire
	zw = gzip.NewWriter(&bomb)
	zw.Write(good)
	zw.Write(bytes.Repeat([]byte(" "), 2<<20))
	zw.Close()
	if res, p := postRaw(
		t,
		e.url,
		"/v1/plan",
		bomb.Bytes(),
		"Content-Type", "application/json",
		"Content-Encoding", "gzip",
	); res.StatusCode != 413 {
		t.Errorf("a gzip body over the limit once decoded (%d bytes sent): %d %+v", bomb.Len(), res.StatusCode, p)
	}
	if res, p := postRaw(
		t,
		e.url,
		"/v1/plan",
		gz.Bytes()[:gz.Len()/2],
		"Content-Type", "application/json",
		"Content-Encoding", "gzip",
	); res.StatusCode != 400 {
		t.Errorf("a truncated gzip body: %d %+v", res.StatusCode, p)
	}
	for _, enc := range []string{"br", "zstd", "deflate", "gzip, gzip"} {
		if res, p := postRaw(
			t,
			e.url,
			"/v1/plan",
			good,
			"Content-Type", "application/json",
			"Content-Encoding", enc,
		); res.StatusCode != 415 ||
			res.Header.Get("Accept-Encoding") != "gzip" {
			t.Errorf(
				"Content-Encoding %q: %d %+v (Accept-Encoding %q), want 415",
				enc,
				res.StatusCode,
				p,
				res.Header.Get("Accept-Encoding"),
			)
		}
	}
}

// X-Request-Id is taken when it is 1 to 128 visible ASCII characters; anything else gets a
// fresh id, so logs and responses carry nothing longer or stranger.
func TestRequestIDIsBounded(t *testing.T) {
	e := opsServer(t, nil)
	ok := strings.Repeat("x", 127) + "~"
	for _, c := range []struct {
		id   string
		kept bool
	}{
		{"abc-123", true},
		{ok, true},
		{ok + "y", false},
		{strings.Repeat("z", 200_000), false},
		{"with space", false},
		{"caf\xc3\xa9", false},
		{"tab\there", false},
	} {
		req, _ := http.NewRequest("GET", e.url+"/healthz", nil)
		req.Header.Set("X-Request-Id", c.id)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		got := res.Header.Get("X-Request-Id")
		if c.kept != (got == c.id) || got == "" || len(got) > 128 {
			t.Errorf(
				"X-Request-Id of %d bytes: echoed %q (%d bytes), kept=%v",
				len(c.id),
				truncateForLog(got),
				len(got),
				c.kept,
			)
		}
	}
}

func truncateForLog(s string) string { return s[:min(len(s), 40)] }

// Tensor names that are not UTF-8 make the file malformed (decoded, two names could collide as
// U+FFFD): 422 naming the file.
func TestNonUTF8TensorNamesAre422(t *testing.T) {
	dir := t.TempDir()
	header := "{\"w\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}"
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	file = append(append(file, header...), 0)
	localPut(t, dir)("m/model.safetensors", file)
	st, _ := store.NewLocal(dir)
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	res := h.do("GET", "/v1/tensors?checkpoint=m", nil)
	if res.status != 422 || !strings.Contains(problemDetail(res.problem), "m/model.safetensors") ||
		!strings.Contains(problemDetail(res.problem), "UTF-8") {
		t.Errorf("a header with a non-UTF-8 name: %d %s", res.status, res.body)
	}
}
