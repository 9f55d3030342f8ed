package server_test

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/oms"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/verify"
)

// verifyShardBytes is the shard size the e2e suite signs with: small, so reads are widened and
// checked across many shards.
const verifyShardBytes = 4096

// signedLocal is a local store under --verify required whose put signs the checkpoint folder
// again after every write, as a publisher would: the whole end-to-end suite runs over it, and
// verification must change no byte.
func signedLocal(t *testing.T) (st store.Store, put func(key string, data []byte), dir string) {
	dir = t.TempDir()
	local, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	write := localPut(t, dir)
	v := verify.New(local, verify.ModeRequired, []crypto.PublicKey{key.Public()}, nil)
	v.Revalidate = 0 // tests replace files and signatures back to back
	return v.AsStore(), func(k string, data []byte) {
		write(k, data)
		folder, _, _ := strings.Cut(k, "/")
		sign(t, filepath.Join(dir, folder), key)
	}, dir
}

// sign writes model.sig over every file under dir.
func sign(t *testing.T, dir string, key crypto.Signer) {
	var files []oms.FileSource
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if oms.DefaultIgnored(filepath.ToSlash(rel)) {
			return nil
		}
		data, err := os.ReadFile(p)
		files = append(files, oms.FileSource{Path: filepath.ToSlash(rel), Size: int64(len(data)),
			R: bytes.NewReader(data)})
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	sort.Slice(files, func(i, j int) bool { return files[i].Path < files[j].Path })
	m, err := oms.BuildShards(filepath.Base(dir), files, verifyShardBytes)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := oms.Sign(m, key)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, oms.SignatureFile), bundle, 0o644); err != nil {
		t.Fatal(err)
	}
}

