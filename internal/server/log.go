package server

import (
	"net/http"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
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

// Unwrap lets http.ResponseController reach the connection.
func (r *recorder) Unwrap() http.ResponseWriter { return r.ResponseWriter }

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
			s.log.Info("request", "request_id", id, "method", r.Method, "route", route, "path", r.URL.Path,
				"status", rec.status, "bytes", rec.bytes, "duration_ms", time.Since(start).Milliseconds(), "aborted", aborted != nil)
			if aborted != nil {
				panic(aborted)
			}
		}()
		next.ServeHTTP(rec, r)
	})
}
