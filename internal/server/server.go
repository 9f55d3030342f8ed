// Package server is shardsrv's HTTP face: it decodes requests, runs them through the catalog, the
// planner and the executor, streams the body, and answers every error as an RFC 9457 problem.
package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/store"
)

// Config is what the server is built from.
type Config struct {
	Catalog  *checkpoint.Catalog
	Executor *executor.Executor
	Planner  planner.Options
	// MaxBodyBytes bounds a request body (413 above it).
	MaxBodyBytes int64
	Limits       Limits
	// Tokens, when set, are the bearer tokens every route but /healthz, /readyz and /metrics needs.
	Tokens *Tokens
	Logger *slog.Logger
	// Tracer and Meter default to no-ops; Metrics serves /metrics (404 when nil).
	Tracer  trace.TracerProvider
	Meter   metric.MeterProvider
	Metrics http.Handler
}

// Limits protect the service from requests that would take more than their share.
type Limits struct {
	MaxTensors int // tensors per request (413 above)
	MaxBlocks  int // blocks per request, all tensors together (413 above)
	MaxStreams int // concurrent shard streams (503 with Retry-After above)
	// RequestTimeout bounds a whole request; WriteTimeout one write to the client, so a stalled
	// client lets go of its buffers.
	RequestTimeout time.Duration
	WriteTimeout   time.Duration
}

// Server implements api.ServerInterface.
type Server struct {
	cfg      Config
	log      *slog.Logger
	tracer   trace.Tracer
	metrics  *metrics
	streams  chan struct{}
	draining atomic.Bool
}

var _ api.ServerInterface = (*Server)(nil)

// New returns a server.
func New(cfg Config) *Server {
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.Tracer == nil {
		cfg.Tracer = tracenoop.NewTracerProvider()
	}
	if cfg.Meter == nil {
		cfg.Meter = metricnoop.NewMeterProvider()
	}
	l := &cfg.Limits
	for _, v := range []*int{&l.MaxTensors, &l.MaxBlocks, &l.MaxStreams} {
		if *v <= 0 {
			*v = math.MaxInt32
		}
	}
	for _, v := range []*time.Duration{&l.RequestTimeout, &l.WriteTimeout} {
		if *v <= 0 {
			*v = 24 * time.Hour
		}
	}
	s := &Server{cfg: cfg, log: cfg.Logger, tracer: cfg.Tracer.Tracer("shardsrv/server"), streams: make(chan struct{}, l.MaxStreams)}
	s.metrics = newMetrics(cfg.Meter, s)
	return s
}

// Drain makes /readyz answer 503, so load balancers stop sending requests before shutdown.
func (s *Server) Drain() { s.draining.Store(true) }

// Handler returns the HTTP handler with every route of openapi.yaml.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(otelhttp.NewMiddleware("shardsrv", otelhttp.WithTracerProvider(s.cfg.Tracer), otelhttp.WithMeterProvider(s.cfg.Meter)),
		middleware.RequestID, s.accessLog, s.authenticate)
	r.NotFound(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, &Problem{Status: http.StatusNotFound, Slug: "no-route", Title: "No such endpoint", Detail: r.Method + " " + r.URL.Path + " is not an endpoint of this service; see openapi.yaml"})
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, r *http.Request) {
		writeProblem(w, r, &Problem{Status: http.StatusMethodNotAllowed, Slug: "method-not-allowed", Title: "Method not allowed", Detail: r.Method + " is not allowed on " + r.URL.Path})
	})
	return api.HandlerWithOptions(s, api.ChiServerOptions{
		BaseRouter: r,
		ErrorHandlerFunc: func(w http.ResponseWriter, r *http.Request, err error) {
			writeProblem(w, r, &Problem{Status: http.StatusBadRequest, Slug: "invalid-parameter", Title: "Invalid query parameter", Detail: err.Error()})
		},
	})
}

// decodeJSON reads a request body strictly: unknown fields, trailing data and wrong types are 400s.
func (s *Server) decodeJSON(w http.ResponseWriter, r *http.Request, v any) *Problem {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err == nil {
		err = dec.Decode(v)
	}
	if err == nil && dec.More() {
		err = errors.New("the body holds more than one JSON value")
	}
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("the body holds data after the JSON object")
		}
	}
	var tooBig *http.MaxBytesError
	var typeErr *json.UnmarshalTypeError
	var syntax *json.SyntaxError
	bad := func(detail string, fields ...api.FieldError) *Problem {
		return &Problem{Status: http.StatusBadRequest, Slug: "malformed-request", Title: "The request is not valid JSON for this endpoint", Detail: detail, Errors: fields}
	}
	switch {
	case err == nil:
		return nil
	case errors.As(err, &tooBig):
		return &Problem{Status: http.StatusRequestEntityTooLarge, Slug: "body-too-large", Title: "Request body too large",
			Detail: fmt.Sprintf("the body is over %d bytes; split the request", tooBig.Limit)}
	case errors.As(err, &syntax):
		return bad(fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, err))
	case errors.Is(err, io.EOF):
		return bad("the body is empty; send a JSON request")
	}
	if ptr, detail, ok := schemaError(body, reflect.TypeOf(v)); ok {
		return bad(ptr+": "+detail, api.FieldError{Pointer: ptr, Detail: detail})
	}
	if errors.As(err, &typeErr) {
		return bad("a value has the wrong JSON type", api.FieldError{Pointer: "/" + strings.ReplaceAll(typeErr.Field, ".", "/"), Detail: "wrong JSON type"})
	}
	return bad(err.Error())
}

