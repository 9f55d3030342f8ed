package server

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strconv"
	"time"

	"github.com/go-chi/chi/v5/middleware"

	"github.com/shardsrv/shardsrv/api"
)

// PostLayouts answers the explicit table a layout expands to.
func (s *Server) PostLayouts(w http.ResponseWriter, r *http.Request) {
	var body api.LayoutRequest
	if p := s.decodeJSON(w, r, &body); p != nil {
		writeProblem(w, r, p)
		return
	}
	l, err := s.resolver.Layout(r.Context(), body.Checkpoint, body.Layout)
	if err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	writeJSON(w, api.LayoutResponse{Checkpoint: l.Checkpoint.Name, EngineVersion: l.EngineVersion, Tensors: l.Tensors})
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
	// A version with bytes found corrupt anywhere is refused before the headers, as a shard that
	// would read them is: a retry gets the problem, not headers and an abort.
	if err := s.cfg.Catalog.KnownCorrupt(f.Key, f.Version, 0, f.Size); err != nil {
		writeProblem(w, r, toProblem(err))
		return
	}
	buf := make([]byte, min(f.Size, fileChunk))
	read := func(off int64) ([]byte, error) {
		p := buf[:min(int64(len(buf)), f.Size-off)]
		return p, s.cfg.Catalog.ReadFileAt(ctx, f, p, off)
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
