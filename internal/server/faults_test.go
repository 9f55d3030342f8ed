package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store/objstore"
)

// syncBuffer collects log lines from concurrent handlers.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

type faultEnv struct {
	url    string
	g      *s3test.Gateway
	proxy  *s3test.Proxy
	bucket string
	data   []byte
	req    api.ShardRequest
	logs   *syncBuffer
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/4) ^ seed
	}
	return b
}

func checkpointBytes(data []byte) []byte {
	var buf bytes.Buffer
	safetensors.Write(
		&buf,
		[]safetensors.TensorData{{Name: "w", DType: "F32", Shape: []int64{64, 1024}, Data: data}},
		nil,
	)
	return buf.Bytes()
}

// faultServer runs shardsrv over S3 through a fault-injecting proxy: 4 segments of 64 KiB, with a
// window of one, which the stream's read-ahead grows to all four while the budget is idle: data
// reads arrive in no fixed order.
func faultServer(t *testing.T, cfg s3reader.Config) *faultEnv {
	g := s3test.Start(t)
	e := &faultEnv{
		g:      g,
		bucket: fmt.Sprintf("bucket-%d", buckets.Add(1)),
		data:   pattern(64*1024*4, 1),
		logs:   &syncBuffer{},
	}
	g.CreateBucket(t, e.bucket)
	g.Put(t, e.bucket, "m/model.safetensors", checkpointBytes(e.data))
	e.proxy = g.NewProxy()
	t.Cleanup(e.proxy.Close)
	if cfg.Bucket == "" {
		cfg.Bucket = e.bucket
	}
	cfg.Endpoint = e.proxy.URL
	if cfg.ReadTimeout == 0 {
		cfg.ReadTimeout = 2 * time.Second
	}
	if cfg.RetryBudget == 0 {
		cfg.RetryBudget = 3 * time.Second
	}
	st, err := s3reader.New(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	opts := planner.DefaultOptions()
	opts.SegmentBytes = 64 << 10
	opts.MaxGap = 1 << 20
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{
		Catalog:  checkpoint.New(st),
		Executor: executor.New(st, mem, executor.Config{Window: 1}),
		Budget:   mem,
		Planner:  opts,
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
		Logger:   slog.New(slog.NewJSONHandler(e.logs, nil)),
	})
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	e.url = ts.URL
	e.req = shardReq(
		"m",
		api.TensorRequest{
			Name:   "w",
			Dtype:  api.F32,
			Shape:  []int64{64, 1024},
			Boxes:  whole(64, 1024),
			Blocks: copyOf("w", 64, 1024),
		},
	)
	return e
}

// dataRead tells a data read from the catalog's header read at offset 0.
func dataRead(r *http.Request) bool { return !strings.HasPrefix(r.Header.Get("Range"), "bytes=0-") }

// faultsOnData applies faults to the n-th data read (from 1), by a map; other reads pass.
func faultsOnData(faults map[int]s3test.Fault) func(int, *http.Request) s3test.Fault {
	var mu sync.Mutex
	n := 0
	return func(_ int, r *http.Request) s3test.Fault {
		if !dataRead(r) {
			return s3test.Pass
		}
		mu.Lock()
		defer mu.Unlock()
		n++
		return faults[n]
	}
}

// fetchWithin is how long a client waits for a fetch: ten times the longest retry budget the
// stores here are given, and far below the request time-out. A fault that holds a request past the
// store's budget fails the fetch with this deadline instead of a problem.
const fetchWithin = 30 * time.Second

func (e *faultEnv) fetch(t *testing.T) (int, http.Header, []byte, error) { return e.fetchThen(t, nil) }

// fetchThen is fetch that calls headers, when it is not nil, once the response's headers are in.
func (e *faultEnv) fetchThen(t *testing.T, headers func()) (int, http.Header, []byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), fetchWithin)
	defer cancel()
	raw, _ := json.Marshal(e.req)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.url+"/v1/shards", bytes.NewReader(raw))
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("no answer within %s: %v", fetchWithin, err)
	}
	defer res.Body.Close()
	if headers != nil {
		headers()
	}
	body, err := io.ReadAll(res.Body)
	return res.StatusCode, res.Header, body, err
}

