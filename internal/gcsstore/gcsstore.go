// Package gcsstore is the store over Google Cloud Storage: every ranged read is conditional on the
// object generation the catalog saw, so a replaced object fails instead of mixing versions, and
// objstore's request slots and retries resume a broken body where it stopped. Credentials are
// Application Default Credentials (Workload Identity on GKE); an emulator needs none. It passes
// the store conformance suite.
package gcsstore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"sort"
	"strconv"
	"strings"
	"time"

	"cloud.google.com/go/auth"
	"cloud.google.com/go/storage"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
)

// Config says which bucket to read and how hard to try.
type Config struct {
	Bucket string
	Prefix string // object name prefix, without a trailing slash
	// Endpoint is an emulator's URL (fake-gcs-server), reached without credentials. Empty:
	// STORAGE_EMULATOR_HOST, else Google Cloud Storage with Application Default Credentials.
	Endpoint string
	// MaxInFlight caps concurrent requests to the store.
	MaxInFlight int
	// ReadTimeout bounds one attempt of one read, headers and body.
	ReadTimeout time.Duration
	// RetryBudget bounds the time one read spends on retries.
	RetryBudget time.Duration
}

// RegisterFlags registers the GCS flags on fs, with their defaults. Bucket and Prefix come from
// the store URL (ParseURL).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "gcs-endpoint", "",
		"GCS emulator `URL`, reached without credentials; default STORAGE_EMULATOR_HOST, else GCS with "+
			"Application Default Credentials")
	objstore.RegisterFlags(fs, "gcs", "GCS", &c.MaxInFlight, &c.ReadTimeout, &c.RetryBudget)
}

// Validate reports the settings no store can run with.
func (c *Config) Validate() error {
	return objstore.ValidateFlags("gcs", c.MaxInFlight, c.ReadTimeout, c.RetryBudget)
}

// ParseURL reads gs://BUCKET/PREFIX.
func ParseURL(raw string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(raw, "gs://")
	if !ok || rest == "" {
		return "", "", fmt.Errorf("%q is not gs://BUCKET[/PREFIX]", raw)
	}
	bucket, prefix, _ = strings.Cut(rest, "/")
	prefix = strings.Trim(prefix, "/")
	if bucket == "" {
		return "", "", fmt.Errorf("%q names no bucket", raw)
	}
	return bucket, prefix, nil
}

// Store reads objects of one bucket under a prefix.
type Store struct {
	cfg    Config
	bucket *storage.BucketHandle
	reader *objstore.Reader
	name   string
}

var _ store.Store = (*Store)(nil)

// New builds a store. Reads use the JSON API, as the SDK recommends; the SDK's own retries are
// off, since objstore retries and resumes under one budget.
func New(ctx context.Context, cfg Config) (*Store, error) {
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
	name := "gs://" + cfg.Bucket
	if cfg.Prefix != "" {
		name += "/" + cfg.Prefix
	}
	if emulator != "" {
		name += " at " + emulator
	}
	s := &Store{cfg: cfg, bucket: client.Bucket(cfg.Bucket), name: name}
	s.reader = objstore.NewReader(objstore.ReaderConfig{
		Name:        s.String(),
		MaxInFlight: cfg.MaxInFlight,
		ReadTimeout: cfg.ReadTimeout,
		RetryBudget: cfg.RetryBudget,
		Transient:   storage.ShouldRetry,
		Classify:    s.classify,
	})
	return s, nil
}

func (s *Store) String() string { return "GCS store " + s.name }

func (s *Store) key(key string) string {
	if s.cfg.Prefix == "" {
		return key
	}
	return s.cfg.Prefix + "/" + key
}

// Stat implements store.Store; the version is the object's generation.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Info{}, err
	}
	var info store.Info
	err := s.reader.Do(ctx, key, func(ctx context.Context) error {
		attrs, err := s.bucket.Object(s.key(key)).Attrs(ctx)
		if err != nil {
			return err
		}
		info = store.Info{Size: attrs.Size, Version: strconv.FormatInt(attrs.Generation, 10)}
		return nil
	})
	return info, err
}

// ReadAt implements store.Store: ranged reads conditional on the generation in version, resumed
// where a body broke off. A read of a missing bucket fails as a missing object does, so a read that
// finds nothing asks the bucket once whether it is there.
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	err := s.readAt(ctx, key, version, p, off)
	if errors.Is(err, store.ErrNotFound) {
		if cerr := s.Check(ctx); errors.Is(cerr, store.ErrNoBucket) {
			return cerr
		}
	}
	return err
}

func (s *Store) readAt(ctx context.Context, key, version string, p []byte, off int64) error {
	return s.reader.ReadAt(ctx, key, p, off, func(ctx context.Context, off, n int64) (io.ReadCloser, int64, error) {
		obj := s.bucket.Object(s.key(key))
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
	})
}

// List implements store.Store. Each page is one attempt, resumed from its page token.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	full := s.cfg.Prefix
	if prefix != "" {
		if err := store.ValidateKey(prefix); err != nil {
			return nil, err
		}
		full = s.key(prefix)
	}
	if full != "" {
		full += "/"
	}
	q := &storage.Query{Prefix: full}
	if err := q.SetAttrSelection([]string{"Name"}); err != nil {
		return nil, err
	}
	var keys []string
	for token := ""; ; {
		var page []*storage.ObjectAttrs
		err := s.reader.Do(ctx, prefix, func(ctx context.Context) error {
			page = page[:0]
			next, err := iterator.NewPager(s.bucket.Objects(ctx, q), 1000, token).NextPage(&page)
			if err == nil {
				token = next
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, o := range page {
			k := strings.TrimPrefix(o.Name, s.cfg.Prefix+"/")
			if s.cfg.Prefix == "" {
				k = o.Name
			}
			if store.ValidateKey(k) == nil {
				keys = append(keys, k)
			}
		}
		if token == "" {
			break
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// Check implements store.Store: the bucket answers a listing of the prefix, which a reader's role
// (storage.objects.list) allows where reading the bucket's metadata may not.
func (s *Store) Check(ctx context.Context) error {
	q := &storage.Query{Prefix: s.cfg.Prefix}
	if err := q.SetAttrSelection([]string{"Name"}); err != nil {
		return err
	}
	it := s.bucket.Objects(ctx, q)
	it.PageInfo().MaxSize = 1
	if _, err := it.Next(); err != nil && err != iterator.Done {
		return s.reader.Err("", err)
	}
	return nil
}

// classify turns GCS errors into the store's sentinels.
func (s *Store) classify(err error) error {
	var ge *googleapi.Error
	code := 0
	if errors.As(err, &ge) {
		code = ge.Code
	}
	var ae *auth.Error
	switch {
	case errors.Is(err, store.ErrChanged), errors.Is(err, store.ErrOutOfRange),
		errors.Is(err, context.DeadlineExceeded):
		return err
	case errors.Is(err, storage.ErrBucketNotExist):
		return fmt.Errorf("%w: the bucket %q does not exist", store.ErrNoBucket, s.cfg.Bucket)
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
