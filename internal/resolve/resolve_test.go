package resolve_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
	"github.com/shardsrv/shardsrv/internal/resolve"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// fixture is a local store holding, for each variant, vllmref's checkpoint of it under the
// variant's name (config.json and model.safetensors), and a resolver over it with a memory budget
// of its own.
type fixture struct {
	dir      string
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
	r := resolve.New(resolve.Config{Catalog: checkpoint.New(st), Memory: b, MaxConfigBytes: maxConfigBytes})
	return &fixture{dir: dir, budget: b, resolver: r}
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

// TestExpandWritesACopy: a request's layout is expanded into a copy; the client's request is the
// same afterwards, and a request with a table is planned as it is.
func TestExpandWritesACopy(t *testing.T) {
	f := newFixture(t, 1<<20, "llama")
	ctx := context.Background()
	ck, err := f.resolver.Open(ctx, "llama")
	if err != nil {
		t.Fatal(err)
	}
	req := &api.ShardRequest{Checkpoint: "llama", Layout: &api.EngineLayout{Engine: api.Vllm, TensorParallelSize: ptr(int64(2))}}
	before, _ := json.Marshal(req)
	out, err := f.resolver.Expand(ctx, req, ck)
	if err != nil {
		t.Fatal(err)
	}
	if after, _ := json.Marshal(req); !bytes.Equal(after, before) {
		t.Errorf("the request changed:\n%s\nto\n%s", before, after)
	}
	if out == req || len(out.Tensors) == 0 || out.Layout == req.Layout {
		t.Fatalf("the expansion is not a copy with a table: %+v", out)
	}
	if out.Layout.EngineVersion == nil || *out.Layout.EngineVersion == "" {
		t.Errorf("the expanded request names no release line: %+v", out.Layout)
	}
	l, err := f.resolver.Layout(ctx, "llama", *req.Layout)
	if err != nil {
		t.Fatal(err)
	}
	if a, b := mustJSON(t, out.Tensors), mustJSON(t, l.Tensors); !bytes.Equal(a, b) {
		t.Errorf("Expand and Layout differ:\n%s\n%s", a, b)
	}
	table := &api.ShardRequest{Checkpoint: "llama", Tensors: l.Tensors}
	if got, err := f.resolver.Expand(ctx, table, ck); err != nil || got != table {
		t.Errorf("a table is not planned as sent: %v", err)
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

// TestExpandRefuses: a table and a layout together, a checkpoint without config.json, a config.json
// over the cap and a budget with no room are refused with their typed errors.
func TestExpandRefuses(t *testing.T) {
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
	ck, err := f.resolver.Open(ctx, "llama")
	if err != nil {
		t.Fatal(err)
	}
	both := &api.ShardRequest{Checkpoint: "llama", Layout: &layout,
		Tensors: []api.TensorRequest{{Name: "x", Dtype: api.F32, Shape: api.Index{1}}}}
	if _, err := f.resolver.Expand(ctx, both, ck); kind(err) != resolve.TableAndLayout {
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
