package main

import (
	"context"
	"flag"
	"fmt"
	"strings"

	"github.com/shardsrv/shardsrv/internal/azstore"
	"github.com/shardsrv/shardsrv/internal/gcsstore"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/store"
)

// objectStoreConfig is one object store's part of the configuration: its flags and their
// validation, what --store's URL sets (the bucket, the prefix), and how the store opens.
type objectStoreConfig interface {
	RegisterFlags(fs *flag.FlagSet)
	Validate() error
	SetURL(url string) error
	Open(ctx context.Context) (store.Store, error)
}

// objectStores are the object stores --store takes, one entry each: the URL form, whose scheme
// picks the store, and a fresh config. Every command that opens a --store or a checkpoint folder
// (serve, fetch, sign, verify) opens it through this table. Object stores get the planner's and
// the cache's object-store defaults (serve -h lists them); anything else is a local directory.
var objectStores = []struct {
	form   string
	config func() objectStoreConfig
	// readBytes is the store's own segment and read size, where it is not the object stores'
	// (planner.ObjectStoreOptions); 0 for none.
	readBytes int64
}{
	{"s3://BUCKET/PREFIX", func() objectStoreConfig { return new(s3reader.Config) }, 0},
	{"gs://BUCKET/PREFIX", func() objectStoreConfig { return new(gcsstore.Config) }, 0},
	{"az://ACCOUNT/CONTAINER/PREFIX", func() objectStoreConfig { return new(azstore.Config) }, azstore.ReadBytes},
}

// newObjectStoreConfigs returns a fresh config of every object store, in the table's order.
func newObjectStoreConfigs() []objectStoreConfig {
	configs := make([]objectStoreConfig, len(objectStores))
	for i, o := range objectStores {
		configs[i] = o.config()
	}
	return configs
}

// objectStoreOf is the index in objectStores of the store url names, -1 for none.
func objectStoreOf(url string) int {
	for i, o := range objectStores {
		scheme, _, _ := strings.Cut(o.form, "://")
		if strings.HasPrefix(url, scheme+"://") {
			return i
		}
	}
	return -1
}

// isObjectStore reports whether a --store value names an object store.
func isObjectStore(url string) bool { return objectStoreOf(url) >= 0 }

// ownReadSizes says, for serve -h, which stores read in their own size and with which defaults.
func ownReadSizes() string {
	var own []string
	for _, o := range objectStores {
		if o.readBytes > 0 {
			scheme, _, _ := strings.Cut(o.form, "://")
			own = append(own, "; "+scheme+":// also "+defaultsBeside(anyObjectStore, scheme+"://"))
		}
	}
	return strings.Join(own, "")
}

// storeForms lists what --store takes, for help and messages.
func storeForms() string {
	forms := []string{"DIR", "file://DIR"}
	for _, o := range objectStores {
		forms = append(forms, o.form)
	}
	return strings.Join(forms, "|")
}

// parseStoreURL sets the object store's config from --store; a directory needs nothing.
func parseStoreURL(c *config) error {
	if i := objectStoreOf(c.store); i >= 0 {
		return c.objectStores[i].SetURL(c.store)
	}
	return nil
}

// openStore opens what --store names.
func openStore(ctx context.Context, c *config) (store.Store, error) {
	if i := objectStoreOf(c.store); i >= 0 {
		return c.objectStores[i].Open(ctx)
	}
	dir, isFile := strings.CutPrefix(c.store, "file://")
	if !isFile && strings.Contains(c.store, "://") {
		return nil, fmt.Errorf("--store %q: use one of %s", c.store, storeForms())
	}
	return store.NewLocal(dir)
}
