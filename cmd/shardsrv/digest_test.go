package main

import (
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io"
	"log"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/example"
)

// flippingProxy serves a reverse proxy in front of server that flips one byte in the middle of
// every 200 /v1/shards body and passes everything else on, the Repr-Digest trailer included. It
// counts the shard responses it changed.
func flippingProxy(t *testing.T, server string) (string, *atomic.Int64) {
	target, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	var flipped atomic.Int64
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		ModifyResponse: func(res *http.Response) error {
			if res.Request.URL.Path != "/v1/shards" || res.StatusCode != http.StatusOK {
				return nil
			}
			length, err := strconv.ParseInt(res.Header.Get("Shard-Length"), 10, 64)
			if err != nil || length == 0 {
				return errors.New("flippingProxy: no Shard-Length to flip a byte within")
			}
			flipped.Add(1)
			res.Body = &byteFlipper{ReadCloser: res.Body, at: length / 2}
			return nil
		},
		ErrorLog: log.New(io.Discard, "", 0),
	}
	// The proxy's transport reads the request body once more after the response has begun (to
	// check it was no longer than declared), and an HTTP/1 server closes a request's body when its
	// response begins unless the handler says it reads both at once: the forward then fails and the
	// response it relays is cut short (a flaky short body, golang/go#40747).
	ts := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		http.NewResponseController(w).EnableFullDuplex()
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(ts.Close)
	return ts.URL, &flipped
}

// byteFlipper flips the bit 0x10 of the body's byte at offset at.
type byteFlipper struct {
	io.ReadCloser
	off, at int64
}

func (f *byteFlipper) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if i := f.at - f.off; i >= 0 && i < int64(n) {
		p[i] ^= 0x10
	}
	f.off += int64(n)
	return n, err
}

func digestOf(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha-256=:" + base64.StdEncoding.EncodeToString(sum[:]) + ":"
}

