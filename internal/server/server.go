// Package server is shardsrv's HTTP face: it decodes requests, has resolve turn each into a plan,
// runs the plan through the executor, streams the body, and answers every error as an RFC 9457
// problem.
package server

import (
	"bufio"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/auth"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/bytesize"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/jsonbody"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/resolve"
	"github.com/shardsrv/shardsrv/internal/server/gen"
)

// Config is what the server is built from. A field left at zero takes its default, but Catalog
// and Executor, which are required, and StoreGrace, whose zero is a setting.
type Config struct {
	Catalog  *checkpoint.Catalog // required: the routes and the store.reachable gauge read it
	Executor *executor.Executor  // required: it streams the shards
	// Budget is the process's memory budget, the executor's too: bodies, plans and /v1/plan reports
	// are held against it (nil: a budget of budget.DefaultBytes).
	Budget *budget.Budget
	// Planner is the planner's options, each at zero its default (planner.Options).
	Planner planner.Options
	Limits  Limits
	// Tokens, when set, are the bearer tokens every route but /healthz, /readyz and /metrics needs
	// (nil: no route needs one).
	Tokens *auth.Tokens
	// Logger defaults to discarding what it is given.
	Logger *slog.Logger
	// Tracer and Meter default to no-ops; Metrics serves /metrics (404 when nil).
	Tracer  trace.TracerProvider
	Meter   metric.MeterProvider
	Metrics http.Handler
	// Cluster, when set, serves the chunk cache the replicas share: /v1/prefetch warms it, and
	// with PeerTokens the peer route serves it (cluster.go; nil: no prefetch, no peer route).
	Cluster *cluster.Handler
	// PeerTokens admit peers to the peer route, which is not served without them.
	PeerTokens *auth.Tokens
	// StoreGrace is how long the store may be unreachable before /readyz says not ready (zero: at
	// once); with a cache it never does (readiness.go).
	StoreGrace time.Duration
}

// Limits protect the service from requests that would take more than their share. A field left
// at zero takes its default (Default*), so a literal names only the limits it changes; nothing is
// unlimited.
type Limits struct {
	MaxBodyBytes int64 // a request body, after decoding (413 above; 0: DefaultMaxBodyBytes)
	MaxTensors   int   // tensors per request (413 above; 0: DefaultMaxTensors)
	MaxBlocks    int   // blocks per request, all tensors together (413 above; 0: DefaultMaxBlocks)
	// MaxConfigBytes caps the config.json a layout is built from (422 above, naming the file); a
	// layout reserves engine.ConfigMemory of its length from the memory budget while it is built
	// (0: DefaultMaxConfigBytes).
	MaxConfigBytes int64
	// MaxStreams caps the requests that plan at once: shard streams and /v1/plan together (503
	// with Retry-After above). A request takes its slot only once its body is read and checked, so
	// a client that is slow to send holds none (0: DefaultMaxStreams).
	MaxStreams int
	// RequestTimeout bounds a whole request; WriteTimeout one write to the client, so a stalled
	// client lets go of its buffers (0: DefaultRequestTimeout, DefaultWriteTimeout).
	RequestTimeout time.Duration
	WriteTimeout   time.Duration
	// BodyTimeout bounds reading a request's body, from the end of its headers (408 after it; the
	// connection is then closed; 0: DefaultBodyTimeout).
	BodyTimeout time.Duration
}

// The limits' defaults, for flags and for Limits left at zero.
const (
	DefaultMaxBodyBytes   = 64 << 20
	DefaultMaxTensors     = 65536
	DefaultMaxBlocks      = 1 << 20
	DefaultMaxConfigBytes = resolve.DefaultMaxConfigBytes
	DefaultMaxStreams     = 256
	DefaultRequestTimeout = 30 * time.Minute
	DefaultWriteTimeout   = time.Minute
	DefaultBodyTimeout    = 30 * time.Second
)

