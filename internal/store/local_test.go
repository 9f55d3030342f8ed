package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

func newLocal(t *testing.T) (store.Store, func(string, []byte)) {
	dir := t.TempDir()
	s, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	put := func(key string, data []byte) {
		p := filepath.Join(dir, key)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		// Write a new file and rename it over the old one, as a checkpoint upload would.
		tmp := p + ".tmp"
		if err := os.WriteFile(tmp, data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, p); err != nil {
			t.Fatal(err)
		}
		// Keep versions distinct even on file systems with coarse timestamps.
		later := time.Now().Add(time.Duration(len(data)) * time.Millisecond)
		os.Chtimes(p, later, later)
	}
	return s, put
}

func TestLocalConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: newLocal})
}

func TestLocalRefusesSymlinkEscape(t *testing.T) {
	outside := t.TempDir()
	os.WriteFile(filepath.Join(outside, "secret"), []byte("secret"), 0o644)
	dir := t.TempDir()
	os.Symlink(filepath.Join(outside, "secret"), filepath.Join(dir, "link"))
	os.Symlink(outside, filepath.Join(dir, "linkdir"))
	s, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	for _, key := range []string{"link", "linkdir/secret"} {
		if err := s.ReadAt(context.Background(), key, "", make([]byte, 6), 0); err == nil || !errors.Is(err, store.ErrInvalidKey) {
			t.Errorf("ReadAt(%q) through a symlink out of the root: %v, want ErrInvalidKey", key, err)
		}
	}
}
