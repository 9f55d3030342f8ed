package telemetry

import (
	"context"

	"go.opentelemetry.io/otel/metric"

	"github.com/shardsrv/shardsrv/internal/verify"
)

// ObserveVerify reports the verifying store's counters.
func ObserveVerify(mp metric.MeterProvider, v *verify.Store) error {
	m := mp.Meter("shardsrv/verify")
	verified, _ := m.Int64ObservableCounter("shardsrv.verify.bytes", metric.WithUnit("By"),
		metric.WithDescription("Bytes read from storage, hashed and found as the checkpoint's signature lists them"))
	failures, _ := m.Int64ObservableCounter("shardsrv.verify.failures",
		metric.WithDescription("Reads refused because stored bytes did not match the signature"))
	hashing, _ := m.Float64ObservableCounter("shardsrv.verify.hash_time", metric.WithUnit("s"),
		metric.WithDescription("Time spent hashing what was read"))
	_, err := m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		s := v.Stats()
		o.ObserveInt64(verified, s.VerifiedBytes)
		o.ObserveInt64(failures, s.Failures)
		o.ObserveFloat64(hashing, float64(s.HashNanos)/1e9)
		return nil
	}, verified, failures, hashing)
	return err
}
