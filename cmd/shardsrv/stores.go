package main

import (
	"context"
	"fmt"
	"strings"

	"github.com/shardsrv/shardsrv/internal/azstore"
	"github.com/shardsrv/shardsrv/internal/gcsstore"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/store"
)

// objectStores are the object stores --store names by URL scheme: each parses its URL into its
// config and opens the store. Object stores get the planner's and the cache's object-store
// defaults (serve -h lists them); anything else is a local directory.
var objectStores = []struct {
	scheme string // with "://"
	url    string // the form --store takes, for messages
	parse  func(c *config) error
	open   func(ctx context.Context, c *config) (store.Store, error)
}{
	{
		scheme: "s3://", url: "s3://BUCKET/PREFIX",
		parse: func(c *config) (err error) {
			c.s3.Bucket, c.s3.Prefix, err = s3reader.ParseURL(c.store)
			return err
		},
		open: func(ctx context.Context, c *config) (store.Store, error) { return s3reader.New(ctx, c.s3) },
	},
	{
		scheme: "gs://", url: "gs://BUCKET/PREFIX",
		parse: func(c *config) (err error) {
			c.gcs.Bucket, c.gcs.Prefix, err = gcsstore.ParseURL(c.store)
			return err
		},
		open: func(ctx context.Context, c *config) (store.Store, error) { return gcsstore.New(ctx, c.gcs) },
	},
	{
		scheme: "az://", url: "az://ACCOUNT/CONTAINER/PREFIX",
		parse: func(c *config) (err error) {
			c.azure.Account, c.azure.Container, c.azure.Prefix, err = azstore.ParseURL(c.store)
			return err
		},
		open: func(ctx context.Context, c *config) (store.Store, error) { return azstore.New(ctx, c.azure) },
	},
}

// isObjectStore reports whether a --store value names an object store.
func isObjectStore(url string) bool {
	for _, o := range objectStores {
		if strings.HasPrefix(url, o.scheme) {
			return true
		}
	}
	return false
}

// storeForms lists what --store takes, for help and messages.
func storeForms() string {
	forms := []string{"DIR", "file://DIR"}
	for _, o := range objectStores {
		forms = append(forms, o.url)
	}
	return strings.Join(forms, "|")
}

// parseStoreURL fills the object store's config from --store; a directory needs nothing.
func parseStoreURL(c *config) error {
	for _, o := range objectStores {
		if strings.HasPrefix(c.store, o.scheme) {
			return o.parse(c)
		}
	}
	return nil
}

// openStore opens what --store names.
func openStore(ctx context.Context, c *config) (store.Store, error) {
	for _, o := range objectStores {
		if strings.HasPrefix(c.store, o.scheme) {
			return o.open(ctx, c)
		}
	}
	dir, isFile := strings.CutPrefix(c.store, "file://")
	if !isFile && strings.Contains(c.store, "://") {
		return nil, fmt.Errorf("--store %q: use one of %s", c.store, storeForms())
	}
	return store.NewLocal(dir)
}
