package objstore

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/url"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Backend is one object store's SDK over one bucket: what Store cannot know. Names are whole
// object names, the prefix included; errors are the SDK's own, which Store runs through Transient
// and Classify.
type Backend interface {
	// Head returns an object's size and version (an ETag, a generation).
	Head(ctx context.Context, name string) (store.Info, error)
	// Open opens a ranged body of n bytes at off, pinned to version unless it is empty, and says
	// how long the body is (its Content-Length, -1 when unknown). An object of another version
	// is store.ErrChanged, also from a store that ignored the condition and sent it anyway.
	Open(ctx context.Context, name, version string, off, n int64) (body io.ReadCloser, length int64, err error)
	// List returns one page of the names under prefix, from the page token ("" for the first),
	// and the next page's token, "" after the last page.
	List(ctx context.Context, prefix, token string) (names []string, next string, err error)
	// Check asks, in one request a reader's role allows, whether the bucket answers; a bucket
	// that does not exist is store.ErrNoBucket.
	Check(ctx context.Context) error
	// Transient reports errors worth another attempt, by the SDK's own classification where it has
	// one (throttling, 5xx, resets). Attempts that timed out and bodies that broke off are
	// retried regardless.
	Transient(err error) bool
	// Classify wraps an SDK error in the store sentinel it stands for, with a short reason, and
	// never with a credential; errors that stand for none are returned as they are. Errors that
	// already wrap a sentinel are not asked about.
	Classify(err error) error
}

// Tunables are how hard a store tries, the same for every object store: each is a flag,
// --NAME-max-in-flight, --NAME-read-timeout and --NAME-retry-budget. A field left at zero takes
// its default, which is its flag's; Validate refuses only negatives.
type Tunables struct {
	// MaxInFlight caps concurrent requests to the store; the connection pool keeps as many idle
	// (zero: 64).
	MaxInFlight int
	// ReadTimeout bounds one attempt of one request, headers and body (zero: 30 s).
	ReadTimeout time.Duration
	// RetryBudget bounds the time one operation spends on retries (zero: 60 s).
	RetryBudget time.Duration
}

// RegisterFlags registers the tunables of store name on fs, with the defaults; title names the
// store in the help texts.
func (t *Tunables) RegisterFlags(fs *flag.FlagSet, name, title string) {
	fs.IntVar(&t.MaxInFlight, name+"-max-in-flight", defaultMaxInFlight,
		"most "+title+" requests in flight across all streams")
	fs.DurationVar(&t.ReadTimeout, name+"-read-timeout", defaultReadTimeout,
		"time one attempt of one "+title+" read may take, headers and body")
	fs.DurationVar(&t.RetryBudget, name+"-retry-budget", defaultRetryBudget,
		"time one "+title+" read may spend retrying 5xx, throttling, resets and broken bodies")
}

// Validate reports tunables no default mends (negatives), naming the flags of store name.
func (t Tunables) Validate(name string) error {
	if t.MaxInFlight < 0 || t.ReadTimeout < 0 || t.RetryBudget < 0 {
		return fmt.Errorf("--%[1]s-max-in-flight, --%[1]s-read-timeout and --%[1]s-retry-budget must not be negative", name)
	}
	return nil
}

// WithDefaults is t with the defaults where it is zero.
func (t Tunables) WithDefaults() Tunables {
	if t.MaxInFlight == 0 {
		t.MaxInFlight = defaultMaxInFlight
	}
	if t.ReadTimeout == 0 {
		t.ReadTimeout = defaultReadTimeout
	}
	if t.RetryBudget == 0 {
		t.RetryBudget = defaultRetryBudget
	}
	return t
}

// Config is one bucket as the store's messages name it, and its tunables.
type Config struct {
	// Kind is the store's kind in its name: "S3".
	Kind string
	// Bucket is the bucket as --store names it, without the prefix: s3://BUCKET,
	// az://ACCOUNT/CONTAINER.
	Bucket string
	// Prefix is the folder keys are under, without slashes at either end ("" for the root).
	Prefix string
	// Endpoint is where the store is reached, when it is not the provider's own: shown in the
	// name without user info or query (a SAS).
	Endpoint string
	Tunables
}

// Store is the store.Store over a Backend: key validation, the prefix, listing page by page,
// the name, and the read path (slots, timeouts, retries, resumed bodies). Safe for concurrent
// use.
type Store struct {
	b      Backend
	prefix string // with its trailing slash, or ""
	name   string
	reader *reader
}

var _ store.Store = (*Store)(nil)

