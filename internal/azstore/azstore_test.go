package azstore_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/azstore"
	"github.com/shardsrv/shardsrv/internal/azstore/aztest"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
	"github.com/shardsrv/shardsrv/internal/store/objstore/faultproxy"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

var containers atomic.Int64

func newContainer(t *testing.T, a *aztest.Server) string {
	name := fmt.Sprintf("container-%d", containers.Add(1))
	a.CreateContainer(t, name)
	return name
}

func newStore(t *testing.T, cfg azstore.Config) *objstore.Store {
	t.Helper()
	s, err := azstore.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestAzureConformance(t *testing.T) {
	a := aztest.Start(t)
	storetest.Run(t, storetest.Harness{New: func(t *testing.T) (store.Store, func(string, []byte)) {
		c := newContainer(t, a)
		s := newStore(t, azstore.Config{
			Account: aztest.Account, Container: c, Prefix: "root/dir", Endpoint: a.Endpoint,
		})
		// A sibling outside the prefix must never show up.
		a.Put(t, c, "root/elsewhere/model.safetensors", []byte("x"))
		return s, func(key string, data []byte) { a.Put(t, c, "root/dir/"+key, data) }
	}})
}

func TestAzureFaults(t *testing.T) {
	a := aztest.Start(t)
	faultproxy.RunMatrix(t, faultproxy.Harness{
		CreateBucket: func(t *testing.T, c string) { a.CreateContainer(t, c) },
		DeleteBucket: func(t *testing.T, c string) { a.DeleteContainer(t, c) },
		Put:          func(t *testing.T, c, key string, data []byte) { a.Put(t, c, key, data) },
		NewProxy:     a.NewProxy,
		Store: func(t *testing.T, root, c string, readTimeout, retryBudget time.Duration) store.Store {
			return newStore(t, azstore.Config{Account: aztest.Account, Container: c, Endpoint: aztest.EndpointAt(root),
				Tunables: objstore.Tunables{ReadTimeout: readTimeout, RetryBudget: retryBudget}})
		},
	})
}

func TestAzureWrongKeyIsPermissionDenied(t *testing.T) {
	a := aztest.Start(t)
	c := newContainer(t, a)
	a.Put(t, c, "m/model.safetensors", []byte("data"))
	const wrong = "bm90LXRoZS1yaWdodC1rZXktMDEyMzQ1Njc4OWFiY2RlZg=="
	t.Setenv(azstore.EnvAccountKey, wrong)
	s := newStore(t, azstore.Config{
		Account: aztest.Account, Container: c, Endpoint: a.Endpoint, Tunables: objstore.Tunables{RetryBudget: time.Second},
	})
	for _, err := range []error{
		s.ReadAt(context.Background(), "m/model.safetensors", "", make([]byte, 4), 0),
		s.Check(context.Background()),
	} {
		if !errors.Is(err, store.ErrPermissionDenied) || strings.Contains(err.Error(), wrong) {
			t.Errorf("%v: want ErrPermissionDenied, without the key", err)
		}
	}
	if _, err := s.Stat(context.Background(), "m/model.safetensors"); !errors.Is(err, store.ErrPermissionDenied) {
		t.Errorf("Stat: %v, want ErrPermissionDenied", err)
	}
}

func TestAzureConnectionString(t *testing.T) {
	a := aztest.Start(t)
	c := newContainer(t, a)
	a.Put(t, c, "m/model.safetensors", []byte("data"))
	cs := "DefaultEndpointsProtocol=http;AccountName=" + aztest.Account + ";AccountKey=" + aztest.AccountKey +
		";BlobEndpoint=" + a.Endpoint + ";"
	t.Setenv(azstore.EnvConnectionString, cs)
	t.Setenv(azstore.EnvAccountKey, "")
	s := newStore(t, azstore.Config{Account: aztest.Account, Container: c})
	if info, err := s.Stat(context.Background(), "m/model.safetensors"); err != nil || info.Size != 4 {
		t.Errorf("Stat = %+v, %v", info, err)
	}
	if _, err := azstore.New(context.Background(), azstore.Config{Account: "other", Container: c}); err == nil {
		t.Error("a connection string for another account was taken")
	}
	cfg := azstore.Config{Account: aztest.Account, Container: c, Endpoint: a.Endpoint}
	if _, err := azstore.New(context.Background(), cfg); err == nil {
		t.Error("an endpoint in both the flag and the connection string was taken")
	}
}

func TestSetURL(t *testing.T) {
	for in, want := range map[string][3]string{
		"az://acct/c":        {"acct", "c", ""},
		"az://acct/c/p/q/":   {"acct", "c", "p/q"},
		"az://acct/c/models": {"acct", "c", "models"},
	} {
		var c azstore.Config
		if err := c.SetURL(in); err != nil || c.Account != want[0] || c.Container != want[1] || c.Prefix != want[2] {
			t.Errorf("SetURL(%q) = %q %q %q %v", in, c.Account, c.Container, c.Prefix, err)
		}
	}
	for _, in := range []string{"az://", "az://acct", "az://acct/", "az:///c/p", "gs://b/p", "acct/c"} {
		if err := new(azstore.Config).SetURL(in); err == nil {
			t.Errorf("SetURL(%q) accepted", in)
		}
	}
}
