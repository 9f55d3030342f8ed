package example_test

import (
	"context"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/store"
)

// Generate writes into the directory it is given and nowhere else, and that directory is a store
// whose only checkpoint is the example: the requests beside it are not listed as one.
func TestGenerateWritesAStoreInsideItsDirectory(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "store")
	requests, err := example.Generate(dir)
	if err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 1 || entries[0].Name() != "store" {
		t.Errorf("Generate wrote beside its directory: %v", entries)
	}
	if len(requests) == 0 {
		t.Fatal("no example requests")
	}
	for _, r := range requests {
		if rel, err := filepath.Rel(dir, r); err != nil || filepath.Dir(rel) != example.RequestsDir {
			t.Errorf("request %s is not in %s/%s", r, dir, example.RequestsDir)
		}
	}
	var files []string
	filepath.WalkDir(dir, func(path string, d fs.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			rel, _ := filepath.Rel(dir, path)
			files = append(files, rel)
		}
		return err
	})
	for _, f := range files {
		if !strings.HasPrefix(f, example.Name+"/") && !slices.Contains(requests, filepath.Join(dir, f)) {
			t.Errorf("%s is neither the checkpoint's nor a request", f)
		}
	}
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	names, err := checkpoint.New(st).List(context.Background())
	if err != nil || !slices.Equal(names, []string{example.Name}) {
		t.Errorf("the store lists %v (%v), want only %s", names, err, example.Name)
	}
}
