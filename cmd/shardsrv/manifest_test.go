package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/example"
)

// TestLayoutCheck: a manifest of exactly the rank's table matches; one with a tensor renamed and
// another reshaped is reported exactly — the renamed one missing from the table, the original
// name extra in it, the reshaped one's two shapes — and the command fails.
func TestLayoutCheck(t *testing.T) {
	url, _ := live(t)
	tp, rank := int64(2), int64(1)
	table, err := api.NewClient(url).
		Layout(context.Background(), example.Name, api.EngineLayout{Engine: api.Vllm, TensorParallelSize: &tp, TpRank: &rank})
	if err != nil {
		t.Fatal(err)
	}
	manifest := make([]manifestEntry, len(table.Tensors))
	for i, tr := range table.Tensors {
		manifest[i] = manifestEntry{Name: tr.Name, Shape: tr.Shape, DType: string(tr.Dtype)}
	}
	write := func(m []manifestEntry) string {
		raw, _ := json.Marshal(m)
		path := filepath.Join(t.TempDir(), "manifest.json")
		if err := os.WriteFile(path, raw, 0o644); err != nil {
			t.Fatal(err)
		}
		return path
	}
	run := func(path string) (string, error) {
		var out, errs bytes.Buffer
		err := layoutCmd([]string{"--server", url, "--checkpoint", example.Name, "--tp", "2", "--rank", "1",
			"--check", path}, &out, &errs)
		return out.String(), err
	}
	if out, err := run(write(manifest)); err != nil || !strings.Contains(out, "matches") {
		t.Fatalf("the table's own manifest: %v %s", err, out)
	}

	renamed, reshaped := manifest[1], manifest[2]
	manifest[1].Name = strings.Replace(renamed.Name, "self_attn", "attention", 1)
	manifest[2].Shape = append([]int64{1}, reshaped.Shape...)
	out, err := run(write(manifest))
	if err == nil {
		t.Fatal("a manifest that differs was accepted")
	}
	want := []string{
		fmt.Sprintf("missing: %s %s %v (the engine holds it; the table does not)",
			manifest[1].Name, renamed.DType, renamed.Shape),
		fmt.Sprintf("shape: %s is %v in the table, %v in the engine", reshaped.Name, reshaped.Shape, manifest[2].Shape),
		fmt.Sprintf("extra: %s %s %v (the table serves it; the engine does not hold it)",
			renamed.Name, renamed.DType, renamed.Shape),
	}
	if got := strings.Split(strings.TrimSpace(out), "\n"); strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Fatalf("reported\n%s\nwant\n%s", out, strings.Join(want, "\n"))
	}
}
