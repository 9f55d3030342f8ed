package server

import (
	"net/http"

	"github.com/go-chi/chi/v5"
)

// HandlerPanickingAt is the server's handler chain with one more route, GET path, whose handler
// panics with v after writing body (nothing when empty): the recovery path, which no real route
// should reach.
func (s *Server) HandlerPanickingAt(path string, v any, body string) http.Handler {
	r := chi.NewRouter()
	r.Use(s.middleware()...)
	r.Get(path, func(w http.ResponseWriter, _ *http.Request) {
		if body != "" {
			w.Write([]byte(body))
		}
		panic(v)
	})
	return r
}
