// Package gcsstore is the store over Google Cloud Storage, an objstore backend: every ranged read
// is conditional on the object generation the catalog saw, so a replaced object fails instead of
// mixing versions; errors are retried by the SDK's own classification (storage.ShouldRetry).
// Credentials are Application Default Credentials (Workload Identity on GKE); an emulator needs
// none. objstore does the rest; it passes the store conformance suite.
package gcsstore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"

	"cloud.google.com/go/auth"
	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
)

// Config says which bucket to read and how hard to try; tunables left at zero take their defaults
// (objstore.Tunables).
type Config struct {
	Bucket string
	Prefix string // object name prefix, without a trailing slash
	// Endpoint is an emulator's URL (fake-gcs-server), reached without credentials. Empty:
	// STORAGE_EMULATOR_HOST, else Google Cloud Storage with Application Default Credentials.
	Endpoint string
	objstore.Tunables
}

// RegisterFlags registers the GCS flags on fs, with their defaults. Bucket and Prefix come from
// the store URL (SetURL).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "gcs-endpoint", "",
		"GCS emulator `URL`, reached without credentials; default STORAGE_EMULATOR_HOST, else GCS with "+
			"Application Default Credentials")
	c.Tunables.RegisterFlags(fs, "gcs", "GCS")
}

// Validate reports the settings no store can run with: negative tunables; zero ones take the
// defaults.
func (c *Config) Validate() error { return c.Tunables.Validate("gcs") }

// SetURL takes Bucket and Prefix from a --store URL, gs://BUCKET[/PREFIX].
func (c *Config) SetURL(raw string) error {
	names, prefix, err := objstore.ParseURL(raw, "gs://BUCKET[/PREFIX]")
	if err != nil {
		return err
	}
	c.Bucket, c.Prefix = names[0], prefix
	return nil
}

// Open opens the store c configures (New).
func (c *Config) Open(ctx context.Context) (store.Store, error) { return New(ctx, *c) }

// New builds a store. Reads use the JSON API, as the SDK recommends; the SDK's own retries are
// off, since objstore retries and resumes under one budget.
func New(ctx context.Context, cfg Config) (*objstore.Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	opts := []option.ClientOption{storage.WithJSONReads()}
	emulator := cfg.Endpoint
	if emulator != "" {
		opts = append(opts, option.WithoutAuthentication(),
			option.WithEndpoint(strings.TrimSuffix(emulator, "/")+"/storage/v1/"))
	} else {
		emulator = os.Getenv("STORAGE_EMULATOR_HOST") // the SDK reads it itself
	}
	client, err := storage.NewClient(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("gcs store: %w", err)
	}
	client.SetRetry(storage.WithPolicy(storage.RetryNever))
	b := &bucket{handle: client.Bucket(cfg.Bucket), name: cfg.Bucket, prefix: cfg.Prefix}
	return objstore.New(b, objstore.Config{Kind: "GCS", Bucket: "gs://" + cfg.Bucket, Prefix: cfg.Prefix,
		Endpoint: emulator, Tunables: cfg.Tunables}), nil
}

// bucket is the objstore.Backend over one GCS bucket.
type bucket struct {
	handle       *storage.BucketHandle
	name, prefix string
}

// Head implements objstore.Backend; the version is the object's generation.
func (b *bucket) Head(ctx context.Context, name string) (store.Info, error) {
	attrs, err := b.handle.Object(name).Attrs(ctx)
	if err != nil {
		return store.Info{}, err
	}
	return store.Info{Size: attrs.Size, Version: strconv.FormatInt(attrs.Generation, 10)}, nil
}

// Open implements objstore.Backend: a ranged read conditional on the generation in version.
func (b *bucket) Open(ctx context.Context, name, version string, off, n int64) (io.ReadCloser, int64, error) {
	obj := b.handle.Object(name)
	var gen int64
	if version != "" {
		var err error
		if gen, err = strconv.ParseInt(version, 10, 64); err != nil || gen <= 0 {
			return nil, 0, fmt.Errorf("%w: %q is no generation", store.ErrChanged, version)
		}
		obj = obj.If(storage.Conditions{GenerationMatch: gen})
	}
	r, err := obj.NewRangeReader(ctx, off, n)
	if err != nil {
		return nil, 0, err
	}
	// An emulator that ignores the condition must not hand over another generation's bytes.
	if gen != 0 && r.Attrs.Generation > 0 && r.Attrs.Generation != gen {
		r.Close()
		return nil, 0, fmt.Errorf("%w (generation %d, expected %d)", store.ErrChanged, r.Attrs.Generation, gen)
	}
	return r, r.Remain(), nil
}

// List implements objstore.Backend: one page of 1,000 names.
func (b *bucket) List(ctx context.Context, prefix, token string) ([]string, string, error) {
	q := &storage.Query{Prefix: prefix}
	if err := q.SetAttrSelection([]string{"Name"}); err != nil {
		return nil, "", err
	}
	var page []*storage.ObjectAttrs
	next, err := iterator.NewPager(b.handle.Objects(ctx, q), 1000, token).NextPage(&page)
	if err != nil {
		return nil, "", err
	}
	names := make([]string, len(page))
	for i, o := range page {
		names[i] = o.Name
	}
	return names, next, nil
}

// Check implements objstore.Backend: the bucket answers a listing of the prefix, which a reader's
// role (storage.objects.list) allows where reading the bucket's metadata may not.
func (b *bucket) Check(ctx context.Context) error {
	q := &storage.Query{Prefix: b.prefix}
	if err := q.SetAttrSelection([]string{"Name"}); err != nil {
		return err
	}
	it := b.handle.Objects(ctx, q)
	it.PageInfo().MaxSize = 1
	if _, err := it.Next(); err != nil && err != iterator.Done {
		return err
	}
	return nil
}

// Transient implements objstore.Backend by the SDK's own classification.
func (b *bucket) Transient(err error) bool { return storage.ShouldRetry(err) }

// Classify implements objstore.Backend.
func (b *bucket) Classify(err error) error {
	var ge *googleapi.Error
	code := 0
	if errors.As(err, &ge) {
		code = ge.Code
	}
	var ae *auth.Error
	switch {
	case errors.Is(err, storage.ErrBucketNotExist):
		return fmt.Errorf("%w: the bucket %q does not exist", store.ErrNoBucket, b.name)
	case code == http.StatusPreconditionFailed:
		return fmt.Errorf("%w (the object was replaced)", store.ErrChanged)
	case code == http.StatusRequestedRangeNotSatisfiable:
		return store.ErrOutOfRange
	case errors.Is(err, storage.ErrObjectNotExist), code == http.StatusNotFound:
		return store.ErrNotFound
	case code == http.StatusUnauthorized, code == http.StatusForbidden:
		return fmt.Errorf("%w (%d): check the credentials and the bucket's IAM policy", store.ErrPermissionDenied, code)
	case errors.As(err, &ae) && ae.Response != nil && ae.Response.StatusCode < 500:
		return fmt.Errorf("%w: the token endpoint refused the credentials: %v", store.ErrPermissionDenied, err)
	case code == http.StatusTooManyRequests, code == http.StatusServiceUnavailable:
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	return err
}
