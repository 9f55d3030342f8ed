package api_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"io"
	"log"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/shardsrv/shardsrv/api"
)

// flipProxy is a reverse proxy (httputil.ReverseProxy, which passes trailers on) in front of a
// server. While flip is set it flips one byte in the middle of every 200 /v1/shards body, and
// only that: headers and the Repr-Digest trailer go through as the server sent them.
type flipProxy struct {
	url    string
	flip   atomic.Bool
	shards atomic.Int64 // /v1/shards responses through it

	mu       sync.Mutex
	exchange []shardExchange
}

// shardExchange is what the proxy saw of one /v1/shards exchange.
type shardExchange struct {
	wantDigest    string // the request's Want-Repr-Digest
	trailer       string // the response's Trailer header
	header        string // the response's Repr-Digest header field
	contentLength int64
}

func newFlipProxy(t *testing.T, server string) *flipProxy {
	target, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	p := &flipProxy{}
	rp := &httputil.ReverseProxy{
		Rewrite: func(r *httputil.ProxyRequest) { r.SetURL(target) },
		ModifyResponse: func(res *http.Response) error {
			if res.Request.URL.Path != "/v1/shards" || res.StatusCode != http.StatusOK {
				return nil
			}
			p.shards.Add(1)
			p.mu.Lock()
			p.exchange = append(p.exchange, shardExchange{
				wantDigest:    res.Request.Header.Get("Want-Repr-Digest"),
				trailer:       strings.Join(keys(res.Trailer), ", "),
				header:        res.Header.Get("Repr-Digest"),
				contentLength: res.ContentLength,
			})
			p.mu.Unlock()
			if p.flip.Load() {
				length, err := strconv.ParseInt(res.Header.Get("Shard-Length"), 10, 64)
				if err != nil || length == 0 {
					return errors.New("flipProxy: no Shard-Length to flip a byte within")
				}
				res.Body = &flipper{ReadCloser: res.Body, at: length / 2}
			}
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
	p.url = ts.URL
	return p
}

func (p *flipProxy) seen() []shardExchange {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]shardExchange(nil), p.exchange...)
}

func keys(h http.Header) []string {
	var out []string
	for k := range h {
		out = append(out, k)
	}
	return out
}

// flipper flips the bit 0x10 of the body's byte at offset at.
type flipper struct {
	io.ReadCloser
	off, at int64
}

func (f *flipper) Read(p []byte) (int, error) {
	n, err := f.ReadCloser.Read(p)
	if i := f.at - f.off; i >= 0 && i < int64(n) {
		p[i] ^= 0x10
	}
	f.off += int64(n)
	return n, err
}

func sha256Field(b []byte) string {
	sum := sha256.Sum256(b)
	return "sha-256=:" + base64.StdEncoding.EncodeToString(sum[:]) + ":"
}

// through is a client of the fixture's server that goes through p, logging its retries to r.
func through(f *fixture, p *flipProxy, r *retries) *api.Client {
	c := api.NewClient(p.url)
	c.Backoff = f.c.Backoff
	c.Logger = r.logger()
	return c
}

func TestFetchVerifiesTheReprDigest(t *testing.T) {
	ctx := context.Background()
	f := clientFixture(t)
	var buf bytes.Buffer
	reset := func() error { buf.Reset(); return nil }
	got, err := f.c.FetchVerified(ctx, &f.req, &buf, reset, nil)
	want := bytes.Clone(buf.Bytes())
	if err != nil || got.Bytes != int64(len(want)) || len(want) != 256*64*2 {
		t.Fatalf("%+v, %d bytes: %v", got, len(want), err)
	}
	if got.Digest != sha256Field(want) {
		t.Fatalf("digest %q, the body's is %q", got.Digest, sha256Field(want))
	}

	// Through a proxy that changes nothing, the server, which streamed the body whole once, sends
	// its digest as a header with Content-Length: the same digest.
	p := newFlipProxy(t, f.c.BaseURL)
	var logs retries
	c := through(f, p, &logs)
	buf.Reset()
	got, err = c.FetchVerified(ctx, &f.req, &buf, reset, nil)
	if err != nil || got.Digest != sha256Field(want) || !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("through the proxy: %+v, %v", got, err)
	}
	if ex := p.seen(); len(ex) != 1 || ex[0].trailer != "" || ex[0].header != sha256Field(want) ||
		ex[0].wantDigest != "" || ex[0].contentLength != int64(len(want)) {
		t.Fatalf("the server's response: %+v", ex)
	}

	// A body the server has not streamed before trails its digest, chunked.
	other := f.req
	other.Tensors = slices.Clone(f.req.Tensors)
	other.Tensors[0].Boxes = []api.Box{{Offsets: []int64{0, 0}, Lengths: []int64{1, other.Tensors[0].Shape[1]}}}
	buf.Reset()
	got, err = c.FetchVerified(ctx, &other, &buf, reset, nil)
	if err != nil || got.Digest != sha256Field(buf.Bytes()) || got.Bytes == int64(len(want)) {
		t.Fatalf("another box: %+v, %v", got, err)
	}
	if ex := p.seen(); len(ex) != 2 || ex[1].trailer != "Repr-Digest" || ex[1].header != "" ||
		ex[1].contentLength != -1 {
		t.Fatalf("the server's response to another box: %+v", ex)
	}
}

