package main

import (
	"context"
	"errors"
	"log/slog"

	"github.com/shardsrv/shardsrv/internal/auth"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/telemetry"
)

// sharedCache is the chunk cache as the replicas share it (docs/cluster.md).
type sharedCache struct {
	cache      *cache.Store       // the top of the store stack, over the cluster store
	handler    *cluster.Handler   // the peer route and prefetches
	peerTokens *auth.Tokens       // admit peers to the peer route; nil without --peers
	discovery  *cluster.Discovery // keeps the peers current while it runs
}

// openCluster builds the chunk cache over the cluster store over st, and finds the peers.
// Without --peers the cluster store owns every chunk and only counts what prefetches fill.
func openCluster(ctx context.Context, c *config, st store.Store, tel *telemetry.Providers,
	clientTokens *auth.Tokens, certs *certReloader, log *slog.Logger) (*sharedCache, error) {
	opts := cluster.Options{Self: c.cluster.Advertise, ChunkBytes: c.cache.Chunk(), Timeout: c.cluster.Timeout,
		ConnectTimeout: c.cluster.Connect, Tracer: tel.Tracer, Meter: tel.Meter, Logger: log}
	if c.tls.peerCAFile != "" || c.tls.peerServerName != "" || certs != nil {
		var err error
		if opts.TLS, err = peerTLS(c.tls.peerCAFile, c.tls.peerServerName, certs); err != nil {
			return nil, err
		}
	}
	var peerTokens *auth.Tokens
	if c.cluster.TokenFile != "" {
		var err error
		if peerTokens, err = auth.LoadTokens(c.cluster.TokenFile, auth.TokensOptions{Logger: log}); err != nil {
			return nil, err
		}
		if clientTokens != nil && clientTokens.Valid(peerTokens.First()) {
			return nil, errors.New("--peer-token-file holds a client token (--auth-tokens-file): a client could " +
				"then read the peer route; give the replicas a secret of their own")
		}
		opts.Token = peerTokens.First
	}
	ring, err := cluster.New(st, opts)
	if err != nil {
		return nil, err
	}
	cached, err := cache.New(ring, c.cache, tel.Meter)
	if err != nil {
		return nil, err
	}
	return &sharedCache{cache: cached, handler: cluster.NewHandler(ring, cached), peerTokens: peerTokens,
		discovery: c.cluster.Discover(ctx, ring, log)}, nil
}
