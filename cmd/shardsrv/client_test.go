package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// live serves the example checkpoint; folder is its directory.
func live(t *testing.T) (url, folder string) { return liveWrapped(t, nil) }

// liveWrapped serves the example checkpoint through wrap (nil: none).
func liveWrapped(t *testing.T, wrap func(http.Handler) http.Handler) (url, folder string) {
	dir := filepath.Join(t.TempDir(), "checkpoints")
	if _, err := example.Generate(dir); err != nil {
		t.Fatal(err)
	}
	st, _ := store.NewLocal(dir)
	mem := budget.New(budget.Config{Bytes: 1 << 26, AdmitWait: time.Second})
	srv := server.New(
		server.Config{Catalog: checkpoint.New(st), Planner: planner.DefaultOptions(),
			Limits:   server.Limits{MaxBodyBytes: 1 << 20},
			Executor: executor.New(st, mem, executor.Config{Window: 2}),
			Budget:   mem,
		},
	)
	h := srv.Handler()
	if wrap != nil {
		h = wrap(h)
	}
	ts := httptest.NewServer(h)
	t.Cleanup(ts.Close)
	return ts.URL, filepath.Join(dir, example.Name)
}

// fileNames lists dir, sorted.
func fileNames(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}

// readSafetensors parses a safetensors file: each tensor's header entry and bytes, by name.
func readSafetensors(t *testing.T, path string) (map[string]safetensors.Tensor, map[string][]byte) {
	t.Helper()
	raw, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(binary.LittleEndian.Uint64(raw))
	h, err := safetensors.Parse(path, raw[8:8+n], int64(len(raw)))
	if err != nil {
		t.Fatal(err)
	}
	entries, data := map[string]safetensors.Tensor{}, map[string][]byte{}
	for _, tn := range h.Tensors {
		entries[tn.Name], data[tn.Name] = tn, raw[tn.Begin:tn.End]
	}
	return entries, data
}

func TestLayoutCommand(t *testing.T) {
	url, _ := live(t)
	var out, errs bytes.Buffer
	if err := layoutCmd(
		[]string{"--server", url, "--checkpoint", example.Name, "--tp", "2", "--rank", "1", "--dtype", "bf16"},
		&out,
		&errs,
	); err != nil {
		t.Fatalf("%v %s", err, errs.String())
	}
	var req api.ShardRequest
	dec := json.NewDecoder(&out)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil || req.Checkpoint != example.Name || req.Layout != nil {
		t.Fatalf("not a shard request with a table: %v", err)
	}
	tp, rank := int64(2), int64(1)
	want, err := api.NewClient(url).
		Layout(context.Background(), example.Name, api.EngineLayout{Engine: api.Vllm, TensorParallelSize: &tp, TpRank: &rank})
	if err != nil || !reflect.DeepEqual(req.Tensors, want.Tensors) {
		t.Fatalf("the printed table is not what /v1/layouts returns (%v)", err)
	}

	out.Reset()
	if err := layoutCmd(
		[]string{
			"--server", url,
			"--checkpoint", example.Name,
			"--tp", "2",
			"--rank", "1",
			"--format", "table",
			"--dtype", "f32",
		},
		&out,
		&errs,
	); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 2+len(want.Tensors) ||
		!slices.Equal(strings.Fields(lines[0]), []string{"tensor", "dtype", "shape", "bytes", "size"}) ||
		!strings.HasPrefix(lines[len(lines)-1], "total") {
		t.Fatalf("table:\n%s", out.String())
	}
	if !strings.Contains(out.String(), "model.layers.1.mlp.experts.routed_experts.w13_weight") ||
		strings.Fields(lines[1])[1] != "F32" {
		t.Errorf("table:\n%s", out.String())
	}

	for _, args := range [][]string{
		{"--checkpoint", example.Name, "--tp", "3"},                // the server refuses: 422
		{"--checkpoint", example.Name, "--format", "yaml"},         // no such format
		{"--checkpoint", example.Name, "--rank", "all"},            // one rank only
		{"llama", "--checkpoint", example.Name},                    // presets are gone
		{"--checkpoint", example.Name, "--engine", "sglang"},       // SGLang's Qwen2-MoE is not laid out
		{"--checkpoint", example.Name, "--engine", "tensorrt"},     // not an engine the server knows
		{"--checkpoint", example.Name, "--tp", "2", "--rank", "2"}, // out of range
	} {
		if err := layoutCmd(append([]string{"--server", url}, args...), &out, &errs); err == nil {
			t.Errorf("%v was accepted", args)
		}
	}
}