func TestAFlippedByteIsADigestErrorAfterTheAttempts(t *testing.T) {
	ctx := context.Background()
	f := clientFixture(t)
	want, err := f.c.FetchBytes(ctx, &f.req)
	if err != nil {
		t.Fatal(err)
	}
	p := newFlipProxy(t, f.c.BaseURL)
	p.flip.Store(true)
	var logs retries
	c := through(f, p, &logs)
	c.Attempts = 3

	var buf bytes.Buffer
	resets := 0
	_, err = c.Fetch(ctx, &f.req, &buf, func() error { resets++; buf.Reset(); return nil }, nil)
	var de *api.DigestError
	if !errors.As(err, &de) {
		t.Fatalf("not a *DigestError: %v", err)
	}
	if de.Want != sha256Field(want) || de.Got == de.Want || !strings.HasPrefix(de.Got, "sha-256=:") ||
		de.Got != sha256Field(buf.Bytes()) {
		t.Errorf("got %s, want %s (the body's is %s)", de.Got, de.Want, sha256Field(want))
	}
	if n := p.shards.Load(); n != 3 || resets != 2 {
		t.Errorf("%d attempts, %d resets; want 3 and 2", n, resets)
	}
	for _, ex := range p.seen() { // the body was streamed whole once: its digest comes as a header
		if ex.header != sha256Field(want) || ex.trailer != "" {
			t.Errorf("a flipped body's digest as a header: %+v", ex)
		}
	}
	recs := logs.records(t)
	if len(recs) != 2 || !strings.Contains(recs[0]["error"].(string), "damaged in transit") {
		t.Errorf("retries logged: %v", recs)
	}

	// FetchBytes and FetchVerified fail the same way.
	if _, err := c.FetchBytes(ctx, &f.req); !errors.As(err, &de) {
		t.Errorf("FetchBytes: %v", err)
	}
	buf.Reset()
	got, err := c.FetchVerified(ctx, &f.req, &buf, func() error { buf.Reset(); return nil }, nil)
	if !errors.As(err, &de) || got.Digest != "" {
		t.Errorf("FetchVerified: %+v, %v", got, err)
	}

	// A writer that cannot start over is not retried into, and the error still says why.
	before := p.shards.Load()
	_, err = c.Fetch(ctx, &f.req, &bytes.Buffer{}, nil, nil)
	if !errors.As(err, &de) || !errors.Is(err, errors.ErrUnsupported) || p.shards.Load()-before != 1 {
		t.Errorf("without reset: %v, %d attempts", err, p.shards.Load()-before)
	}
}

func TestNoDigestDeclinesIt(t *testing.T) {
	ctx := context.Background()
	f := clientFixture(t)
	want, err := f.c.FetchBytes(ctx, &f.req)
	if err != nil {
		t.Fatal(err)
	}
	p := newFlipProxy(t, f.c.BaseURL)
	var logs retries
	c := through(f, p, &logs)
	c.NoDigest = true
	var buf bytes.Buffer
	got, err := c.FetchVerified(ctx, &f.req, &buf, func() error { buf.Reset(); return nil }, nil)
	if err != nil || got.Digest != "" || got.Bytes != int64(len(want)) || !bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("declined: %+v, %v", got, err)
	}
	ex := p.seen()
	if len(ex) != 1 || ex[0].wantDigest != "sha-256=0" || ex[0].trailer != "" ||
		ex[0].contentLength != int64(len(want)) {
		t.Fatalf("declined, the exchange: %+v", ex)
	}

	// Declined, a flipped byte goes unnoticed: only the length is checked.
	p.flip.Store(true)
	buf.Reset()
	got, err = c.FetchVerified(ctx, &f.req, &buf, func() error { buf.Reset(); return nil }, nil)
	if err != nil || got.Digest != "" || got.Bytes != int64(len(want)) || bytes.Equal(buf.Bytes(), want) {
		t.Fatalf("declined, flipped: %+v, %v", got, err)
	}
}

// A client that declined the digest still checks one the server sends anyway (one that ignores
// Want-Repr-Digest): it hashes only then.
func TestNoDigestChecksADigestSentAnyway(t *testing.T) {
	other := sha256.Sum256([]byte("another body"))
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Repr-Digest", "sha-256=:"+base64.StdEncoding.EncodeToString(other[:])+":")
		io.WriteString(w, "this body")
	}))
	t.Cleanup(srv.Close)
	c := api.NewClient(srv.URL)
	c.NoDigest = true
	c.Attempts = 1
	var de *api.DigestError
	if _, err := c.FetchBytes(context.Background(), &api.ShardRequest{Checkpoint: "any"}); !errors.As(err, &de) {
		t.Fatalf("a wrong digest sent to a client that declined it: %v", err)
	}
}
