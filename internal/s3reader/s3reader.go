// Package s3reader is the store over S3 and S3-compatible object stores (MinIO, Ceph, versitygw):
// ranged GetObject with the version the catalog saw sent as If-Match on every read, a connection
// pool sized for the fan-out, a cap on reads in flight, and retries with backoff and jitter that
// resume a broken body where it stopped. It passes the store conformance suite.
package s3reader

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Config says which bucket to read and how hard to try.
type Config struct {
	Bucket string
	Prefix string // key prefix, without a trailing slash
	// Endpoint is a custom endpoint (S3-compatible stores); when set, addressing is path-style.
	// Empty: AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then AWS's own.
	Endpoint string
	Region   string // empty: from the standard chain (AWS_REGION, profile), else us-east-1
	// MaxInFlight caps concurrent requests to the store; the connection pool keeps as many idle.
	MaxInFlight int
	// ReadTimeout bounds one attempt of one read, headers and body.
	ReadTimeout time.Duration
	// RetryBudget bounds the time one read spends on retries.
	RetryBudget time.Duration
}

// The defaults of the tunables, for flags and for a Config left at zero.
const (
	DefaultMaxInFlight = 64
	DefaultReadTimeout = 30 * time.Second
	DefaultRetryBudget = 60 * time.Second
)

// RegisterFlags registers the S3 flags on fs, with their defaults. Bucket and Prefix come from the
// store URL (ParseURL).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "s3-endpoint", "",
		"S3-compatible endpoint `URL` (path-style addressing); default AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, then AWS")
	fs.StringVar(
		&c.Region,
		"s3-region",
		"",
		"S3 region; default from the AWS chain (AWS_REGION, profile), else us-east-1",
	)
	fs.IntVar(&c.MaxInFlight, "s3-max-in-flight", DefaultMaxInFlight,
		"most S3 requests in flight across all streams; the connection pool keeps as many idle")
	fs.DurationVar(&c.ReadTimeout, "s3-read-timeout", DefaultReadTimeout,
		"time one attempt of one S3 read may take, headers and body")
	fs.DurationVar(&c.RetryBudget, "s3-retry-budget", DefaultRetryBudget,
		"time one S3 read may spend retrying 5xx, SlowDown, resets and broken bodies")
}

// Validate reports the settings no store can run with.
func (c *Config) Validate() error {
	if c.MaxInFlight < 1 || c.ReadTimeout <= 0 || c.RetryBudget <= 0 {
		return errors.New("--s3-max-in-flight, --s3-read-timeout and --s3-retry-budget must be positive")
	}
	return nil
}

// ParseURL reads s3://BUCKET/PREFIX.
func ParseURL(raw string) (bucket, prefix string, err error) {
	rest, ok := strings.CutPrefix(raw, "s3://")
	if !ok || rest == "" {
		return "", "", fmt.Errorf("%q is not s3://BUCKET[/PREFIX]", raw)
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
	client *s3.Client
	slots  chan struct{}
	name   string
}

var _ store.Store = (*Store)(nil)

// New builds a store; credentials and region come from the standard AWS chain (environment,
// shared profile, web identity for IRSA).
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = DefaultMaxInFlight
	}
	if cfg.ReadTimeout <= 0 {
		cfg.ReadTimeout = DefaultReadTimeout
	}
	if cfg.RetryBudget <= 0 {
		cfg.RetryBudget = DefaultRetryBudget
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = firstEnv("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL")
	}
	httpClient := awshttp.NewBuildableClient().WithTransportOptions(func(t *http.Transport) {
		t.MaxIdleConns = 2 * cfg.MaxInFlight
		t.MaxIdleConnsPerHost = cfg.MaxInFlight
		t.IdleConnTimeout = 90 * time.Second
	}).WithDialerOptions(func(d *net.Dialer) { d.Timeout = 10 * time.Second })
	opts := []func(*config.LoadOptions) error{
		config.WithHTTPClient(httpClient),
		config.WithRetryMaxAttempts(1), // this package retries, resuming bodies where they broke
	}
	if cfg.Region != "" {
		opts = append(opts, config.WithRegion(cfg.Region))
	}
	awsCfg, err := config.LoadDefaultConfig(ctx, opts...)
	if err != nil {
		return nil, fmt.Errorf("s3 store: loading AWS configuration: %w", err)
	}
	if awsCfg.Region == "" {
		awsCfg.Region = "us-east-1"
	}
	client := s3.NewFromConfig(awsCfg, func(o *s3.Options) {
		if cfg.Endpoint != "" {
			o.BaseEndpoint = aws.String(cfg.Endpoint)
			o.UsePathStyle = true
		}
		// Ranged reads of objects uploaded in parts carry no whole-object checksum to validate.
		o.ResponseChecksumValidation = aws.ResponseChecksumValidationWhenRequired
	})
	name := "s3://" + cfg.Bucket
	if cfg.Prefix != "" {
		name += "/" + cfg.Prefix
	}
	if cfg.Endpoint != "" {
		name += " at " + redact(cfg.Endpoint)
	}
	return &Store{cfg: cfg, client: client, slots: make(chan struct{}, cfg.MaxInFlight), name: name}, nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// redact drops user info from an endpoint URL so no secret reaches a log line.