// RegisterFlags registers the limits' flags on fs, with their defaults.
func (l *Limits) RegisterFlags(fs *flag.FlagSet) {
	l.MaxBodyBytes = DefaultMaxBodyBytes
	fs.Var(bytesize.Value{P: &l.MaxBodyBytes}, "max-body-bytes", "largest request `SIZE` accepted (413 above)")
	fs.IntVar(&l.MaxTensors, "max-tensors", DefaultMaxTensors, "tensors per request (413 above)")
	fs.IntVar(&l.MaxBlocks, "max-blocks", DefaultMaxBlocks, "blocks per request, all tensors together (413 above)")
	l.MaxConfigBytes = DefaultMaxConfigBytes
	fs.Var(bytesize.Value{P: &l.MaxConfigBytes}, "max-config-bytes",
		"largest config.json `SIZE` a layout is built from (422 above)")
	fs.IntVar(&l.MaxStreams, "max-streams", DefaultMaxStreams,
		"requests planning or streaming at once, /v1/shards and /v1/plan together (503 with Retry-After above)")
	fs.DurationVar(&l.RequestTimeout, "request-timeout", DefaultRequestTimeout,
		"longest a request may take, streaming included")
	fs.DurationVar(&l.WriteTimeout, "write-timeout", DefaultWriteTimeout,
		"longest one write to a client may take; a stalled client is cut off and its buffers freed")
	fs.DurationVar(&l.BodyTimeout, "body-timeout", DefaultBodyTimeout,
		"longest a client may take to send a request body (408 after it); a request takes its stream slot "+
			"only once its body is in")
}

// Validate reports limits the server cannot run with: negative ones (zero is the default).
func (l *Limits) Validate() error {
	if l.MaxBodyBytes < 0 || l.MaxTensors < 0 || l.MaxBlocks < 0 || l.MaxStreams < 0 || l.MaxConfigBytes < 0 ||
		l.RequestTimeout < 0 || l.WriteTimeout < 0 || l.BodyTimeout < 0 {
		return errors.New("--max-body-bytes, --max-tensors, --max-blocks, --max-streams, --max-config-bytes " +
			"and the timeouts must not be negative")
	}
	return nil
}

// withDefaults fills the limits left at zero.
func (l Limits) withDefaults() Limits {
	orDefault(&l.MaxBodyBytes, DefaultMaxBodyBytes)
	orDefault(&l.MaxTensors, DefaultMaxTensors)
	orDefault(&l.MaxBlocks, DefaultMaxBlocks)
	orDefault(&l.MaxConfigBytes, DefaultMaxConfigBytes)
	orDefault(&l.MaxStreams, DefaultMaxStreams)
	orDefault(&l.RequestTimeout, DefaultRequestTimeout)
	orDefault(&l.WriteTimeout, DefaultWriteTimeout)
	orDefault(&l.BodyTimeout, DefaultBodyTimeout)
	return l
}

func orDefault[T int | int64 | time.Duration](v *T, def T) {
	if *v == 0 {
		*v = def
	}
}

// Server implements gen.ServerInterface.
type Server struct {
	cfg      Config
	log      *slog.Logger
	metrics  *metrics
	resolver *resolve.Resolver
	streams  chan struct{}
	draining atomic.Bool
	digests  *digestMemo
}

var _ gen.ServerInterface = (*Server)(nil)

// Validate reports a configuration no server can run with: no catalog or executor, or Limits
// that Validate refuses.
func (c *Config) Validate() error {
	if c.Catalog == nil || c.Executor == nil {
		return errors.New("a server needs a catalog and an executor")
	}
	return c.Limits.Validate()
}

