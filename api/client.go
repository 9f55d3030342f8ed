package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/shardsrv/shardsrv/internal/sfv"
)

// Client talks to a shardsrv server. It is safe for concurrent use.
type Client struct {
	// BaseURL is the server, e.g. http://shardsrv:8080.
	BaseURL string
	// Token, when set, is sent as a bearer token.
	Token string
	// HTTP is the client used; nil means a shared one from NewHTTPClient.
	HTTP *http.Client
	// Attempts is how many times a request that failed in a way worth retrying is sent (>= 1).
	Attempts int
	// Backoff bounds the first wait between attempts; the bound doubles up to MaxBackoff. Each wait
	// is drawn uniformly below the bound (full jitter), so many pods told to back off at once do
	// not come back in lockstep; a Retry-After from the server is added to it.
	Backoff time.Duration
	// Logger is told of every retry: what, why and when; nil means slog.Default() (stderr).
	Logger *slog.Logger
	// NoDigest declines the Repr-Digest trailer (Want-Repr-Digest: sha-256=0), for a client that
	// measures hashing as too costly; the server may then send local files without copying them.
	NoDigest bool
}

// MaxBackoff caps the bound on a wait between attempts (not a server's Retry-After).
const MaxBackoff = 30 * time.Second

// NewClient returns a client with 5 attempts and a 500 ms first backoff.
func NewClient(baseURL string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Attempts: 5, Backoff: 500 * time.Millisecond}
}

// NewHTTPClient returns the HTTP client a Client uses when given none. It bounds connecting, the
// TLS handshake and the wait for the response headers (the server answers once the plan is made
// and its first reads came back), but not the whole exchange: a shard may stream for many minutes.
// Bound that with the context.
func NewHTTPClient() *http.Client {
	return &http.Client{Transport: &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		TLSHandshakeTimeout:   10 * time.Second,
		ResponseHeaderTimeout: 2 * time.Minute, // above the server's store retry budget (60 s) and admission wait
		IdleConnTimeout:       90 * time.Second,
		MaxIdleConnsPerHost:   16, // the ranks of a pod fetch in parallel from one server
	}}
}

// NewHTTPClientWithCA is NewHTTPClient trusting the CA certificates in the PEM file caFile (a
// server whose certificate a private CA issued, such as cert-manager's) instead of the system's.
func NewHTTPClientWithCA(caFile string) (*http.Client, error) {
	pem, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("shardsrv: %s holds no PEM certificate", caFile)
	}
	c := NewHTTPClient()
	c.Transport.(*http.Transport).TLSClientConfig = &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}
	return c, nil
}

// defaultHTTP is shared so that clients made per request still reuse connections.
var defaultHTTP = NewHTTPClient()

// ProblemError is an RFC 9457 problem the server answered with.
type ProblemError struct{ Problem }

func (e *ProblemError) Error() string {
	msg := fmt.Sprintf("shardsrv: %d %s", e.Status, e.Title)
	if e.Detail != nil {
		msg += ": " + *e.Detail
	}
	if e.Errors != nil {
		for _, fe := range *e.Errors {
			msg += fmt.Sprintf("\n  %s: %s", fe.Pointer, fe.Detail)
		}
	}
	return msg
}

// retryable reports whether another attempt may cure a problem. Of the 4xx only a time-out, a
// checkpoint file that changed under the request (the next attempt reads the new version) and
// overload (408, 409, 429); of the server's failures (502, 503, 504) those whose problem does not
// say "retryable": false (bytes that fail their signature, a store denying access: the same on
// every attempt). An answer that is not the server's problem (a proxy's) is judged by its status.
func retryable(p *Problem) bool {
	switch p.Status {
	case http.StatusRequestTimeout, http.StatusConflict, http.StatusTooManyRequests:
		return true
	case http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return p.Retryable == nil || *p.Retryable
	}
	return false
}

// ShortBodyError is a response that ended before its Content-Length: the server aborted the
// stream (a storage failure after the headers) or the connection broke.
type ShortBodyError struct {
	Got, Want int64
	Err       error
}

func (e *ShortBodyError) Error() string {
	return fmt.Sprintf("shardsrv: the body ended after %d of %d bytes: %v", e.Got, e.Want, e.Err)
}

func (e *ShortBodyError) Unwrap() error { return e.Err }

