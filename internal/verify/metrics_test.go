package verify_test

import (
	"bytes"
	"context"
	"crypto"
	"testing"

	sdkmetric "go.opentelemetry.io/otel/sdk/metric"
	"go.opentelemetry.io/otel/sdk/metric/metricdata"

	"github.com/shardsrv/shardsrv/internal/oms"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
	"github.com/shardsrv/shardsrv/internal/verify"
)

// The store given a meter reports what it verified on it: the bytes of a file read whole, and no
// failure; a store that verifies nothing reports nothing.
func TestVerifiedBytesAreMetered(t *testing.T) {
	raw, put := storetest.Local(t)
	data := pattern(64<<10, 7)
	src := oms.FileSource{Path: "w.bin", Size: int64(len(data)), R: bytes.NewReader(data)}
	m, err := oms.BuildShards("model", []oms.FileSource{src}, 64)
	if err != nil {
		t.Fatal(err)
	}
	key := newKey(t)
	bundle, err := oms.Sign(m, key)
	if err != nil {
		t.Fatal(err)
	}
	put("m/w.bin", data)
	put("m/model.sig", bundle)
	reader := sdkmetric.NewManualReader()
	s := verify.New(raw, verify.ModeRequired, []crypto.PublicKey{key.Public()},
		sdkmetric.NewMeterProvider(sdkmetric.WithReader(reader)))
	ctx := context.Background()
	info, err := s.Stat(ctx, "m/w.bin")
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReadAt(ctx, "m/w.bin", info.Version, make([]byte, len(data)), 0); err != nil {
		t.Fatal(err)
	}
	sums := collect(t, reader)
	if sums["shardsrv.verify.bytes"] != int64(len(data)) || sums["shardsrv.verify.failures"] != 0 {
		t.Errorf("metrics %v after verifying %d bytes", sums, len(data))
	}

	off := sdkmetric.NewManualReader()
	verify.New(raw, verify.ModeOff, nil, sdkmetric.NewMeterProvider(sdkmetric.WithReader(off)))
	if sums := collect(t, off); len(sums) != 0 {
		t.Errorf("a store that verifies nothing reports %v", sums)
	}
}

// collect reads the integer sums a reader holds, by name.
func collect(t *testing.T, r *sdkmetric.ManualReader) map[string]int64 {
	var rm metricdata.ResourceMetrics
	if err := r.Collect(context.Background(), &rm); err != nil {
		t.Fatal(err)
	}
	out := map[string]int64{}
	for _, sm := range rm.ScopeMetrics {
		for _, m := range sm.Metrics {
			if sum, ok := m.Data.(metricdata.Sum[int64]); ok {
				for _, dp := range sum.DataPoints {
					out[m.Name] += dp.Value
				}
			}
		}
	}
	return out
}
