// Package azstore is the store over Azure Blob Storage: every ranged download carries the ETag the
// catalog saw as If-Match, so a replaced blob fails instead of mixing versions, and objstore's
// request slots and retries resume a broken body where it stopped. Credentials are a connection
// string, an account key, or DefaultAzureCredential (Workload Identity on AKS). It passes the
// store conformance suite.
package azstore

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
	"slices"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/blob"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/bloberror"
	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob/container"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
)

// The environment variables credentials come from, in this order; without either,
// DefaultAzureCredential (environment, workload identity, managed identity, Azure CLI).
const (
	EnvConnectionString = "AZURE_STORAGE_CONNECTION_STRING"
	EnvAccountKey       = "AZURE_STORAGE_KEY"
)

// Config says which container to read and how hard to try.
type Config struct {
	Account   string
	Container string
	Prefix    string // blob name prefix, without a trailing slash
	// Endpoint is the blob service URL, for an emulator or another cloud (Azurite:
	// http://127.0.0.1:10000/ACCOUNT). Empty: https://ACCOUNT.blob.core.windows.net/, or the
	// connection string's.
	Endpoint string
	// MaxInFlight caps concurrent requests to the store; the connection pool keeps as many idle.
	MaxInFlight int
	// ReadTimeout bounds one attempt of one read, headers and body.
	ReadTimeout time.Duration
	// RetryBudget bounds the time one read spends on retries.
	RetryBudget time.Duration
}

// RegisterFlags registers the Azure flags on fs, with their defaults. Account, Container and
// Prefix come from the store URL (ParseURL).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "azure-endpoint", "",
		"Azure blob service `URL` (Azurite: http://127.0.0.1:10000/ACCOUNT); default "+
			"https://ACCOUNT.blob.core.windows.net/, or the one in "+EnvConnectionString)
	objstore.RegisterFlags(fs, "azure", "Azure", &c.MaxInFlight, &c.ReadTimeout, &c.RetryBudget)
}

// Validate reports the settings no store can run with.
func (c *Config) Validate() error {
	return objstore.ValidateFlags("azure", c.MaxInFlight, c.ReadTimeout, c.RetryBudget)
}

// ParseURL reads az://ACCOUNT/CONTAINER/PREFIX.
func ParseURL(raw string) (account, container, prefix string, err error) {
	rest, ok := strings.CutPrefix(raw, "az://")
	if !ok || rest == "" {
		return "", "", "", fmt.Errorf("%q is not az://ACCOUNT/CONTAINER[/PREFIX]", raw)
	}
	account, rest, _ = strings.Cut(rest, "/")
	container, prefix, _ = strings.Cut(rest, "/")
	prefix = strings.Trim(prefix, "/")
	if account == "" || container == "" {
		return "", "", "", fmt.Errorf("%q names no account or no container: az://ACCOUNT/CONTAINER[/PREFIX]", raw)
	}
	return account, container, prefix, nil
}

// Store reads blobs of one container under a prefix.
type Store struct {
	cfg       Config
	container *container.Client
	reader    *objstore.Reader
	name      string
}

var _ store.Store = (*Store)(nil)

// New builds a store. The SDK's own retries are off, since objstore retries and resumes under one
// budget.
func New(ctx context.Context, cfg Config) (*Store, error) {
	if cfg.MaxInFlight <= 0 {
		cfg.MaxInFlight = objstore.DefaultMaxInFlight
	}
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConns = 2 * cfg.MaxInFlight
	transport.MaxIdleConnsPerHost = cfg.MaxInFlight
	opts := &azblob.ClientOptions{ClientOptions: azcore.ClientOptions{
		Transport: &http.Client{Transport: transport},
		Retry:     policy.RetryOptions{MaxRetries: -1},
	}}
	client, err := newClient(cfg, opts)
	if err != nil {
		return nil, fmt.Errorf("azure store az://%s/%s: %w", cfg.Account, cfg.Container, err)
	}
	name := "az://" + cfg.Account + "/" + cfg.Container
	if cfg.Prefix != "" {
		name += "/" + cfg.Prefix
	}
	if cfg.Endpoint != "" {
		name += " at " + redact(cfg.Endpoint)
	}
	s := &Store{cfg: cfg, container: client.ServiceClient().NewContainerClient(cfg.Container), name: name}
	s.reader = objstore.NewReader(objstore.ReaderConfig{
		Name:        s.String(),
		MaxInFlight: cfg.MaxInFlight,
		ReadTimeout: cfg.ReadTimeout,
		RetryBudget: cfg.RetryBudget,
		Transient:   transient,
		Classify:    s.classify,
	})
	return s, nil
}

