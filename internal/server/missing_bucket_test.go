package server_test

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/azstore"
	"github.com/shardsrv/shardsrv/internal/azstore/aztest"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/gcsstore"
	"github.com/shardsrv/shardsrv/internal/gcsstore/gcstest"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
)

// bucketEnv is a bucket (a container) on an object store's emulator: put writes an object into
// it, remove deletes it and what it holds, and open opens a store over a bucket by name.
type bucketEnv struct {
	bucket string
	put    func(key string, data []byte)
	remove func()
	open   func(bucket string) store.Store
}

// Stores over a missing bucket give up within a second.
var quickTunables = objstore.Tunables{RetryBudget: time.Second}

// bucketEnvs start each object store's emulator with a bucket of their own.
var bucketEnvs = map[string]func(t *testing.T) bucketEnv{
	"s3": func(t *testing.T) bucketEnv {
		g := s3test.Start(t)
		b := fmt.Sprintf("bucket-%d", buckets.Add(1))
		g.CreateBucket(t, b)
		return bucketEnv{bucket: b,
			put:    func(key string, data []byte) { g.Put(t, b, key, data) },
			remove: func() { g.DeleteBucket(t, b) },
			open: func(bucket string) store.Store {
				st, err := s3reader.New(context.Background(),
					s3reader.Config{Bucket: bucket, Endpoint: g.Endpoint, Tunables: quickTunables})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}}
	},
	"gcs": func(t *testing.T) bucketEnv {
		g := gcstest.Start(t)
		b := fmt.Sprintf("bucket-%d", buckets.Add(1))
		g.CreateBucket(t, b)
		return bucketEnv{bucket: b,
			put:    func(key string, data []byte) { g.Put(t, b, key, data) },
			remove: func() { g.DeleteBucket(t, b) },
			open: func(bucket string) store.Store {
				st, err := gcsstore.New(context.Background(),
					gcsstore.Config{Bucket: bucket, Endpoint: g.Endpoint, Tunables: quickTunables})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}}
	},
	"azure": func(t *testing.T) bucketEnv {
		a := aztest.Start(t)
		c := fmt.Sprintf("container-%d", buckets.Add(1))
		a.CreateContainer(t, c)
		return bucketEnv{bucket: c,
			put:    func(key string, data []byte) { a.Put(t, c, key, data) },
			remove: func() { a.DeleteContainer(t, c) },
			open: func(container string) store.Store {
				st, err := azstore.New(context.Background(), azstore.Config{Account: aztest.Account,
					Container: container, Endpoint: a.Endpoint, Tunables: quickTunables})
				if err != nil {
					t.Fatal(err)
				}
				return st
			}}
	},
}

// A missing bucket or container is one answer on every store: a 502 store-bucket-missing problem
// naming it, not retried, and /readyz fails. The catalog meets it resolving a checkpoint in a
// bucket that never existed (a Stat that finds nothing, then Check); a read meets it when the
// bucket is deleted after the checkpoint was resolved (ReadAt at the version the catalog saw),
// and must not take it for a file that changed (409, retried).
func TestMissingBucketIsA502OnEveryStore(t *testing.T) {
	for name, start := range bucketEnvs {
		t.Run(name, func(t *testing.T) {
			env := start(t)
			data := pattern(64*1024*4, 1)
			env.put("m/model.safetensors", checkpointBytes(data))
			req := shardReq("m", api.TensorRequest{Name: "w", Dtype: api.F32, Shape: []int64{64, 1024},
				Boxes: whole(64, 1024), Blocks: copyOf("w", 64, 1024)})

			never := &faultEnv{url: bucketServer(t, env.open("no-such-bucket"), 0), req: req}
			never.expectProblem(t, 502, "no-such-bucket", "urn:shardsrv:problem:store-bucket-missing",
				`"retryable":false`)
			expectUnready(t, never.url)

			// The resolution is trusted for an hour, so the request after the deletion reads.
			gone := &faultEnv{url: bucketServer(t, env.open(env.bucket), time.Hour), req: req, data: data}
			gone.expectBytes(t, data)
			env.remove()
			gone.expectProblem(t, 502, env.bucket, "urn:shardsrv:problem:store-bucket-missing", `"retryable":false`)
			expectUnready(t, gone.url)
		})
	}
}

// bucketServer serves st, its catalog trusting a resolution for revalidate.
func bucketServer(t *testing.T, st store.Store, revalidate time.Duration) string {
	catalog := checkpoint.New(st)
	catalog.Revalidate = revalidate
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{Catalog: catalog, Executor: executor.New(st, mem, executor.Config{}),
		Budget: mem, Planner: planner.ObjectStoreOptions(), Limits: server.Limits{MaxBodyBytes: 1 << 20},
		Logger: slog.New(slog.DiscardHandler)})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	return ts.URL
}

func expectUnready(t *testing.T, url string) {
	t.Helper()
	res, err := http.Get(url + "/readyz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	if res.StatusCode != 503 {
		t.Errorf("/readyz without a bucket: %d, want 503", res.StatusCode)
	}
}