// New returns a server. It panics on a Config that Validate refuses: a program validates its
// configuration before it builds anything.
func New(cfg Config) *Server {
	if err := cfg.Validate(); err != nil {
		panic("server: " + err.Error())
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Tracer == nil {
		cfg.Tracer = tracenoop.NewTracerProvider()
	}
	if cfg.Meter == nil {
		cfg.Meter = metricnoop.NewMeterProvider()
	}
	if cfg.Budget == nil {
		cfg.Budget = budget.New(budget.Config{})
	}
	cfg.Limits = cfg.Limits.withDefaults()
	l := &cfg.Limits
	s := &Server{
		cfg:     cfg,
		log:     cfg.Logger,
		streams: make(chan struct{}, l.MaxStreams),
		digests: newDigestMemo(),
	}
	s.resolver = resolve.New(resolve.Config{Catalog: cfg.Catalog, Memory: cfg.Budget, Planner: cfg.Planner,
		MaxConfigBytes: l.MaxConfigBytes, Tracer: cfg.Tracer.Tracer("shardsrv/resolve")})
	s.metrics = newMetrics(cfg.Meter, s)
	return s
}

// PlanBytes is the memory a plan may grow to (resolve.Resolver.PlanBytes), for the startup line.
func (s *Server) PlanBytes() int64 { return s.resolver.PlanBytes() }

// Drain makes /readyz answer 503, so load balancers stop sending requests before shutdown.
func (s *Server) Drain() { s.draining.Store(true) }

// Shutdown stops hs, which serves this server's handler, the way Kubernetes expects: /readyz
// answers 503 at once while the listener still accepts for drainDelay (the time endpoints and
// load balancers take to stop sending here; ctx ending cuts it short), then the listener closes,
// idle connections are closed, and requests in flight get grace to finish. Those still running
// after it are cut off, and Shutdown says so.
func (s *Server) Shutdown(ctx context.Context, hs *http.Server, drainDelay, grace time.Duration) error {
	s.Drain()
	s.log.Info("draining: /readyz answers 503, new requests are still served", "drain_delay", drainDelay.String())
	select {
	case <-time.After(drainDelay):
	case <-ctx.Done():
	}
	s.log.Info("shutting down: the listener is closed, requests in flight finish", "grace", grace.String())
	graceCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
	defer cancel()
	if err := hs.Shutdown(graceCtx); err != nil {
		hs.Close()
		return fmt.Errorf("requests still running at the end of the grace period were cut off: %w", err)
	}
	return nil
}

// admit takes a planning slot (a shard stream or a /v1/plan), or answers 503.
func (s *Server) admit(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	select {
	case s.streams <- struct{}{}:
		return func() { <-s.streams }, true
	default:
		writeProblem(w, r, newProblem("busy", fmt.Sprintf(
			"%d shard streams and plans are running, the most this server takes; retry shortly",
			s.cfg.Limits.MaxStreams)))
		return nil, false
	}
}

// Handler returns the HTTP handler with every route of openapi.yaml.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(s.middleware()...)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, newProblem("no-route",
			r.Method+" "+r.URL.Path+" is not an endpoint of this service; see openapi.yaml"))
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, newProblem("method-not-allowed", r.Method+" is not allowed on "+r.URL.Path))
	})
	s.routePeers(r)
	return gen.HandlerWithOptions(s, gen.ChiServerOptions{
		BaseRouter: r,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeProblem(w, r, newProblem("invalid-parameter", err.Error()))
		},
	})
}

// middleware is what every request passes through before its route, outermost first.
func (s *Server) middleware() []func(http.Handler) http.Handler {
	return []func(http.Handler) http.Handler{
		s.bodyDeadline,
		otelhttp.NewMiddleware(
			"shardsrv",
			otelhttp.WithTracerProvider(s.cfg.Tracer),
			otelhttp.WithMeterProvider(s.cfg.Meter),
		),
		requestID,
		s.accessLog,
		s.recoverPanics,
		s.authenticate,
	}
}

// bodyDeadline gives every request that carries a body BodyTimeout to send it: the connection's
// read deadline, which jsonbody.Read lifts once the whole body is in. A handler that never reads the
// body (a 401, a 415) leaves it set, so the server's attempt to drain the rest times out too and
// the connection is closed.
func (s *Server) bodyDeadline(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			http.NewResponseController(w).SetReadDeadline(time.Now().Add(s.cfg.Limits.BodyTimeout))
		}
		next.ServeHTTP(w, r)
	})
}

// decodeJSON reads a request body strictly: unknown fields, duplicate keys, trailing data and
// wrong types are 400s.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) *Problem {
	release, p := s.decodeBody(w, r, v)
	if p == nil {
		release()
	}
	return p
}