// DigestError is a body whose SHA-256 is not the Repr-Digest the server sent with it: bytes
// changed between the server and here.
type DigestError struct {
	Got  string // the body's, sha-256=:BASE64: (RFC 9530)
	Want string // the Repr-Digest field the server sent; a header's and a trailer's, both sent, joined by "; "
}

func (e *DigestError) Error() string {
	return fmt.Sprintf("shardsrv: the body's digest is %s, the server sent %s: it was damaged in transit", e.Got, e.Want)
}

// transient marks an error another attempt may cure, with the wait the server asked for.
type transient struct {
	err   error
	after time.Duration
}

func (t *transient) Error() string { return t.err.Error() }
func (t *transient) Unwrap() error { return t.err }

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return defaultHTTP
}

func (c *Client) logger() *slog.Logger {
	if c.Logger != nil {
		return c.Logger
	}
	return slog.Default()
}

// do sends one request and returns the response when its status is 200; any other status is
// read as a problem. Errors another attempt may cure are marked transient.
func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
	// A URL without a scheme or host fails the same way on every attempt: say so at once.
	if u, err := url.Parse(c.BaseURL); err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("shardsrv: server %q is not a URL such as http://shardsrv:8080", c.BaseURL)
	}
	var rd io.Reader
	if body != nil {
		raw, err := json.Marshal(body)
		if err != nil {
			return nil, err
		}
		rd = bytes.NewReader(raw)
	}
	req, err := http.NewRequestWithContext(ctx, method, c.BaseURL+path, rd)
	if err != nil {
		return nil, err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	if c.NoDigest {
		req.Header.Set("Want-Repr-Digest", "sha-256=0")
	}
	res, err := c.httpClient().Do(req)
	if err != nil {
		var cert *tls.CertificateVerificationError
		if ctx.Err() != nil || errors.As(err, &cert) {
			return nil, err
		}
		return nil, &transient{err: err} // refused, reset, timed out: the network, not the request
	}
	if res.StatusCode == http.StatusOK {
		return res, nil
	}
	defer res.Body.Close()
	var p ProblemError
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&p.Problem); err != nil || p.Status == 0 {
		p.Problem = Problem{Status: res.StatusCode, Title: http.StatusText(res.StatusCode)}
	}
	if !retryable(&p.Problem) {
		return nil, &p
	}
	return nil, &transient{err: &p, after: retryAfter(res.Header.Get("Retry-After"))}
}

// retryAfter reads a Retry-After header: seconds or an HTTP date.
func retryAfter(h string) time.Duration {
	if s, err := strconv.Atoi(h); err == nil && s > 0 {
		return time.Duration(s) * time.Second
	}
	if t, err := http.ParseTime(h); err == nil {
		return max(0, time.Until(t))
	}
	return 0
}

// retry runs attempt until it succeeds, fails in a way no retry cures, or the attempts run out.
// what names the request in the log.
func (c *Client) retry(ctx context.Context, what string, attempt func() error) error {
	attempts := max(1, c.Attempts)
	bound := c.Backoff
	for n := 1; ; n++ {
		err := attempt()
		var t *transient
		if !errors.As(err, &t) {
			return err
		}
		if n >= attempts || ctx.Err() != nil {
			return t.err
		}
		wait := t.after + rand.N(max(bound, 0)+1) // full jitter on top of what the server asked for
		c.logger().
			Warn("shardsrv: retrying", "request", what, "error", t.err.Error(), "attempt", n+1, "of", attempts, "in", wait)
		timer := time.NewTimer(wait)
		select {
		case <-timer.C:
		case <-ctx.Done():
			timer.Stop()
			return ctx.Err()
		}
		bound = min(2*bound, MaxBackoff)
	}
}

// getJSON sends a request and decodes its JSON answer, retrying what is worth retrying.
func (c *Client) getJSON(ctx context.Context, method, path string, body, out any) error {
	return c.retry(ctx, method+" "+path, func() error {
		res, err := c.do(ctx, method, path, body)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		raw, err := io.ReadAll(res.Body)
		if err != nil {
			return &transient{err: &ShortBodyError{Got: int64(len(raw)), Want: res.ContentLength, Err: err}}
		}
		return json.Unmarshal(raw, out)
	})
}

