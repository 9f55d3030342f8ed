package oms

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/ed25519"
	"crypto/elliptic"
	"crypto/rand"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"testing"
)

// sampleContents is the reference's sample model (testdata/README.md): ten small text files.
func sampleContents() map[string]string {
	files := map[string]string{}
	for i := range 2 {
		for j := range 3 {
			files[fmt.Sprintf("d%d/f%d%d", i, i, j)] = fmt.Sprintf("This is file f%d%d in d%d.", i, j, i)
		}
	}
	for i := range 4 {
		files[fmt.Sprintf("f%d", i)] = fmt.Sprintf("This is file f%d in root.", i)
	}
	return files
}

// writeModel writes files under a new directory and returns them as sources, read from disk.
func writeModel(t *testing.T, files map[string]string) []FileSource {
	t.Helper()
	dir := t.TempDir()
	var out []FileSource
	for p, content := range files {
		full := filepath.Join(dir, filepath.FromSlash(p))
		if err := os.MkdirAll(filepath.Dir(full), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(full, []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
		f, err := os.Open(full)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { f.Close() })
		out = append(out, FileSource{Path: p, Size: int64(len(content)), R: f})
	}
	return out
}

// memSource is a file held in memory.
func memSource(path string, data []byte) FileSource {
	return FileSource{Path: path, Size: int64(len(data)), R: bytes.NewReader(data)}
}

func readFile(t testing.TB, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// verifyModel checks a whole model against m, as `shardsrv verify` would: the files not Ignored are
// exactly the covered ones, and each matches.
func verifyModel(m *Manifest, model []FileSource) error {
	var paths []string
	for _, f := range model {
		if !m.Ignored(f.Path) {
			paths = append(paths, f.Path)
		}
	}
	slices.SortFunc(paths, comparePaths)
	if got := m.Files(); !slices.Equal(got, paths) {
		return fmt.Errorf("manifest covers %q, model has %q", got, paths)
	}
	for _, f := range model {
		if m.Ignored(f.Path) {
			continue
		}
		if err := m.CheckFile(f.Path, f.R, f.Size); err != nil {
			return err
		}
	}
	return nil
}

// subjectAndResources is what a manifest writer must reproduce of a statement.
type subjectAndResources struct {
	Subject   []subjectJSON
	Resources []resourceJSON
}

func subjectAndResourcesOf(t *testing.T, statement []byte) subjectAndResources {
	t.Helper()
	var st statementJSON
	if err := json.Unmarshal(statement, &st); err != nil {
		t.Fatal(err)
	}
	return subjectAndResources{st.Subject, st.Predicate.Resources}
}

// testKeys are one signing key of each supported kind.
func testKeys(t testing.TB) map[string]crypto.Signer {
	t.Helper()
	keys := map[string]crypto.Signer{}
	for name, c := range map[string]elliptic.Curve{"P-256": elliptic.P256(), "P-384": elliptic.P384(),
		"P-521": elliptic.P521()} {
		k, err := ecdsa.GenerateKey(c, rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		keys[name] = k
	}
	_, ed, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	keys["Ed25519"] = ed
	return keys
}

// sampleManifest builds the sample model's shards manifest (shard size 8).
func sampleManifest(t testing.TB) *Manifest {
	t.Helper()
	var files []FileSource
	for p, c := range sampleContents() {
		files = append(files, memSource(p, []byte(c)))
	}
	m, err := BuildShards("sample_model", files, 8)
	if err != nil {
		t.Fatal(err)
	}
	return m
}
