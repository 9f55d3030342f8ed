package server

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"

	"github.com/shardsrv/shardsrv/internal/planner"
)

// metrics are the server's instruments (the OTel Prometheus exporter names them
// shardsrv_requests_total, shardsrv_plan_duration_seconds, ...).
type metrics struct {
	requests      metric.Int64Counter
	served        metric.Int64Counter
	planDuration  metric.Float64Histogram
	streamLatency metric.Float64Histogram
	amplification metric.Float64Histogram
	streams       metric.Int64UpDownCounter
	panics        metric.Int64Counter
	digests       metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider, s *Server) *metrics {
	m := mp.Meter("shardsrv/server")
	out := &metrics{}
	out.requests, _ = m.Int64Counter("shardsrv.requests", metric.WithDescription("Requests, by route and status"))
	out.served, _ = m.Int64Counter(
		"shardsrv.served",
		metric.WithUnit("By"),
		metric.WithDescription("Response bytes, by route"),
	)
	out.planDuration, _ = m.Float64Histogram(
		"shardsrv.plan.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time to resolve and plan a request"),
	)
	out.streamLatency, _ = m.Float64Histogram(
		"shardsrv.stream.duration",
		metric.WithUnit("s"),
		metric.WithDescription("Time to stream a shard, from plan to last byte"),
		metric.WithExplicitBucketBoundaries(0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300),
	)
	out.amplification, _ = m.Float64Histogram(
		"shardsrv.read.amplification",
		metric.WithDescription("Bytes a plan reads from storage per byte it needs"),
		metric.WithExplicitBucketBoundaries(1, 1.05, 1.1, 1.25, 1.5, 2, 4, 8, 16),
	)
	out.streams, _ = m.Int64UpDownCounter(
		"shardsrv.streams.active",
		metric.WithDescription("Shard streams in progress"),
	)
	out.panics, _ = m.Int64Counter(
		"shardsrv.panics",
		metric.WithDescription("Handler panics answered with a 500, by route"),
	)
	out.digests, _ = m.Int64Counter(
		"shardsrv.digest.lookups",
		metric.WithDescription("Shard responses with the digest on, by whether the digest memo knew the body's "+
			"digest (hit: sent as a header, the body not hashed) or not (miss: hashed and trailed)"),
	)
	inFlight, _ := m.Int64ObservableGauge(
		"shardsrv.buffers.in_flight",
		metric.WithUnit("By"),
		metric.WithDescription("Bytes of segment and read buffers held by streams"),
	)
	reachable, _ := m.Int64ObservableGauge(
		"shardsrv.store.reachable",
		metric.WithDescription("1 when the store answered the last readiness check, else 0"),
	)
	m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		if s.cfg.Budget != nil {
			o.ObserveInt64(inFlight, s.cfg.Budget.Held())
		}
		up := int64(0)
		if s.cfg.Catalog.Reachable() {
			up = 1
		}
		o.ObserveInt64(reachable, up)
		return nil
	}, inFlight, reachable)
	return out
}

func (m *metrics) planned(ctx context.Context, p *planner.Plan, took time.Duration) {
	m.planDuration.Record(ctx, took.Seconds())
	if p.NeededBytes > 0 {
		m.amplification.Record(ctx, float64(p.ReadBytes)/float64(p.NeededBytes))
	}
}

func (m *metrics) streamed(ctx context.Context, p *planner.Plan, took time.Duration) {
	m.streamLatency.Record(ctx, took.Seconds(), metric.WithAttributes(attribute.String("format", string(p.Format))))
}

func (m *metrics) digestLookup(ctx context.Context, hit bool) {
	result := "miss"
	if hit {
		result = "hit"
	}
	m.digests.Add(ctx, 1, metric.WithAttributes(attribute.String("result", result)))
}
