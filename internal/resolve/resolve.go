// Package resolve turns one shard request into one plan: it opens the checkpoint in the catalog,
// expands a layout (an engine's rank) into the tensors table it stands for, from the checkpoint's
// config.json and headers, reserves the plan's memory and plans. It writes only to copies: the
// client's request is never changed. It also owns what a failed read says about the resolution
// (Resolved.ReadFailed). Its errors are typed (Error, and the catalog's, engine's, planner's and
// store's own), for the server to map to problems; nothing here knows HTTP.
package resolve

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/engine"
	"github.com/shardsrv/shardsrv/internal/planner"
)

// configFile is the Hugging Face config a layout is built from.
const configFile = "config.json"

// Memory is the process memory budget: a layout's config.json is held against it while the layout
// is built, a plan while it is built and used. Reserve waits for n bytes or fails; release gives
// back part or all of them. Bytes is its size (a *budget.Budget).
type Memory interface {
	Reserve(ctx context.Context, n int64) (release func(n int64), err error)
	Bytes() int64
}

// Config is what a Resolver is built from. A field left at zero takes its default, but Catalog
// and Memory, which are required.
type Config struct {
	Catalog *checkpoint.Catalog // required
	Memory  Memory              // required
	// Planner is the planner's options, each at zero its default (planner.Options).
	Planner planner.Options
	// MaxConfigBytes caps the config.json a layout is built from (a ConfigTooLarge Error above,
	// refused before it is read; zero: DefaultMaxConfigBytes).
	MaxConfigBytes int64
	// Tracer defaults to a no-op.
	Tracer trace.Tracer
}

// Validate reports a configuration no resolver can run with: a missing catalog or budget, negative
// sizes.
func (c *Config) Validate() error {
	var errs []error
	if c.Catalog == nil || c.Memory == nil {
		errs = append(errs, errors.New("a resolver needs a catalog and a memory budget"))
	}
	if c.MaxConfigBytes < 0 {
		errs = append(errs, errors.New("--max-config-bytes must not be negative"))
	}
	return errors.Join(append(errs, c.Planner.Validate())...)
}

// DefaultMaxConfigBytes is forty times the largest config.json of a released model we know of
// (multimodal configs of ~100 KB; a text model's is a few KB).
const DefaultMaxConfigBytes = 4 << 20

// Resolver resolves requests against one catalog.
type Resolver struct {
	cfg       Config
	planBytes int64
}

