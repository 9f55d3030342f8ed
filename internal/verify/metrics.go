package verify

import (
	"context"

	"go.opentelemetry.io/otel/metric"
)

// observe registers the store's counters on mp (the OTel Prometheus exporter names them
// shardsrv_verify_bytes_total, ...). A store that verifies nothing registers none.
func (s *Store) observe(mp metric.MeterProvider) {
	if mp == nil || s.mode == ModeOff {
		return
	}
	m := mp.Meter("shardsrv/verify")
	verified, _ := m.Int64ObservableCounter("shardsrv.verify.bytes", metric.WithUnit("By"),
		metric.WithDescription("Bytes read from storage, hashed and found as the checkpoint's signature lists them"))
	failures, _ := m.Int64ObservableCounter("shardsrv.verify.failures",
		metric.WithDescription("Reads refused because stored bytes did not match the signature"))
	hashing, _ := m.Float64ObservableCounter("shardsrv.verify.hash_time", metric.WithUnit("s"),
		metric.WithDescription("Time spent hashing what was read"))
	// Instruments this SDK cannot register are left out, as the exporter leaves out what fails.
	m.RegisterCallback(func(_ context.Context, o metric.Observer) error {
		st := s.Stats()
		o.ObserveInt64(verified, st.VerifiedBytes)
		o.ObserveInt64(failures, st.Failures)
		o.ObserveFloat64(hashing, float64(st.HashNanos)/1e9)
		return nil
	}, verified, failures, hashing)
}