// decodedBodyFactor is the memory a JSON request takes while it is decoded and planned from, as a
// multiple of its length: the bytes, and the Go values they decode to (a 12 MB table of 150k blocks
// holds 23 MB once decoded), with room for the decoder's garbage.
const decodedBodyFactor = 4

func malformed(detail string, fields ...api.FieldError) *Problem {
	return newProblem("malformed-request", detail, fields...)
}

// decodeBody reads and decodes a body. Once read, the body is charged to the memory budget streams
// and plans share, at decodedBodyFactor times its length, so many large requests at once wait (or
// get 503) instead of growing the heap past it; release gives the charge back. A body is charged
// only once it is in, so a client slow to send one holds none of the budget.
func (s *Server) decodeBody(w http.ResponseWriter, r *http.Request, v any) (release func(), p *Problem) {
	body, err := jsonbody.Read(w, r, s.cfg.Limits.MaxBodyBytes, s.cfg.Limits.BodyTimeout)
	if err != nil {
		return nil, toProblem(err)
	}
	cost := int64(len(body)) * decodedBodyFactor
	giveBack, err := s.cfg.Budget.Reserve(r.Context(), cost)
	if err != nil {
		return nil, toProblem(err)
	}
	release = func() { giveBack(cost) }
	if err := jsonbody.Decode(body, v); err != nil {
		release()
		return nil, toProblem(err)
	}
	return release, nil
}

// decode reads a shard request and checks what needs no checkpoint: a name, and the size limits.
func (s *Server) decode(w http.ResponseWriter, r *http.Request) (_ *api.ShardRequest, release func(), _ *Problem) {
	var req api.ShardRequest
	release, p := s.decodeBody(w, r, &req)
	if p != nil {
		return nil, nil, p
	}
	fail := func(p *Problem) (*api.ShardRequest, func(), *Problem) {
		release()
		return nil, nil, p
	}
	bad := malformed
	if req.Checkpoint == "" {
		return fail(bad("checkpoint is required",
			api.FieldError{Pointer: "/checkpoint", Detail: "name the checkpoint folder"}))
	}
	blocks := 0
	for _, t := range req.Tensors {
		if t.Blocks != nil {
			blocks += len(*t.Blocks)
		}
	}
	if len(req.Tensors) > s.cfg.Limits.MaxTensors || blocks > s.cfg.Limits.MaxBlocks {
		return fail(newProblem("request-too-large", fmt.Sprintf(
			"the request has %d tensors and %d blocks; this server takes at most %d and %d: split the request",
			len(req.Tensors), blocks, s.cfg.Limits.MaxTensors, s.cfg.Limits.MaxBlocks),
			api.FieldError{Pointer: "/tensors", Detail: "split the request"}))
	}
	return &req, release, nil
}

// admitAndPlan decodes a request, takes a slot — only now, so a client slow to send its body holds
// none — and resolves it. When ok, done gives back the slot and the memory the body and plan hold;
// otherwise the problem was written.
func (s *Server) admitAndPlan(w http.ResponseWriter, r *http.Request, purpose resolve.Purpose) (
	res *resolve.Resolved, done func(), ok bool,
) {
	req, releaseBody, p := s.decode(w, r)
	if p != nil {
		writeProblem(w, r, p)
		return nil, nil, false
	}
	releaseSlot, ok := s.admit(w, r)
	if !ok {
		releaseBody()
		return nil, nil, false
	}
	res, err := s.resolver.Resolve(r.Context(), req, purpose)
	if err != nil {
		releaseSlot()
		releaseBody()
		writeProblem(w, r, toProblem(err))
		return nil, nil, false
	}
	s.metrics.planned(r.Context(), res.Plan, res.Planning)
	return res, func() { res.Release(); releaseSlot(); releaseBody() }, true
}

