package telemetry_test

import (
	"context"
	"slices"
	"testing"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
	"github.com/shardsrv/shardsrv/internal/telemetry"
)

// The instrumented store is a wrapper like any other: it passes the conformance suite.
func TestInstrumentedStoreConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: func(t *testing.T) (store.Store, func(string, []byte)) {
		local, put := storetest.Local(t)
		return telemetry.InstrumentStore(local, tracenoop.NewTracerProvider(), metricnoop.NewMeterProvider()), put
	}})
}

// Every method of the store interface, and of store.Sectioner over a store that has it, leaves a
// span.
func TestEveryStoreMethodIsTraced(t *testing.T) {
	spans := tracetest.NewSpanRecorder()
	local, put := storetest.Local(t)
	put("m/a", []byte("abc"))
	s := telemetry.InstrumentStore(
		local,
		sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(spans)),
		metricnoop.NewMeterProvider(),
	)
	ctx := context.Background()
	info, _ := s.Stat(ctx, "m/a")
	s.ReadAt(ctx, "m/a", info.Version, make([]byte, 2), 0)
	s.List(ctx, "m")
	s.Check(ctx)
	sec, err := s.(store.Sectioner).Section(ctx, "m/a", info.Version, []store.Range{{Offset: 1, Length: 2}})
	if err != nil {
		t.Fatal(err)
	}
	sec.Close()
	var names []string
	for _, sp := range spans.Ended() {
		names = append(names, sp.Name())
	}
	want := []string{"store.stat", "store.read", "store.list", "store.check", "store.section"}
	if !slices.Equal(names, want) {
		t.Errorf("spans %v, want %v", names, want)
	}
}

// Over a store without sections the instrumented store has none either, so callers read through
// ReadAt.
func TestNoSectionsOverAStoreWithout(t *testing.T) {
	local, _ := storetest.Local(t)
	s := telemetry.InstrumentStore(struct{ store.Store }{local}, tracenoop.NewTracerProvider(),
		metricnoop.NewMeterProvider())
	if _, ok := s.(store.Sectioner); ok {
		t.Error("the instrumented store offers sections its store does not have")
	}
}
