package server_test

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
)

// An S3 outage (the gateway stopped: every connection refused) shorter than the store grace keeps
// /readyz ready, with the store's state on ?verbose; without a grace it is not ready at once.
func TestReadinessSurvivesAStoreOutageShorterThanTheGrace(t *testing.T) {
	g := s3test.Start(t)
	g.CreateBucket(t, "ready")
	st, err := s3reader.New(context.Background(), s3reader.Config{Bucket: "ready", Endpoint: g.Endpoint,
		Tunables: objstore.Tunables{ReadTimeout: 2 * time.Second, RetryBudget: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	serve := func(grace time.Duration) string {
		mem := budget.New(budget.Config{Bytes: 1 << 26})
		srv := server.New(server.Config{Catalog: checkpoint.New(st), Planner: planner.DefaultOptions(),
			Executor:   executor.New(st, mem, executor.Config{Window: 1}),
			StoreGrace: grace})
		ts := httptest.NewServer(srv.Handler())
		t.Cleanup(ts.Close)
		return ts.URL
	}
	patient, impatient := serve(time.Hour), serve(0)
	readyz := func(url string) (int, api.Health) {
		t.Helper()
		res, err := http.Get(url + "/readyz?verbose")
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var h api.Health
		json.NewDecoder(res.Body).Decode(&h)
		return res.StatusCode, h
	}
	if status, h := readyz(patient); status != 200 || h.Store == nil || !h.Store.Reachable {
		t.Fatalf("with the store up: %d %+v", status, h.Store)
	}
	g.Stop()
	status, h := readyz(patient)
	if status != 200 || h.Store == nil || h.Store.Reachable || h.Store.Error == nil || h.Store.UnreachableSeconds == nil {
		t.Errorf("the store down for less than the grace: %d %+v, want ready and the store's state", status, h.Store)
	}
	if status, _ := readyz(impatient); status != http.StatusServiceUnavailable {
		t.Errorf("the store down without a grace: %d, want 503", status)
	}
}