// rankRequest writes the shard request of TP=2 rank 0 into dir and returns its path.
func rankRequest(t *testing.T, server, dir string) string {
	var req, errs bytes.Buffer
	if err := layoutCmd(
		[]string{"--server", server, "--checkpoint", example.Name, "--tp", "2", "--rank", "0"},
		&req,
		&errs,
	); err != nil {
		t.Fatalf("%v %s", err, errs.String())
	}
	path := filepath.Join(dir, "rank0.json")
	if err := os.WriteFile(path, req.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// captureRetries sends what the client logs (slog's default logger) to a buffer until the test ends.
func captureRetries(t *testing.T) *bytes.Buffer {
	var buf bytes.Buffer
	old, out, flags := slog.Default(), log.Writer(), log.Flags()
	slog.SetDefault(slog.New(slog.NewJSONHandler(&buf, nil)))
	t.Cleanup(func() {
		slog.SetDefault(old)
		log.SetOutput(out)
		log.SetFlags(flags)
	})
	return &buf
}

func TestFetchPrintsTheDigestItVerified(t *testing.T) {
	server, _ := live(t)
	dir := t.TempDir()
	reqPath := rankRequest(t, server, dir)
	shard := filepath.Join(dir, "shard.bin")
	var errs bytes.Buffer
	if err := fetch([]string{"--server", server, "--request", reqPath, "-o", shard}, io.Discard, &errs); err != nil {
		t.Fatal(err)
	}
	body, err := os.ReadFile(shard)
	if err != nil || len(body) == 0 {
		t.Fatalf("%d bytes: %v", len(body), err)
	}
	if want := "; digest verified, " + digestOf(body) + "\n"; !strings.HasSuffix(errs.String(), want) {
		t.Errorf("said %q, want it to end in %q", errs.String(), want)
	}

	// To stdout too.
	var stdout bytes.Buffer
	errs.Reset()
	if err := fetch([]string{"--server", server, "--request", reqPath, "-o", "-"}, &stdout, &errs); err != nil ||
		!bytes.Equal(stdout.Bytes(), body) || !strings.Contains(errs.String(), "digest verified, "+digestOf(body)) {
		t.Errorf("-o -: %d bytes, said %q: %v", stdout.Len(), errs.String(), err)
	}

	// Declined, it says the digest was not checked.
	errs.Reset()
	if err := fetch(
		[]string{"--server", server, "--no-digest", "--request", reqPath, "-o", shard},
		io.Discard,
		&errs,
	); err != nil || !strings.Contains(errs.String(), "digest not checked") {
		t.Errorf("--no-digest said %q: %v", errs.String(), err)
	}
	if got, _ := os.ReadFile(shard); !bytes.Equal(got, body) {
		t.Error("--no-digest fetched other bytes")
	}

	// The sharded_state directory: one verified digest a rank file.
	errs.Reset()
	out := filepath.Join(dir, "state")
	if err := fetch(
		[]string{"--server", server, "--checkpoint", example.Name, "--layout", "vllm", "--tp", "2", "--rank", "all",
			"--out", out},
		io.Discard,
		&errs,
	); err != nil {
		t.Fatal(err)
	}
	for r := range 2 {
		name := filepath.Join(out, "model-rank-"+strconv.Itoa(r)+"-part-0.safetensors")
		raw, err := os.ReadFile(name)
		if err != nil {
			t.Fatal(err)
		}
		said := errs.String()
		if !strings.Contains(said, "fetched "+size(int64(len(raw)))+" into "+name+" in ") ||
			!strings.Contains(said, "; digest verified, "+digestOf(raw)+"\n") {
			t.Errorf("rank %d: said %q", r, said)
		}
	}
}

func TestFetchThroughAFlippingProxyFails(t *testing.T) {
	server, _ := live(t)
	dir := t.TempDir()
	reqPath := rankRequest(t, server, dir)
	var parsed api.ShardRequest
	raw, _ := os.ReadFile(reqPath)
	if err := json.Unmarshal(raw, &parsed); err != nil {
		t.Fatal(err)
	}
	proxy, flipped := flippingProxy(t, server)
	logs := captureRetries(t)

	// Into a file: every attempt is damaged; the file is left as it was.
	shard := filepath.Join(dir, "shard.bin")
	os.WriteFile(shard, []byte("before"), 0o644)
	var errs bytes.Buffer
	err := fetch([]string{"--server", proxy, "--request", reqPath, "-o", shard}, io.Discard, &errs)
	var de *api.DigestError
	if !errors.As(err, &de) || !strings.Contains(err.Error(), "damaged in transit") {
		t.Fatalf("not a digest error: %v", err)
	}
	if de.Got == de.Want || !strings.HasPrefix(de.Want, "sha-256=:") {
		t.Errorf("got %s, want %s", de.Got, de.Want)
	}
	attempts := api.NewClient(proxy).Attempts
	if n := flipped.Load(); n != int64(attempts) {
		t.Errorf("%d attempts, want %d", n, attempts)
	}
	if n := strings.Count(logs.String(), "damaged in transit"); n != attempts-1 {
		t.Errorf("%d retries logged, want %d:\n%s", n, attempts-1, logs.String())
	}
	if strings.Contains(errs.String(), "fetched") {
		t.Errorf("said %q", errs.String())
	}
	if got, _ := os.ReadFile(shard); string(got) != "before" {
		t.Errorf("a failed fetch changed the output file: %d bytes", len(got))
	}
	if hidden, _ := filepath.Glob(filepath.Join(dir, ".*")); len(hidden) != 0 {
		t.Errorf("temporary files left behind: %v", hidden)
	}

	// To stdout, which cannot start over: one attempt, and the same error.
	before := flipped.Load()
	err = fetch([]string{"--server", proxy, "--request", reqPath, "-o", "-"}, io.Discard, &errs)
	if !errors.As(err, &de) || !errors.Is(err, errors.ErrUnsupported) || flipped.Load()-before != 1 {
		t.Errorf("-o -: %v after %d attempts", err, flipped.Load()-before)
	}

	// Declined, nothing checks the bytes: the proxy's damage gets through (what the digest is for).
	var stdout bytes.Buffer
	if err := fetch(
		[]string{"--server", proxy, "--no-digest", "--request", reqPath, "-o", "-"},
		&stdout,
		io.Discard,
	); err != nil {
		t.Fatal(err)
	}
	want, err := api.NewClient(server).FetchBytes(t.Context(), &parsed)
	if err != nil || stdout.Len() != len(want) || bytes.Equal(stdout.Bytes(), want) {
		t.Errorf("declined through the proxy: %d bytes of %d, equal %v (%v)",
			stdout.Len(), len(want), bytes.Equal(stdout.Bytes(), want), err)
	}
}
