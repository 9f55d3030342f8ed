package layout_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/api/layout"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// fixture is a live server over the example checkpoint, and the checkpoint's tensors read
// straight from its files, to compute what each layout must hold.
type fixture struct {
	client *api.Client
	shapes layout.Shapes
	data   map[string][]byte
}

func newFixture(t *testing.T) *fixture {
	dir := filepath.Join(t.TempDir(), "checkpoints")
	if _, err := example.Generate(dir); err != nil {
		t.Fatal(err)
	}
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	mem := budget.New(budget.Config{Bytes: 1 << 28, AdmitWait: time.Second})
	srv := server.New(
		server.Config{Catalog: checkpoint.New(st), Planner: planner.DefaultOptions(),
			Limits:   server.Limits{MaxBodyBytes: 1 << 20},
			Executor: executor.New(st, mem, executor.Config{Window: 2}),
			Budget:   mem,
		},
	)
	ts := httptest.NewServer(srv.Handler())
	t.Cleanup(ts.Close)
	f := &fixture{client: api.NewClient(ts.URL), data: map[string][]byte{}}
	list, err := f.client.Tensors(context.Background(), example.Name)
	if err != nil {
		t.Fatal(err)
	}
	f.shapes = layout.ShapesOf(list)
	files, _ := filepath.Glob(filepath.Join(dir, example.Name, "*.safetensors"))
	for _, path := range files {
		raw, _ := os.ReadFile(path)
		n := int64(binary.LittleEndian.Uint64(raw))
		h, err := safetensors.Parse(path, raw[8:8+n], int64(len(raw)))
		if err != nil {
			t.Fatal(err)
		}
		for _, tn := range h.Tensors {
			f.data[tn.Name] = raw[tn.Begin:tn.End]
		}
	}
	return f
}

// rows is rows [lo, hi) of a 2-d BF16 checkpoint tensor.
func (f *fixture) rows(name string, lo, hi int64) []byte {
	cols := f.shapes[name][1]
	return f.data[name][lo*cols*2 : hi*cols*2]
}

func cat(parts ...[]byte) []byte { return bytes.Join(parts, nil) }

func (f *fixture) fetch(t *testing.T, tensors ...api.TensorRequest) []byte {
	t.Helper()
	body, err := f.client.FetchBytes(
		context.Background(),
		&api.ShardRequest{Checkpoint: example.Name, Tensors: tensors},
	)
	if err != nil {
		t.Fatal(err)
	}
	return body
}

// ok fails the test when a builder does.
func ok(t *testing.T) func(api.TensorRequest, error) api.TensorRequest {
	return func(tr api.TensorRequest, err error) api.TensorRequest {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
		return tr
	}
}

const attn = "model.layers.0.self_attn."

func TestInterleavedQKV(t *testing.T) {
	f := newFixture(t)
	q, k, v := attn+"q_proj.weight", attn+"k_proj.weight", attn+"v_proj.weight"
	got := f.fetch(t, ok(t)(layout.InterleavedQKV(f.shapes, q, k, v, "wqkv", api.BF16, 16, layout.Rank{Size: 1})))
	want := cat(
		f.rows(q, 0, 32),
		f.rows(k, 0, 16),
		f.rows(v, 0, 16),
		f.rows(q, 32, 64),
		f.rows(k, 16, 32),
		f.rows(v, 16, 32),
	)
	if !bytes.Equal(got, want) {
		t.Error("the interleave is not [q of group 0; k0; v0; q of group 1; k1; v1]")
	}
	if _, err := layout.InterleavedQKV(f.shapes, q, k, v, "wqkv", api.BF16, 16, layout.Rank{Size: 4}); err == nil {
		t.Error("4 ranks cannot split 2 KV groups")
	}
}

func TestGateUpPerRank(t *testing.T) {
	f := newFixture(t)
	gate, up := "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"
	want := cat(f.rows(gate, 64, 128), f.rows(up, 64, 128))
	r := layout.Rank{Size: 2, Index: 1}
	if got := f.fetch(t, ok(t)(layout.GateUpPerRank(f.shapes, gate, up, "fc1", api.BF16, r))); !bytes.Equal(got, want) {
		t.Error("Megatron's fc1 rank 1 is not [gate_1; up_1]")
	}
}

func TestStackedExperts(t *testing.T) {
	f := newFixture(t)
	ex := func(e int, p string) string {
		return "model.layers.1.mlp.experts." + string(rune('0'+e)) + "." + p + "_proj.weight"
	}
	var parts [][]string
	for e := range example.Experts {
		parts = append(parts, []string{ex(e, "gate"), ex(e, "up")})
	}
	got := f.fetch(t, ok(t)(layout.StackedExperts(f.shapes, parts, "w13", api.BF16, layout.Rank{Size: 2, Index: 1})))
	want := cat(
		f.rows(ex(2, "gate"), 0, 32),
		f.rows(ex(2, "up"), 0, 32),
		f.rows(ex(3, "gate"), 0, 32),
		f.rows(ex(3, "up"), 0, 32),
	)
	if !bytes.Equal(got, want) {
		t.Error("EP=2 rank 1 is not experts 2 and 3, each [gate; up]")
	}
}

func TestRoPEPermutation(t *testing.T) {
	f := newFixture(t)
	q := attn + "q_proj.weight"
	const d = 16
	toMeta := f.fetch(t, ok(t)(layout.RoPEPermute(f.shapes, q, "wq", api.BF16, d, layout.HFToMeta)))
	toHF := f.fetch(t, ok(t)(layout.RoPEPermute(f.shapes, q, "wq", api.BF16, d, layout.MetaToHF)))
	row := func(b []byte, i int64) []byte { return b[i*64*2 : (i+1)*64*2] }
	for h := range int64(4) {
		for j := range int64(d / 2) {
			for tt := range int64(2) {
				// Meta[h*D + 2j + t] = HF[h*D + t*D/2 + j], read both ways.
				if !bytes.Equal(row(toMeta, h*d+2*j+tt), row(f.data[q], h*d+tt*d/2+j)) ||
					!bytes.Equal(row(toHF, h*d+tt*d/2+j), row(f.data[q], h*d+2*j+tt)) {
					t.Fatalf("head %d pair %d half %d", h, j, tt)
				}
			}
		}
	}
}

func TestParallelSplits(t *testing.T) {
	f := newFixture(t)
	o := attn + "o_proj.weight"
	got := f.fetch(t, ok(t)(layout.RowParallel(f.shapes, o, "o", api.BF16, layout.Rank{Size: 2, Index: 1})))
	var want []byte
	for i := range int64(64) {
		want = append(want, f.data[o][(i*64+32)*2:(i*64+64)*2]...)
	}
	if !bytes.Equal(got, want) {
		t.Error("row-parallel rank 1 is not the second half of every row")
	}
	if got := f.fetch(
		t,
		ok(t)(layout.ColumnParallel(f.shapes, o, "o", api.BF16, layout.Rank{Size: 4, Index: 2})),
	); !bytes.Equal(got, f.rows(o, 32, 48)) {
		t.Error("column-parallel rank 2 of 4 is not rows [32, 48)")
	}
}
