package telemetry

import (
	"context"
	"io"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/metric"
	"go.opentelemetry.io/otel/trace"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Store wraps every method of a store with a span (reads carry key, offset and length) and the
// storage counters. The capabilities' answers, which cost no request, pass through untraced.
type Store struct {
	store.Forwarder
	tracer   trace.Tracer
	bytes    metric.Int64Counter
	requests metric.Int64Counter
}

// InstrumentStore wraps s; put it under the cache so it sees what storage sees. Over a
// store.Sectioner it is a *SectionStore, so sections stay available through it.
func InstrumentStore(s store.Store, tp trace.TracerProvider, mp metric.MeterProvider) store.Store {
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
	st := &Store{Forwarder: store.Forwarder{Next: s}, tracer: tp.Tracer("shardsrv/store"), bytes: bytes, requests: requests}
	if sc, ok := s.(store.Sectioner); ok {
		return &SectionStore{Store: st, sections: sc}
	}
	return st
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Aligner   = (*Store)(nil)
	_ store.Splitter  = (*Store)(nil)
	_ store.Sectioner = (*SectionStore)(nil)
)

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
	err := s.Next.ReadAt(ctx, key, version, p, off)
	s.count(ctx, "read", err)
	if err != nil {
		fail(span, err)
		return err
	}
	s.bytes.Add(ctx, int64(len(p)))
	return nil
}

// SectionStore is Store over a store.Sectioner, and one itself.
type SectionStore struct {
	*Store
	sections store.Sectioner
}

// Section implements store.Sectioner. Its span covers the opening; the bytes are counted as they
// are written out.
func (s *SectionStore) Section(ctx context.Context, key, version string, ranges []store.Range) (store.Section, error) {
	var n int64
	for _, r := range ranges {
		n += r.Length
	}
	ctx, span := s.tracer.Start(ctx, "store.section", trace.WithAttributes(
		attribute.String("key", key), attribute.Int("ranges", len(ranges)), attribute.Int64("length", n)))
	defer span.End()
	sec, err := s.sections.Section(ctx, key, version, ranges)
	s.count(ctx, "section", err)
	if err != nil {
		fail(span, err)
		return nil, err
	}
	return &countedSection{Section: sec, bytes: s.bytes, ctx: context.WithoutCancel(ctx)}, nil
}

// SectionMemory implements store.Sectioner.
func (s *SectionStore) SectionMemory(n int64) int64 { return s.sections.SectionMemory(n) }

// countedSection adds what a section writes out to the storage read counter.
type countedSection struct {
	store.Section
	bytes metric.Int64Counter
	ctx   context.Context // the section's span, for the counter's exemplars
}

func (c *countedSection) WriteTo(w io.Writer) (int64, error) {
	n, err := c.Section.WriteTo(w)
	c.bytes.Add(c.ctx, n)
	return n, err
}

// Stat implements store.Store.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	ctx, span := s.tracer.Start(ctx, "store.stat", trace.WithAttributes(attribute.String("key", key)))
	defer span.End()
	info, err := s.Next.Stat(ctx, key)
	s.count(ctx, "stat", err)
	fail(span, err)
	return info, err
}

// List implements store.Store.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	ctx, span := s.tracer.Start(ctx, "store.list", trace.WithAttributes(attribute.String("prefix", prefix)))
	defer span.End()
	keys, err := s.Next.List(ctx, prefix)
	s.count(ctx, "list", err)
	fail(span, err)
	return keys, err
}

// Check implements store.Store.
func (s *Store) Check(ctx context.Context) error {
	ctx, span := s.tracer.Start(ctx, "store.check")
	defer span.End()
	err := s.Next.Check(ctx)
	s.count(ctx, "check", err)
	fail(span, err)
	return err
}

func fail(span trace.Span, err error) {
	if err != nil {
		span.SetStatus(codes.Error, err.Error())
	}
}
