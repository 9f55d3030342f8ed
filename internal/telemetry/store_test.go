package telemetry_test

import (
	"testing"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
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
