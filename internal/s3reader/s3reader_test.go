package s3reader_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
	"github.com/shardsrv/shardsrv/internal/store/objstore/faultproxy"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

var buckets atomic.Int64

func TestS3Conformance(t *testing.T) {
	g := s3test.Start(t)
	storetest.Run(t, storetest.Harness{New: func(t *testing.T) (store.Store, func(string, []byte)) {
		bucket := fmt.Sprintf("bucket-%d", buckets.Add(1))
		g.CreateBucket(t, bucket)
		s, err := s3reader.New(
			context.Background(),
			s3reader.Config{Bucket: bucket, Prefix: "root/dir", Endpoint: g.Endpoint},
		)
		if err != nil {
			t.Fatal(err)
		}
		// A sibling outside the prefix must never show up.
		g.Put(t, bucket, "root/elsewhere/model.safetensors", []byte("x"))
		return s, func(key string, data []byte) { g.Put(t, bucket, "root/dir/"+key, data) }
	}})
}

func TestSetURL(t *testing.T) {
	for in, want := range map[string][2]string{"s3://b": {"b", ""}, "s3://b/p/q/": {"b", "p/q"}} {
		var c s3reader.Config
		if err := c.SetURL(in); err != nil || c.Bucket != want[0] || c.Prefix != want[1] {
			t.Errorf("SetURL(%q) = %q %q %v", in, c.Bucket, c.Prefix, err)
		}
	}
	for _, in := range []string{"s3://", "b/p", "s3:///p"} {
		if err := new(s3reader.Config).SetURL(in); err == nil {
			t.Errorf("SetURL(%q) accepted", in)
		}
	}
}

func TestS3Faults(t *testing.T) {
	g := s3test.Start(t)
	faultproxy.RunMatrix(t, faultproxy.Harness{
		CreateBucket: func(t *testing.T, bucket string) { g.CreateBucket(t, bucket) },
		DeleteBucket: func(t *testing.T, bucket string) { g.DeleteBucket(t, bucket) },
		Put:          func(t *testing.T, bucket, key string, data []byte) { g.Put(t, bucket, key, data) },
		NewProxy:     g.NewProxy,
		Store: func(t *testing.T, endpoint, bucket string, readTimeout, retryBudget time.Duration) store.Store {
			s, err := s3reader.New(context.Background(), s3reader.Config{Bucket: bucket, Endpoint: endpoint,
				Tunables: objstore.Tunables{ReadTimeout: readTimeout, RetryBudget: retryBudget}})
			if err != nil {
				t.Fatal(err)
			}
			return s
		},
	})
}
