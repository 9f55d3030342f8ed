package server

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/engine"
)

// configFile is the Hugging Face config a layout is built from.
const configFile = "config.json"

// expandLayout turns a request's layout into the tensors table it stands for, from the
// checkpoint's config.json and headers.
func (s *Server) expandLayout(ctx context.Context, req *api.ShardRequest, ck *checkpoint.Checkpoint) error {
	if req.Layout == nil {
		return nil
	}
	if len(req.Tensors) > 0 {
		return newProblem("malformed-request",
			"a request carries either tensors (a table) or layout (an engine's rank), not both",
			api.FieldError{Pointer: "/layout", Detail: "drop tensors or layout"})
	}
	f, err := s.cfg.Catalog.StatFile(ctx, req.Checkpoint, configFile)
	if errors.Is(err, checkpoint.ErrNoFile) {
		return newProblem("invalid-layout",
			"the checkpoint has no config.json, which a layout is built from; send a tensors table instead",
			api.FieldError{Pointer: "/layout", Detail: "the checkpoint has no config.json"})
	}
	if err != nil {
		return err
	}
	if limit := s.cfg.Limits.MaxConfigBytes; f.Size > limit {
		detail := fmt.Sprintf("%s is %d bytes, over --max-config-bytes %d", configFile, f.Size, limit)
		return newProblem("checkpoint-over-limits", detail, api.FieldError{Pointer: "/layout", Detail: detail})
	}
	// The config and what it decodes to are held only while the layout is built.
	cost := engine.ConfigMemory(f.Size)
	release, err := s.cfg.Budget.Reserve(ctx, cost)
	if err != nil {
		return err
	}
	defer release(cost)
	config, err := s.cfg.Catalog.ReadFile(ctx, f)
	if err != nil {
		return err
	}
	infos := make(map[string]engine.TensorInfo, len(ck.Tensors))
	for name, t := range ck.Tensors {
		infos[name] = engine.TensorInfo{DType: t.DTypeName, Shape: t.Shape}
	}
	l := req.Layout
	spec := engine.Spec{Engine: string(l.Engine), Version: orDefault(l.EngineVersion, ""), Parallel: engine.Parallel{
		TP: orDefault(l.TensorParallelSize, 1), TPRank: orDefault(l.TpRank, 0),
		DP: orDefault(l.DataParallelSize, 1), DPRank: orDefault(l.DpRank, 0),
		ExpertParallel: l.EnableExpertParallel != nil && *l.EnableExpertParallel}}
	if l.Dtype != nil {
		spec.DType = *l.Dtype
	}
	_, span := s.tracer.Start(ctx, "layout")
	table, err := engine.Build(spec, config, infos)
	span.End()
	if err != nil {
		return err
	}
	req.Tensors = table.Tensors
	// The layout names the release line it was built for, so the response can say it.
	l.EngineVersion = nil
	if table.Version != "" {
		l.EngineVersion = &table.Version
	}
	return nil
}

func orDefault[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}

// PostLayouts answers the explicit table a layout expands to.
func (s *Server) PostLayouts(w http.ResponseWriter, r *http.Request) {
	var body api.LayoutRequest
	if p := s.decodeJSON(w, r, &body); p != nil {
		writeProblem(w, r, p)
		return
	}
	req := api.ShardRequest{Checkpoint: body.Checkpoint, Layout: &body.Layout}
	ck, err := s.cfg.Catalog.Open(r.Context(), req.Checkpoint)
	if err == nil {
		err = s.expandLayout(r.Context(), &req, ck)
	}
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	writeJSON(w, api.LayoutResponse{Checkpoint: ck.Name, EngineVersion: body.Layout.EngineVersion, Tensors: req.Tensors})
}

// ListFiles lists a checkpoint's small files.
func (s *Server) ListFiles(w http.ResponseWriter, r *http.Request, name string) {
	files, err := s.cfg.Catalog.Files(r.Context(), name)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	out := api.FileList{Checkpoint: name, Files: []api.FileInfo{}}
	for _, f := range files {
		out.Files = append(out.Files, api.FileInfo{Name: f.Name, Size: f.Size})
	}
	writeJSON(w, out)
}

// fileChunk is the piece a small file is streamed in: no file is held whole in memory.
const fileChunk = 1 << 20

// GetFile streams one of a checkpoint's small files, every piece read at the version its Stat saw.
func (s *Server) GetFile(w http.ResponseWriter, r *http.Request, name, file string) {
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.Limits.RequestTimeout)
	defer cancel()
	f, err := s.cfg.Catalog.StatFile(ctx, name, file)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	buf := make([]byte, min(f.Size, fileChunk))
	read := func(off int64) ([]byte, error) {
		p := buf[:min(int64(len(buf)), f.Size-off)]
		return p, s.cfg.Catalog.Store().ReadAt(ctx, f.Key, f.Version, p, off)
	}
	first, err := read(0)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Size, 10))
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	for off, p := int64(0), first; ; {
		rc.SetWriteDeadline(time.Now().Add(s.cfg.Limits.WriteTimeout))
		if _, err = w.Write(p); err == nil {
			off += int64(len(p))
			if off == f.Size {
				return
			}
			p, err = read(off)
		}
		if err != nil {
			if ctx.Err() == nil && !errors.Is(err, io.ErrClosedPipe) {
				s.log.Error("aborting a file after its headers were sent",
					"err", err, "file", f.Key, "request_id", middleware.GetReqID(ctx))
			}
			panic(http.ErrAbortHandler)
		}
	}
}