func (e *faultEnv) expectBytes(t *testing.T, want []byte) {
	t.Helper()
	status, _, body, err := e.fetch(t)
	if status != 200 || err != nil || !bytes.Equal(body, want) {
		t.Fatalf(
			"status %d, err %v, %d bytes (equal: %v); want exactly the %d bytes",
			status,
			err,
			len(body),
			bytes.Equal(body, want),
			len(want),
		)
	}
}

func (e *faultEnv) expectProblem(t *testing.T, status int, mentions ...string) string {
	t.Helper()
	got, hdr, body, _ := e.fetch(t)
	if got != status || hdr.Get("Content-Type") != "application/problem+json" {
		t.Fatalf("status %d %s, want a %d problem", got, body, status)
	}
	for _, m := range mentions {
		if !strings.Contains(string(body), m) {
			t.Errorf("problem %s does not mention %q", body, m)
		}
	}
	return string(body)
}

func TestS3SlowDownIsRetried(t *testing.T) {
	e := faultServer(t, s3reader.Config{})
	e.proxy.SetDecide(faultsOnData(map[int]s3test.Fault{1: s3test.SlowDown, 2: s3test.SlowDown, 4: s3test.SlowDown}))
	e.expectBytes(t, e.data)
}

func TestS3SlowDownEverywhereIs503(t *testing.T) {
	e := faultServer(t, s3reader.Config{Tunables: objstore.Tunables{RetryBudget: 500 * time.Millisecond}})
	e.proxy.SetDecide(func(_ int, r *http.Request) s3test.Fault {
		if dataRead(r) {
			return s3test.SlowDown
		}
		return s3test.Pass
	})
	_, hdr, _, _ := e.fetch(t)
	if hdr.Get("Retry-After") == "" {
		t.Error("a 503 says when to retry")
	}
	e.expectProblem(t, 503, "s3://"+e.bucket, "SlowDown")
}

func TestS3BrokenBodiesResumeWhereTheyStopped(t *testing.T) {
	e := faultServer(t, s3reader.Config{})
	// The first request for the first segment is reset half-way, the first for the third closed
	// cleanly half-way: each read asks again only for its missing tail, whichever segments the
	// stream's read-ahead has in flight beside them.
	begin, segment := int64(len(headerOf(e.data))), int64(64<<10)
	faults := map[int64]s3test.Fault{begin: s3test.Reset, begin + 2*segment: s3test.Truncate}
	var mu sync.Mutex
	e.proxy.SetDecide(func(_ int, r *http.Request) s3test.Fault {
		from := rangeStart(r.Header.Get("Range"))
		mu.Lock()
		defer mu.Unlock()
		f := faults[from]
		delete(faults, from)
		return f
	})
	e.expectBytes(t, e.data)
	for _, c := range []struct {
		from  int64
		fault string
	}{{begin, "reset"}, {begin + 2*segment, "truncated"}} {
		var resumed []int64 // the requests for the rest of the segment
		for _, r := range e.proxy.Ranges {
			if at := rangeStart(r); at > c.from && at < c.from+segment {
				resumed = append(resumed, at)
			}
		}
		// A reset may lose bytes the proxy wrote before it; a clean close loses none.
		half := c.from + segment/2
		if len(resumed) != 1 || resumed[0] > half || c.fault == "truncated" && resumed[0] != half {
			t.Errorf("ranges %v: the %s read at %d should be resumed once, at %d (a reset: at most there)",
				e.proxy.Ranges, c.fault, c.from, half)
		}
	}
}

// rangeStart is the first byte a Range header of bytes=FROM- asks for.
func rangeStart(r string) int64 {
	var from int64
	fmt.Sscanf(r, "bytes=%d-", &from)
	return from
}

func TestS3StalledReadIsRetried(t *testing.T) {
	e := faultServer(t, s3reader.Config{Tunables: objstore.Tunables{ReadTimeout: 300 * time.Millisecond}})
	e.proxy.SetDecide(faultsOnData(map[int]s3test.Fault{2: s3test.Stall}))
	e.expectBytes(t, e.data)
}

