package server_test

import (
	"bytes"
	"crypto/sha256"
	"crypto/sha512"
	"encoding/base64"
	"encoding/json"
	"hash"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// shardLength is a 200 shard response's body length, from Shard-Length (always there).
func shardLength(t *testing.T, res *http.Response) int64 {
	t.Helper()
	n, err := strconv.ParseInt(res.Header.Get("Shard-Length"), 10, 64)
	if err != nil {
		t.Fatalf("Shard-Length %q: %v", res.Header.Get("Shard-Length"), err)
	}
	return n
}

// reprDigest is the Repr-Digest field value of a body.
func reprDigest(body []byte) string {
	sum := sha256.Sum256(body)
	return "sha-256=:" + base64.StdEncoding.EncodeToString(sum[:]) + ":"
}

// sentDigest is the Repr-Digest a shard response carries, and whether it trailed the body (else it
// came as a header field, or not at all: "").
func sentDigest(res *http.Response) (field string, trailed bool) {
	if _, announced := res.Trailer["Repr-Digest"]; announced { // the client moves Trailer there
		return res.Trailer.Get("Repr-Digest"), true
	}
	return res.Header.Get("Repr-Digest"), false
}

// checkDigest checks a whole 200 shard response: the digest it carries, trailing the body or in a
// header, matches the body; a response without a trailer has an exact Content-Length, and none
// carries both.
func checkDigest(t *testing.T, res *http.Response, body []byte) {
	t.Helper()
	if res.Request.URL.Path != "/v1/shards" || res.StatusCode != 200 {
		return
	}
	if n := shardLength(t, res); n != int64(len(body)) {
		t.Errorf("Shard-Length %d, body %d bytes", n, len(body))
	}
	field, trailed := sentDigest(res)
	if trailed && res.Header.Get("Repr-Digest") != "" {
		t.Errorf("a Repr-Digest header and trailer both: %q, %q", res.Header.Get("Repr-Digest"), field)
	}
	if !trailed && res.ContentLength != int64(len(body)) {
		t.Errorf("no trailer and Content-Length %d for a body of %d bytes", res.ContentLength, len(body))
	}
	if want := reprDigest(body); field != "" && field != want {
		t.Errorf("Repr-Digest %q (trailed %v), the body's is %q", field, trailed, want)
	}
}

// postWithin is how long postShards waits for the whole answer: a hundred times the shortest
// request time-out a test sets (300 ms), and far below the hangs some tests guard against, which
// fail the post with it.
const postWithin = 30 * time.Second

// postShards sends a shard request with extra header lines (name, value, ...) and reads the whole
// response.
func postShards(t *testing.T, url string, req api.ShardRequest, header ...string) (*http.Response, []byte) {
	t.Helper()
	raw, _ := json.Marshal(req)
	hreq, _ := http.NewRequest("POST", url+"/v1/shards", bytes.NewReader(raw))
	hreq.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		hreq.Header.Add(header[i], header[i+1])
	}
	res, err := (&http.Client{Timeout: postWithin}).Do(hreq)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatalf("reading the body: %v", err)
	}
	return res, body
}

// Every kind of 200 shard response trails the SHA-256 of its body — direct runs (sent from the
// file or the cache), gathered and converted ones, the safetensors format — on every store, the
// first time its body is streamed; a later request for the same body gets it as a header with an
// exact Content-Length; one the client declines has an exact Content-Length and no digest.
func TestReprDigestTrailsEveryShard(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		data := make([]byte, 64*1024*2)
		for i := range data {
			data[i] = byte(i * 7)
		}
		writeCheckpoint(t, h, "m",
			safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{64, 1024}, Data: data})
		direct := api.TensorRequest{Name: "w", Dtype: api.BF16, Shape: []int64{64, 1024}, Boxes: whole(64, 1024),
			Blocks: copyOf("w", 64, 1024)}
		widened := direct
		widened.Dtype = api.F32
		safetensorsFormat := api.Safetensors
		for name, req := range map[string]api.ShardRequest{
			"direct":      shardReq("m", direct),
			"gathered":    shardReq("m", widened),
			"safetensors": {Checkpoint: "m", Tensors: []api.TensorRequest{direct}, Format: &safetensorsFormat},
		} {
			var first []byte
			for _, c := range []struct {
				declined, trailed bool
			}{{declined: true}, {trailed: true}, {trailed: false}, {declined: true}} {
				var header []string
				if c.declined {
					header = []string{"Want-Repr-Digest", "sha-256=0"}
				}
				res, body := postShards(t, h.url, req, header...)
				if res.StatusCode != 200 {
					t.Fatalf("%s: %d %s", name, res.StatusCode, body)
				}
				if name == "direct" && !bytes.Equal(body, data) {
					t.Errorf("%s: the body is not the tensor's bytes", name)
				}
				if first == nil {
					first = body
				} else if !bytes.Equal(body, first) {
					t.Errorf("%s: the same request streamed another body", name)
				}
				checkDigest(t, res, body)
				if field, trailed := sentDigest(res); (field == "") != c.declined || trailed != c.trailed {
					t.Errorf("%s, declined %v: Repr-Digest %q, trailed %v; want trailed %v", name, c.declined, field,
						trailed, c.trailed)
				}
			}
		}
	})
}

