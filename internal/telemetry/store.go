package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Store wraps a store with a span per read (key, offset, length) and the storage counters.
type Store struct {
	store.Store
	tracer   trace.Tracer
	bytes    metric.Int64Counter
	requests metric.Int64Counter
}

// InstrumentStore wraps s; put it under the cache so it sees what storage sees.
func InstrumentStore(s store.Store, tp trace.TracerProvider, mp metric.MeterProvider) *Store {
	m := mp.Meter("shardsrv/store")
	bytes, _ := m.Int64Counter("shardsrv.storage.read", metric.WithUnit("By"), metric.WithDescription("Bytes read from storage"))
	requests, _ := m.Int64Counter("shardsrv.storage.requests", metric.WithDescription("Storage requests, by operation and outcome"))
	return &Store{Store: s, tracer: tp.Tracer("shardsrv/store"), bytes: bytes, requests: requests}
}

func (s *Store) count(ctx context.Context, op string, err error) {
	outcome := "ok"
	if err != nil {
		outcome = "error"
	}
	s.requests.Add(ctx, 1, metric.WithAttributes(attribute.String("op", op), attribute.String("outcome", outcome)))
}

// ReadAt implements store.Store.
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	ctx, span := s.tracer.Start(ctx, "store.read", trace.WithAttributes(
		attribute.String("key", key), attribute.Int64("offset", off), attribute.Int("length", len(p))))
	defer span.End()
	err := s.Store.ReadAt(ctx, key, version, p, off)
	s.count(ctx, "read", err)
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
		return err
	}
	s.bytes.Add(ctx, int64(len(p)))
	return nil
}

// Stat implements store.Store.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	ctx, span := s.tracer.Start(ctx, "store.stat", trace.WithAttributes(attribute.String("key", key)))
	defer span.End()
	info, err := s.Store.Stat(ctx, key)
	s.count(ctx, "stat", err)
	return info, err
}
