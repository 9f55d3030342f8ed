package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Client talks to a shardsrv server. It is safe for concurrent use.
type Client struct {
	// BaseURL is the server, e.g. http://shardsrv:8080.
	BaseURL string
	// Token, when set, is sent as a bearer token.
	Token string
	// HTTP is the client used; nil means http.DefaultClient.
	HTTP *http.Client
	// Attempts is how many times a request that failed in a way worth retrying is sent (>= 1).
	Attempts int
	// Backoff is the first wait between attempts; it doubles, and a Retry-After header wins.
	Backoff time.Duration
}

// NewClient returns a client with 5 attempts and a 500 ms first backoff.
func NewClient(baseURL string) *Client {
	return &Client{BaseURL: strings.TrimRight(baseURL, "/"), Attempts: 5, Backoff: 500 * time.Millisecond}
}

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

// retryable reports problems worth another attempt: overload, storage trouble, a file that
// changed under the request (the next attempt sees the new version).
func (e *ProblemError) retryable() bool {
	switch e.Status {
	case http.StatusConflict, http.StatusBadGateway, http.StatusServiceUnavailable, http.StatusGatewayTimeout:
		return true
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

func (c *Client) httpClient() *http.Client {
	if c.HTTP != nil {
		return c.HTTP
	}
	return http.DefaultClient
}

// do sends one request and returns the response when its status is 200; any other status is
// read as a problem.
func (c *Client) do(ctx context.Context, method, path string, body any) (*http.Response, error) {
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
	req.Header.Set("Content-Type", "application/json")
	if c.Token != "" {
		req.Header.Set("Authorization", "Bearer "+c.Token)
	}
	res, err := c.httpClient().Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode == http.StatusOK {
		return res, nil
	}
	defer res.Body.Close()
	var p ProblemError
	if err := json.NewDecoder(io.LimitReader(res.Body, 1<<20)).Decode(&p.Problem); err != nil || p.Status == 0 {
		p.Problem = Problem{Status: res.StatusCode, Title: http.StatusText(res.StatusCode)}
	}
	return nil, &retryAfter{err: &p, after: res.Header.Get("Retry-After")}
}

// retryAfter carries a server's Retry-After with its error.
type retryAfter struct {
	err   error
	after string
}

func (r *retryAfter) Error() string { return r.err.Error() }
func (r *retryAfter) Unwrap() error { return r.err }

// retry runs attempt until it succeeds, fails for good, or the attempts run out.
func (c *Client) retry(ctx context.Context, attempt func() error) error {
	wait := c.Backoff
	for n := 1; ; n++ {
		err := attempt()
		if err == nil || n >= max(1, c.Attempts) || ctx.Err() != nil || !worthRetrying(err) {
			var ra *retryAfter
			if errors.As(err, &ra) {
				return ra.err
			}
			return err
		}
		sleep := wait
		var ra *retryAfter
		if errors.As(err, &ra) {
			if s, perr := strconv.Atoi(ra.after); perr == nil {
				sleep = time.Duration(s) * time.Second
			}
		}
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			return ctx.Err()
		}
		wait *= 2
	}
}

func worthRetrying(err error) bool {
	var p *ProblemError
	if errors.As(err, &p) {
		return p.retryable()
	}
	var short *ShortBodyError
	var uerr *url.Error
	return errors.As(err, &short) || errors.As(err, &uerr) // aborted streams, refused or reset connections
}

func (c *Client) getJSON(ctx context.Context, method, path string, body, out any) error {
	return c.retry(ctx, func() error {
		res, err := c.do(ctx, method, path, body)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		return json.NewDecoder(res.Body).Decode(out)
	})
}

// Checkpoints lists the checkpoints the server has.
func (c *Client) Checkpoints(ctx context.Context) ([]string, error) {
	var out CheckpointList
	err := c.getJSON(ctx, http.MethodGet, "/v1/checkpoints", nil, &out)
	return out.Checkpoints, err
}

// Tensors lists a checkpoint's tensors.
func (c *Client) Tensors(ctx context.Context, checkpoint string) (*TensorList, error) {
	var out TensorList
	err := c.getJSON(ctx, http.MethodGet, "/v1/tensors?checkpoint="+url.QueryEscape(checkpoint), nil, &out)
	return &out, err
}

// Plan asks for the plan of a request without reading tensor data.
func (c *Client) Plan(ctx context.Context, req *ShardRequest) (*PlanResponse, error) {
	var out PlanResponse
	err := c.getJSON(ctx, http.MethodPost, "/v1/plan", req, &out)
	return &out, err
}

// Progress is told how many bytes of how many arrived.
type Progress func(done, total int64)

// Fetch streams a shard into w, which must be able to start over: before every attempt after
// the first, reset is called (truncate the file, rewind the buffer). It checks the body against
// its Content-Length and returns the bytes written.
func (c *Client) Fetch(ctx context.Context, req *ShardRequest, w io.Writer, reset func() error, progress Progress) (int64, error) {
	var n int64
	first := true
	err := c.retry(ctx, func() error {
		if !first {
			if reset == nil {
				return fmt.Errorf("shardsrv: cannot retry into a writer without reset: %w", errors.ErrUnsupported)
			}
			if err := reset(); err != nil {
				return err
			}
		}
		first = false
		n = 0
		res, err := c.do(ctx, http.MethodPost, "/v1/shards", req)
		if err != nil {
			return err
		}
		defer res.Body.Close()
		total := res.ContentLength
		buf := make([]byte, 4<<20)
		for {
			m, rerr := res.Body.Read(buf)
			if m > 0 {
				if _, werr := w.Write(buf[:m]); werr != nil {
					return werr
				}
				n += int64(m)
				if progress != nil {
					progress(n, total)
				}
			}
			if rerr == io.EOF {
				break
			}
			if rerr != nil {
				return &ShortBodyError{Got: n, Want: total, Err: rerr}
			}
		}
		if total >= 0 && n != total {
			return &ShortBodyError{Got: n, Want: total, Err: io.ErrUnexpectedEOF}
		}
		return nil
	})
	return n, err
}

// FetchBytes returns a whole shard in memory.
func (c *Client) FetchBytes(ctx context.Context, req *ShardRequest) ([]byte, error) {
	var buf bytes.Buffer
	_, err := c.Fetch(ctx, req, &buf, func() error { buf.Reset(); return nil }, nil)
	return buf.Bytes(), err
}