// PostShards streams a shard. The response is committed only once the first segment is ready
// and its first byte is written; after that a failure aborts the connection so the client sees a
// short body.
//
// The body carries a Repr-Digest unless the client declines it (digest.go): as a header field when
// the memo has the body's digest, else as a trailer of the body hashed as it streams. Over HTTP/1.1
// a trailer needs the chunked coding, which excludes Content-Length, so the length is then in
// Shard-Length alone; otherwise (the digest declined or known, or HTTP/2) Content-Length carries it
// too, and segments read straight from local files go to the socket by sendfile.
func (s *Server) PostShards(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.RequestTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	res, done, ok := s.admitAndPlan(w, r, resolve.Stream)
	if !ok {
		return
	}
	defer done()
	plan := res.Plan
	start := time.Now()
	s.metrics.streams.Add(ctx, 1)
	defer s.metrics.streams.Add(context.WithoutCancel(ctx), -1)
	digest := sendsDigest(r)
	var key [sha256.Size]byte
	var keyed bool   // the body has a key, to find its digest by or keep it under
	var known []byte // the body's digest, from the memo
	if digest {
		if key, keyed = res.BodyKey(); keyed {
			if sum, hit := s.digests.Get(key); hit {
				known = sum[:]
			}
			s.metrics.digestLookup(ctx, known != nil)
		}
	}
	trailer := digest && known == nil
	to := executor.Output{Sendfile: true}
	if trailer {
		to.Hash = sha256.New()
	}
	stream, err := s.cfg.Executor.Stream(ctx, plan, to)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	defer stream.Close()
	if err := stream.Prime(); err != nil {
		res.ReadFailed(err)
		writeProblem(w, r, toProblem(err))
		return
	}
	// The response is committed when its first byte is written: a file section confirms its
	// version only as it is sent, and one that fails first is still a problem.
	commit := func() {
		h := w.Header()
		h.Set("Content-Type", "application/octet-stream")
		if plan.Format == api.Safetensors {
			h.Set("Content-Type", "application/vnd.safetensors")
		}
		length := strconv.FormatInt(plan.BodyBytes, 10)
		h.Set("Shard-Length", length)
		switch {
		case known != nil:
			h.Set("Repr-Digest", reprDigest(known))
		case trailer:
			h.Set("Trailer", "Repr-Digest")
		}
		if !trailer || r.ProtoMajor >= 2 {
			h.Set("Content-Length", length)
		}
		w.WriteHeader(http.StatusOK)
	}
	sock := &socket{w: w, rc: http.NewResponseController(w), timeout: s.cfg.Limits.WriteTimeout, commit: commit}
	if _, err := stream.WriteTo(sock); err != nil {
		res.ReadFailed(err)
		if sock.commit != nil {
			writeProblem(w, r, toProblem(err))
			return
		}
		if r.Context().Err() == nil {
			s.log.Error("aborting a shard stream after its headers were sent",
				"err", err, "checkpoint", plan.Checkpoint, "request_id", middleware.GetReqID(r.Context()))
		}
		// The connection is cut before the body's last byte (or, chunked, before its end): the
		// client sees a failed transfer, and a digest of it is never sent nor kept.
		panic(http.ErrAbortHandler)
	}
	sock.begin() // an empty body wrote nothing
	if trailer {
		// WriteTo returned only once the body's last byte was written, every file's version
		// confirmed: this is the digest of the body the key names.
		sum := [sha256.Size]byte(stream.Sum())
		if keyed {
			s.digests.Add(key, sum)
		}
		w.Header().Set("Repr-Digest", reprDigest(sum[:]))
	}
	s.metrics.streamed(ctx, plan, time.Since(start))
}

// socket writes a response body: it commits the response before its first byte, every write
// gets WriteTimeout to complete, so a stalled client lets go of its buffers, and ReadFrom hands a
// file on to the connection's sendfile.
type socket struct {
	w       http.ResponseWriter
	rc      *http.ResponseController
	timeout time.Duration
	commit  func() // nil once called
}

// begin commits the response, once.
func (s *socket) begin() {
	if s.commit != nil {
		s.commit()
		s.commit = nil
	}
}

