package store_test

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

func newLocal(t *testing.T) (store.Store, func(string, []byte)) { return storetest.Local(t) }

func TestLocalConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: newLocal})
}

// A symlink out of the root is a file the store does not have: not found, and the error names
// neither the store's directory nor the link's target.
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
		err := s.ReadAt(context.Background(), key, "", make([]byte, 6), 0)
		if !errors.Is(err, store.ErrNotFound) {
			t.Errorf("ReadAt(%q) through a symlink out of the root: %v, want ErrNotFound", key, err)
		}
		_, serr := s.Stat(context.Background(), key)
		if !errors.Is(serr, store.ErrNotFound) {
			t.Errorf("Stat(%q) through a symlink out of the root: %v, want ErrNotFound", key, serr)
		}
		for _, e := range []error{err, serr} {
			if e != nil && (strings.Contains(e.Error(), dir) || strings.Contains(e.Error(), outside)) {
				t.Errorf("the error names a local path: %v", e)
			}
		}
	}
}

// A FIFO or a directory in place of a file is refused at once: opening a FIFO for reading would
// otherwise wait for a writer forever.
func TestLocalRefusesNonRegularFiles(t *testing.T) {
	s, put := storetest.Local(t)
	put("m/f.safetensors", []byte("12345678"))
	info, err := s.Stat(context.Background(), "m/f.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	dir := localDir(t, s)
	os.Remove(filepath.Join(dir, "m/f.safetensors"))
	if err := syscall.Mkfifo(filepath.Join(dir, "m/f.safetensors"), 0o644); err != nil {
		t.Skip("no FIFOs here:", err)
	}
	os.Mkdir(filepath.Join(dir, "m/d.safetensors"), 0o755)
	for _, c := range []struct {
		key, ver string
		want     error
	}{
		{"m/f.safetensors", info.Version, store.ErrChanged},
		{"m/f.safetensors", "", store.ErrNotFound},
		{"m/d.safetensors", "", store.ErrNotFound},
	} {
		done := make(chan error, 1)
		go func() { done <- s.ReadAt(context.Background(), c.key, c.ver, make([]byte, 4), 0) }()
		select {
		case err := <-done:
			if !errors.Is(err, c.want) {
				t.Errorf("ReadAt(%s, version %q): %v, want %v", c.key, c.ver, err, c.want)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("ReadAt(%s) blocked", c.key)
		}
		if _, err := s.Stat(context.Background(), c.key); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Stat(%s): %v, want ErrNotFound", c.key, err)
		}
	}
}

// A rewrite in place of the same size that puts the mtime back is still a new version: ctime.
func TestLocalVersionSeesARewriteThatRestoresMtime(t *testing.T) {
	s, put := storetest.Local(t)
	put("m/f", []byte("aaaaaaaa"))
	p := filepath.Join(localDir(t, s), "m/f")
	fi, _ := os.Stat(p)
	before, _ := s.Stat(context.Background(), "m/f")
	time.Sleep(10 * time.Millisecond) // past a coarse timestamp tick
	f, _ := os.OpenFile(p, os.O_WRONLY, 0)
	f.WriteAt([]byte("bbbbbbbb"), 0)
	f.Close()
	os.Chtimes(p, fi.ModTime(), fi.ModTime())
	after, _ := s.Stat(context.Background(), "m/f")
	if after.Size != before.Size || after.Version == before.Version {
		t.Fatalf("a same-size rewrite with the old mtime kept the version %q", after.Version)
	}
	if err := s.ReadAt(context.Background(), "m/f", before.Version, make([]byte, 8), 0); !errors.Is(
		err,
		store.ErrChanged,
	) {
		t.Errorf("reading the old version: %v, want ErrChanged", err)
	}
}

func TestValidateKeyLengths(t *testing.T) {
	seg := strings.Repeat("a", store.MaxSegmentBytes)
	cases := []struct {
		key string
		ok  bool
	}{
		{seg, true},
		{seg + "a", false},
		{strings.Repeat(seg[:100]+"/", 10) + strings.Repeat("b", 14), true}, // 1024 bytes
		{strings.Repeat(seg[:100]+"/", 10) + strings.Repeat("b", 15), false},
	}
	for _, c := range cases {
		if err := store.ValidateKey(c.key); (err == nil) != c.ok ||
			(err != nil && !errors.Is(err, store.ErrInvalidKey)) {
			t.Errorf("ValidateKey(%d bytes): %v, want ok=%v", len(c.key), err, c.ok)
		}
	}
}

func localDir(t *testing.T, s *store.Local) string {
	name := s.String()
	dir, ok := strings.CutPrefix(name, "local store ")
	if !ok {
		t.Fatalf("cannot find the directory of %q", name)
	}
	return dir
}
