// Package s3reader is the store over S3 and S3-compatible object stores (MinIO, Ceph, versitygw):
// ranged GetObject with the version the catalog saw sent as If-Match on every read, a connection
// pool sized for the fan-out, and objread's request slots and retries that resume a broken body
// where it stopped. It passes the store conformance suite.
package s3reader

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
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
	"github.com/shardsrv/shardsrv/internal/store/objread"
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
	objread.RegisterFlags(fs, "s3", "S3", &c.MaxInFlight, &c.ReadTimeout, &c.RetryBudget)
}

// Validate reports the settings no store can run with.
func (c *Config) Validate() error {
	return objread.ValidateFlags("s3", c.MaxInFlight, c.ReadTimeout, c.RetryBudget)
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
	reader *objread.Reader
	name   string
}

var _ store.Store = (*Store)(nil)

// New builds a store; credentials and region come from the standard AWS chain (environment,
// shared profile, web identity for IRSA).
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = objread.DefaultMaxInFlight
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
		config.WithRetryMaxAttempts(1), // objread retries, resuming bodies where they broke
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
	s := &Store{cfg: cfg, client: client, name: name}
	s.reader = objread.New(objread.Config{
		Name:        s.String(),
		MaxInFlight: cfg.MaxInFlight,
		ReadTimeout: cfg.ReadTimeout,
		RetryBudget: cfg.RetryBudget,
		Transient:   transient,
		Classify:    s.classify,
	})
	return s, nil
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

// Stat implements store.Store.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Info{}, err
	}
	var info store.Info
	err := s.reader.Do(ctx, key, func(ctx context.Context) error {
		out, err := s.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &s.cfg.Bucket, Key: aws.String(s.key(key))})
		if err != nil {
			return err
		}
		info = store.Info{Size: aws.ToInt64(out.ContentLength), Version: aws.ToString(out.ETag)}
		return nil
	})
	return info, err
}

// ReadAt implements store.Store: ranged GetObjects with If-Match on version, resumed where a body
// broke off.
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	return s.reader.ReadAt(ctx, key, p, off, func(ctx context.Context, off, n int64) (io.ReadCloser, int64, error) {
		in := &s3.GetObjectInput{Bucket: &s.cfg.Bucket, Key: aws.String(s.key(key)),
			Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))}
		if version != "" {
			in.IfMatch = aws.String(version)
		}
		out, err := s.client.GetObject(ctx, in)
		if err != nil {
			return nil, 0, err
		}
		// A store that ignores If-Match must not hand over another version's bytes.
		if version != "" && out.ETag != nil && *out.ETag != version {
			out.Body.Close()
			return nil, 0, fmt.Errorf("%w (ETag %s, expected %s)", store.ErrChanged, *out.ETag, version)
		}
		return out.Body, aws.ToInt64(out.ContentLength), nil
	})
}

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
		err := s.reader.Do(ctx, prefix, func(ctx context.Context) error {
			var err error
			page, err = pages.NextPage(ctx)
			return err
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
		return fmt.Errorf("%s: %w: the bucket %q does not exist", s, store.ErrNoBucket, s.cfg.Bucket)
	}
	if err != nil {
		return s.reader.Err("", err)
	}
	return nil
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

// transient reports errors worth another attempt: what the SDK retries, and S3's SlowDown.
func transient(err error) bool {
	return code(err) == "SlowDown" || sdkRetryable.IsErrorRetryable(err)
}

// classify turns S3 errors into the store's sentinels.
func (s *Store) classify(err error) error {
	switch st, c := status(err), code(err); {
	case errors.Is(err, store.ErrChanged), errors.Is(err, store.ErrOutOfRange):
		return err
	case st == http.StatusPreconditionFailed || c == "PreconditionFailed":
		return fmt.Errorf("%w (the object was replaced)", store.ErrChanged)
	case st == http.StatusRequestedRangeNotSatisfiable || c == "InvalidRange":
		return store.ErrOutOfRange
	case c == "NoSuchBucket":
		return fmt.Errorf("%w: the bucket %q does not exist", store.ErrNoBucket, s.cfg.Bucket)
	case st == http.StatusNotFound || c == "NoSuchKey" || c == "NotFound":
		return store.ErrNotFound
	case st == http.StatusForbidden || c == "AccessDenied" || c == "InvalidAccessKeyId" || c == "SignatureDoesNotMatch":
		return fmt.Errorf(
			"%w (%s): check the credentials and the bucket policy",
			store.ErrPermissionDenied,
			firstNonEmpty(c, "403"),
		)
	case errors.Is(err, context.DeadlineExceeded):
		return err
	case st == http.StatusServiceUnavailable || c == "SlowDown" || st == http.StatusTooManyRequests:
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	return err
}

func firstNonEmpty(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
