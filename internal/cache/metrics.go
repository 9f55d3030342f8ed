package cache

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// observe registers the cache's counters on mp (the OTel Prometheus exporter names them
// shardsrv_cache_hits_total, ...); nil registers none.
func (s *Store) observe(mp metric.MeterProvider) {
	if mp == nil {
		return
	}
	m := mp.Meter("shardsrv/cache")
	hits, _ := m.Int64ObservableCounter("shardsrv.cache.hits",
		metric.WithDescription("Chunk lookups served from memory"))
	misses, _ := m.Int64ObservableCounter("shardsrv.cache.misses",
		metric.WithDescription("Chunk lookups that waited for storage"))
	served, _ := m.Int64ObservableCounter("shardsrv.cache.served", metric.WithUnit("By"),
		metric.WithDescription("Bytes served from the cache"))
	filled, _ := m.Int64ObservableCounter("shardsrv.cache.filled", metric.WithUnit("By"),
		metric.WithDescription("Bytes the cache read from storage"))
	evictions, _ := m.Int64ObservableCounter("shardsrv.cache.evictions", metric.WithDescription("Chunks evicted"))
	fills, _ := m.Int64ObservableGauge("shardsrv.cache.fills_in_flight",
		metric.WithDescription("Chunk fills waiting for storage"))
	// Instruments this SDK cannot register are left out, as the exporter leaves out what fails.
	m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		o.ObserveInt64(hits, st.Hits)
		o.ObserveInt64(misses, st.Misses)
		o.ObserveInt64(served, st.BytesFromCache)
		o.ObserveInt64(filled, st.BytesFromStore)
		o.ObserveInt64(evictions, st.Evictions)
		o.ObserveInt64(fills, st.FillsInFlight)
		return nil
	}, hits, misses, served, filled, evictions, fills)
}