// New returns a resolver. It panics on a Config that Validate refuses: a program validates its
// configuration before it builds anything.
func New(cfg Config) *Resolver {
	if err := cfg.Validate(); err != nil {
		panic("resolve: " + err.Error())
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	if cfg.MaxConfigBytes == 0 {
		cfg.MaxConfigBytes = DefaultMaxConfigBytes
	}
	planBytes := cfg.Planner.MaxPlanBytes
	if planBytes == 0 {
		planBytes = planner.DefaultMaxPlanBytes
	}
	// At most a quarter of the budget, so that bodies and streams keep room.
	return &Resolver{cfg: cfg, planBytes: max(1, min(planBytes, cfg.Memory.Bytes()/4))}
}

// PlanBytes is the memory a plan may grow to, reserved while it is built: the planner's
// MaxPlanBytes, at most a quarter of the budget.
func (r *Resolver) PlanBytes() int64 { return r.planBytes }

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

// Purpose is what a plan is for.
type Purpose int

const (
	// Stream is a plan the executor streams: it carries no pieces.
	Stream Purpose = iota
	// Report is a plan reported whole (/v1/plan), pieces included.
	Report
)

// Resolved is one request resolved and planned. Its plan holds part of the memory budget until
// Release.
type Resolved struct {
	Plan *planner.Plan
	// Planning is how long the planner took (opening the checkpoint and the layout aside).
	Planning time.Duration

	catalog *checkpoint.Catalog
	request *api.ShardRequest // as planned: a layout expanded into its table
	release func(n int64)
	held    int64
}

// Release gives back the memory the plan holds; the plan is not used after it.
func (x *Resolved) Release() { x.release(x.held) }

// ReadFailed tells the catalog that reading the plan's data failed with err: a resolution that
// turns out stale (a file changed or vanished since it was resolved) is dropped, so the next
// request resolves the files as they are now, and bytes found corrupt are refused to the next
// plan that reads them at the same file version.
func (x *Resolved) ReadFailed(err error) { x.catalog.ReadFailed(x.Plan.Checkpoint, err) }

// BodyKey identifies the body the plan streams: equal keys, equal bodies. It hashes what the body
// is a function of — the request as planned (its table, each tensor's boxes, blocks, conversions,
// fills and completions, the format), the body's header and length, and every read the plan makes
// (file, version, range, in order). The planner is pure (the same plan for the same request and
// checkpoint), and what it takes of the checkpoint — the tensors' files, dtypes, shapes and
// offsets — comes from the headers of the files it reads, at the versions those reads carry; the
// bytes a read returns are its file's at that version, or the read fails. ok is false for a
// request that cannot be encoded, which then has no key.
func (x *Resolved) BodyKey() (key [sha256.Size]byte, ok bool) {
	request, err := json.Marshal(x.request)
	if err != nil {
		return key, false
	}
	h := sha256.New()
	var varint [binary.MaxVarintLen64]byte
	number := func(n int64) { h.Write(binary.AppendVarint(varint[:0], n)) }
	field := func(b []byte) { // length-prefixed, so no two sequences of fields hash alike
		number(int64(len(b)))
		h.Write(b)
	}
	field(request)
	field([]byte(x.Plan.Format))
	field(x.Plan.Header)
	number(x.Plan.BodyBytes)
	for i := range x.Plan.Items {
		for _, rd := range x.Plan.Items[i].Reads() {
			field([]byte(rd.Key))
			field([]byte(rd.Version))
			number(rd.Offset)
			number(rd.Length)
		}
	}
	h.Sum(key[:0])
	return key, true
}

// Resolve opens req's checkpoint, expands its layout into a copy of it, and plans that. All a plan
// may grow to is reserved while it is built (PlanBytes) and what it holds is kept until Release.
func (r *Resolver) Resolve(ctx context.Context, req *api.ShardRequest, purpose Purpose) (*Resolved, error) {
	ck, err := r.open(ctx, req.Checkpoint)
	if err != nil {
		return nil, err
	}
	if req, err = r.expand(ctx, req, ck); err != nil {
		return nil, err
	}
	opts := r.cfg.Planner
	opts.NoPieces = purpose == Stream
	opts.MaxPlanBytes = r.planBytes
	giveBack, err := r.cfg.Memory.Reserve(ctx, opts.MaxPlanBytes)
	if err != nil {
		return nil, err
	}
	start := time.Now()
	pctx, span := r.cfg.Tracer.Start(ctx, "plan", trace.WithAttributes(attribute.Int("tensors", len(req.Tensors))))
	plan, err := planner.NewContext(pctx, req, ck, opts)
	span.End()
	if err == nil && purpose == Stream {
		err = r.knownCorrupt(plan)
	}
	if err != nil {
		giveBack(opts.MaxPlanBytes)
		return nil, err
	}
	held := min(plan.MemoryBytes, opts.MaxPlanBytes)
	giveBack(opts.MaxPlanBytes - held)
	return &Resolved{Plan: plan, Planning: time.Since(start), catalog: r.cfg.Catalog, request: req, release: giveBack,
		held: held}, nil
}

// knownCorrupt fails a plan that would read bytes an earlier read of the same file version found
// corrupt (Resolved.ReadFailed), so a retry gets the error before its first byte, not a body cut
// short after the headers.
func (r *Resolver) knownCorrupt(plan *planner.Plan) error {
	for i := range plan.Items {
		for _, rd := range plan.Items[i].Reads() {
			if err := r.cfg.Catalog.KnownCorrupt(rd.Key, rd.Version, rd.Offset, rd.Length); err != nil {
				return err
			}
		}
	}
	return nil
}

// open resolves a checkpoint by name.
func (r *Resolver) open(ctx context.Context, name string) (*checkpoint.Checkpoint, error) {
	ctx, span := r.cfg.Tracer.Start(ctx, "catalog.open", trace.WithAttributes(attribute.String("checkpoint", name)))
	defer span.End()
	return r.cfg.Catalog.Open(ctx, name)
}

// Layout opens checkpoint name and expands l into its table.
func (r *Resolver) Layout(ctx context.Context, name string, l api.EngineLayout) (*Layout, error) {
	ck, err := r.open(ctx, name)
	if err != nil {
		return nil, err
	}
	return r.build(ctx, ck, l)
}

// expand returns req as it is planned: req itself when it carries a table, else a copy whose
// tensors are the table its layout expands to and whose layout names the release line the table
// follows (so the response can say it).
func (r *Resolver) expand(ctx context.Context, req *api.ShardRequest, ck *checkpoint.Checkpoint) (*api.ShardRequest, error) {
	if req.Layout == nil {
		return req, nil
	}
	if len(req.Tensors) > 0 {
		return nil, &Error{Kind: TableAndLayout,
			Detail: "a request carries either tensors (a table) or layout (an engine's rank), not both",
			Field:  "drop tensors or layout"}
	}
	l, err := r.build(ctx, ck, *req.Layout)
	if err != nil {
		return nil, err
	}
	out, layout := *req, *req.Layout
	layout.EngineVersion = l.EngineVersion
	out.Layout, out.Tensors = &layout, l.Tensors
	return &out, nil
}

// build expands a layout into its table.
func (r *Resolver) build(ctx context.Context, ck *checkpoint.Checkpoint, l api.EngineLayout) (*Layout, error) {
	f, err := r.cfg.Catalog.StatFile(ctx, ck.Name, configFile)
	if errors.Is(err, checkpoint.ErrNoFile) {
		return nil, &Error{Kind: NoConfig,
			Detail: "the checkpoint has no config.json, which a layout is built from; send a tensors table instead",
			Field:  "the checkpoint has no config.json"}
	}
	if err != nil {
		return nil, err
	}
	if limit := r.cfg.MaxConfigBytes; f.Size > limit {
		detail := fmt.Sprintf("%s is %d bytes, over --max-config-bytes %d", configFile, f.Size, limit)
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
		PCP: orDefault(l.PrefillContextParallelSize, 1), PCPRank: orDefault(l.PcpRank, 0),
		ExpertParallel: orDefault(l.EnableExpertParallel, false),
		EPLB:           orDefault(l.EnableEplb, false), RedundantExperts: orDefault(l.NumRedundantExperts, 0),
		Placement:   string(orDefault(l.ExpertPlacementStrategy, api.Linear)),
		DPAttention: orDefault(l.EnableDpAttention, false), EP: orDefault(l.ExpertParallelSize, 1)}}
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
