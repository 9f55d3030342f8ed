package resolve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/resolve"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// fixture is a local store holding, for each variant, vllmref's checkpoint of it under the
// variant's name (config.json and model.safetensors), and a resolver over it with a memory budget
// of its own.
type fixture struct {
	dir      string
	catalog  *checkpoint.Catalog
	budget   *budget.Budget
	resolver *resolve.Resolver
}

func newFixture(t *testing.T, maxConfigBytes int64, variants ...string) *fixture {
	t.Helper()
	dir := t.TempDir()
	for _, v := range variants {
		cfg, tensors := vllmref.Checkpoint(v, 42)
		writeCheckpoint(t, dir, v, cfg, tensors)
	}
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	b := budget.New(budget.Config{Bytes: 64 << 20})
	catalog := checkpoint.New(st)
	r := resolve.New(resolve.Config{Catalog: catalog, Memory: b, Planner: planner.DefaultOptions(),
		MaxConfigBytes: maxConfigBytes})
	return &fixture{dir: dir, catalog: catalog, budget: b, resolver: r}
}

func writeCheckpoint(t *testing.T, dir, name string, cfg []byte, tensors map[string]vllmref.Tensor) {
	t.Helper()
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	var data []safetensors.TensorData
	for _, n := range names {
		x := tensors[n]
		data = append(data, safetensors.TensorData{Name: n, DType: x.DType, Shape: x.Shape, Data: x.Data})
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, data, nil); err != nil {
		t.Fatal(err)
	}
	if err := os.MkdirAll(filepath.Join(dir, name), 0o755); err != nil {
		t.Fatal(err)
	}
	files := map[string][]byte{"model.safetensors": buf.Bytes()}
	if cfg != nil {
		files["config.json"] = cfg
	}
	for file, b := range files {
		if err := os.WriteFile(filepath.Join(dir, name, file), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

func ptr[T any](v T) *T { return &v }

// vllmLayout is a vLLM 0.10 layout of one rank.
func vllmLayout(p vllmref.Parallel) api.EngineLayout {
	return api.EngineLayout{
		Engine: api.Vllm, EngineVersion: ptr("0.10"),
		TensorParallelSize: ptr(int64(p.TP)), TpRank: ptr(int64(p.TPRank)),
		DataParallelSize: ptr(int64(p.DP)), DpRank: ptr(int64(p.DPRank)), EnableExpertParallel: ptr(p.EnableEP),
	}
}

// TestLayoutIsTheRankVLLMSaves: the table a layout expands to names every tensor vllmref (written
// from vLLM v0.10.2's loader) says the rank saves, at its dtype and shape, and nothing else; its
// config.json's memory is given back.
func TestLayoutIsTheRankVLLMSaves(t *testing.T) {
	variants := []string{"llama", "mixtral"}
	f := newFixture(t, 1<<20, variants...)
	for _, v := range variants {
		cfg, tensors := vllmref.Checkpoint(v, 42)
		for _, p := range []vllmref.Parallel{
			{TP: 1, DP: 1}, {TP: 2, TPRank: 0, DP: 1}, {TP: 2, TPRank: 1, DP: 1}, {TP: 2, TPRank: 1, DP: 1, EnableEP: true},
		} {
			want, err := vllmref.Rank(cfg, tensors, p)
			if err != nil {
				t.Fatal(err)
			}
			l, err := f.resolver.Layout(context.Background(), v, vllmLayout(p))
			if err != nil {
				t.Fatalf("%s %+v: %v", v, p, err)
			}
			if l.Checkpoint.Name != v || l.EngineVersion == nil || *l.EngineVersion != "0.10" {
				t.Errorf("%s %+v: checkpoint %q, engine version %v", v, p, l.Checkpoint.Name, l.EngineVersion)
			}
			got := map[string]bool{}
			for _, x := range l.Tensors {
				got[x.Name] = true
				w, ok := want[x.Name]
				if !ok {
					t.Errorf("%s %+v: %s is not saved by the rank", v, p, x.Name)
					continue
				}
				if string(x.Dtype) != w.DType || !slices.Equal(x.Shape, w.Shape) {
					t.Errorf("%s %+v: %s is %s %v, want %s %v", v, p, x.Name, x.Dtype, x.Shape, w.DType, w.Shape)
				}
			}
			for n := range want {
				if !got[n] {
					t.Errorf("%s %+v: %s is missing", v, p, n)
				}
			}
		}
	}
	if n := f.budget.Held(); n != 0 {
		t.Errorf("%d bytes of the budget still held", n)
	}
}

// TestResolveExpandsACopy: a request's layout is planned from a copy; the client's request is the
// same afterwards, the plan's tensors are the layout's table, and its header names the release line.
func TestResolveExpandsACopy(t *testing.T) {
	f := newFixture(t, 1<<20, "llama")
	ctx := context.Background()
	safetensorsFormat := api.Safetensors
	req := &api.ShardRequest{Checkpoint: "llama", Format: &safetensorsFormat,
		Layout: &api.EngineLayout{Engine: api.Vllm, TensorParallelSize: ptr(int64(2))}}
	before := mustJSON(t, req)
	res, err := f.resolver.Resolve(ctx, req, resolve.Stream)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Release()
	if after := mustJSON(t, req); !bytes.Equal(after, before) {
		t.Errorf("the request changed:\n%s\nto\n%s", before, after)
	}
	l, err := f.resolver.Layout(ctx, "llama", *req.Layout)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	for _, x := range l.Tensors {
		want = append(want, x.Name)
	}
	got := make([]string, len(want))
	for _, it := range res.Plan.Items { // in body order; Tensor is the index in the table
		got[it.Tensor] = it.Name
	}
	if !slices.Equal(got, want) {
		t.Errorf("the plan's tensors are\n%v\nthe layout's\n%v", got, want)
	}
	if l.EngineVersion == nil || !bytes.Contains(res.Plan.Header, []byte(`"shardsrv.engine_version":"`+*l.EngineVersion+`"`)) {
		t.Errorf("the header does not name release line %v: %s", l.EngineVersion, res.Plan.Header)
	}
}

// TestResolveHoldsWhatThePlanHolds: a resolved plan holds its memory of the budget until Release;
// a request the planner refuses holds none.
func TestResolveHoldsWhatThePlanHolds(t *testing.T) {
	f := newFixture(t, 1<<20, "llama")
	ctx := context.Background()
	res, err := f.resolver.Resolve(ctx, &api.ShardRequest{Checkpoint: "llama", Layout: &api.EngineLayout{Engine: api.Vllm}},
		resolve.Stream)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := f.budget.Held(), min(res.Plan.MemoryBytes, f.budget.Bytes()/4); got != want || got <= 0 {
		t.Errorf("a plan of %d bytes holds %d of the budget, want %d", res.Plan.MemoryBytes, got, want)
	}
	res.Release()
	if n := f.budget.Held(); n != 0 {
		t.Errorf("%d bytes held after Release", n)
	}
	_, err = f.resolver.Resolve(ctx, &api.ShardRequest{Checkpoint: "llama",
		Tensors: []api.TensorRequest{{Name: "no.such.tensor", Dtype: api.F32, Shape: api.Index{1}}}}, resolve.Report)
	var verr *planner.ValidationError
	if !errors.As(err, &verr) {
		t.Errorf("an unknown tensor: %v", err)
	}
	if n := f.budget.Held(); n != 0 {
		t.Errorf("%d bytes held after a refused plan", n)
	}
}

// TestReadFailedDropsAStaleResolution: with revalidation far off, a checkpoint replaced in the
// store is still planned from the old resolution — until a read of it fails with a changed file;
// another failure leaves the resolution.
func TestReadFailedDropsAStaleResolution(t *testing.T) {
	f := newFixture(t, 1<<20, "llama")
	f.catalog.Revalidate = time.Hour
	ctx := context.Background()
	table := func(name string) *api.ShardRequest {
		blocks := []api.Block{{Source: name, Base: api.Index{0}, Coeff: []api.Index{{1}}, Offsets: api.Index{0},
			Lengths: api.Lengths{1}}}
		return &api.ShardRequest{Checkpoint: "llama", Tensors: []api.TensorRequest{{Name: name, Dtype: api.F32,
			Shape: api.Index{1}, Boxes: []api.Box{{Offsets: api.Index{0}, Lengths: api.Lengths{1}}}, Blocks: &blocks}}}
	}
	res, err := f.resolver.Resolve(ctx, &api.ShardRequest{Checkpoint: "llama", Layout: &api.EngineLayout{Engine: api.Vllm}},
		resolve.Stream)
	if err != nil {
		t.Fatal(err)
	}
	res.Release()
	cfg, tensors := vllmref.Checkpoint("llama", 42)
	tensors["added"] = vllmref.Tensor{DType: "F32", Shape: []int64{1}, Data: make([]byte, 4)}
	writeCheckpoint(t, f.dir, "llama", cfg, tensors)
	plans := func() error {
		res, err := f.resolver.Resolve(ctx, table("added"), resolve.Stream)
		if err == nil {
			res.Release()
		}
		return err
	}
	if err := plans(); err == nil {
		t.Fatal("the new tensor is planned before the resolution was found stale: revalidation is not what is tested")
	}
	res.ReadFailed(fmt.Errorf("a read: %w", store.ErrUnavailable))
	if err := plans(); err == nil {
		t.Error("a store that is unavailable dropped the resolution")
	}
	res.ReadFailed(fmt.Errorf("a read: %w", store.ErrChanged))
	if err := plans(); err != nil {
		t.Errorf("after a read found a file changed: %v", err)
	}
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestResolveRefuses: a table and a layout together, a checkpoint without config.json, a config.json
// over the cap and a budget with no room are refused with their typed errors.
func TestResolveRefuses(t *testing.T) {
	f := newFixture(t, 1<<20, "llama")
	cfg, tensors := vllmref.Checkpoint("llama", 42)
	writeCheckpoint(t, f.dir, "no-config", nil, tensors)
	writeCheckpoint(t, f.dir, "big-config", append(cfg[:len(cfg)-1:len(cfg)-1],
		[]byte(`,"_padding":"`+string(bytes.Repeat([]byte("a"), 1<<20))+`"}`)...), tensors)
	ctx := context.Background()
	layout := api.EngineLayout{Engine: api.Vllm}
	kind := func(err error) any {
		var rerr *resolve.Error
		if errors.As(err, &rerr) {
			return rerr.Kind
		}
		return err
	}
	both := &api.ShardRequest{Checkpoint: "llama", Layout: &layout,
		Tensors: []api.TensorRequest{{Name: "x", Dtype: api.F32, Shape: api.Index{1}}}}
	if _, err := f.resolver.Resolve(ctx, both, resolve.Stream); kind(err) != resolve.TableAndLayout {
		t.Errorf("tensors and layout: %v", err)
	}
	if _, err := f.resolver.Layout(ctx, "no-config", layout); kind(err) != resolve.NoConfig {
		t.Errorf("no config.json: %v", err)
	}
	if _, err := f.resolver.Layout(ctx, "big-config", layout); kind(err) != resolve.ConfigTooLarge {
		t.Errorf("config.json over the cap: %v", err)
	}
	if _, err := f.resolver.Layout(ctx, "missing", layout); !errors.Is(err, checkpoint.ErrNotFound) {
		t.Errorf("unknown checkpoint: %v", err)
	}
	// The whole budget held elsewhere: the layout cannot reserve its config's memory, and AdmitWait
	// is zero, so it is refused at once.
	release, err := f.budget.Reserve(ctx, f.budget.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.resolver.Layout(ctx, "llama", layout); !errors.Is(err, budget.ErrBusy) {
		t.Errorf("no room in the budget: %v", err)
	}
	release(f.budget.Bytes())
	if n := f.budget.Held(); n != 0 {
		t.Errorf("%d bytes of the budget still held", n)
	}
}

// New refuses what Validate does: a zero Config has no catalog and no budget, and a negative size
// is no default.
func TestNewRefusesWhatValidateRefuses(t *testing.T) {
	f := newFixture(t, 0)
	for name, c := range map[string]struct {
		cfg  resolve.Config
		want string
	}{
		"zero":                   {resolve.Config{}, "catalog and a memory budget"},
		"negative config size":   {resolve.Config{Catalog: f.catalog, Memory: f.budget, MaxConfigBytes: -1}, "--max-config-bytes"},
		"negative planner sizes": {resolve.Config{Catalog: f.catalog, Memory: f.budget, Planner: planner.Options{MaxGap: -1}}, "planner"},
	} {
		func() {
			defer func() {
				if v, _ := recover().(string); !strings.Contains(v, c.want) {
					t.Errorf("%s: New panicked with %q, want it to name %q", name, v, c.want)
				}
			}()
			resolve.New(c.cfg)
		}()
	}
}