func (s *socket) start() {
	s.begin()
	s.rc.SetWriteDeadline(time.Now().Add(s.timeout))
}

func (s *socket) Write(p []byte) (int, error) {
	s.start()
	return s.w.Write(p)
}

func (s *socket) ReadFrom(r io.Reader) (int64, error) {
	s.start()
	return readFrom(s.w, r)
}

// readFrom copies r to w through w's ReadFrom when it has one — the connection's, which sends a
// file by sendfile — and through a buffer otherwise (HTTP/2, TLS).
func readFrom(w io.Writer, r io.Reader) (int64, error) {
	if rf, ok := w.(io.ReaderFrom); ok {
		return rf.ReadFrom(r)
	}
	return io.Copy(struct{ io.Writer }{w}, r)
}

// PostPlan answers the plan without reading tensor data. Planning costs what it costs for a
// stream, so it takes a slot like one.
func (s *Server) PostPlan(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.RequestTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	res, done, ok := s.admitAndPlan(w, r, resolve.Report)
	if !ok {
		return
	}
	defer done()
	// The report is built and encoded whole: charge it too.
	cost := res.Plan.ReportBytes()
	giveBack, err := s.cfg.Budget.Reserve(ctx, cost)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	defer giveBack(cost)
	writeJSON(w, res.Plan.Report())
}

// ListCheckpoints lists the checkpoints in the store.
func (s *Server) ListCheckpoints(w http.ResponseWriter, r *http.Request) {
	names, err := s.cfg.Catalog.List(r.Context())
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	if names == nil {
		names = []string{}
	}
	writeJSON(w, api.CheckpointList{Checkpoints: names})
}

// Pages of /v1/tensors: the default holds any real checkpoint's tensors in a few pages and about
// 1 MB of JSON; the largest about 10 MB.
const (
	defaultTensorPage = 10_000
	maxTensorPage     = 100_000
)

// ListTensors lists a page of a checkpoint's tensors.
func (s *Server) ListTensors(w http.ResponseWriter, r *http.Request, params api.ListTensorsParams) {
	limit := defaultTensorPage
	if params.Limit != nil {
		if limit = *params.Limit; limit < 1 || limit > maxTensorPage {
			writeProblem(w, r, newProblem("invalid-parameter",
				fmt.Sprintf("limit %d: a page holds 1 to %d tensors", limit, maxTensorPage)))
			return
		}
	}
	var after string
	if params.PageToken != nil && *params.PageToken != "" {
		b, err := base64.RawURLEncoding.DecodeString(*params.PageToken)
		if err != nil {
			writeProblem(w, r, newProblem("invalid-parameter",
				"page_token is not a token this server gave: pass next_page_token as it came"))
			return
		}
		after = string(b)
	}
	ck, err := s.cfg.Catalog.Open(r.Context(), params.Checkpoint)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	l := ck.Listing()
	start := 0
	if params.PageToken != nil && *params.PageToken != "" {
		start = l.After(after)
	}
	end := min(start+limit, l.Len())
	name, _ := json.Marshal(ck.Name)
	w.Header().Set("Content-Type", "application/json")
	bw := bufio.NewWriterSize(w, 64<<10)
	bw.WriteString(`{"checkpoint":`)
	bw.Write(name)
	bw.WriteString(`,"tensors":[`)
	for i := start; i < end; i++ {
		if i > start {
			bw.WriteByte(',')
		}
		bw.Write(l.Entry(i))
	}
	bw.WriteByte(']')
	if end < l.Len() {
		bw.WriteString(`,"next_page_token":"` + base64.RawURLEncoding.EncodeToString([]byte(l.Name(end-1))) + `"`)
	}
	bw.WriteString("}\n")
	bw.Flush()
}

// Metrics serves the Prometheus scrape endpoint.
func (s *Server) Metrics(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Metrics == nil {
		writeProblem(w, r, newProblem("no-metrics", ""))
		return
	}
	s.cfg.Metrics.ServeHTTP(w, r)
}

// Healthz answers while the process is alive.
func (s *Server) Healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, api.Health{Status: "ok"})
}
