package storetest_test

import (
	"bytes"
	"context"
	"testing"
	"time"

	metricnoop "go.opentelemetry.io/otel/metric/noop"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
	"github.com/shardsrv/shardsrv/internal/telemetry"
	"github.com/shardsrv/shardsrv/internal/verify"
)

// capable is a local store (a Sectioner) that is also an Aligner and a Splitter, with answers
// no default gives.
type capable struct{ *store.Local }

func (capable) Alignment(context.Context, string, string) int64 { return 4096 }
func (capable) Split(_, _ string, off int64) bool               { return off == 8192 }

// Every decorator passes each capability of the store below on, or answers it itself, as its
// documentation says: none offers sections it does not write itself, and none that checks or
// routes reads offers sections at all.
func TestDecoratorsPassCapabilities(t *testing.T) {
	const stripe = 1 << 20
	ctx := context.Background()
	for _, c := range []struct {
		name     string
		wrap     func(store.Store) store.Store
		sections bool  // offers sections
		split    int64 // the offset Split reports (8192: the store below's)
	}{
		{"telemetry", func(s store.Store) store.Store {
			return telemetry.InstrumentStore(s, tracenoop.NewTracerProvider(), metricnoop.NewMeterProvider())
		}, true, 8192},
		{"verify", func(s store.Store) store.Store { return verify.New(s, verify.ModeRequired, nil, nil) }, false, 8192},
		{"cluster", func(s store.Store) store.Store {
			cl, err := cluster.New(s, cluster.Options{ChunkBytes: 4096, StripeBytes: stripe, Timeout: time.Second})
			if err != nil {
				t.Fatal(err)
			}
			return cl
		}, false, stripe},
		{"cache", func(s store.Store) store.Store {
			c, err := cache.New(s, cache.Config{Bytes: 1 << 20, ChunkBytes: 4096}, nil)
			if err != nil {
				t.Fatal(err)
			}
			return c
		}, true, 8192},
		{"counting", func(s store.Store) store.Store { return storetest.NewCounting(s) }, false, 8192},
	} {
		t.Run(c.name, func(t *testing.T) {
			local, put := storetest.Local(t)
			put("m/a", []byte("abcdef"))
			info, _ := local.Stat(ctx, "m/a")
			d := c.wrap(capable{local})
			a, ok := d.(store.Aligner)
			if !ok || a.Alignment(ctx, "m/a", info.Version) != 4096 {
				t.Error("the store below's alignment is lost")
			}
			sp, ok := d.(store.Splitter)
			if !ok || !sp.Split("m/a", info.Version, c.split) || sp.Split("m/a", info.Version, 3*4096) {
				t.Errorf("Split is not true at %d alone", c.split)
			}
			sc, ok := d.(store.Sectioner)
			if ok != c.sections {
				t.Fatalf("offers sections: %v, want %v", ok, c.sections)
			}
			if !ok {
				return
			}
			sec, err := sc.Section(ctx, "m/a", info.Version, []store.Range{{Offset: 1, Length: 3}})
			if err != nil {
				t.Fatal(err)
			}
			var b bytes.Buffer
			_, err = sec.WriteTo(&b)
			sec.Close()
			if err != nil || b.String() != "bcd" {
				t.Errorf("section wrote %q, %v", b.String(), err)
			}
		})
	}
}
