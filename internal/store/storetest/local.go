package storetest

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Local is a local store over a temporary directory, and a put that writes or replaces a file
// the way an upload does (a new file renamed into place, with a new modification time).
func Local(t *testing.T) (*store.Local, func(key string, data []byte)) {
	t.Helper()
	dir := t.TempDir()
	s, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s, func(key string, data []byte) {
		p := filepath.Join(dir, key)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p+".tmp", data, 0o644); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(p+".tmp", p); err != nil {
			t.Fatal(err)
		}
		// Keep versions distinct even on file systems with coarse timestamps.
		later := time.Now().Add(time.Duration(len(data)) * time.Millisecond)
		os.Chtimes(p, later, later)
	}
}