// A body several times the hasher's buffers, and not a multiple of them, trails the SHA-256 of
// exactly the bytes received while concurrent streams hash beside it.
func TestReprDigestOfLargeBodiesUnderConcurrency(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		const rows, cols = 333, 2049 // 1.3 MiB of BF16
		data := make([]byte, rows*cols*2)
		for i := range data {
			data[i] = byte(i*31 + i>>11)
		}
		writeCheckpoint(t, h, "m",
			safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{rows, cols}, Data: data})
		direct := api.TensorRequest{Name: "w", Dtype: api.BF16, Shape: []int64{rows, cols},
			Boxes: whole(rows, cols), Blocks: copyOf("w", rows, cols)}
		widened := direct
		widened.Dtype = api.F32
		var wg sync.WaitGroup
		for i := range 8 {
			req := shardReq("m", direct)
			if i%2 == 1 {
				req = shardReq("m", widened)
			}
			wg.Go(func() {
				raw, _ := json.Marshal(req)
				res, err := http.Post(h.url+"/v1/shards", "application/json", bytes.NewReader(raw))
				if err != nil {
					t.Error(err)
					return
				}
				defer res.Body.Close()
				body, err := io.ReadAll(res.Body)
				if err != nil {
					t.Errorf("reading the body: %v", err)
					return
				}
				if res.StatusCode != 200 {
					t.Errorf("%d %s", res.StatusCode, body)
					return
				}
				if i%2 == 0 && !bytes.Equal(body, data) {
					t.Error("the direct body is not the tensor's bytes")
				}
				if field, _ := sentDigest(res); field == "" { // a trailer, or a header once the body is memoised
					t.Errorf("no Repr-Digest: header %v, trailers %v", res.Header, res.Trailer)
				}
				checkDigest(t, res, body)
			})
		}
		wg.Wait()
	})
}

// Want-Repr-Digest is an RFC 8941 dictionary of algorithm preferences: sha-256 at 0 declines the
// digest, wherever it stands and however the lines split; a field that does not parse, sha-256
// preferred or not named leave it on.
func TestWantReprDigestDeclinesOnlySha256AtZero(t *testing.T) {
	dir := t.TempDir()
	req, _ := u8File(t, dir, pattern(1000, 2))
	handler, _ := fileServer(t, dir, 1<<20, 1<<30, 0)
	ts := httptest.NewServer(handler)
	defer ts.Close()
	for _, c := range []struct {
		lines    []string
		declined bool
	}{
		{nil, false},
		{[]string{"sha-256=0"}, true},
		{[]string{"sha-512=3, sha-256=0"}, true},
		{[]string{"sha-512=3", "sha-256=0"}, true},
		{[]string{"sha-256=0;note=\"x\", unixsum=?1"}, true},
		{[]string{"sha-256=1"}, false},
		{[]string{"sha-512=0"}, false},
		{[]string{"sha-256=0, sha-256=2"}, false}, // the last member stands
		{[]string{"sha-256"}, false},              // a boolean, not a preference
		{[]string{"sha-256=0,"}, false},           // not a dictionary: ignored
		{[]string{"SHA-256=0"}, false},            // keys are lower case
		{[]string{"sha-256=0.0"}, false},          // a decimal, not an integer
	} {
		var header []string
		for _, l := range c.lines {
			header = append(header, "Want-Repr-Digest", l)
		}
		res, body := postShards(t, ts.URL, req, header...)
		checkDigest(t, res, body)
		if field, _ := sentDigest(res); res.StatusCode != 200 || (field != "") == c.declined {
			t.Errorf("Want-Repr-Digest %q: %d, Repr-Digest %q; declined should be %v", c.lines, res.StatusCode,
				field, c.declined)
		}
	}
}

// The algorithms RFC 9530 registers without known weaknesses, on a 64 MiB body written in the
// stream's 256 KiB copies: the trailer uses the faster (docs/performance.md has the numbers).
func BenchmarkReprDigestAlgorithms(b *testing.B) {
	body := make([]byte, 64<<20)
	for i := range body {
		body[i] = byte(i*31 + i>>11)
	}
	for _, alg := range []struct {
		name string
		new  func() hash.Hash
	}{{"sha-256", sha256.New}, {"sha-512", sha512.New}} {
		b.Run(alg.name, func(b *testing.B) {
			b.SetBytes(int64(len(body)))
			for b.Loop() {
				h := alg.new()
				for p := body; len(p) > 0; p = p[256<<10:] {
					h.Write(p[:256<<10])
				}
				h.Sum(nil)
			}
		})
	}
}