// newClient picks the credentials: a connection string, an account key, else
// DefaultAzureCredential.
func newClient(cfg Config, opts *azblob.ClientOptions) (*azblob.Client, error) {
	if cs := os.Getenv(EnvConnectionString); cs != "" {
		if cfg.Endpoint != "" {
			return nil, fmt.Errorf("--azure-endpoint and %s both name the endpoint: "+
				"set BlobEndpoint in the connection string instead", EnvConnectionString)
		}
		client, err := azblob.NewClientFromConnectionString(cs, opts)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvConnectionString, err)
		}
		// Another account's connection string would read another account's containers.
		u, err := url.Parse(client.URL())
		if err != nil || !strings.HasPrefix(u.Host, cfg.Account+".") &&
			strings.Split(strings.Trim(u.Path, "/"), "/")[0] != cfg.Account {
			return nil, fmt.Errorf("%s is not for the account %q", EnvConnectionString, cfg.Account)
		}
		return client, nil
	}
	serviceURL := cfg.Endpoint
	if serviceURL == "" {
		serviceURL = "https://" + cfg.Account + ".blob.core.windows.net/"
	}
	if key := os.Getenv(EnvAccountKey); key != "" {
		cred, err := azblob.NewSharedKeyCredential(cfg.Account, key)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", EnvAccountKey, err)
		}
		return azblob.NewClientWithSharedKeyCredential(serviceURL, cred, opts)
	}
	cred, err := azidentity.NewDefaultAzureCredential(nil)
	if err != nil {
		return nil, err
	}
	return azblob.NewClient(serviceURL, cred, opts)
}

// redact drops user info and the query (a SAS) from an endpoint URL so no secret reaches a log line.
func redact(endpoint string) string {
	u, err := url.Parse(endpoint)
	if err != nil {
		return "(unparsable endpoint)"
	}
	u.User, u.RawQuery = nil, ""
	return u.String()
}

func (s *Store) String() string { return "Azure store " + s.name }

func (s *Store) key(key string) string {
	if s.cfg.Prefix == "" {
		return key
	}
	return s.cfg.Prefix + "/" + key
}

// Stat implements store.Store; the version is the blob's ETag.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	if err := store.ValidateKey(key); err != nil {
		return store.Info{}, err
	}
	var info store.Info
	err := s.reader.Do(ctx, key, func(ctx context.Context) error {
		props, err := s.container.NewBlobClient(s.key(key)).GetProperties(ctx, nil)
		if err != nil {
			return err
		}
		if props.ContentLength == nil || props.ETag == nil {
			return errors.New("the store sent no Content-Length or ETag")
		}
		info = store.Info{Size: *props.ContentLength, Version: string(*props.ETag)}
		return nil
	})
	if errors.Is(err, store.ErrNoBucket) { // as on every store (store.ErrNoBucket)
		return store.Info{}, fmt.Errorf("%w: %v", store.ErrNotFound, err)
	}
	return info, err
}

// ReadAt implements store.Store: ranged downloads with If-Match on version, resumed where a body
// broke off.
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	blobClient := s.container.NewBlobClient(s.key(key))
	return s.reader.ReadAt(ctx, key, p, off, func(ctx context.Context, off, n int64) (io.ReadCloser, int64, error) {
		opts := &blob.DownloadStreamOptions{Range: blob.HTTPRange{Offset: off, Count: n}}
		if version != "" {
			etag := azcore.ETag(version)
			opts.AccessConditions = &blob.AccessConditions{
				ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &etag},
			}
		}
		resp, err := blobClient.DownloadStream(ctx, opts)
		if err != nil {
			return nil, 0, err
		}
		// A store that ignores If-Match must not hand over another version's bytes.
		if version != "" && resp.ETag != nil && string(*resp.ETag) != version {
			resp.Body.Close()
			return nil, 0, fmt.Errorf("%w (ETag %s, expected %s)", store.ErrChanged, *resp.ETag, version)
		}
		length := int64(-1)
		if resp.ContentLength != nil {
			length = *resp.ContentLength
		}
		return resp.Body, length, nil
	})
}

