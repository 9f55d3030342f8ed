// Package resolve turns one shard request into what the executor runs: it opens the checkpoint in
// the catalog and expands a layout (an engine's rank) into the tensors table it stands for, from the
// checkpoint's config.json and headers. It writes only to copies: the client's request is never
// changed. Its errors are typed (Error, and the catalog's, engine's and store's own), for the server
// to map to problems; nothing here knows HTTP.
package resolve

import (
	"context"
	"errors"
	"fmt"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/engine"
)

// ConfigFile is the Hugging Face config a layout is built from.
const ConfigFile = "config.json"

// Memory is the process memory budget a layout's config.json is held against while the layout is
// built (a *budget.Budget).
type Memory interface {
	Reserve(ctx context.Context, n int64) (release func(n int64), err error)
}

// Config is what a Resolver is built from.
type Config struct {
	Catalog *checkpoint.Catalog
	Memory  Memory
	// MaxConfigBytes caps the config.json a layout is built from (a ConfigTooLarge Error above,
	// refused before it is read); must be positive.
	MaxConfigBytes int64
	// Tracer defaults to a no-op.
	Tracer trace.Tracer
}

// Resolver resolves requests against one catalog.
type Resolver struct{ cfg Config }

// New returns a resolver.
func New(cfg Config) *Resolver {
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	return &Resolver{cfg: cfg}
}

// Kind is what is wrong with a request that cannot be resolved as sent.
type Kind int

const (
	// TableAndLayout is a request that carries both a tensors table and a layout.
	TableAndLayout Kind = iota
	// NoConfig is a layout asked of a checkpoint without config.json.
	NoConfig
	// ConfigTooLarge is a layout whose config.json is over MaxConfigBytes.
	ConfigTooLarge
)

// Error is a request that cannot be resolved as sent, at its layout (/layout).
type Error struct {
	Kind   Kind
	Detail string // the whole story
	Field  string // what is wrong at /layout, briefly
}

func (e *Error) Error() string { return e.Detail }

// Layout is the explicit table a layout expands to.
type Layout struct {
	Checkpoint *checkpoint.Checkpoint
	Tensors    []api.TensorRequest
	// EngineVersion is the release line the table follows (nil for unversioned engines).
	EngineVersion *string
}

// Open resolves a checkpoint by name.
func (r *Resolver) Open(ctx context.Context, name string) (*checkpoint.Checkpoint, error) {
	ctx, span := r.cfg.Tracer.Start(ctx, "catalog.open", trace.WithAttributes(attribute.String("checkpoint", name)))
	defer span.End()
	return r.cfg.Catalog.Open(ctx, name)
}

// Layout opens checkpoint name and expands l into its table.
func (r *Resolver) Layout(ctx context.Context, name string, l api.EngineLayout) (*Layout, error) {
	ck, err := r.Open(ctx, name)
	if err != nil {
		return nil, err
	}
	return r.expand(ctx, ck, l)
}

// Expand returns req as it is planned: req itself when it carries a table, else a copy whose
// tensors are the table its layout expands to and whose layout names the release line the table
// follows (so the response can say it).
func (r *Resolver) Expand(ctx context.Context, req *api.ShardRequest, ck *checkpoint.Checkpoint) (*api.ShardRequest, error) {
	if req.Layout == nil {
		return req, nil
	}
	if len(req.Tensors) > 0 {
		return nil, &Error{Kind: TableAndLayout,
			Detail: "a request carries either tensors (a table) or layout (an engine's rank), not both",
			Field:  "drop tensors or layout"}
	}
	l, err := r.expand(ctx, ck, *req.Layout)
	if err != nil {
		return nil, err
	}
	out, layout := *req, *req.Layout
	layout.EngineVersion = l.EngineVersion
	out.Layout, out.Tensors = &layout, l.Tensors
	return &out, nil
}

func (r *Resolver) expand(ctx context.Context, ck *checkpoint.Checkpoint, l api.EngineLayout) (*Layout, error) {
	f, err := r.cfg.Catalog.StatFile(ctx, ck.Name, ConfigFile)
	if errors.Is(err, checkpoint.ErrNoFile) {
		return nil, &Error{Kind: NoConfig,
			Detail: "the checkpoint has no config.json, which a layout is built from; send a tensors table instead",
			Field:  "the checkpoint has no config.json"}
	}
	if err != nil {
		return nil, err
	}
	if limit := r.cfg.MaxConfigBytes; f.Size > limit {
		detail := fmt.Sprintf("%s is %d bytes, over --max-config-bytes %d", ConfigFile, f.Size, limit)
		return nil, &Error{Kind: ConfigTooLarge, Detail: detail, Field: detail}
	}
	// The config and what it decodes to are held only while the layout is built.
	cost := engine.ConfigMemory(f.Size)
	release, err := r.cfg.Memory.Reserve(ctx, cost)
	if err != nil {
		return nil, err
	}
	defer release(cost)
	config, err := r.cfg.Catalog.ReadFile(ctx, f)
	if err != nil {
		return nil, err
	}
	infos := make(map[string]engine.TensorInfo, len(ck.Tensors))
	for name, t := range ck.Tensors {
		infos[name] = engine.TensorInfo{DType: t.DTypeName, Shape: t.Shape}
	}
	spec := engine.Spec{Engine: string(l.Engine), Version: orDefault(l.EngineVersion, ""), Parallel: engine.Parallel{
		TP: orDefault(l.TensorParallelSize, 1), TPRank: orDefault(l.TpRank, 0),
		DP: orDefault(l.DataParallelSize, 1), DPRank: orDefault(l.DpRank, 0),
		ExpertParallel: orDefault(l.EnableExpertParallel, false)}}
	if l.Dtype != nil {
		spec.DType = *l.Dtype
	}
	_, span := r.cfg.Tracer.Start(ctx, "layout")
	table, err := engine.Build(spec, config, infos)
	span.End()
	if err != nil {
		return nil, err
	}
	out := &Layout{Checkpoint: ck, Tensors: table.Tensors}
	if table.Version != "" {
		out.EngineVersion = &table.Version
	}
	return out, nil
}

func orDefault[T any](p *T, def T) T {
	if p == nil {
		return def
	}
	return *p
}
