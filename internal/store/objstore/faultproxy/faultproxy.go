// Package faultproxy is a reverse proxy for tests that injects faults into the ranged GETs (data
// reads) an object store client sends: throttling, bodies that break off by a reset or a short
// close, stalls, refusals. It speaks any HTTP object store; a Dialect writes that store's errors.
package faultproxy

import (
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Fault is what the proxy does to one request.
type Fault int

// The faults.
const (
	Pass      Fault = iota
	Throttle        // the store's answer when it sheds load (S3 503 SlowDown, GCS 429, Azure 503 ServerBusy)
	Reset           // half the body, then a TCP reset
	Truncate        // half the body, then a clean close short of Content-Length
	Stall           // no answer until the client gives up
	Forbidden       // the store's 403
)

// Dialect writes a store's own error answer for Throttle or Forbidden.
type Dialect func(w http.ResponseWriter, f Fault)

// XMLError writes an error the way S3, GCS's XML API and Azure do; Azure also names the code in
// the x-ms-error-code header, which other stores ignore.
func XMLError(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.Header().Set("x-ms-error-code", code)
	w.WriteHeader(status)
	io.WriteString(w, `<?xml version="1.0" encoding="UTF-8"?><Error><Code>`+code+`</Code><Message>`+msg+
		`</Message><RequestId>fault</RequestId></Error>`)
}

// Proxy sits between a client and a store and injects faults into ranged GETs (a Range or
// x-ms-range header). Other requests pass. Signatures survive: the Host header and the path are
// kept.
type Proxy struct {
	URL string

	mu     sync.Mutex
	decide func(n int, r *http.Request) Fault
	n      int
	Ranges []string // the range of every ranged GET, in order
	server *httptest.Server
	gets   atomic.Int64
	bytes  atomic.Int64
}

// Traffic is how many GETs went through, ranged or whole, and the body bytes they carried.
func (p *Proxy) Traffic() (gets, bytes int64) { return p.gets.Load(), p.bytes.Load() }

// counter counts the body bytes written through it. It counts them before they are written and
// takes back what was not: a client that has read a whole body (to its Content-Length) can finish
// before the write that sent the last bytes returns, and must find them counted.
type counter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c counter) Write(b []byte) (int, error) {
	c.n.Add(int64(len(b)))
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n - len(b)))
	return n, err
}

// Range is the byte range a request asks for: Range, or Azure's x-ms-range.
func Range(r *http.Request) string {
	if v := r.Header.Get("Range"); v != "" {
		return v
	}
	return r.Header.Get("X-Ms-Range")
}

// Start runs a proxy in front of the store at endpoint, answering errors in its dialect.
func Start(endpoint string, dialect Dialect) *Proxy {
	target, _ := url.Parse(endpoint)
	rp := httputil.NewSingleHostReverseProxy(target)
	p := &Proxy{}
	p.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fault := Pass
		if rng := Range(r); r.Method == http.MethodGet && rng != "" {
			p.mu.Lock()
			p.n++
			n := p.n
			p.Ranges = append(p.Ranges, rng)
			decide := p.decide
			p.mu.Unlock()
			if decide != nil {
				fault = decide(n, r)
			}
		}
		switch fault {
		case Throttle, Forbidden:
			dialect(w, fault)
		case Stall:
			select {
			case <-r.Context().Done():
			case <-time.After(time.Minute):
			}
		case Reset, Truncate:
			breakBody(w, r, rp, fault)
		default:
			if r.Method == http.MethodGet {
				p.gets.Add(1)
				w = counter{ResponseWriter: w, n: &p.bytes}
			}
			rp.ServeHTTP(w, r)
		}
	}))
	p.URL = p.server.URL
	return p
}

// SetDecide sets what picks the fault for the n-th ranged GET (from 1); nil passes everything.
// Requests still in flight from an earlier stream may read it at any time.
func (p *Proxy) SetDecide(decide func(n int, r *http.Request) Fault) {
	p.mu.Lock()
	p.decide = decide
	p.mu.Unlock()
}

// Close stops the proxy.
func (p *Proxy) Close() { p.server.Close() }

// breakBody forwards the request but sends only half the body, then resets or closes.
func breakBody(w http.ResponseWriter, r *http.Request, rp *httputil.ReverseProxy, fault Fault) {
	rec := httptest.NewRecorder()
	rp.ServeHTTP(rec, r)
	body := rec.Body.Bytes()
	for k, v := range rec.Header() {
		w.Header()[k] = v
	}
	w.Header().Set("Content-Length", strconv.Itoa(len(body)))
	w.WriteHeader(rec.Code)
	w.Write(body[:len(body)/2])
	w.(http.Flusher).Flush()
	conn, _, err := w.(http.Hijacker).Hijack()
	if err != nil {
		return
	}
	if tcp, ok := conn.(*net.TCPConn); ok && fault == Reset {
		tcp.SetLinger(0) // close with RST
	}
	conn.Close()
}