// Checkpoints lists the checkpoints the server has.
func (c *Client) Checkpoints(ctx context.Context) ([]string, error) {
	var out CheckpointList
	err := c.getJSON(ctx, http.MethodGet, "/v1/checkpoints", nil, &out)
	return out.Checkpoints, err
}

// Tensors lists all of a checkpoint's tensors, following the server's pages.
func (c *Client) Tensors(ctx context.Context, checkpoint string) (*TensorList, error) {
	var all TensorList
	q := url.Values{"checkpoint": {checkpoint}}
	for {
		var page TensorList
		if err := c.getJSON(ctx, http.MethodGet, "/v1/tensors?"+q.Encode(), nil, &page); err != nil {
			return &all, err
		}
		all.Checkpoint = page.Checkpoint
		all.Tensors = append(all.Tensors, page.Tensors...)
		if page.NextPageToken == nil {
			return &all, nil
		}
		q.Set("page_token", *page.NextPageToken)
	}
}

// Plan asks for the plan of a request without reading tensor data.
func (c *Client) Plan(ctx context.Context, req *ShardRequest) (*PlanResponse, error) {
	var out PlanResponse
	err := c.getJSON(ctx, http.MethodPost, "/v1/plan", req, &out)
	return &out, err
}

// Layout asks for the explicit tensors table an engine's rank expands to: the tensors the server
// serves for a ShardRequest carrying l, ready to send (or edit and send) as Tensors.
func (c *Client) Layout(ctx context.Context, checkpoint string, l EngineLayout) (*LayoutResponse, error) {
	var out LayoutResponse
	err := c.getJSON(ctx, http.MethodPost, "/v1/layouts", &LayoutRequest{Checkpoint: checkpoint, Layout: l}, &out)
	return &out, err
}

// filesPath is a checkpoint's files route; a '/' in a name is escaped, as the route wants it.
func filesPath(checkpoint string) string {
	return "/v1/checkpoints/" + url.PathEscape(checkpoint) + "/files"
}

// Files lists a checkpoint's small files (config.json, tokenizer files, ...).
func (c *Client) Files(ctx context.Context, checkpoint string) (*FileList, error) {
	var out FileList
	err := c.getJSON(ctx, http.MethodGet, filesPath(checkpoint), nil, &out)
	return &out, err
}

// File writes one of a checkpoint's small files to w and returns its size. The server caps these
// files (64 MiB), so the body is held in memory until it is whole: w sees one complete write,
// and a broken stream is retried without w having to start over.
func (c *Client) File(ctx context.Context, checkpoint, name string, w io.Writer) (int64, error) {
	var buf bytes.Buffer
	if _, err := c.download(
		ctx,
		http.MethodGet,
		filesPath(checkpoint)+"/"+url.PathEscape(name),
		nil,
		&buf,
		func() error { buf.Reset(); return nil },
		nil,
		nil,
	); err != nil {
		return 0, err
	}
	return buf.WriteTo(w)
}

// Progress is told how many bytes of how many arrived.
type Progress func(done, total int64)

// Fetch streams a shard into w and returns the bytes written. It checks the body against its
// length and its Repr-Digest trailer (unless NoDigest). When an attempt fails after writing, the
// next one starts over: reset is called first (truncate the file, rewind the buffer); without
// reset such a failure is not retried. A digest that does not match is retried like a broken
// body, then returned as a *DigestError.
func (c *Client) Fetch(
	ctx context.Context,
	req *ShardRequest,
	w io.Writer,
	reset func() error,
	progress Progress,
) (int64, error) {
	f, err := c.FetchVerified(ctx, req, w, reset, progress)
	return f.Bytes, err
}

// Fetched is what a fetch wrote: its length and the digest it was checked against ("" when the
// server sent none).
type Fetched struct {
	Bytes  int64
	Digest string
}

// FetchVerified is Fetch, returning the digest the body was checked against too.
func (c *Client) FetchVerified(
	ctx context.Context,
	req *ShardRequest,
	w io.Writer,
	reset func() error,
	progress Progress,
) (Fetched, error) {
	var f Fetched
	var err error
	f.Bytes, err = c.download(ctx, http.MethodPost, "/v1/shards", req, w, reset, progress, &f.Digest)
	return f, err
}

