package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

func newLocal(t *testing.T) (store.Store, func(string, []byte)) { return storetest.Local(t) }

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