func TestS3StalledStoreTimesOutWithin(t *testing.T) {
	e := faultServer(t, s3reader.Config{Tunables: objstore.Tunables{ReadTimeout: 200 * time.Millisecond, RetryBudget: time.Second}})
	e.proxy.SetDecide(func(_ int, r *http.Request) s3test.Fault {
		if dataRead(r) {
			return s3test.Stall
		}
		return s3test.Pass
	})
	// A 504 at all is the store giving up at its budget: past it, the fetch's deadline fires.
	e.expectProblem(t, 504, "s3://"+e.bucket)
}

func TestS3ObjectReplacedMidLoad(t *testing.T) {
	e := faultServer(t, s3reader.Config{})
	replaced := pattern(len(e.data), 7)
	// Replaced once the first segment was read (the response's headers wait for it), before the
	// request for the second goes on, however many the read-ahead has in flight: that read's
	// If-Match fails and the connection is aborted, so the client never holds bytes of two versions.
	secondSegment := fmt.Sprintf("bytes=%d-", len(headerOf(e.data))+64<<10)
	headers := make(chan struct{})
	var once, once2 sync.Once
	e.proxy.SetDecide(func(n int, r *http.Request) s3test.Fault {
		if strings.HasPrefix(r.Header.Get("Range"), secondSegment) {
			once.Do(func() {
				<-headers
				e.g.PutErr(e.bucket, "m/model.safetensors", checkpointBytes(replaced))
			})
		}
		return s3test.Pass
	})
	status, _, body, err := e.fetchThen(t, func() { close(headers) })
	if status != 200 || err == nil || len(body) >= len(e.data) {
		t.Fatalf("status %d, %d bytes, err %v: want a short body and an error", status, len(body), err)
	}
	if !bytes.Equal(body, e.data[:len(body)]) {
		t.Fatal("the bytes sent before the abort must be the old version's")
	}
	// The cached metadata was dropped: the next request serves the new version whole.
	e.proxy.SetDecide(nil)
	e.expectBytes(t, replaced)
	// Replaced between the catalog's look and the first data read: a clean 409 before any byte,
	// and the request after it serves the new version.
	e.proxy.SetDecide(func(n int, r *http.Request) s3test.Fault {
		if dataRead(r) {
			once2.Do(func() { e.g.PutErr(e.bucket, "m/model.safetensors", checkpointBytes(e.data)) })
		}
		return s3test.Pass
	})
	e.expectProblem(t, 409, "replaced")
	e.proxy.SetDecide(nil)
	e.expectBytes(t, e.data)
}

// headerOf is the safetensors header (length prefix included) the fixture is written with.
func headerOf(data []byte) []byte {
	b := checkpointBytes(data)
	return b[:len(b)-len(data)]
}

func TestS3WrongCredentialsAreA502WithoutTheSecret(t *testing.T) {
	const secret = "not-the-right-secret-0123456789"
	e := faultServer(t, s3reader.Config{})
	t.Setenv("AWS_SECRET_ACCESS_KEY", secret)
	st, err := s3reader.New(
		context.Background(),
		s3reader.Config{Bucket: e.bucket, Endpoint: e.proxy.URL, Tunables: objstore.Tunables{RetryBudget: time.Second}},
	)
	if err != nil {
		t.Fatal(err)
	}
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
	srv := server.New(server.Config{
		Catalog:  checkpoint.New(st),
		Executor: executor.New(st, mem, executor.Config{Window: 1}),
		Budget:   mem,
		Planner:  planner.DefaultOptions(),
		Limits:   server.Limits{MaxBodyBytes: 1 << 20},
		Logger:   slog.New(slog.NewJSONHandler(e.logs, nil)),
	})
	ts := httptest.NewServer(srv.Handler())
	defer ts.Close()
	e.url = ts.URL
	body := e.expectProblem(t, 502, "access denied", "s3://"+e.bucket)
	if strings.Contains(body, secret) || strings.Contains(e.logs.String(), secret) ||
		strings.Contains(body, s3test.AccessKey) {
		t.Error("a credential leaked into a problem or a log line")
	}
	res, _ := http.Get(ts.URL + "/readyz")
	if res.StatusCode != 503 {
		t.Errorf("/readyz with wrong credentials: %d", res.StatusCode)
	}
}
