package cache_test

import (
	"context"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/shardsrv/shardsrv/internal/cache"
)

// The cache given a meter reports its counters on it, under the names, units and scope /metrics
// has always shown, over a cache that holds two of a file's three chunks.
func TestCacheCountersAreMetered(t *testing.T) {
	inner, put := local(t)
	data := make([]byte, 3*4096)
	put("f", data)
	reader := sdkmetric.NewManualReader()
	c, err := cache.New(inner, cache.Config{Bytes: 2 * 4096, ChunkBytes: 4096}, sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	info, err := inner.Stat(ctx, "f")
	if err != nil {
		t.Fatal(err)
	}
	// The whole file misses three chunks and evicts the first; its last chunk then hits.
	if err := c.ReadAt(ctx, "f", info.Version, make([]byte, len(data)), 0); err != nil {
		t.Fatal(err)
	}
	if err := c.ReadAt(ctx, "f", info.Version, make([]byte, 4096), 2*4096); err != nil {
		t.Fatal(err)
	}
	st := c.Stats()
	if st.Hits == 0 || st.Misses == 0 || st.BytesFromCache == 0 || st.BytesFromStore == 0 || st.Evictions == 0 {
		t.Fatalf("stats %+v: the reads should hit, miss and evict", st)
	}
	var rm metricdata.ResourceMetrics
	if err := reader.Collect(ctx, &rm); err != nil {
		t.Fatal(err)
	}
	type metered struct {
		value int64
		unit  string
	}
	got := map[string]metered{}
	for _, sm := range rm.ScopeMetrics {
		if sm.Scope.Name != "shardsrv/cache" {
			t.Errorf("scope %q", sm.Scope.Name)
		}
		for _, m := range sm.Metrics {
			switch d := m.Data.(type) {
			case metricdata.Sum[int64]:
				got[m.Name] = metered{d.DataPoints[0].Value, m.Unit}
			case metricdata.Gauge[int64]:
				got[m.Name] = metered{d.DataPoints[0].Value, m.Unit}
			}
		}
	}
	for name, want := range map[string]metered{
		"shardsrv.cache.hits":            {st.Hits, ""},
		"shardsrv.cache.misses":          {st.Misses, ""},
		"shardsrv.cache.served":          {st.BytesFromCache, "By"},
		"shardsrv.cache.filled":          {st.BytesFromStore, "By"},
		"shardsrv.cache.evictions":       {st.Evictions, ""},
		"shardsrv.cache.fills_in_flight": {0, ""},
	} {
		if g, ok := got[name]; !ok || g != want {
			t.Errorf("%s = %+v (reported: %v), want %+v", name, g, ok, want)
		}
	}
	if len(got) != 6 {
		t.Errorf("metrics %v, want the six of the cache", got)
	}
}
