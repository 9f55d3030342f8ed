package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Store wraps every method of a store with a span (reads carry key, offset and length) and the
// storage counters. It names each method rather than embedding the store, so a method added to the
// interface cannot go untraced unnoticed.
type Store struct {
	next     store.Store
	tracer   trace.Tracer
	bytes    metric.Int64Counter
	requests metric.Int64Counter
}

// InstrumentStore wraps s; put it under the cache so it sees what storage sees.
func InstrumentStore(s store.Store, tp trace.TracerProvider, mp metric.MeterProvider) *Store {
	m := mp.Meter("shardsrv/store")
	bytes, _ := m.Int64Counter(
		"shardsrv.storage.read",
		metric.WithUnit("By"),
		metric.WithDescription("Bytes read from storage"),
	)
	requests, _ := m.Int64Counter(
		"shardsrv.storage.requests",
		metric.WithDescription("Storage requests, by operation and outcome"),
	)
	return &Store{next: s, tracer: tp.Tracer("shardsrv/store"), bytes: bytes, requests: requests}
}

var _ store.Store = (*Store)(nil)

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
	err := s.next.ReadAt(ctx, key, version, p, off)
	s.count(ctx, "read", err)
	if err != nil {
		fail(span, err)
		return err
	}
	s.bytes.Add(ctx, int64(len(p)))
	return nil
}

// Stat implements store.Store.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	ctx, span := s.tracer.Start(ctx, "store.stat", trace.WithAttributes(attribute.String("key", key)))
	defer span.End()
	info, err := s.next.Stat(ctx, key)
	s.count(ctx, "stat", err)
	fail(span, err)
	return info, err
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	ctx, span := s.tracer.Start(ctx, "store.list", trace.WithAttributes(attribute.String("prefix", prefix)))
	defer span.End()
	keys, err := s.next.List(ctx, prefix)
	s.count(ctx, "list", err)
	fail(span, err)
	return keys, err
}

// Check implements store.Store.
func (s *Store) Check(ctx context.Context) error {
	ctx, span := s.tracer.Start(ctx, "store.check")
	defer span.End()
	err := s.next.Check(ctx)
	s.count(ctx, "check", err)
	fail(span, err)
	return err
}

// String implements store.Store.
func (s *Store) String() string { return s.next.String() }

func fail(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
}