func TestPlanPicksUnitsBySize(t *testing.T) {
	url, _ := live(t)
	var req, out, errs bytes.Buffer
	if err := layoutCmd(
		[]string{"--server", url, "--checkpoint", example.Name, "--tp", "2", "--rank", "1", "--ep"},
		&req,
		&errs,
	); err != nil {
		t.Fatal(err)
	}
	reqFile := filepath.Join(t.TempDir(), "rank1.json")
	os.WriteFile(reqFile, req.Bytes(), 0o644)
	if err := planCmd([]string{"--server", url, "--request", reqFile}, &out, &errs); err != nil {
		t.Fatal(err)
	}
	s := out.String()
	if !strings.Contains(s, "model.layers.1.mlp.experts.routed_experts.w13_weight") || !strings.Contains(s, "16.0 KiB") ||
		!strings.Contains(s, "128 B") ||
		strings.Contains(s, "0.0 MiB") ||
		!strings.Contains(s, "amplification") {
		t.Errorf("plan table:\n%s", s)
	}
}

func TestSizeAndETA(t *testing.T) {
	for n, want := range map[int64]string{
		0:       "0 B",
		1023:    "1023 B",
		1536:    "1.5 KiB",
		3 << 20: "3.0 MiB",
		5 << 30: "5.0 GiB",
	} {
		if got := size(n); got != want {
			t.Errorf("size(%d) = %q, want %q", n, got, want)
		}
	}
	if got := eta(25, 100, 10*time.Second); got != "30s" {
		t.Errorf("a quarter in 10 s leaves %s, want 30s", got)
	}
	if got := eta(0, 100, time.Second); got != "?" {
		t.Errorf("nothing yet: %s", got)
	}
}

func TestFetchRequestReplacesTheFileOnlyOnSuccess(t *testing.T) {
	url, _ := live(t)
	dir := t.TempDir()
	var req, errs bytes.Buffer
	if err := layoutCmd(
		[]string{"--server", url, "--checkpoint", example.Name, "--tp", "2", "--rank", "0"},
		&req,
		&errs,
	); err != nil {
		t.Fatal(err)
	}
	good, bad := filepath.Join(dir, "good.json"), filepath.Join(dir, "bad.json")
	os.WriteFile(good, req.Bytes(), 0o644)
	os.WriteFile(bad, bytes.Replace(req.Bytes(), []byte(example.Name), []byte("no-such-checkpoint"), 1), 0o644)
	var parsed api.ShardRequest
	json.Unmarshal(req.Bytes(), &parsed)
	want, err := api.NewClient(url).FetchBytes(context.Background(), &parsed)
	if err != nil {
		t.Fatal(err)
	}

	shard := filepath.Join(dir, "shard.bin")
	os.WriteFile(shard, []byte("before"), 0o644)
	if err := fetch([]string{"--server", url, "--request", bad, "-o", shard}, &bytes.Buffer{}, &errs); err == nil {
		t.Fatal("an unknown checkpoint was fetched")
	}
	if got, _ := os.ReadFile(shard); string(got) != "before" {
		t.Errorf("a failed fetch changed the output file: %q", got)
	}
	errs.Reset()
	if err := fetch([]string{"--server", url, "--request", good, "-o", shard}, &bytes.Buffer{}, &errs); err != nil {
		t.Fatal(err)
	}
	if got, _ := os.ReadFile(shard); !bytes.Equal(got, want) || !strings.Contains(errs.String(), "fetched") {
		t.Errorf("fetched %d bytes, want %d; said %q", len(got), len(want), errs.String())
	}
	if names, _ := filepath.Glob(filepath.Join(dir, "*")); len(names) != 3 {
		t.Errorf("left behind: %v", names) // good.json, bad.json, shard.bin
	}
	if hidden, _ := filepath.Glob(filepath.Join(dir, ".*")); len(hidden) != 0 {
		t.Errorf("temporary files left behind: %v", hidden)
	}

	var stdout bytes.Buffer
	if err := fetch([]string{"--server", url, "--request", good, "-o", "-"}, &stdout, &errs); err != nil ||
		!bytes.Equal(stdout.Bytes(), want) {
		t.Errorf("-o - wrote %d bytes to stdout, want %d (%v)", stdout.Len(), len(want), err)
	}
	if _, err := os.Stat("-"); err == nil {
		t.Error("-o - wrote a file named -")
	}
}

