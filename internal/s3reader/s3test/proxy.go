package s3test

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
	SlowDown        // 503 SlowDown, as S3 sheds load
	Reset           // half the body, then a TCP reset
	Truncate        // half the body, then a clean close short of Content-Length
	Stall           // no answer until the client gives up
	Forbidden       // 403 AccessDenied
)

// Proxy sits between a client and the gateway and injects faults into ranged GETs (data reads).
// Other requests pass. SigV4 signatures survive: the Host header is kept.
type Proxy struct {
	URL string
	// Decide picks the fault for the n-th ranged GET (from 1); nil passes everything.
	Decide func(n int, r *http.Request) Fault

	mu     sync.Mutex
	n      int
	Ranges []string // the Range header of every ranged GET, in order
	server *httptest.Server
	gets   atomic.Int64
	bytes  atomic.Int64
}

// Traffic is how many GETs went through, ranged or whole, and the body bytes they carried.
func (p *Proxy) Traffic() (gets, bytes int64) { return p.gets.Load(), p.bytes.Load() }

// counter counts the body bytes written through it.
type counter struct {
	http.ResponseWriter
	n *atomic.Int64
}

func (c counter) Write(b []byte) (int, error) {
	n, err := c.ResponseWriter.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// NewProxy starts a proxy in front of the gateway.
func (g *Gateway) NewProxy() *Proxy {
	target, _ := url.Parse(g.Endpoint)
	rp := httputil.NewSingleHostReverseProxy(target)
	p := &Proxy{}
	p.server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fault := Pass
		if r.Method == http.MethodGet && r.Header.Get("Range") != "" {
			p.mu.Lock()
			p.n++
			n := p.n
			p.Ranges = append(p.Ranges, r.Header.Get("Range"))
			decide := p.Decide
			p.mu.Unlock()
			if decide != nil {
				fault = decide(n, r)
			}
		}
		switch fault {
		case SlowDown:
			s3Error(w, http.StatusServiceUnavailable, "SlowDown", "Please reduce your request rate.")
		case Forbidden:
			s3Error(w, http.StatusForbidden, "AccessDenied", "Access Denied")
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

// Close stops the proxy.
func (p *Proxy) Close() { p.server.Close() }

func s3Error(w http.ResponseWriter, status int, code, msg string) {
	w.Header().Set("Content-Type", "application/xml")
	w.WriteHeader(status)
	io.WriteString(
		w,
		`<?xml version="1.0" encoding="UTF-8"?><Error><Code>`+code+`</Code><Message>`+msg+`</Message><RequestId>fault</RequestId></Error>`,
	)
}

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
