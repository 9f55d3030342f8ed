package server_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// socketListener is a TCP listener whose connections count the files handed to their ReadFrom:
// net/http's way to the kernel's sendfile, which it takes only when the connection itself is the
// response's writer (plain HTTP/1.1). Under TLS the connection is below the TLS record layer and
// only ever written to.
type socketListener struct {
	net.Listener
	files atomic.Int64 // ReadFrom calls with a file: sendfile
}

func (l *socketListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &socketConn{TCPConn: c.(*net.TCPConn), l: l}, nil
}

type socketConn struct {
	*net.TCPConn
	l *socketListener
}

func (c *socketConn) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if _, ok := lr.R.(*os.File); ok {
			c.l.files.Add(1)
		}
	}
	return c.TCPConn.ReadFrom(r)
}

// transport is how a test server is reached: plain HTTP/1.1 (where sendfile is possible), or TLS
// with HTTP/1.1 or HTTP/2.
type transport struct {
	name  string
	tls   bool
	proto int // the HTTP major version the response must come in
}

var transports = []transport{{"http1", false, 1}, {"tls-http1", true, 1}, {"tls-http2", true, 2}}

// start serves handler over tr and returns its URL, its client and its listener.
func (tr transport) start(t *testing.T, handler http.Handler) (string, *http.Client, *socketListener) {
	t.Helper()
	ts := httptest.NewUnstartedServer(handler)
	l := &socketListener{Listener: ts.Listener}
	ts.Listener = l
	if tr.tls {
		ts.EnableHTTP2 = tr.proto == 2
		ts.StartTLS()
	} else {
		ts.Start()
	}
	t.Cleanup(ts.Close)
	return ts.URL, ts.Client(), l
}

// Every body path over TLS, HTTP/1.1 and HTTP/2, beside plain HTTP/1.1 for contrast: which path
// each request takes and that its bytes are exact. A client that declines the digest is sent file
// sections by sendfile only over plain HTTP/1.1 — under TLS they are copied through the stream's
// buffer — with an exact Content-Length; with the digest on, the first time, the sections are
// copied and hashed, and the body trails a Repr-Digest that matches it (chunked over HTTP/1.1,
// beside Content-Length over HTTP/2); later, its digest memoised, it comes as a header and the body
// as a declined one does; a read that fails after the headers cuts the body short, with no digest,
// on every transport and either way.
func TestTLSBodyPaths(t *testing.T) {
	dir := t.TempDir()
	data := pattern(4<<20, 11)
	req, _ := u8File(t, dir, data)
	raw, _ := json.Marshal(req)
	files, _ := fileServer(t, dir, 1<<20, 1<<30, 1<<20) // the last segment copied, the others sent
	// The same checkpoint over a store whose reads fail from the second MiB of the data on.
	local, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	failing := &failingStore{Store: local, from: 1 << 20, err: store.ErrChanged}
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 256 << 10
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	aborting := server.New(server.Config{Catalog: checkpoint.New(failing), Planner: opts, Budget: mem,
		Executor: executor.New(failing, mem, executor.Config{Window: 2}),
		Limits:   server.Limits{MaxBodyBytes: 1 << 20}}).Handler()

	memoised := false // whether the files server has streamed the body with its digest
	for _, tr := range transports {
		t.Run(tr.name, func(t *testing.T) {
			url, client, l := tr.start(t, files)
			abortURL, abortClient, _ := tr.start(t, aborting)
			send := func(c *http.Client, url string, digest bool) (*http.Response, []byte, error) {
				t.Helper()
				hreq, _ := http.NewRequest("POST", url+"/v1/shards", bytes.NewReader(raw))
				hreq.Header.Set("Content-Type", "application/json")
				if !digest {
					hreq.Header.Set(declined[0], declined[1])
				}
				res, err := c.Do(hreq)
				if err != nil {
					t.Fatal(err)
				}
				defer res.Body.Close()
				body, err := io.ReadAll(res.Body)
				if res.ProtoMajor != tr.proto || res.StatusCode != http.StatusOK || (res.TLS != nil) != tr.tls {
					t.Fatalf("HTTP/%d, %d, TLS %v; want HTTP/%d, 200, TLS %v", res.ProtoMajor, res.StatusCode,
						res.TLS != nil, tr.proto, tr.tls)
				}
				return res, body, err
			}

			before := l.files.Load()
			res, body, err := send(client, url, false)
			sent := l.files.Load() - before
			switch {
			case err != nil || !bytes.Equal(body[len(body)-len(data):], data):
				t.Errorf("declined: %v, %d bytes, exact: %v", err, len(body), bytes.Equal(body[len(body)-len(data):], data))
			case res.ContentLength != int64(len(body)) || res.Trailer.Get("Repr-Digest") != "":
				t.Errorf("declined: Content-Length %d for %d bytes, trailer %v", res.ContentLength, len(body), res.Trailer)
			case !tr.tls && sent != 3:
				t.Errorf("declined over plain HTTP/1.1: %d file sections went by sendfile, want 3 (the last copied)", sent)
			case tr.tls && sent != 0:
				t.Errorf("declined over TLS: %d file sections reached the socket's ReadFrom; TLS must copy them", sent)
			}

			for range 2 { // the first streams the body, later ones (on every transport) find its digest
				before = l.files.Load()
				res, body, err = send(client, url, true)
				sent = l.files.Load() - before
				length := res.ContentLength
				field, trailed := sentDigest(res)
				switch {
				case err != nil || !bytes.Equal(body[len(body)-len(data):], data):
					t.Errorf("digest: %v, %d bytes, exact: %v", err, len(body), bytes.Equal(body[len(body)-len(data):], data))
				case field != reprDigest(body):
					t.Errorf("digest: Repr-Digest %q, the body's is %q", field, reprDigest(body))
				case trailed == memoised:
					t.Errorf("digest, memoised %v: trailed %v", memoised, trailed)
				case trailed && (tr.proto == 1 && length != -1 || tr.proto == 2 && length != int64(len(body))):
					t.Errorf("digest trailed over HTTP/%d: Content-Length %d for %d bytes", tr.proto, length, len(body))
				case !trailed && length != int64(len(body)):
					t.Errorf("digest in a header: Content-Length %d for %d bytes", length, len(body))
				case trailed && sent != 0:
					t.Errorf("digest trailed: a file section went by sendfile; the bytes must be hashed on their way")
				case !trailed && !tr.tls && sent != 3:
					t.Errorf("digest in a header over plain HTTP/1.1: %d file sections went by sendfile, want 3", sent)
				case !trailed && tr.tls && sent != 0:
					t.Errorf("digest in a header over TLS: %d file sections reached the socket's ReadFrom", sent)
				}
				memoised = true
			}

			for _, digest := range []bool{false, true} {
				res, body, err := send(abortClient, abortURL, digest)
				if err == nil || int64(len(body)) >= shardLength(t, res) || res.Trailer.Get("Repr-Digest") != "" {
					t.Errorf("a read failing after the headers (digest %v): %d of %d bytes, error %v, trailer %v; "+
						"want a short body, an error and no digest", digest, len(body), shardLength(t, res), err, res.Trailer)
				}
			}
		})
	}
}
