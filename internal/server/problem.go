package server

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/engine"
	"github.com/shardsrv/shardsrv/internal/jsonbody"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/resolve"
	"github.com/shardsrv/shardsrv/internal/store"
)

// problemType names each kind of problem (RFC 9457 "type"); the URN needs no server to resolve.
func problemType(slug string) string { return "urn:shardsrv:problem:" + slug }

// kind is what every problem of one type shares.
type kind struct {
	Status int
	Title  string
	// Retryable says whether the same request may succeed later (the problem's "retryable" member,
	// which the clients obey).
	Retryable bool
	// RetryAfter, in seconds, is sent as Retry-After when set.
	RetryAfter int
}

// problemTypes is every problem type the server sends, by slug: a public contract. docs/contract.md
// and openapi.yaml list it, and tests hold both to it and every newProblem call to a slug in it.
// Retryable is true for 408, 409 and 429 and for server-side trouble (5xx) but the kinds that fail
// the same way on every attempt; any other 4xx is the request's fault.
var problemTypes = map[string]kind{
	// The request.
	"malformed-request":            {Status: 400, Title: "The request is not valid JSON for this endpoint"},
	"invalid-parameter":            {Status: 400, Title: "Invalid query parameter"},
	"invalid-checkpoint-name":      {Status: 400, Title: "Invalid checkpoint name"},
	"unauthorized":                 {Status: 401, Title: "A valid bearer token is required"},
	"unauthorized-peer":            {Status: 401, Title: "The peer route needs the peer secret"},
	"no-route":                     {Status: 404, Title: "No such endpoint"},
	"unknown-checkpoint":           {Status: 404, Title: "Unknown checkpoint"},
	"unknown-file":                 {Status: 404, Title: "No such file"},
	"no-metrics":                   {Status: 404, Title: "Metrics are off"},
	"prefetch-off":                 {Status: 404, Title: "Prefetch is off"},
	"method-not-allowed":           {Status: 405, Title: "Method not allowed"},
	"body-timeout":                 {Status: 408, Title: "The request body did not arrive in time", Retryable: true},
	"checkpoint-changed":           {Status: 409, Title: "A checkpoint file changed while it was read", Retryable: true},
	"body-too-large":               {Status: 413, Title: "Request body too large"},
	"request-too-large":            {Status: 413, Title: "Too many tensors or blocks"},
	"file-too-large":               {Status: 413, Title: "The file is over the size cap"},
	"unsupported-media-type":       {Status: 415, Title: "The body must be JSON"},
	"unsupported-content-encoding": {Status: 415, Title: "Unsupported Content-Encoding"},
	"not-owner":                    {Status: 421, Title: "This replica does not hold the chunk"},
	// 400 instead when a value breaks the schema (a negative step): see toProblem.
	"invalid-request":        {Status: 422, Title: "The request cannot be served"},
	"invalid-layout":         {Status: 422, Title: "The layout cannot be built for this checkpoint"},
	"invalid-checkpoint":     {Status: 422, Title: "The checkpoint cannot be served as stored"},
	"checkpoint-over-limits": {Status: 422, Title: "A checkpoint file is over this server's limits"},
	// The server and its store.
	"internal-error":        {Status: 500, Title: "The server failed"},
	"storage-failure":       {Status: 502, Title: "The store failed", Retryable: true},
	"integrity-mismatch":    {Status: 502, Title: "Stored bytes do not match the checkpoint's signature"},
	"unverified-checkpoint": {Status: 502, Title: "The checkpoint cannot be served verified"},
	"store-access-denied":   {Status: 502, Title: "The store denied this server access"},
	"store-bucket-missing":  {Status: 502, Title: "The store's bucket or container does not exist"},
	"busy":                  {Status: 503, Title: "The server is busy", Retryable: true, RetryAfter: 1},
	"store-unavailable":     {Status: 503, Title: "The store is overloaded", Retryable: true, RetryAfter: 1},
	"cancelled":             {Status: 503, Title: "The request was cancelled", Retryable: true, RetryAfter: 1},
	"draining":              {Status: 503, Title: "The server is shutting down", Retryable: true, RetryAfter: 1},
	"not-ready":             {Status: 503, Title: "The store is not reachable", Retryable: true, RetryAfter: 5},
	"timeout":               {Status: 504, Title: "The request did not finish in time", Retryable: true},
}

// bodyProblems is the problem type of each kind of body jsonbody refuses.
var bodyProblems = map[jsonbody.Kind]string{
	jsonbody.Malformed: "malformed-request",
	jsonbody.MediaType: "unsupported-media-type",
	jsonbody.Encoding:  "unsupported-content-encoding",
	jsonbody.TooLarge:  "body-too-large",
	jsonbody.Timeout:   "body-timeout",
}