// List implements store.Store. Each page is one attempt, resumed from its marker.
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
	var marker *string
	for {
		var page container.ListBlobsFlatResponse
		err := s.reader.Do(ctx, prefix, func(ctx context.Context) error {
			var err error
			pager := s.container.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &full, Marker: marker})
			page, err = pager.NextPage(ctx)
			return err
		})
		if err != nil {
			return nil, err
		}
		for _, b := range page.Segment.BlobItems {
			if b.Name == nil {
				continue
			}
			k := strings.TrimPrefix(*b.Name, s.cfg.Prefix+"/")
			if s.cfg.Prefix == "" {
				k = *b.Name
			}
			if store.ValidateKey(k) == nil {
				keys = append(keys, k)
			}
		}
		if page.NextMarker == nil || *page.NextMarker == "" {
			break
		}
		marker = page.NextMarker
	}
	sort.Strings(keys)
	return keys, nil
}

// Check implements store.Store: the container answers a listing of the prefix, which a reader's
// role (Storage Blob Data Reader) allows.
func (s *Store) Check(ctx context.Context) error {
	one := int32(1)
	pager := s.container.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &s.cfg.Prefix, MaxResults: &one})
	_, err := pager.NextPage(ctx)
	if bloberror.HasCode(err, bloberror.ContainerNotFound) {
		return fmt.Errorf("%s: %w: the container %q does not exist", s, store.ErrNoBucket, s.cfg.Container)
	}
	if err != nil {
		return s.reader.Err("", err)
	}
	return nil
}

// retryStatus are the statuses azcore's retry policy retries by default.
var retryStatus = []int{
	http.StatusRequestTimeout,
	http.StatusTooManyRequests,
	http.StatusInternalServerError,
	http.StatusBadGateway,
	http.StatusServiceUnavailable,
	http.StatusGatewayTimeout,
}

// transient reports errors worth another attempt: the statuses azcore retries, and connections
// that were refused, reset or timed out.
func transient(err error) bool {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return slices.Contains(retryStatus, re.StatusCode)
	}
	var ne net.Error
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) && ne.Timeout()
}

// classify turns Azure errors into the store's sentinels, keeping the code and status of a
// response error rather than the SDK's multi-line dump of it.
func (s *Store) classify(err error) error {
	var re *azcore.ResponseError
	status, code := 0, ""
	if errors.As(err, &re) {
		status, code = re.StatusCode, re.ErrorCode
	}
	var af *azidentity.AuthenticationFailedError
	switch {
	case errors.Is(err, store.ErrChanged), errors.Is(err, store.ErrOutOfRange),
		errors.Is(err, context.DeadlineExceeded):
		return err
	case code == string(bloberror.ContainerNotFound):
		return fmt.Errorf("%w: the container %q does not exist", store.ErrNoBucket, s.cfg.Container)
	case status == http.StatusPreconditionFailed:
		return fmt.Errorf("%w (the blob was replaced)", store.ErrChanged)
	case status == http.StatusRequestedRangeNotSatisfiable:
		return store.ErrOutOfRange
	case status == http.StatusNotFound:
		return store.ErrNotFound
	case status == http.StatusUnauthorized, status == http.StatusForbidden:
		return fmt.Errorf("%w (%s): check the credentials and the container's role assignments",
			store.ErrPermissionDenied, code)
	case errors.As(err, &af):
		return fmt.Errorf("%w: %v", store.ErrPermissionDenied, err)
	case status == http.StatusTooManyRequests, status == http.StatusServiceUnavailable:
		return fmt.Errorf("%w: %s (%d)", store.ErrUnavailable, code, status)
	case re != nil:
		return fmt.Errorf("%s (%d)", code, status)
	}
	return err
}