// decode reads a shard request and checks what needs no checkpoint: a name, and the size limits.
func (s *Server) decode(w http.ResponseWriter, r *http.Request) (*api.ShardRequest, *Problem) {
	var req api.ShardRequest
	if p := s.decodeJSON(w, r, &req); p != nil {
		return nil, p
	}
	bad := func(detail string, fields ...api.FieldError) *Problem {
		return &Problem{Status: http.StatusBadRequest, Slug: "malformed-request", Title: "The request is not valid JSON for this endpoint", Detail: detail, Errors: fields}
	}
	if req.Checkpoint == "" {
		return nil, bad("checkpoint is required", api.FieldError{Pointer: "/checkpoint", Detail: "name the checkpoint folder"})
	}
	blocks := 0
	for _, t := range req.Tensors {
		if t.Blocks != nil {
			blocks += len(*t.Blocks)
		}
	}
	if len(req.Tensors) > s.cfg.Limits.MaxTensors || blocks > s.cfg.Limits.MaxBlocks {
		return nil, &Problem{Status: http.StatusRequestEntityTooLarge, Slug: "request-too-large", Title: "Too many tensors or blocks",
			Detail: fmt.Sprintf("the request has %d tensors and %d blocks; this server takes at most %d and %d: split the request",
				len(req.Tensors), blocks, s.cfg.Limits.MaxTensors, s.cfg.Limits.MaxBlocks),
			Errors: []api.FieldError{{Pointer: "/tensors", Detail: "split the request"}}}
	}
	return &req, nil
}

// plan decodes, resolves and plans a request.
func (s *Server) plan(w http.ResponseWriter, r *http.Request) (*planner.Plan, *Problem) {
	req, p := s.decode(w, r)
	if p != nil {
		return nil, p
	}
	ctx, span := s.tracer.Start(r.Context(), "catalog.open", trace.WithAttributes(attribute.String("checkpoint", req.Checkpoint)))
	ck, err := s.cfg.Catalog.Open(ctx, req.Checkpoint)
	span.End()
	if err == nil {
		err = s.expandLayout(ctx, req, ck)
	}
	if err != nil {
		return nil, toProblem(err)
	}
	start := time.Now()
	_, span = s.tracer.Start(r.Context(), "plan", trace.WithAttributes(attribute.Int("tensors", len(req.Tensors))))
	plan, err := planner.New(req, ck, s.cfg.Planner)
	span.End()
	if err != nil {
		return nil, toProblem(err)
	}
	s.metrics.planned(r.Context(), plan, time.Since(start))
	return plan, nil
}

// PostShards streams a shard. The response is committed only once the first segment has been
// read; after that a failure aborts the connection so the client sees a short body.
func (s *Server) PostShards(w http.ResponseWriter, r *http.Request) {
	select {
	case s.streams <- struct{}{}:
		defer func() { <-s.streams }()
	default:
		writeProblem(w, r, &Problem{Status: http.StatusServiceUnavailable, Slug: "busy", Title: "The server is busy",
			Detail: fmt.Sprintf("%d shard streams are running, the most this server takes; retry shortly", s.cfg.Limits.MaxStreams), RetryAfter: 1})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.RequestTimeout)
	defer cancel()
	r = r.WithContext(ctx)
	plan, p := s.plan(w, r)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	start := time.Now()
	s.metrics.streams.Add(ctx, 1)
	defer s.metrics.streams.Add(context.WithoutCancel(ctx), -1)
	stream, err := s.cfg.Executor.Stream(ctx, plan)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	defer stream.Close()
	if err := stream.Prime(); err != nil {
		if errors.Is(err, store.ErrChanged) || errors.Is(err, store.ErrNotFound) {
			s.cfg.Catalog.Forget(plan.Checkpoint)
		}
		writeProblem(w, r, toProblem(err))
		return
	}
	contentType := "application/octet-stream"
	if plan.Format == api.Safetensors {
		contentType = "application/vnd.safetensors"
	}
	w.Header().Set("Content-Type", contentType)
	w.Header().Set("Content-Length", strconv.FormatInt(plan.BodyBytes, 10))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for {
		chunk, err := stream.Next()
		if err == nil && chunk == nil {
			s.metrics.streamed(ctx, plan, time.Since(start))
			return
		}
		if err == nil {
			rc.SetWriteDeadline(time.Now().Add(s.cfg.Limits.WriteTimeout))
			_, err = w.Write(chunk)
		}
		if err != nil {
			if errors.Is(err, store.ErrChanged) {
				s.cfg.Catalog.Forget(plan.Checkpoint)
			}
			if r.Context().Err() == nil {
				s.log.Error("aborting a shard stream after its headers were sent", "err", err, "checkpoint", plan.Checkpoint, "request_id", middleware.GetReqID(r.Context()))
			}
			panic(http.ErrAbortHandler)
		}
	}
}