// New builds the store over b; tunables left at zero take the defaults. It panics on tunables
// Validate refuses: a backend's New validates them first and returns the error.
func New(b Backend, cfg Config) *Store {
	if err := cfg.Tunables.Validate(strings.ToLower(cfg.Kind)); err != nil {
		panic(err)
	}
	name := cfg.Kind + " store " + cfg.Bucket
	if cfg.Prefix != "" {
		name += "/" + cfg.Prefix
	}
	if cfg.Endpoint != "" {
		name += " at " + redact(cfg.Endpoint)
	}
	s := &Store{b: b, name: name}
	if cfg.Prefix != "" {
		s.prefix = cfg.Prefix + "/"
	}
	s.reader = newReader(readerConfig{name: name, Tunables: cfg.Tunables, transient: b.Transient,
		classify: s.classify})
	return s
}

// ParseURL reads a --store URL of the given form: its scheme, the names it must have, then an
// optional prefix (s3://BUCKET[/PREFIX], az://ACCOUNT/CONTAINER[/PREFIX]).
func ParseURL(raw, form string) (names []string, prefix string, err error) {
	scheme, shape, _ := strings.Cut(form, "://")
	shape, _, _ = strings.Cut(shape, "[")
	n := strings.Count(shape, "/") + 1
	rest, ok := strings.CutPrefix(raw, scheme+"://")
	names = strings.SplitN(rest, "/", n+1)
	if !ok || len(names) < n || slices.Contains(names[:n], "") {
		return nil, "", fmt.Errorf("%q is not %s", raw, form)
	}
	if len(names) > n {
		prefix = strings.Trim(names[n], "/")
	}
	return names[:n], prefix, nil
}

// redact drops user info and the query (a SAS) from an endpoint so no secret reaches a log line.
// A bare host:port, as STORAGE_EMULATOR_HOST may be, is shown as it is.
func redact(endpoint string) string {
	if !strings.Contains(endpoint, "://") {
		_, host, found := strings.Cut(endpoint, "@")
		if found {
			return host
		}
		return endpoint
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "(unparsable endpoint)"
	}
	u.User, u.RawQuery = nil, ""
	return u.String()
}

func (s *Store) String() string { return s.name }

// object is the name of key's object.
func (s *Store) object(key string) string { return s.prefix + key }

// classify leaves errors that already stand for a sentinel (or for a deadline) as they are and
// asks the backend about the rest.
func (s *Store) classify(err error) error {
	for _, e := range []error{store.ErrNotFound, store.ErrOutOfRange, store.ErrChanged, store.ErrInvalidKey,
		store.ErrUnavailable, store.ErrPermissionDenied, store.ErrNoBucket, context.DeadlineExceeded} {
		if errors.Is(err, e) {
			return err
		}
	}
	return s.b.Classify(err)
}

// Stat implements store.Store. A missing bucket is ErrNotFound, as on every store
// (store.ErrNoBucket).
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Info{}, err
	}
	var info store.Info
	err := s.reader.do(ctx, key, func(ctx context.Context) error {
		var err error
		info, err = s.b.Head(ctx, s.object(key))
		return err
	})
	if errors.Is(err, store.ErrNoBucket) {
		return store.Info{}, fmt.Errorf("%w: %v", store.ErrNotFound, err)
	}
	return info, err
}

// ReadAt implements store.Store: ranged reads pinned to version, resumed where a body broke off.
// Not every store's read says that the bucket is missing rather than the object (GCS's does not),
// so a read that finds nothing asks the bucket once whether it is there.
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	name := s.object(key)
	err := s.reader.readAt(ctx, key, p, off, func(ctx context.Context, off, n int64) (io.ReadCloser, int64, error) {
		return s.b.Open(ctx, name, version, off, n)
	})
	if errors.Is(err, store.ErrNotFound) {
		if cerr := s.Check(ctx); errors.Is(cerr, store.ErrNoBucket) {
			return cerr
		}
	}
	return err
}

// List implements store.Store. Each page is one attempt, resumed from its token; names that are
// no valid key are left out.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	under := s.prefix
	if prefix != "" {
		if err := store.ValidateKey(prefix); err != nil {
			return nil, err
		}
		under = s.object(prefix) + "/"
	}
	var keys []string
	for token := ""; ; {
		var names []string
		err := s.reader.do(ctx, prefix, func(ctx context.Context) error {
			var next string
			var err error
			if names, next, err = s.b.List(ctx, under, token); err == nil {
				token = next
			}
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, name := range names {
			if k, ok := strings.CutPrefix(name, s.prefix); ok && store.ValidateKey(k) == nil {
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

// Check implements store.Store: one request, not retried, so a probe learns at once.
func (s *Store) Check(ctx context.Context) error {
	if err := s.b.Check(ctx); err != nil {
		return s.reader.fail("", err)
	}
	return nil
}
