// Package server is shardsrv's HTTP face: it decodes requests, runs them through the catalog, the
// planner and the executor, streams the body, and answers every error as an RFC 9457 problem.
package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/go-chi/chi/v5"
	"github.com/go-chi/chi/v5/middleware"

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
	Logger       *slog.Logger
}

// Server implements api.ServerInterface.
type Server struct {
	cfg Config
	log *slog.Logger
}

var _ api.ServerInterface = (*Server)(nil)

// New returns a server.
func New(cfg Config) *Server {
	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Server{cfg: cfg, log: log}
}

// Handler returns the HTTP handler with every route of openapi.yaml.
func (s *Server) Handler() http.Handler {
	r := chi.NewRouter()
	r.Use(middleware.RequestID, s.accessLog)
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

// decode reads a shard request strictly: unknown fields, trailing data and wrong types are 400s.
func (s *Server) decode(w http.ResponseWriter, r *http.Request) (*api.ShardRequest, *Problem) {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, s.cfg.MaxBodyBytes))
	dec.DisallowUnknownFields()
	var req api.ShardRequest
	err := dec.Decode(&req)
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
	case errors.As(err, &tooBig):
		return nil, &Problem{Status: http.StatusRequestEntityTooLarge, Slug: "body-too-large", Title: "Request body too large",
			Detail: fmt.Sprintf("the body is over %d bytes; split the request", tooBig.Limit)}
	case errors.As(err, &typeErr):
		ptr := "/" + strings.ReplaceAll(typeErr.Field, ".", "/")
		return nil, bad(err.Error(), api.FieldError{Pointer: ptr, Detail: fmt.Sprintf("expected %s, got a JSON %s", typeErr.Type, typeErr.Value)})
	case errors.As(err, &syntax):
		return nil, bad(fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, err))
	case errors.Is(err, io.EOF):
		return nil, bad("the body is empty; send a JSON shard request")
	default:
		return nil, bad(err.Error())
	}
	if req.Checkpoint == "" {
		return nil, bad("checkpoint is required", api.FieldError{Pointer: "/checkpoint", Detail: "name the checkpoint folder"})
	}
	return &req, nil
}

// plan decodes, resolves and plans a request.
func (s *Server) plan(w http.ResponseWriter, r *http.Request) (*planner.Plan, *Problem) {
	req, p := s.decode(w, r)
	if p != nil {
		return nil, p
	}
	ck, err := s.cfg.Catalog.Open(r.Context(), req.Checkpoint)
	if err != nil {
		return nil, toProblem(err)
	}
	plan, err := planner.New(req, ck, s.cfg.Planner)
	if err != nil {
		return nil, toProblem(err)
	}
	return plan, nil
}

// PostShards streams a shard. The response is committed only once the first segment has been
// read; after that a failure aborts the connection so the client sees a short body.
func (s *Server) PostShards(w http.ResponseWriter, r *http.Request) {
	plan, p := s.plan(w, r)
	if p != nil {
		writeProblem(w, r, p)
		return
	}
	stream, err := s.cfg.Executor.Stream(r.Context(), plan)
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
	for {
		chunk, err := stream.Next()
		if err == nil && chunk == nil {
			return
		}
		if err == nil {
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
	plan, p := s.plan(w, r)
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

// Healthz answers while the process is alive.
func (s *Server) Healthz(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, api.Health{Status: "ok"})
}

// Readyz answers 200 while the store is reachable.
func (s *Server) Readyz(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), 5*time.Second)
	defer cancel()
	if err := s.cfg.Catalog.Store().Check(ctx); err != nil {
		writeProblem(w, r, &Problem{Status: http.StatusServiceUnavailable, Slug: "not-ready", Title: "The store is not reachable", Detail: err.Error(), RetryAfter: 5})
		return
	}
	writeJSON(w, api.Health{Status: "ready"})
}