// PostPlan answers the plan without reading tensor data.
func (s *Server) PostPlan(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.RequestTimeout)
	defer cancel()
	plan, p := s.plan(w, r.WithContext(ctx))
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	writeJSON(w, planResponse(plan, s.cfg.Planner.MaxRead))
}

func planResponse(p *planner.Plan, maxRead int64) api.PlanResponse {
	resp := api.PlanResponse{Summary: api.PlanSummary{OutputBytes: p.BodyBytes, NeededBytes: p.NeededBytes, ReadBytes: p.ReadBytes, ReadRequests: p.ReadRequests}}
	boxes := []int{} // boxes per tensor, in request order; items are in body order
	for _, it := range p.Items {
		for len(boxes) <= it.Tensor {
			boxes = append(boxes, 0)
		}
		boxes[it.Tensor] = max(boxes[it.Tensor], it.Box+1)
	}
	resp.Tensors = make([]api.TensorPlan, len(boxes))
	for i, n := range boxes {
		resp.Tensors[i].Boxes = make([]api.BoxPlan, n)
	}
	for _, it := range p.Items {
		box := api.BoxPlan{Offsets: it.Offsets, Lengths: it.Lengths, OutputOffset: it.Output, OutputBytes: it.Bytes, Pieces: []api.PiecePlan{}, Reads: []api.ReadPlan{}}
		for _, pc := range it.Pieces {
			mode := api.Gather
			if pc.Direct {
				mode = api.Direct
			}
			box.Pieces = append(box.Pieces, api.PiecePlan{Block: pc.Block, Source: pc.Source, Offsets: pc.Offsets, Lengths: pc.Lengths, Mode: mode})
		}
		for _, seg := range it.Segments {
			for _, list := range [][]planner.Read{seg.Direct, seg.Spans} {
				for _, rd := range list {
					for _, part := range planner.SplitReads(rd, maxRead) {
						box.Reads = append(box.Reads, api.ReadPlan{File: part.Key, Offset: part.Offset, Length: part.Length})
					}
				}
			}
		}
		resp.Tensors[it.Tensor].Name = it.Name
		resp.Tensors[it.Tensor].Boxes[it.Box] = box
	}
	return resp
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

// ListTensors lists a checkpoint's tensors.
func (s *Server) ListTensors(w http.ResponseWriter, r *http.Request, params api.ListTensorsParams) {
	ck, err := s.cfg.Catalog.Open(r.Context(), params.Checkpoint)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	out := api.TensorList{Checkpoint: ck.Name, Tensors: []api.TensorInfo{}}
	for _, name := range ck.Names() {
		t := ck.Tensors[name]
		out.Tensors = append(out.Tensors, api.TensorInfo{Name: name, Dtype: t.DTypeName, Shape: t.Shape, File: strings.TrimPrefix(t.Key, ck.Name+"/")})
	}
	writeJSON(w, out)
}

// Metrics serves the Prometheus scrape endpoint.
func (s *Server) Metrics(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Metrics == nil {
		writeProblem(w, r, &Problem{Status: http.StatusNotFound, Slug: "no-metrics", Title: "Metrics are off"})
		return
	}
	s.cfg.Metrics.ServeHTTP(w, r)
}

// Healthz answers while the process is alive.
func (s *Server) Healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, api.Health{Status: "ok"})
}

// Readyz answers 200 while the store is reachable.
func (s *Server) Readyz(w http.ResponseWriter, r *http.Request) {
	if s.draining.Load() {
		writeProblem(w, r, &Problem{Status: http.StatusServiceUnavailable, Slug: "draining", Title: "The server is shutting down", Detail: "this instance takes no new requests", RetryAfter: 1})
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := s.cfg.Catalog.Store().Check(ctx); err != nil {
		writeProblem(w, r, &Problem{Status: http.StatusServiceUnavailable, Slug: "not-ready", Title: "The store is not reachable", Detail: err.Error(), RetryAfter: 5})
		return
	}
	writeJSON(w, api.Health{Status: "ready"})
}