// FetchBytes returns a whole shard in memory.
func (c *Client) FetchBytes(ctx context.Context, req *ShardRequest) ([]byte, error) {
	var buf bytes.Buffer
	_, err := c.Fetch(ctx, req, &buf, func() error { buf.Reset(); return nil }, nil)
	return buf.Bytes(), err
}

// download streams a response body into w, retrying as Fetch says; digest, when not nil, is set
// to the Repr-Digest the body matched.
func (c *Client) download(
	ctx context.Context,
	method, path string,
	body any,
	w io.Writer,
	reset func() error,
	progress Progress,
	digest *string,
) (int64, error) {
	var n int64
	err := c.retry(ctx, method+" "+path, func() error {
		if n > 0 { // a failed attempt left bytes in w
			if err := reset(); err != nil {
				return err
			}
			n = 0
		}
		err := c.stream(ctx, method, path, body, w, &n, progress, digest)
		var t *transient
		if n > 0 && reset == nil && errors.As(err, &t) {
			return fmt.Errorf(
				"%w; not retried: %d bytes were written and there is no reset to start over (%w)",
				t.err,
				n,
				errors.ErrUnsupported,
			)
		}
		return err
	})
	return n, err
}

// stream sends one request and copies its body into w, counting into n.
func (c *Client) stream(
	ctx context.Context,
	method, path string,
	body any,
	w io.Writer,
	n *int64,
	progress Progress,
	digest *string,
) error {
	res, err := c.do(ctx, method, path, body)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	total := res.ContentLength
	if total < 0 { // chunked, to carry the digest trailer: the length comes as a header
		if v, err := strconv.ParseInt(res.Header.Get("Shard-Length"), 10, 64); err == nil {
			total = v
		}
	}
	// A client that declined the digest hashes only a body that carries one anyway: SHA-256 runs
	// at about a core's worth of a fast download.
	_, announced := res.Trailer["Repr-Digest"]
	check := !c.NoDigest || announced || len(res.Header.Values("Repr-Digest")) > 0
	hash := sha256.New()
	buf := make([]byte, 4<<20)
	for {
		m, rerr := res.Body.Read(buf)
		if m > 0 {
			if _, err := w.Write(buf[:m]); err != nil {
				return err
			}
			if check {
				hash.Write(buf[:m])
			}
			*n += int64(m)
			if progress != nil {
				progress(*n, total)
			}
		}
		if rerr == io.EOF {
			break
		}
		if rerr != nil {
			return &transient{err: &ShortBodyError{Got: *n, Want: total, Err: rerr}}
		}
	}
	if total >= 0 && *n != total {
		return &transient{err: &ShortBodyError{Got: *n, Want: total, Err: io.ErrUnexpectedEOF}}
	}
	if !check {
		return nil
	}
	matched, err := checkDigest(res.Header.Values("Repr-Digest"), res.Trailer.Values("Repr-Digest"), hash.Sum(nil))
	if err != nil {
		return &transient{err: err}
	}
	if digest != nil {
		*digest = matched
	}
	return nil
}

// checkDigest checks a body whose SHA-256 is sum against the Repr-Digest field lines (RFC 9530)
// the server sent with it: in the header section when it knew the digest before the body, in the
// trailer otherwise. It returns the digest matched, "" when neither names sha-256 (the client
// declined it, or the server sends none). A *DigestError is a digest other than sum, a header and
// a trailer that name different ones, or a field that does not parse (RFC 8941), which cannot be
// checked against.
func checkDigest(header, trailer []string, sum []byte) (string, error) {
	got := "sha-256=:" + base64.StdEncoding.EncodeToString(sum) + ":"
	var named [][]byte
	var sent []string
	for _, lines := range [][]string{header, trailer} {
		if len(lines) == 0 {
			continue
		}
		field := strings.Join(lines, ", ")
		sent = append(sent, field)
		dict, ok := sfv.ParseDictionary(field)
		if !ok {
			return "", &DigestError{Got: got, Want: strings.Join(sent, "; ")}
		}
		if d, found := dict["sha-256"]; found { // a dictionary may name other algorithms beside it
			named = append(named, d.Bytes)
		}
	}
	if len(named) == 0 {
		return "", nil
	}
	for _, want := range named {
		if !bytes.Equal(want, sum) {
			return "", &DigestError{Got: got, Want: strings.Join(sent, "; ")}
		}
	}
	return got, nil
}
