// Package s3reader is the store over S3 and S3-compatible object stores (MinIO, Ceph, versitygw),
// an objstore backend: ranged GetObject with the version the catalog saw sent as If-Match on
// every read, ListObjectsV2 pages, the SDK's own retry classification, and a connection pool sized
// for the fan-out. objstore does the rest; it passes the store conformance suite.
package s3reader

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/aws-sdk-go-v2/config"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"github.com/aws/smithy-go"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
)

// Config says which bucket to read and how hard to try; tunables left at zero take their defaults
// (objstore.Tunables).
type Config struct {
	Bucket string
	Prefix string // key prefix, without a trailing slash
	// Endpoint is a custom endpoint (S3-compatible stores); when set, addressing is path-style.
	// Empty: AWS_ENDPOINT_URL_S3, then AWS_ENDPOINT_URL, then AWS's own.
	Endpoint string
	Region   string // empty: from the standard chain (AWS_REGION, profile), else us-east-1
	objstore.Tunables
}

// RegisterFlags registers the S3 flags on fs, with their defaults. Bucket and Prefix come from the
// store URL (SetURL).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "s3-endpoint", "",
		"S3-compatible endpoint `URL` (path-style addressing); default AWS_ENDPOINT_URL_S3, AWS_ENDPOINT_URL, then AWS")
	fs.StringVar(&c.Region, "s3-region", "", "S3 region; default from the AWS chain (AWS_REGION, profile), else us-east-1")
	c.Tunables.RegisterFlags(fs, "s3", "S3")
}

// Validate reports the settings no store can run with: negative tunables; zero ones take the
// defaults.
func (c *Config) Validate() error { return c.Tunables.Validate("s3") }

// SetURL takes Bucket and Prefix from a --store URL, s3://BUCKET[/PREFIX].
func (c *Config) SetURL(raw string) error {
	names, prefix, err := objstore.ParseURL(raw, "s3://BUCKET[/PREFIX]")
	if err != nil {
		return err
	}
	c.Bucket, c.Prefix = names[0], prefix
	return nil
}

// Open opens the store c configures (New).
func (c *Config) Open(ctx context.Context) (store.Store, error) { return New(ctx, *c) }

// New builds a store; credentials and region come from the standard AWS chain (environment,
// shared profile, web identity for IRSA).
func New(ctx context.Context, cfg Config) (*objstore.Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Tunables = cfg.Tunables.WithDefaults()
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
		config.WithRetryMaxAttempts(1), // objstore retries, resuming bodies where they broke
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
	return objstore.New(&bucket{client: client, name: cfg.Bucket}, objstore.Config{Kind: "S3",
		Bucket: "s3://" + cfg.Bucket, Prefix: cfg.Prefix, Endpoint: cfg.Endpoint, Tunables: cfg.Tunables}), nil
}

func firstEnv(names ...string) string {
	for _, n := range names {
		if v := os.Getenv(n); v != "" {
			return v
		}
	}
	return ""
}

// bucket is the objstore.Backend over one S3 bucket.
type bucket struct {
	client *s3.Client
	name   string
}

// Head implements objstore.Backend; the version is the ETag.
func (b *bucket) Head(ctx context.Context, name string) (store.Info, error) {
	out, err := b.client.HeadObject(ctx, &s3.HeadObjectInput{Bucket: &b.name, Key: &name})
	if err != nil {
		return store.Info{}, err
	}
	return store.Info{Size: aws.ToInt64(out.ContentLength), Version: aws.ToString(out.ETag)}, nil
}

// Open implements objstore.Backend: a ranged GetObject with If-Match on version.
func (b *bucket) Open(ctx context.Context, name, version string, off, n int64) (io.ReadCloser, int64, error) {
	in := &s3.GetObjectInput{Bucket: &b.name, Key: &name, Range: aws.String(fmt.Sprintf("bytes=%d-%d", off, off+n-1))}
	if version != "" {
		in.IfMatch = aws.String(version)
	}
	out, err := b.client.GetObject(ctx, in)
	if err != nil {
		return nil, 0, err
	}
	// A store that ignores If-Match must not hand over another version's bytes.
	if version != "" && out.ETag != nil && *out.ETag != version {
		out.Body.Close()
		return nil, 0, fmt.Errorf("%w (ETag %s, expected %s)", store.ErrChanged, *out.ETag, version)
	}
	return out.Body, aws.ToInt64(out.ContentLength), nil
}

// List implements objstore.Backend: one ListObjectsV2.
func (b *bucket) List(ctx context.Context, prefix, token string) ([]string, string, error) {
	in := &s3.ListObjectsV2Input{Bucket: &b.name, Prefix: &prefix}
	if token != "" {
		in.ContinuationToken = &token
	}
	out, err := b.client.ListObjectsV2(ctx, in)
	if err != nil {
		return nil, "", err
	}
	names := make([]string, 0, len(out.Contents))
	for _, o := range out.Contents {
		names = append(names, aws.ToString(o.Key))
	}
	if !aws.ToBool(out.IsTruncated) {
		return names, "", nil
	}
	return names, aws.ToString(out.NextContinuationToken), nil
}

// Check implements objstore.Backend: the bucket answers a HEAD.
func (b *bucket) Check(ctx context.Context) error {
	_, err := b.client.HeadBucket(ctx, &s3.HeadBucketInput{Bucket: &b.name})
	if status(err) == http.StatusNotFound { // a HEAD has no body to say NoSuchBucket
		return fmt.Errorf("%w: the bucket %q does not exist", store.ErrNoBucket, b.name)
	}
	return err
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

// Transient implements objstore.Backend: what the SDK retries, and S3's SlowDown.
func (b *bucket) Transient(err error) bool {
	return code(err) == "SlowDown" || sdkRetryable.IsErrorRetryable(err)
}

// Classify implements objstore.Backend.
func (b *bucket) Classify(err error) error {
	switch st, c := status(err), code(err); {
	case st == http.StatusPreconditionFailed || c == "PreconditionFailed":
		return fmt.Errorf("%w (the object was replaced)", store.ErrChanged)
	case st == http.StatusRequestedRangeNotSatisfiable || c == "InvalidRange":
		return store.ErrOutOfRange
	case c == "NoSuchBucket":
		return fmt.Errorf("%w: the bucket %q does not exist", store.ErrNoBucket, b.name)
	case st == http.StatusNotFound || c == "NoSuchKey" || c == "NotFound":
		return store.ErrNotFound
	case st == http.StatusForbidden || c == "AccessDenied" || c == "InvalidAccessKeyId" || c == "SignatureDoesNotMatch":
		return fmt.Errorf(
			"%w (%s): check the credentials and the bucket policy",
			store.ErrPermissionDenied,
			firstNonEmpty(c, "403"),
		)
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
