// Package azstore is the store over Azure Blob Storage, an objstore backend: every ranged
// download carries the ETag the catalog saw as If-Match, so a replaced blob fails instead of
// mixing versions; errors are retried on the statuses azcore's retry policy retries. Credentials
// are a connection string, an account key, or DefaultAzureCredential (Workload Identity on AKS).
// objstore does the rest; it passes the store conformance suite.
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
	"strings"
	"syscall"

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

// ReadBytes is the segment and read size serve plans Azure reads with, 8 MiB where other object
// stores read 4: Azurite hashes (MD5) every range of 4 MiB or less before it sends it, reading the
// range twice on its one Node.js thread, so 4 MiB reads cost it three times the CPU of 8 MiB ones
// and halve what it serves (docs/performance.md). Azure itself hashes a range only when asked;
// there 8 MiB reads keep the same bytes in flight in half the requests, as the SDK's
// parallel download with 8 MiB blocks does.
const ReadBytes = 8 << 20

// Config says which container to read and how hard to try; tunables left at zero take their defaults
// (objstore.Tunables).
type Config struct {
	Account   string
	Container string
	Prefix    string // blob name prefix, without a trailing slash
	// Endpoint is the blob service URL, for an emulator or another cloud (Azurite:
	// http://127.0.0.1:10000/ACCOUNT). Empty: https://ACCOUNT.blob.core.windows.net/, or the
	// connection string's.
	Endpoint string
	objstore.Tunables
}

// RegisterFlags registers the Azure flags on fs, with their defaults. Account, Container and
// Prefix come from the store URL (SetURL).
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.StringVar(&c.Endpoint, "azure-endpoint", "",
		"Azure blob service `URL` (Azurite: http://127.0.0.1:10000/ACCOUNT); default "+
			"https://ACCOUNT.blob.core.windows.net/, or the one in "+EnvConnectionString)
	c.Tunables.RegisterFlags(fs, "azure", "Azure")
}

// Validate reports the settings no store can run with: negative tunables; zero ones take the
// defaults.
func (c *Config) Validate() error { return c.Tunables.Validate("azure") }

// SetURL takes Account, Container and Prefix from a --store URL, az://ACCOUNT/CONTAINER[/PREFIX].
func (c *Config) SetURL(raw string) error {
	names, prefix, err := objstore.ParseURL(raw, "az://ACCOUNT/CONTAINER[/PREFIX]")
	if err != nil {
		return err
	}
	c.Account, c.Container, c.Prefix = names[0], names[1], prefix
	return nil
}

// Open opens the store c configures (New).
func (c *Config) Open(ctx context.Context) (store.Store, error) { return New(ctx, *c) }

// New builds a store. The SDK's own retries are off, since objstore retries and resumes under one
// budget.
func New(ctx context.Context, cfg Config) (*objstore.Store, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg.Tunables = cfg.Tunables.WithDefaults()
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
	b := &blobs{client: client.ServiceClient().NewContainerClient(cfg.Container), name: cfg.Container,
		prefix: cfg.Prefix}
	return objstore.New(b, objstore.Config{Kind: "Azure", Bucket: "az://" + cfg.Account + "/" + cfg.Container,
		Prefix: cfg.Prefix, Endpoint: cfg.Endpoint, Tunables: cfg.Tunables}), nil
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

// blobs is the objstore.Backend over one Azure container.
type blobs struct {
	client       *container.Client
	name, prefix string
}

// Head implements objstore.Backend; the version is the blob's ETag.
func (b *blobs) Head(ctx context.Context, name string) (store.Info, error) {
	props, err := b.client.NewBlobClient(name).GetProperties(ctx, nil)
	if err != nil {
		return store.Info{}, err
	}
	if props.ContentLength == nil || props.ETag == nil {
		return store.Info{}, errors.New("the store sent no Content-Length or ETag")
	}
	return store.Info{Size: *props.ContentLength, Version: string(*props.ETag)}, nil
}

// Open implements objstore.Backend: a ranged download with If-Match on version.
func (b *blobs) Open(ctx context.Context, name, version string, off, n int64) (io.ReadCloser, int64, error) {
	opts := &blob.DownloadStreamOptions{Range: blob.HTTPRange{Offset: off, Count: n}}
	if version != "" {
		etag := azcore.ETag(version)
		opts.AccessConditions = &blob.AccessConditions{
			ModifiedAccessConditions: &blob.ModifiedAccessConditions{IfMatch: &etag},
		}
	}
	resp, err := b.client.NewBlobClient(name).DownloadStream(ctx, opts)
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
}

// List implements objstore.Backend: one page of a flat listing, from its marker.
func (b *blobs) List(ctx context.Context, prefix, token string) ([]string, string, error) {
	opts := &container.ListBlobsFlatOptions{Prefix: &prefix}
	if token != "" {
		opts.Marker = &token
	}
	page, err := b.client.NewListBlobsFlatPager(opts).NextPage(ctx)
	if err != nil {
		return nil, "", err
	}
	var names []string
	for _, item := range page.Segment.BlobItems {
		if item.Name != nil {
			names = append(names, *item.Name)
		}
	}
	var next string
	if page.NextMarker != nil {
		next = *page.NextMarker
	}
	return names, next, nil
}

// Check implements objstore.Backend: the container answers a listing of the prefix, which a
// reader's role (Storage Blob Data Reader) allows.
func (b *blobs) Check(ctx context.Context) error {
	one := int32(1)
	_, err := b.client.NewListBlobsFlatPager(&container.ListBlobsFlatOptions{Prefix: &b.prefix, MaxResults: &one}).
		NextPage(ctx)
	return err
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

// Transient implements objstore.Backend: the statuses azcore retries, and connections that were
// refused, reset or timed out.
func (b *blobs) Transient(err error) bool {
	var re *azcore.ResponseError
	if errors.As(err, &re) {
		return slices.Contains(retryStatus, re.StatusCode)
	}
	var ne net.Error
	return errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.ECONNREFUSED) ||
		errors.Is(err, syscall.EPIPE) || errors.Is(err, io.ErrUnexpectedEOF) || errors.As(err, &ne) && ne.Timeout()
}

// Classify implements objstore.Backend, keeping the code and status of a response error rather
// than the SDK's multi-line dump of it.
func (b *blobs) Classify(err error) error {
	var re *azcore.ResponseError
	status, code := 0, ""
	if errors.As(err, &re) {
		status, code = re.StatusCode, re.ErrorCode
	}
	var af *azidentity.AuthenticationFailedError
	switch {
	case code == string(bloberror.ContainerNotFound):
		return fmt.Errorf("%w: the container %q does not exist", store.ErrNoBucket, b.name)
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
