package cluster

import (
	"context"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
)

// metrics are the cluster's instruments (the OTel Prometheus exporter names them
// shardsrv_cluster_peer_requests_total, shardsrv_cluster_hit_ratio, ...).
type metrics struct {
	requests metric.Int64Counter
	errors   metric.Int64Counter
	bytes    metric.Int64Counter
	latency  metric.Float64Histogram
	chunks   metric.Int64Counter
}

func newMetrics(mp metric.MeterProvider, s *Store) (*metrics, error) {
	m := mp.Meter("shardsrv/cluster")
	out := &metrics{}
	out.requests, _ = m.Int64Counter("shardsrv.cluster.peer.requests",
		metric.WithDescription("Chunk fetches from peers, by peer"))
	out.errors, _ = m.Int64Counter("shardsrv.cluster.peer.errors",
		metric.WithDescription("Chunk fetches from peers that failed, by peer and reason; their chunks were read here"))
	out.bytes, _ = m.Int64Counter("shardsrv.cluster.peer.received", metric.WithUnit("By"),
		metric.WithDescription("Chunk bytes received from peers, by peer"))
	out.latency, _ = m.Float64Histogram("shardsrv.cluster.peer.duration", metric.WithUnit("s"),
		metric.WithDescription("Time to fetch a chunk from a peer, by peer"),
		metric.WithExplicitBucketBoundaries(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))
	out.chunks, _ = m.Int64Counter("shardsrv.cluster.chunks",
		metric.WithDescription("Runs of chunks this replica's cache missed, by where they came from: peer or storage"))
	ratio, _ := m.Float64ObservableGauge("shardsrv.cluster.hit_ratio",
		metric.WithDescription("Share of this replica's chunk misses that peers served (a replica of N reaches (N-1)/N)"))
	peers, _ := m.Int64ObservableGauge("shardsrv.cluster.peers",
		metric.WithDescription("Replicas in the ring, this one included; peers that failed to answer are out"))
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		if total := st.PeerLoads + st.StorageLoads; total > 0 {
			o.ObserveFloat64(ratio, float64(st.PeerLoads)/float64(total))
		}
		o.ObserveInt64(peers, int64(st.Peers))
		return nil
	}, ratio, peers)
	return out, err
}

// fetched records one fetch from a peer; reason is "" when it succeeded.
func (m *metrics) fetched(ctx context.Context, peer string, n int64, took time.Duration, reason string) {
	ctx = context.WithoutCancel(ctx)
	p := metric.WithAttributes(attribute.String("peer", peer))
	m.requests.Add(ctx, 1, p)
	m.latency.Record(ctx, took.Seconds(), p)
	if reason != "" {
		m.errors.Add(ctx, 1, metric.WithAttributes(attribute.String("peer", peer), attribute.String("reason", reason)))
	}
	m.bytes.Add(ctx, n, p)
}

// chunk records where a missed chunk came from.
func (m *metrics) chunk(ctx context.Context, source string) {
	m.chunks.Add(context.WithoutCancel(ctx), 1, metric.WithAttributes(attribute.String("source", source)))
}
