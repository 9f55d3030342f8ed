// Package telemetry builds shardsrv's OpenTelemetry providers, which the rest of the service gets
// injected (no globals): metrics through the Prometheus exporter, served on /metrics, and traces
// exported over OTLP when the standard OTEL_* variables ask for it (off by default).
package telemetry

import (
	"context"
	"errors"
	"net/http"
	"os"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/exporters/otlp/otlptrace/otlptracehttp"
	otelprom "go.opentelemetry.io/otel/exporters/prometheus"
	"go.opentelemetry.io/otel/metric"
	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.37.0"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
)

// Providers are what the service is instrumented with.
type Providers struct {
	Tracer  trace.TracerProvider
	Meter   metric.MeterProvider
	Metrics http.Handler // the Prometheus scrape endpoint
	// Shutdown flushes and stops the exporters.
	Shutdown func(context.Context) error
}

// tracesWanted reports whether the OTEL_* variables ask for OTLP traces.
func tracesWanted() bool {
	if os.Getenv("OTEL_SDK_DISABLED") == "true" || os.Getenv("OTEL_TRACES_EXPORTER") == "none" {
		return false
	}
	return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != "" ||
		os.Getenv("OTEL_TRACES_EXPORTER") == "otlp"
}

// New builds the providers for a service named name (OTEL_SERVICE_NAME overrides it).
func New(ctx context.Context, name, version string) (*Providers, error) {
	res, err := resource.Merge(
		resource.Default(),
		resource.NewSchemaless(semconv.ServiceName(name), semconv.ServiceVersion(version)),
	)
	if err != nil {
		return nil, err
	}
	if env, err := resource.New(ctx, resource.WithFromEnv()); err == nil {
		res, _ = resource.Merge(res, env)
	}
	registry := prometheus.NewRegistry()
	exporter, err := otelprom.New(otelprom.WithRegisterer(registry))
	if err != nil {
		return nil, err
	}
	meter := sdkmetric.NewMeterProvider(sdkmetric.WithReader(exporter), sdkmetric.WithResource(res))
	p := &Providers{
		Meter:   meter,
		Metrics: promhttp.HandlerFor(registry, promhttp.HandlerOpts{}),
		Tracer:  noop.NewTracerProvider(),
	}
	shutdowns := []func(context.Context) error{meter.Shutdown}
	if tracesWanted() {
		exp, err := otlptracehttp.New(ctx)
		if err != nil {
			return nil, err
		}
		tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
		p.Tracer = tp
		shutdowns = append(shutdowns, tp.Shutdown)
	}
	p.Shutdown = func(ctx context.Context) error {
		var errs []error
		for _, f := range shutdowns {
			errs = append(errs, f(ctx))
		}
		return errors.Join(errs...)
	}
	return p, nil
}
