package server

import (
	"context"
	"net/http"

	"github.com/go-chi/chi/v5"

	"github.com/shardsrv/shardsrv/internal/cluster"
)

// routePeers mounts the peer route (cluster.Handler) when the server has peers. It sits outside
// openapi.yaml: it is no client's, and ordinary client tokens do not open it (authenticate leaves
// it to peerAuth). It is bounded like a stream: --request-timeout for the request, --write-timeout
// for its write.
func (s *Server) routePeers(r chi.Router) {
	if s.cfg.Cluster == nil || s.cfg.PeerTokens == nil {
		return
	}
	r.With(s.peerAuth).Get(cluster.PeerPath, func(w http.ResponseWriter, r *http.Request) {
		ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.RequestTimeout)
		defer cancel()
		if err := s.cfg.Cluster.ServeChunk(w, r.WithContext(ctx), s.cfg.Limits.WriteTimeout); err != nil {
			writeProblem(w, r, toProblem(err))
		}
	})
}

// peerAuth admits requests bearing the secret the replicas share.
func (s *Server) peerAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		token, ok := bearerToken(r.Header.Get("Authorization"))
		if !ok || !s.cfg.PeerTokens.Valid(token) {
			writeProblem(w, r, newProblem("unauthorized-peer", "this route is for the server's replicas only"))
			return
		}
		next.ServeHTTP(w, r)
	})
}