func TestFetchLayoutWritesAShardedStateDirectory(t *testing.T) {
	url, folder := live(t)
	ctx := context.Background()
	c := api.NewClient(url)
	// The checkpoint's own tensors, read from its files, for an independent look at one tensor.
	ckptData := map[string][]byte{}
	for _, f := range []string{"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"} {
		_, data := readSafetensors(t, filepath.Join(folder, f))
		for k, v := range data {
			ckptData[k] = v
		}
	}

	for _, c0 := range []struct {
		args  []string
		ranks []int64
		ep    bool
	}{
		{[]string{"--tp", "2", "--rank", "all", "--parallel", "0"}, []int64{0, 1}, false}, // 0: the default
		{[]string{"--tp", "2", "--rank", "1", "--ep"}, []int64{1}, true},
	} {
		dir := filepath.Join(t.TempDir(), "out") // created by fetch
		var errs bytes.Buffer
		args := append(
			[]string{"--server", url, "--checkpoint", example.Name, "--layout", "vllm", "--out", dir},
			c0.args...)
		if err := fetch(args, &bytes.Buffer{}, &errs); err != nil {
			t.Fatalf("%v: %v %s", args, err, errs.String())
		}
		smallFiles := []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}
		var wantNames []string
		for _, r := range c0.ranks {
			rank := "model-rank-" + string(rune('0'+r)) + "-part-0.safetensors"
			wantNames = append(wantNames, rank, recordName(rank))
		}
		wantNames = append(wantNames, smallFiles...)
		names := fileNames(t, dir)
		slices.Sort(wantNames)
		if !slices.Equal(names, wantNames) {
			t.Fatalf("%v wrote %v, want %v", args, names, wantNames)
		}
		for _, f := range smallFiles {
			got, _ := os.ReadFile(filepath.Join(dir, f))
			if want, _ := os.ReadFile(filepath.Join(folder, f)); !bytes.Equal(got, want) {
				t.Errorf("%s differs from the checkpoint's", f)
			}
		}
		for _, r := range c0.ranks {
			tp := int64(2)
			l := api.EngineLayout{Engine: api.Vllm, TensorParallelSize: &tp, TpRank: &r, EnableExpertParallel: &c0.ep}
			table, err := c.Layout(ctx, example.Name, l)
			if err != nil {
				t.Fatal(err)
			}
			body, err := c.FetchBytes(ctx, &api.ShardRequest{Checkpoint: example.Name, Layout: &l})
			if err != nil {
				t.Fatal(err)
			}
			file := filepath.Join(dir, fmt.Sprintf("model-rank-%d-part-0.safetensors", r))
			stored, data := readSafetensors(t, file)
			if len(stored) != len(table.Tensors) {
				t.Errorf("%s holds %d tensors, the layout %d", file, len(stored), len(table.Tensors))
			}
			// The raw body is the table's tensors in order: each must be the file's tensor.
			for _, tr := range table.Tensors {
				dt, _ := tensor.ParseDType(string(tr.Dtype))
				n := int64(dt.Size())
				for _, d := range tr.Shape {
					n *= d
				}
				e := stored[tr.Name]
				if e.DTypeName != string(tr.Dtype) || !slices.Equal(e.Shape, tr.Shape) ||
					!bytes.Equal(data[tr.Name], body[:n]) {
					t.Errorf(
						"rank %d %s: %s %v in the file, %s %v from /v1/shards, bytes equal %v",
						r,
						tr.Name,
						e.DTypeName,
						e.Shape,
						tr.Dtype,
						tr.Shape,
						bytes.Equal(data[tr.Name], body[:n]),
					)
				}
				body = body[n:]
			}
			// vLLM pads the 256-row vocabulary to 256 and splits it by 2: rank r holds rows [128r, 128r+128).
			if emb, want := data["model.embed_tokens.weight"],
				ckptData["model.embed_tokens.weight"][r*128*64*2:(r+1)*128*64*2]; !bytes.Equal(emb, want) {
				t.Errorf("rank %d's embedding is not rows [%d, %d) of the checkpoint's", r, 128*r, 128*r+128)
			}
		}
	}

	var errs bytes.Buffer
	for _, args := range [][]string{
		{"--checkpoint", example.Name, "--layout", "vllm"},                                      // no --out
		{"--checkpoint", example.Name, "--out", t.TempDir()},                                    // no --layout
		{"--checkpoint", example.Name, "--layout", "vllm", "--rank", "x", "--out", t.TempDir()}, // not a rank
		{"--request", "r.json", "--out", t.TempDir()},                                           // --out is for layouts
		{"--checkpoint", example.Name, "--layout", "megatron", "--out", t.TempDir()},            // the directory is vLLM's
	} {
		if err := fetch(append([]string{"--server", url}, args...), &bytes.Buffer{}, &errs); err == nil {
			t.Errorf("%v was accepted", args)
		}
	}
}