// layoutProblems is the problem type of each kind of request resolve refuses.
var layoutProblems = map[resolve.Kind]string{
	resolve.TableAndLayout: "malformed-request",
	resolve.NoConfig:       "invalid-layout",
	resolve.ConfigTooLarge: "checkpoint-over-limits",
}

// Problem is what writeProblem sends for an error. It is not an error itself, so nothing returns
// one as an error: packages return their typed errors and sentinels, and toProblem maps them.
type Problem struct {
	Slug   string
	Detail string
	Errors []api.FieldError
	kind
}

// newProblem is a problem of the type slug names, which must be in problemTypes.
func newProblem(slug, detail string, fields ...api.FieldError) *Problem {
	k, ok := problemTypes[slug]
	if !ok {
		panic("server: problem type " + slug + " is not in problemTypes")
	}
	return &Problem{Slug: slug, Detail: detail, Errors: fields, kind: k}
}

// toProblem maps every error the service can meet to its problem: the one place sentinels and
// error types become HTTP.
func toProblem(err error) *Problem {
	var verr *planner.ValidationError
	var cerr *checkpoint.Error
	var lerr *engine.Error
	var berr *jsonbody.Error
	var rerr *resolve.Error
	var qerr *cluster.QueryError
	switch {
	case errors.As(err, &qerr):
		return newProblem("invalid-parameter", qerr.Error())
	case errors.Is(err, cluster.ErrNotOwner):
		return newProblem("not-owner", err.Error())
	case errors.As(err, &berr):
		var fields []api.FieldError
		if berr.Pointer != "" {
			fields = append(fields, api.FieldError{Pointer: berr.Pointer, Detail: berr.Field})
		}
		return newProblem(bodyProblems[berr.Kind], berr.Detail, fields...)
	case errors.As(err, &rerr):
		return newProblem(layoutProblems[rerr.Kind], rerr.Detail, api.FieldError{Pointer: "/layout", Detail: rerr.Field})
	case errors.As(err, &verr):
		var fields []api.FieldError
		for _, fe := range verr.Errors {
			fields = append(fields, api.FieldError{Pointer: fe.Pointer, Detail: fe.Detail})
		}
		out := newProblem("invalid-request", verr.Error(), fields...)
		if verr.Schema {
			out.Status, out.Title = http.StatusBadRequest, "The request does not follow the schema"
		}
		return out
	case errors.As(err, &lerr):
		ptr := lerr.Pointer
		if ptr == "" {
			ptr = "/layout"
		}
		return newProblem("invalid-layout", lerr.Detail, api.FieldError{Pointer: ptr, Detail: lerr.Detail})
	case errors.Is(err, checkpoint.ErrNoFile):
		return newProblem("unknown-file", err.Error())
	case errors.Is(err, checkpoint.ErrFileTooLarge):
		return newProblem("file-too-large", err.Error())
	case errors.Is(err, store.ErrInvalidKey):
		return newProblem("invalid-checkpoint-name", err.Error(), api.FieldError{
			Pointer: "/checkpoint",
			Detail:  "names are relative paths of [A-Za-z0-9._-] segments; '..' and absolute paths are refused",
		})
	case errors.Is(err, checkpoint.ErrNotFound):
		return newProblem("unknown-checkpoint", err.Error())
	case errors.As(err, &cerr):
		return newProblem("invalid-checkpoint", err.Error())
	case errors.Is(err, store.ErrChanged), errors.Is(err, store.ErrNotFound):
		return newProblem("checkpoint-changed", err.Error()+"; retry the request")
	case errors.Is(err, budget.ErrBusy):
		return newProblem("busy", err.Error()+"; retry shortly")
	case errors.Is(err, store.ErrCorrupt):
		return newProblem("integrity-mismatch", err.Error()+
			"; the store holds a damaged or replaced file: re-upload it or re-sign the checkpoint")
	case errors.Is(err, store.ErrUnverified):
		return newProblem("unverified-checkpoint", err.Error())
	case errors.Is(err, store.ErrPermissionDenied):
		return newProblem("store-access-denied", err.Error())
	case errors.Is(err, store.ErrNoBucket):
		return newProblem("store-bucket-missing", err.Error())
	case errors.Is(err, store.ErrUnavailable):
		return newProblem("store-unavailable", err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return newProblem("timeout", err.Error()+
			": the store was slow, or the request plans more than --request-timeout allows")
	case errors.Is(err, context.Canceled): // the client left, or the server is shutting down
		return newProblem("cancelled", err.Error())
	}
	return newProblem("storage-failure", err.Error())
}

func writeProblem(w http.ResponseWriter, r *http.Request, p *Problem) {
	retryable := p.Retryable
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
