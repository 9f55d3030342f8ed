package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/metric"

	"github.com/shardsrv/shardsrv/internal/cache"
)

// ObserveCache exports the cache's counters.
func ObserveCache(mp metric.MeterProvider, c *cache.Store) error {
	m := mp.Meter("shardsrv/cache")
	hits, _ := m.Int64ObservableCounter(
		"shardsrv.cache.hits",
		metric.WithDescription("Chunk lookups served from memory"),
	)
	misses, _ := m.Int64ObservableCounter(
		"shardsrv.cache.misses",
		metric.WithDescription("Chunk lookups that waited for storage"),
	)
	fromCache, _ := m.Int64ObservableCounter(
		"shardsrv.cache.served",
		metric.WithUnit("By"),
		metric.WithDescription("Bytes served from the cache"),
	)
	fromStore, _ := m.Int64ObservableCounter(
		"shardsrv.cache.filled",
		metric.WithUnit("By"),
		metric.WithDescription("Bytes the cache read from storage"),
	)
	evictions, _ := m.Int64ObservableCounter("shardsrv.cache.evictions", metric.WithDescription("Chunks evicted"))
	fills, _ := m.Int64ObservableGauge(
		"shardsrv.cache.fills_in_flight",
		metric.WithDescription("Chunk fills waiting for storage"),
	)
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := c.Stats()
		o.ObserveInt64(hits, s.Hits)
		o.ObserveInt64(misses, s.Misses)
		o.ObserveInt64(fromCache, s.BytesFromCache)
		o.ObserveInt64(fromStore, s.BytesFromStore)
		o.ObserveInt64(evictions, s.Evictions)
		o.ObserveInt64(fills, s.FillsInFlight)
		return nil
	}, hits, misses, fromCache, fromStore, evictions, fills)
	return err
}