func TestEveryClientCommandExplainsItself(t *testing.T) {
	for name, cmd := range map[string]func([]string, *bytes.Buffer, *bytes.Buffer) error{
		"fetch":  func(a []string, o, e *bytes.Buffer) error { return fetch(a, o, e) },
		"plan":   func(a []string, o, e *bytes.Buffer) error { return planCmd(a, o, e) },
		"layout": func(a []string, o, e *bytes.Buffer) error { return layoutCmd(a, o, e) },
	} {
		var out, errs bytes.Buffer
		if err := cmd([]string{"-h"}, &out, &errs); !errors.Is(err, flag.ErrHelp) {
			t.Errorf("%s -h: %v", name, err)
		}
		help := errs.String()
		for _, want := range []string{"Usage:", "Example", "shardsrv " + name + " --", "-server", "-request"} {
			if name == "layout" && want == "-request" {
				want = "-checkpoint"
			}
			if !strings.Contains(help, want) {
				t.Errorf("%s -h has no %q:\n%s", name, want, help)
			}
		}
	}
}

func TestErrorsArePrefixedOnce(t *testing.T) {
	detail := "no checkpoint x"
	p := &api.ProblemError{Problem: api.Problem{Status: 404, Title: "Not Found", Detail: &detail}}
	if got := errorLine(p); got != "shardsrv: 404 Not Found: no checkpoint x" {
		t.Errorf("%q", got)
	}
	if got := errorLine(errors.New("--request is required")); got != "shardsrv: --request is required" {
		t.Errorf("%q", got)
	}
	if got := errorLine(fmt.Errorf("config.json: %w", p)); got != "shardsrv: config.json: 404 Not Found: no checkpoint x" {
		t.Errorf("%q", got)
	}
}

func TestFetchSmallFilesWritesNoWeights(t *testing.T) {
	url, folder := live(t)
	// A signature covers the checkpoint's weight files, none of which the directory holds.
	if err := os.WriteFile(filepath.Join(folder, "model.sig"), []byte("{}"), 0o644); err != nil {
		t.Fatal(err)
	}
	dir := filepath.Join(t.TempDir(), "model")
	var errs bytes.Buffer
	if err := fetch([]string{"--server", url, "--checkpoint", example.Name, "--small-files", "--out", dir},
		&bytes.Buffer{}, &errs); err != nil {
		t.Fatalf("%v %s", err, errs.String())
	}
	entries, _ := os.ReadDir(dir)
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	if want := []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"}; !slices.Equal(names, want) {
		t.Errorf("--small-files wrote %v, want %v", names, want)
	}
	if err := fetch([]string{"--server", url, "--checkpoint", example.Name, "--small-files", "--layout", "vllm",
		"--out", dir}, &bytes.Buffer{}, &errs); err == nil {
		t.Error("--small-files with --layout was accepted")
	}
}

func TestA401NamesTheTokenFlag(t *testing.T) {
	p := &api.ProblemError{Problem: api.Problem{Status: 401, Title: "Unauthorized"}}
	if got := errorLine(p); !strings.Contains(got, "--token") || !strings.Contains(got, "SHARDSRV_TOKEN") {
		t.Errorf("%q", got)
	}
}