func redact(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "(unparsable endpoint)"
	}
	u.User = nil
	return u.String()
}

func (s *Store) String() string { return "S3 store " + s.name }

func (s *Store) key(key string) string {
	if s.cfg.Prefix == "" {
		return key
	}
	return s.cfg.Prefix + "/" + key
}

// acquire takes one of the store's request slots.
func (s *Store) acquire(ctx context.Context) error {
	select {
	case s.slots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (s *Store) release() { <-s.slots }

// Stat implements store.Store.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Info{}, err
	}
	var info store.Info
	err := s.retry(ctx, key, func(ctx context.Context) (bool, error) {
		out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.cfg.Bucket, Key: aws.String(s.key(key))})
		if err != nil {
			return false, err
		}
		info = store.Info{Size: aws.ToInt64(out.ContentLength), Version: aws.ToString(out.ETag)}
		return true, nil
	})
	return info, err
}

// ReadAt implements store.Store. A body that breaks off is resumed from where it stopped.
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	if off < 0 {
		return fmt.Errorf("%s: %q: %w: negative offset", s, key, store.ErrOutOfRange)
	}
	done := 0
	return s.retry(ctx, key, func(ctx context.Context) (bool, error) {
		start := off + int64(done)
		in := &s3.GetObjectInput{Bucket: &s.cfg.Bucket, Key: aws.String(s.key(key)),
			Range: aws.String(fmt.Sprintf("bytes=%d-%d", start, off+int64(len(p))-1))}
		if version != "" {
			in.IfMatch = aws.String(version)
		}
		out, err := s.client.GetObject(ctx, in)
		if err != nil {
			return false, err
		}
		defer drain(out.Body)
		if version != "" && out.ETag != nil && *out.ETag != version {
			return false, fmt.Errorf("%s: %q: %w (ETag %s, expected %s)", s, key, store.ErrChanged, *out.ETag, version)
		}
		if want := int64(len(p) - done); aws.ToInt64(out.ContentLength) != want {
			// A store that ignores or trims the range: the object is shorter than the read.
			return false, fmt.Errorf(
				"%s: %q: %w: asked for %d bytes at %d, got %d",
				s,
				key,
				store.ErrOutOfRange,
				want,
				start,
				aws.ToInt64(out.ContentLength),
			)
		}
		n, err := io.ReadFull(out.Body, p[done:])
		done += n
		if err != nil {
			return false, &bodyError{err: err, got: n}
		}
		return true, nil
	})
}

// drain reads what is left of a body (a little) so the connection goes back to the pool.
func drain(body io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	body.Close()
}

// bodyError is a body that broke off: always worth resuming.
type bodyError struct {
	err error
	got int
}

func (e *bodyError) Error() string {
	return fmt.Sprintf("the body broke off after %d bytes: %v", e.got, e.err)
}

func (e *bodyError) Unwrap() error { return e.err }

// List implements store.Store.
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
	var keys []string
	pages := s3.NewListObjectsV2Paginator(
		s.client,
		&s3.ListObjectsV2Input{Bucket: &s.cfg.Bucket, Prefix: aws.String(full)},
	)
	for pages.HasMorePages() {
		var page *s3.ListObjectsV2Output
		err := s.retry(ctx, prefix, func(ctx context.Context) (bool, error) {
			var err error
			page, err = pages.NextPage(ctx)
			return err == nil, err
		})
		if err != nil {
			return nil, err
		}
		for _, o := range page.Contents {
			k := strings.TrimPrefix(aws.ToString(o.Key), s.cfg.Prefix+"/")
			if s.cfg.Prefix == "" {
				k = aws.ToString(o.Key)
			}
			if store.ValidateKey(k) == nil {
				keys = append(keys, k)
			}
		}
	}
	sort.Strings(keys)
	return keys, nil
}

