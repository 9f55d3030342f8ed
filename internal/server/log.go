package server

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"runtime/debug"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardsrv/shardsrv/internal/cluster"
)

// recorder notes the status and body bytes of a response.
type recorder struct {
	http.ResponseWriter
	status int
	bytes  int64
}

func (r *recorder) WriteHeader(code int) {
	if r.status == 0 {
		r.status = code
	}
	r.ResponseWriter.WriteHeader(code)
}

func (r *recorder) Write(b []byte) (int, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := r.ResponseWriter.Write(b)
	r.bytes += int64(n)
	return n, err
}

// ReadFrom keeps the connection's sendfile reachable through the recorder.
func (r *recorder) ReadFrom(src io.Reader) (int64, error) {
	if r.status == 0 {
		r.status = http.StatusOK
	}
	n, err := readFrom(r.ResponseWriter, src)
	r.bytes += n
	return n, err
}

// Unwrap lets http.ResponseController reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

// requestID takes the client's X-Request-Id when it is 1 to 128 visible ASCII characters, and
// otherwise gives the request a fresh one, so what is logged and echoed is bounded and printable.
func requestID(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := r.Header.Get(middleware.RequestIDHeader)
		if !validRequestID(id) {
			id = fmt.Sprintf("%s-%06d", idPrefix, idCounter.Add(1))
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), middleware.RequestIDKey, id)))
	})
}

const maxRequestID = 128

func validRequestID(id string) bool {
	if id == "" || len(id) > maxRequestID {
		return false
	}
	for i := 0; i < len(id); i++ {
		if id[i] < 0x21 || id[i] > 0x7e {
			return false
		}
	}
	return true
}

// Fresh ids are a per-process random prefix and a counter: unique, cheap, and sortable in a log.
var (
	idPrefix  = func() string { b := make([]byte, 6); rand.Read(b); return hex.EncodeToString(b) }()
	idCounter atomic.Uint64
)

// accessLog writes one line per request and echoes the request id.
func (s *Server) accessLog(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id := middleware.GetReqID(r.Context())
		w.Header().Set(middleware.RequestIDHeader, id)
		rec := &recorder{ResponseWriter: w}
		defer func() {
			aborted := recover()
			route := chi.RouteContext(r.Context()).RoutePattern()
			if route == "" {
				route = "unmatched"
			}
			// otelhttp's request span and metrics learn the route once chi has found it.
			if labeler, ok := otelhttp.LabelerFromContext(r.Context()); ok {
				labeler.Add(semconv.HTTPRoute(route))
			}
			span := trace.SpanFromContext(r.Context())
			span.SetName(r.Method + " " + route)
			span.SetAttributes(semconv.HTTPRoute(route), attribute.String("request_id", id))
			attrs := metric.WithAttributes(
				attribute.String("route", route),
				attribute.Int("status", rec.status),
				attribute.Bool("aborted", aborted != nil),
			)
			s.metrics.requests.Add(context.WithoutCancel(r.Context()), 1, attrs)
			s.metrics.served.Add(context.WithoutCancel(r.Context()), rec.bytes,
				metric.WithAttributes(attribute.String("route", route)))
			s.log.Info("request", "request_id", id, "method", r.Method, "route", route, "path", r.URL.Path,
				"status", rec.status, "bytes", rec.bytes, "duration_ms", time.Since(start).Milliseconds(),
				"aborted", aborted != nil)
			if aborted != nil {
				panic(aborted)
			}
		}()
		next.ServeHTTP(rec, r)
	})
}

// recoverPanics answers a handler's panic with a 500 problem carrying the request id, logs it with
// its stack and counts it (shardsrv.panics), where net/http would drop the connection unanswered.
// A deliberate abort (http.ErrAbortHandler), and a panic once the response has begun, still abort
// the connection: a client must not take a partial body for a whole one.
func (s *Server) recoverPanics(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &recorder{ResponseWriter: w}
		defer func() {
			v := recover()
			if v == nil {
				return
			}
			if v == http.ErrAbortHandler {
				panic(v)
			}
			id := middleware.GetReqID(r.Context())
			route := chi.RouteContext(r.Context()).RoutePattern()
			s.log.Error("handler panicked", "request_id", id, "route", route, "panic", fmt.Sprint(v),
				"stack", string(debug.Stack()))
			s.metrics.panics.Add(context.WithoutCancel(r.Context()), 1,
				metric.WithAttributes(attribute.String("route", route)))
			if rec.status != 0 {
				panic(http.ErrAbortHandler)
			}
			writeProblem(w, r, newProblem("internal-error", "an internal error, logged under request id "+id))
		}()
		next.ServeHTTP(rec, r)
	})
}

// openPaths need no token: probes and the scrape endpoint.
var openPaths = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// authenticate checks the bearer token when the server has tokens.
func (s *Server) authenticate(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if s.cfg.Tokens == nil || openPaths[r.URL.Path] || r.URL.Path == cluster.PeerPath { // see peerAuth
			next.ServeHTTP(w, r)
			return
		}
		token, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok || !s.cfg.Tokens.Valid(token) {
			w.Header().Set("WWW-Authenticate", `Bearer realm="shardsrv"`)
			writeProblem(w, r, newProblem("unauthorized",
				"send 'Authorization: Bearer <token>' with a token this server accepts"))
			return
		}
		next.ServeHTTP(w, r)
	})
}