// Tampered storage through HTTP: a problem before the first byte, or an aborted stream, never a
// wrong byte.
func TestTamperedCheckpointThroughHTTP(t *testing.T) {
	st, put, dir := signedLocal(t)
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 64 << 10
	h := newHarness(t, opts, st, put)
	data := arange(0, 64<<10) // 256 KiB of F32: many shards, four segments
	writeCheckpoint(t, h, "m", safetensors.TensorData{Name: "w", DType: "F32", Shape: []int64{64 << 10},
		Data: f32(data...)})
	req := shardReq("m", api.TensorRequest{Name: "w", Dtype: api.F32, Shape: []int64{64 << 10},
		Boxes: whole(64 << 10), Blocks: copyOf("w", 64<<10)})
	if res := h.do("POST", "/v1/shards", req); res.status != http.StatusOK || !bytes.Equal(res.body, f32(data...)) {
		t.Fatalf("a signed checkpoint: %d %s", res.status, res.body)
	}
	path := filepath.Join(dir, "m", "model.safetensors")
	pristine, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	start := len(pristine) - len(data)*4 // where the tensor's bytes begin
	// A byte of the first segment (a problem before the first byte), then one of the last (an
	// aborted stream).
	for _, at := range []int{start + 100, len(pristine) - 10} {
		raw := bytes.Clone(pristine)
		raw[at] ^= 0x40
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		body, _ := json.Marshal(req)
		res, err := http.Post(h.url+"/v1/shards", "application/json", bytes.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		got, rerr := io.ReadAll(res.Body)
		res.Body.Close()
		switch {
		case res.StatusCode == http.StatusOK && rerr == nil:
			t.Fatalf("a damaged checkpoint streamed a complete body (%d bytes, exact: %v)", len(got),
				bytes.Equal(got, f32(data...)))
		case res.StatusCode != http.StatusOK && (res.StatusCode != http.StatusBadGateway ||
			!strings.Contains(string(got), "integrity-mismatch")):
			t.Errorf("byte %d flipped: %d %s, want 502 integrity-mismatch", at, res.StatusCode, got)
		case res.StatusCode != http.StatusOK:
			// The same bytes fail the same way on every attempt: the problem says so, and the
			// client, which retries a 502 otherwise, sends the request once.
			var p api.Problem
			if json.Unmarshal(got, &p) != nil || p.Retryable == nil || *p.Retryable {
				t.Errorf("an integrity-mismatch must say retryable: false: %s", got)
			}
			var logged bytes.Buffer
			c := api.NewClient(h.url)
			c.Logger = slog.New(slog.NewTextHandler(&logged, nil))
			var perr *api.ProblemError
			if _, err := c.FetchBytes(t.Context(), &req); !errors.As(err, &perr) ||
				perr.Status != http.StatusBadGateway || logged.Len() != 0 {
				t.Errorf("the client on an integrity-mismatch: %v, logged %q; want the problem, not retried", err,
					logged.String())
			}
		}
	}
}

// A read that found a file version corrupt is remembered: the first request commits its headers
// and is cut short, a retry of it gets the integrity-mismatch before its first byte, a request
// that reads only other bytes of that version still streams them, and a new version of the file
// (the bytes restored) is served again.
func TestACorruptVersionIsAProblemBeforeTheFirstByteOnRetry(t *testing.T) {
	st, put, dir := signedLocal(t)
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 64 << 10
	h := newHarness(t, opts, st, put)
	const n = 64 << 10 // 256 KiB of F32: four segments
	data := arange(0, n)
	writeCheckpoint(t, h, "m", safetensors.TensorData{Name: "w", DType: "F32", Shape: []int64{n},
		Data: f32(data...)})
	all := shardReq("m", api.TensorRequest{Name: "w", Dtype: api.F32, Shape: []int64{n},
		Boxes: whole(n), Blocks: copyOf("w", n)})
	head := shardReq("m", api.TensorRequest{Name: "w", Dtype: api.F32, Shape: []int64{1024},
		Boxes: whole(1024), Blocks: copyOf("w", 1024)})
	path := filepath.Join(dir, "m", "model.safetensors")
	pristine, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	raw := bytes.Clone(pristine)
	raw[len(raw)-10] ^= 0x40 // in the last segment, read after the headers are sent
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	post := func(req api.ShardRequest) (status int, body []byte, readErr error) {
		t.Helper()
		js, _ := json.Marshal(req)
		res, err := http.Post(h.url+"/v1/shards", "application/json", bytes.NewReader(js))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		body, readErr = io.ReadAll(res.Body)
		return res.StatusCode, body, readErr
	}
	if status, body, rerr := post(all); status != http.StatusOK || rerr == nil {
		t.Fatalf("the first request: %d, read error %v after %d bytes; want 200 cut short", status, rerr, len(body))
	}
	for attempt := 1; attempt <= 2; attempt++ {
		res := h.do("POST", "/v1/shards", all)
		if res.status != http.StatusBadGateway || res.problem.Type == "" ||
			!strings.HasSuffix(res.problem.Type, "integrity-mismatch") {
			t.Fatalf("retry %d: %d %s; want the 502 integrity-mismatch before the first byte", attempt, res.status, res.body)
		}
	}
	if res := h.do("POST", "/v1/shards", head); res.status != http.StatusOK || !bytes.Equal(res.body, f32(data[:1024]...)) {
		t.Fatalf("bytes of the corrupt version that hash as signed: %d %.200s", res.status, res.body)
	}
	if err := os.WriteFile(path, pristine, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := h.do("POST", "/v1/shards", all); res.status != http.StatusOK || !bytes.Equal(res.body, f32(data...)) {
		t.Fatalf("the file restored (a new version): %d %.200s", res.status, res.body)
	}
}

// The files route honours the same verdicts: a small file whose bytes failed their signature after
// its headers is refused before the headers on a retry, and served again once replaced.
func TestACorruptFileVersionIsAProblemBeforeTheFirstByteOnRetry(t *testing.T) {
	st, put, dir := signedLocal(t)
	h := newHarness(t, planner.DefaultOptions(), st, put)
	writeCheckpoint(t, h, "m", safetensors.TensorData{Name: "w", DType: "F32", Shape: []int64{4},
		Data: f32(arange(0, 4)...)})
	pristine := bytes.Repeat([]byte(`{"vocab": "abcdefgh"}`), 3<<20/21) // over the route's 1 MiB pieces
	put("m/tokenizer.json", pristine)
	path := filepath.Join(dir, "m", "tokenizer.json")
	raw := bytes.Clone(pristine)
	raw[len(raw)-10] ^= 0x40 // in the last piece, read after the headers are sent
	if err := os.WriteFile(path, raw, 0o644); err != nil {
		t.Fatal(err)
	}
	res, err := http.Get(h.url + "/v1/checkpoints/m/files/tokenizer.json")
	if err != nil {
		t.Fatal(err)
	}
	body, rerr := io.ReadAll(res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK || rerr == nil {
		t.Fatalf("the first request: %d, read error %v after %d bytes; want 200 cut short", res.StatusCode, rerr, len(body))
	}
	for attempt := 1; attempt <= 2; attempt++ {
		res := h.do("GET", "/v1/checkpoints/m/files/tokenizer.json", nil)
		if res.status != http.StatusBadGateway || !strings.HasSuffix(res.problem.Type, "integrity-mismatch") {
			t.Fatalf("retry %d: %d %s; want the 502 integrity-mismatch before the first byte", attempt, res.status, res.body)
		}
	}
	if err := os.WriteFile(path, pristine, 0o644); err != nil {
		t.Fatal(err)
	}
	if res := h.do("GET", "/v1/checkpoints/m/files/tokenizer.json", nil); res.status != http.StatusOK ||
		!bytes.Equal(res.body, pristine) {
		t.Fatalf("the file restored (a new version): %d, %d bytes", res.status, len(res.body))
	}
}
