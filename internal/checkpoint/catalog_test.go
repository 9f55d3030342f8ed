package checkpoint

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

func writeFile(t *testing.T, dir, name string, tensors ...safetensors.TensorData) {
	t.Helper()
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, tensors, map[string]string{"format": "pt"}); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Dir(filepath.Join(dir, name)), 0o755)
	if err := os.WriteFile(filepath.Join(dir, name), buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
}

func td(name string, n int) safetensors.TensorData {
	return safetensors.TensorData{Name: name, DType: "F32", Shape: []int64{int64(n)}, Data: make([]byte, 4*n)}
}

func catalog(t *testing.T) (*Catalog, string) {
	dir := t.TempDir()
	s, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	return New(s), dir
}

func TestIndexedCheckpoint(t *testing.T) {
	c, dir := catalog(t)
	writeFile(t, dir, "m/model-00001-of-00002.safetensors", td("embed.weight", 12))
	writeFile(t, dir, "m/model-00002-of-00002.safetensors", td("norm.weight", 3))
	writeFile(t, dir, "m/consolidated.safetensors", td("norm.weight", 3), td("extra", 1)) // never opened
	os.WriteFile(
		filepath.Join(dir, "m", IndexFile),
		[]byte(
			`{"metadata":{"total_size":0},"weight_map":{"embed.weight":"model-00001-of-00002.safetensors",`+
				`"norm.weight":"model-00002-of-00002.safetensors"}}`,
		),
		0o644,
	)
	ck, err := c.Open(context.Background(), "m")
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(ck.Names(), ","); got != "embed.weight,norm.weight" {
		t.Errorf("tensors %s", got)
	}
	if ck.Tensors["norm.weight"].Key != "m/model-00002-of-00002.safetensors" {
		t.Errorf("norm.weight in %s", ck.Tensors["norm.weight"].Key)
	}
	if again, _ := c.Open(context.Background(), "m"); again != ck {
		t.Error("a second Open should reuse the cached resolution")
	}
	names, err := c.List(context.Background())
	if err != nil || strings.Join(names, ",") != "m" {
		t.Errorf("List = %v, %v", names, err)
	}
}

func TestSingleFileIgnoresStrays(t *testing.T) {
	c, dir := catalog(t)
	writeFile(t, dir, "s/model.safetensors", td("w", 2))
	os.WriteFile(filepath.Join(dir, "s/shard-00001-model-00001-of-00001.safetensors"), []byte("garbage"), 0o644)
	ck, err := c.Open(context.Background(), "s")
	if err != nil || len(ck.Tensors) != 1 {
		t.Fatalf("%v %v", ck, err)
	}
}

func TestRejectedCheckpoints(t *testing.T) {
	c, dir := catalog(t)
	writeFile(t, dir, "dup/a.safetensors", td("w", 2))
	writeFile(t, dir, "dup/b.safetensors", td("w", 2))
	os.WriteFile(
		filepath.Join(dir, "dup", IndexFile),
		[]byte(`{"weight_map":{"w":"a.safetensors","x":"b.safetensors"}}`),
		0o644,
	)
	os.MkdirAll(filepath.Join(dir, "empty-index"), 0o755)
	os.WriteFile(filepath.Join(dir, "empty-index", IndexFile), []byte(`{}`), 0o644)
	os.MkdirAll(filepath.Join(dir, "missing-file"), 0o755)
	os.WriteFile(
		filepath.Join(dir, "missing-file", IndexFile),
		[]byte(`{"weight_map":{"w":"gone.safetensors"}}`),
		0o644,
	)
	os.MkdirAll(filepath.Join(dir, "escape"), 0o755)
	os.WriteFile(filepath.Join(dir, "escape", IndexFile), []byte(`{"weight_map":{"w":"../dup/a.safetensors"}}`), 0o644)
	os.MkdirAll(filepath.Join(dir, "bad"), 0o755)
	os.WriteFile(filepath.Join(dir, "bad", SingleFile), []byte("\x03\x00\x00\x00\x00\x00\x00\x00{x}"), 0o644)
	cases := map[string]string{
		"dup":          "a.safetensors and dup/b.safetensors",
		"empty-index":  "weight_map",
		"missing-file": "gone.safetensors",
		"escape":       "not a file name",
		"bad":          "bad/model.safetensors",
	}
	for name, want := range cases {
		_, err := c.Open(context.Background(), name)
		var e *Error
		if !errors.As(err, &e) || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want a checkpoint error containing %q", name, err, want)
		}
	}
	if _, err := c.Open(context.Background(), "nothing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("unknown checkpoint: %v", err)
	}
	if _, err := c.Open(context.Background(), "../etc"); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("traversal: %v", err)
	}
}

// The catalog decides from a read's error whether its resolution is stale.
func TestReadFailedDropsOnlyStaleResolutions(t *testing.T) {
	c, dir := catalog(t)
	writeFile(t, dir, "m/"+SingleFile, td("w", 4))
	ctx := context.Background()
	ck, err := c.Open(ctx, "m")
	if err != nil {
		t.Fatal(err)
	}
	c.ReadFailed("m", errors.New("the connection broke"))
	if again, _ := c.Open(ctx, "m"); again != ck {
		t.Error("a failure that says nothing of the files dropped the resolution")
	}
	for _, stale := range []error{store.ErrChanged, store.ErrNotFound} {
		c.ReadFailed("m", fmt.Errorf("read: %w", stale))
		again, err := c.Open(ctx, "m")
		if err != nil || again == ck {
			t.Errorf("after %v the resolution was kept", stale)
		}
		ck = again
	}
}
