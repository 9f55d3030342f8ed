package checkpoint_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// An index is read within the memory budget the catalog is charged to: four times its length is
// held while it is decoded, so while others hold the budget the open waits and then fails with
// ErrBusy (a 503), and once they let go it opens, and every byte comes back.
func TestIndexReadIsChargedToTheBudget(t *testing.T) {
	dir := t.TempDir()
	weights := map[string]string{}
	var tensors []safetensors.TensorData
	for i := range 20000 {
		name := fmt.Sprintf("model.layers.%d.weight", i)
		weights[name] = "model-00001-of-00001.safetensors"
		tensors = append(tensors, safetensors.TensorData{Name: name, DType: "F32", Shape: []int64{1}, Data: make([]byte, 4)})
	}
	index, _ := json.Marshal(map[string]any{"weight_map": weights})
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, tensors, nil); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, "c"), 0o755)
	os.WriteFile(filepath.Join(dir, "c", checkpoint.IndexFile), index, 0o644)
	os.WriteFile(filepath.Join(dir, "c", "model-00001-of-00001.safetensors"), buf.Bytes(), 0o644)
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	n := int64(len(index))
	mem := budget.New(budget.Config{Bytes: 5 * n})
	others, err := mem.Reserve(context.Background(), 2*n)
	if err != nil {
		t.Fatal(err)
	}
	cat := checkpoint.New(st)
	cat.ChargeTo(mem.Reserve)
	if _, err := cat.Open(context.Background(), "c"); !errors.Is(err, budget.ErrBusy) {
		t.Fatalf("a %d-byte index with %d of a %d-byte budget free: %v, want ErrBusy", n, 3*n, 5*n, err)
	}
	others(2 * n)
	if _, err := cat.Open(context.Background(), "c"); err != nil {
		t.Fatal(err)
	}
	if got := mem.Held(); got != 0 {
		t.Fatalf("the budget holds %d bytes after the open", got)
	}
}