// Check implements store.Store: the bucket answers.
func (s *Store) Check(ctx context.Context) error {
	_, err := s.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &s.cfg.Bucket})
	if status(err) == http.StatusNotFound {
		return fmt.Errorf("%s: the bucket %q does not exist", s, s.cfg.Bucket)
	}
	if err != nil {
		return s.mapErr("", err)
	}
	return nil
}

// retry runs one attempt at a time, each under ReadTimeout and one request slot, and tries again
// with full-jitter backoff while the error is transient and the retry budget lasts.
func (s *Store) retry(ctx context.Context, key string, attempt func(context.Context) (bool, error)) error {
	deadline := time.Now().Add(s.cfg.RetryBudget)
	backoff := 50 * time.Millisecond
	for n := 1; ; n++ {
		if err := s.acquire(ctx); err != nil {
			return err
		}
		actx, cancel := context.WithTimeout(ctx, s.cfg.ReadTimeout)
		ok, err := attempt(actx)
		timedOut := actx.Err() == context.DeadlineExceeded
		cancel()
		s.release()
		if ok {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if timedOut && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
		}
		if !transient(err) || time.Now().Add(backoff).After(deadline) {
			if n > 1 {
				err = fmt.Errorf("after %d attempts: %w", n, err)
			}
			return s.mapErr(key, err)
		}
		sleep := time.Duration(rand.Int64N(int64(backoff)))
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func status(err error) int {
	var re *awshttp.ResponseError
	if errors.As(err, &re) {
		return re.HTTPStatusCode()
	}
	return 0
}

func code(err error) string {
	var ae smithy.APIError
	if errors.As(err, &ae) {
		return ae.ErrorCode()
	}
	return ""
}

// sdkRetryable is the SDK's own classification of retryable errors: 500/502/503/504, 429,
// throttling and time-out codes, connections reset or refused — but not a host that does not
// resolve, or a request the caller cancelled.
var sdkRetryable = retry.NewStandard()

// transient reports errors worth another attempt: what the SDK retries, S3's SlowDown, an attempt
// that timed out, and a body that broke off (which this package resumes).
func transient(err error) bool {
	var be *bodyError
	switch {
	case err == nil:
		return false
	case errors.As(err, &be), errors.Is(err, context.DeadlineExceeded), code(err) == "SlowDown":
		return true
	}
	return sdkRetryable.IsErrorRetryable(err)
}

// mapErr turns S3 errors into the store's sentinels, naming the store and never a credential.
func (s *Store) mapErr(key string, err error) error {
	what := s.String()
	if key != "" {
		what += fmt.Sprintf(": %q", key)
	}
	switch st, c := status(err), code(err); {
	case errors.Is(err, store.ErrChanged), errors.Is(err, store.ErrOutOfRange):
		return err
	case st == http.StatusPreconditionFailed || c == "PreconditionFailed":
		return fmt.Errorf("%s: %w (the object was replaced)", what, store.ErrChanged)
	case st == http.StatusRequestedRangeNotSatisfiable || c == "InvalidRange":
		return fmt.Errorf("%s: %w", what, store.ErrOutOfRange)
	case c == "NoSuchBucket":
		return fmt.Errorf("%s: the bucket %q does not exist", s, s.cfg.Bucket)
	case st == http.StatusNotFound || c == "NoSuchKey" || c == "NotFound":
		return fmt.Errorf("%s: %w", what, store.ErrNotFound)
	case st == http.StatusForbidden || c == "AccessDenied" || c == "InvalidAccessKeyId" || c == "SignatureDoesNotMatch":
		return fmt.Errorf(
			"%s: %w (%s): check the credentials and the bucket policy",
			what,
			store.ErrPermissionDenied,
			firstNonEmpty(c, "403"),
		)
	case errors.Is(err, context.DeadlineExceeded):
		return fmt.Errorf("%s: %w", what, err)
	case st == http.StatusServiceUnavailable || c == "SlowDown" || st == http.StatusTooManyRequests:
		return fmt.Errorf("%s: %w: %v", what, store.ErrUnavailable, err)
	}
	return fmt.Errorf("%s: %w", what, err)
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
