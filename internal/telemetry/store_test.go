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

// Every method of the store interface leaves a span.
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
	var names []string
	for _, sp := range spans.Ended() {
		names = append(names, sp.Name())
	}
	if want := []string{"store.stat", "store.read", "store.list", "store.check"}; !slices.Equal(names, want) {
		t.Errorf("spans %v, want %v", names, want)
	}
}
