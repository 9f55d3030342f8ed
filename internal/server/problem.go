package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/engine"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/store"
)

// problemType names each kind of problem (RFC 9457 "type"); the URN needs no server to resolve.
func problemType(slug string) string { return "urn:shardsrv:problem:" + slug }

// Problem is an error with its HTTP face.
type Problem struct {
	Status int
	Slug   string
	Title  string
	Detail string
	Errors []api.FieldError
	// RetryAfter, in seconds, is sent for 503s.
	RetryAfter int
}

func (p *Problem) Error() string { return p.Title + ": " + p.Detail }

// toProblem maps every error the service can meet to its status: the one place sentinels and
// error types become HTTP.
func toProblem(err error) *Problem {
	var p *Problem
	var verr *planner.ValidationError
	var cerr *checkpoint.Error
	var lerr *engine.Error
	switch {
	case errors.As(err, &p):
		return p
	case errors.As(err, &verr):
		out := &Problem{
			Status: http.StatusUnprocessableEntity,
			Slug:   "invalid-request",
			Title:  "The request cannot be served",
			Detail: verr.Error(),
		}
		if verr.Schema {
			out.Status, out.Title = http.StatusBadRequest, "The request does not follow the schema"
		}
		for _, fe := range verr.Errors {
			out.Errors = append(out.Errors, api.FieldError{Pointer: fe.Pointer, Detail: fe.Detail})
		}
		return out
	case errors.As(err, &lerr):
		ptr := lerr.Pointer
		if ptr == "" {
			ptr = "/layout"
		}
		return &Problem{
			Status: http.StatusUnprocessableEntity,
			Slug:   "invalid-layout",
			Title:  "The layout cannot be built for this checkpoint",
			Detail: lerr.Detail,
			Errors: []api.FieldError{{Pointer: ptr, Detail: lerr.Detail}},
		}
	case errors.Is(err, checkpoint.ErrNoFile):
		return &Problem{Status: http.StatusNotFound, Slug: "unknown-file", Title: "No such file", Detail: err.Error()}
	case errors.Is(err, checkpoint.ErrFileTooLarge):
		return &Problem{
			Status: http.StatusRequestEntityTooLarge,
			Slug:   "file-too-large",
			Title:  "The file is over the size cap",
			Detail: err.Error(),
		}
	case errors.Is(err, store.ErrInvalidKey):
		return &Problem{
			Status: http.StatusBadRequest,
			Slug:   "invalid-checkpoint-name",
			Title:  "Invalid checkpoint name",
			Detail: err.Error(),
			Errors: []api.FieldError{
				{
					Pointer: "/checkpoint",
					Detail:  "names are relative paths of [A-Za-z0-9._-] segments; '..' and absolute paths are refused",
				},
			},
		}
	case errors.Is(err, checkpoint.ErrNotFound):
		return &Problem{
			Status: http.StatusNotFound,
			Slug:   "unknown-checkpoint",
			Title:  "Unknown checkpoint",
			Detail: err.Error(),
		}
	case errors.As(err, &cerr):
		return &Problem{
			Status: http.StatusUnprocessableEntity,
			Slug:   "invalid-checkpoint",
			Title:  "The checkpoint cannot be served as stored",
			Detail: err.Error(),
		}
	case errors.Is(err, store.ErrChanged), errors.Is(err, store.ErrNotFound):
		return &Problem{
			Status: http.StatusConflict,
			Slug:   "checkpoint-changed",
			Title:  "A checkpoint file changed while it was read",
			Detail: err.Error() + "; retry the request",
		}
	case errors.Is(err, executor.ErrBusy):
		return &Problem{
			Status:     http.StatusServiceUnavailable,
			Slug:       "busy",
			Title:      "The server is busy",
			Detail:     err.Error() + "; retry shortly",
			RetryAfter: 1,
		}
	case errors.Is(err, store.ErrCorrupt):
		return &Problem{
			Status: http.StatusBadGateway,
			Slug:   "integrity-mismatch",
			Title:  "Stored bytes do not match the checkpoint's signature",
			Detail: err.Error() + "; the store holds a damaged or replaced file: re-upload it or re-sign the checkpoint",
		}
	case errors.Is(err, store.ErrUnverified):
		return &Problem{
			Status: http.StatusBadGateway,
			Slug:   "unverified-checkpoint",
			Title:  "The checkpoint cannot be served verified",
			Detail: err.Error(),
		}
	case errors.Is(err, store.ErrPermissionDenied):
		return &Problem{
			Status: http.StatusBadGateway,
			Slug:   "store-access-denied",
			Title:  "The store denied this server access",
			Detail: err.Error(),
		}
	case errors.Is(err, store.ErrNoBucket):
		return &Problem{
			Status: http.StatusBadGateway,
			Slug:   "store-bucket-missing",
			Title:  "The store's bucket or container does not exist",
			Detail: err.Error(),
		}
	case errors.Is(err, store.ErrUnavailable):
		return &Problem{
			Status:     http.StatusServiceUnavailable,
			Slug:       "store-unavailable",
			Title:      "The store is overloaded",
			Detail:     err.Error(),
			RetryAfter: 1,
		}
	case errors.Is(err, context.DeadlineExceeded):
		return &Problem{Status: http.StatusGatewayTimeout, Slug: "timeout", Title: "The request did not finish in time",
			Detail: err.Error() + ": the store was slow, or the request plans more than --request-timeout allows"}
	case errors.Is(err, context.Canceled): // the client left, or the server is shutting down
		return &Problem{
			Status:     http.StatusServiceUnavailable,
			Slug:       "cancelled",
			Title:      "The request was cancelled",
			Detail:     err.Error(),
			RetryAfter: 1,
		}
	}
	return &Problem{
		Status: http.StatusBadGateway,
		Slug:   "storage-failure",
		Title:  "The store failed",
		Detail: err.Error(),
	}
}

// permanent are the server-side problems (5xx) that fail the same way on every attempt: bytes that
// fail their signature, a checkpoint that cannot be served verified, a store denying access or
// missing its bucket, and the server's own bug.
var permanent = map[string]bool{
	"integrity-mismatch":    true,
	"unverified-checkpoint": true,
	"store-access-denied":   true,
	"store-bucket-missing":  true,
	"internal-error":        true,
}

// retryable says whether the same request may succeed later (the problem's "retryable" member,
// which the clients obey): a time-out, a conflict with a file replaced mid-read, overload (408,
// 409, 429), and server-side trouble but the permanent kinds. Any other 4xx is the request's fault.
func (p *Problem) retryable() bool {
	switch {
	case p.Status == http.StatusRequestTimeout, p.Status == http.StatusConflict,
		p.Status == http.StatusTooManyRequests:
		return true
	case p.Status >= 500:
		return !permanent[p.Slug]
	}
	return false
}

func writeProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	retryable := p.retryable()
	body := api.Problem{Type: problemType(p.Slug), Title: p.Title, Status: p.Status, Retryable: &retryable}
	if p.Detail != "" {
		body.Detail = &p.Detail
	}
	if len(p.Errors) > 0 {
		body.Errors = &p.Errors
	}
	instance := r.URL.Path
	body.Instance = &instance
	w.Header().Set("Content-Type", "application/problem+json")
	if p.RetryAfter > 0 {
		w.Header().Set("Retry-After", fmt.Sprint(p.RetryAfter))
	}
	w.WriteHeader(p.Status)
	json.NewEncoder(w).Encode(body)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	json.NewEncoder(w).Encode(v)
}
