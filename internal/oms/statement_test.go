package oms

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
)

var goldens = []struct {
	file      string
	method    Method
	shardSize int64
	resources int
}{
	{"sample_model_folder.files.json", MethodFiles, 0, 10},
	{"sample_model_folder.shards8.json", MethodShards, 8, 30},
}

func TestReferencePayloadsParse(t *testing.T) {
	for _, g := range goldens {
		t.Run(string(g.method), func(t *testing.T) {
			m, err := ParseStatement(readFile(t, g.file))
			if err != nil {
				t.Fatal(err)
			}
			if m.Method() != g.method || m.ShardSize() != g.shardSize || m.Name() != "sample_model" {
				t.Errorf("got %s/%d/%q", m.Method(), m.ShardSize(), m.Name())
			}
			want := []string{"d0/f00", "d0/f01", "d0/f02", "d1/f10", "d1/f11", "d1/f12", "f0", "f1", "f2", "f3"}
			if diff := cmp.Diff(want, m.Files()); diff != "" {
				t.Errorf("files (-want +got):\n%s", diff)
			}
			n := 0
			for _, f := range m.Files() {
				n += len(m.Shards(f))
			}
			if n != g.resources {
				t.Errorf("%d resources, want %d", n, g.resources)
			}
			if g.method == MethodShards {
				// "This is file f00 in d0." is 23 bytes: 0:8, 8:16, 16:23.
				if got := m.Shards("d0/f00"); got[2].Start != 16 || got[2].End != 23 {
					t.Errorf("last shard of d0/f00 is [%d, %d)", got[2].Start, got[2].End)
				}
				if size, ok := m.Size("f0"); !ok || size != 24 {
					t.Errorf("Size(f0) = %d, %v", size, ok)
				}
			}
		})
	}
}

// The statement the build functions write over the sample model has exactly the reference's subject
// and resources; the reference's manifest verifies the model file by file.
func TestBuildReproducesReference(t *testing.T) {
	contents := sampleContents()
	contents["model.sig"] = "an old signature"
	contents[".git/HEAD"] = "ref: refs/heads/main\n"
	contents[".gitignore"] = "*.tmp\n"
	model := writeModel(t, contents) // in map order: Build sorts
	for _, g := range goldens {
		t.Run(string(g.method), func(t *testing.T) {
			var m *Manifest
			var err error
			if g.method == MethodShards {
				m, err = BuildShards("sample_model", model, g.shardSize)
			} else {
				m, err = BuildFiles("sample_model", model)
			}
			if err != nil {
				t.Fatal(err)
			}
			golden := readFile(t, g.file)
			st, err := m.statement()
			if err != nil {
				t.Fatal(err)
			}
			if diff := cmp.Diff(subjectAndResourcesOf(t, golden), subjectAndResourcesOf(t, st)); diff != "" {
				t.Errorf("statement (-reference +built):\n%s", diff)
			}
			ref, err := ParseStatement(golden)
			if err != nil {
				t.Fatal(err)
			}
			if ref.SubjectDigest() != m.SubjectDigest() {
				t.Errorf("subject %x, reference %x", m.SubjectDigest(), ref.SubjectDigest())
			}
			if err := verifyModel(ref, model); err != nil {
				t.Errorf("the reference manifest rejects the model: %v", err)
			}
			if diff := cmp.Diff(defaultIgnore, m.IgnorePaths()); diff != "" {
				t.Errorf("ignore_paths (-want +got):\n%s", diff)
			}
		})
	}
}

// mutation changes one thing in a decoded reference statement.
type mutation struct {
	name  string
	field string // the *StatementError's Field, if the change is caught without the model
	apply func(st *statementJSON)
}

// mutations are single changes to a statement: each digest, each name, each range boundary, the
// subject digest, the shard size, and every other member ParseStatement checks.
func mutations(st statementJSON) []mutation {
	res := func(i int) string { return "predicate.resources[" + strconv.Itoa(i) + "]" }
	muts := []mutation{
		{"subject digest", "subject[0].digest.sha256", func(s *statementJSON) {
			s.Subject[0].Digest["sha256"] = flipHex(s.Subject[0].Digest["sha256"], 5)
		}},
		{"subject digest uppercase", "subject[0].digest.sha256", func(s *statementJSON) {
			s.Subject[0].Digest["sha256"] = strings.ToUpper(s.Subject[0].Digest["sha256"])
		}},
		{"two subjects", "subject", func(s *statementJSON) { s.Subject = append(s.Subject, s.Subject[0]) }},
		{"_type", "_type", func(s *statementJSON) { s.Type = "https://in-toto.io/Statement/v0.1" }},
		{"predicateType v0.1", "predicateType", func(s *statementJSON) { s.PredicateType = predicateTypeV01 }},
		{"method", "predicate.serialization.method", func(s *statementJSON) { s.Predicate.Serialization.Method = "file" }},
		{"hash_type", "predicate.serialization.hash_type", func(s *statementJSON) {
			s.Predicate.Serialization.HashType = "blake2"
		}},
		{"no resources", "predicate.resources", func(s *statementJSON) { s.Predicate.Resources = nil }},
		{"last resource dropped", "subject[0].digest.sha256", func(s *statementJSON) {
			s.Predicate.Resources = s.Predicate.Resources[:len(s.Predicate.Resources)-1]
		}},
		{"first two swapped", "", func(s *statementJSON) {
			r := s.Predicate.Resources
			r[0], r[1] = r[1], r[0]
		}},
		{"first repeated", res(1) + ".name", func(s *statementJSON) {
			r := s.Predicate.Resources
			s.Predicate.Resources = append([]resourceJSON{r[0]}, r...)
		}},
	}
	if st.Predicate.Serialization.Method == string(MethodShards) {
		for _, size := range []string{"16", "7", "8.5", `"8"`, "0", "-8", "1e300", "null"} {
			muts = append(muts, mutation{"shard_size " + size, "", func(s *statementJSON) {
				s.Predicate.Serialization.ShardSize = json.RawMessage(size)
			}})
		}
	}
	for i, r := range st.Predicate.Resources {
		muts = append(muts,
			mutation{fmt.Sprintf("digest %d", i), "subject[0].digest.sha256", func(s *statementJSON) {
				s.Predicate.Resources[i].Digest = flipHex(r.Digest, i%64)
			}},
			mutation{fmt.Sprintf("digest %d short", i), res(i) + ".digest", func(s *statementJSON) {
				s.Predicate.Resources[i].Digest = r.Digest[:62]
			}},
			mutation{fmt.Sprintf("algorithm %d", i), res(i) + ".algorithm", func(s *statementJSON) {
				s.Predicate.Resources[i].Algorithm = "sha256-sharded-16"
			}},
			// A renamed file may keep the order and the subject (which binds digests, not names):
			// then only the model shows the change.
			mutation{fmt.Sprintf("name %d", i), "", func(s *statementJSON) {
				path, rest, _ := strings.Cut(r.Name, ":")
				s.Predicate.Resources[i].Name = strings.TrimSuffix(path+"x:"+rest, ":")
			}},
			mutation{fmt.Sprintf("name %d as other file", i), "", func(s *statementJSON) {
				other := st.Predicate.Resources[(i+3)%len(st.Predicate.Resources)].Name
				path, _, _ := strings.Cut(other, ":")
				_, rest, _ := strings.Cut(r.Name, ":")
				s.Predicate.Resources[i].Name = strings.TrimSuffix(path+":"+rest, ":")
			}},
		)
		path, rng, ok := strings.Cut(r.Name, ":")
		if !ok {
			continue
		}
		startEnd := strings.Split(rng, ":")
		for b := range 2 {
			for _, delta := range []int{-1, 1} {
				v, _ := strconv.Atoi(startEnd[b])
				moved := slicesWith(startEnd, b, strconv.Itoa(v+delta))
				muts = append(muts, mutation{fmt.Sprintf("range %d bound %d %+d", i, b, delta), "",
					func(s *statementJSON) { s.Predicate.Resources[i].Name = path + ":" + strings.Join(moved, ":") }})
			}
		}
		muts = append(muts, mutation{fmt.Sprintf("range %d not canonical", i), res(i) + ".name", func(s *statementJSON) {
			s.Predicate.Resources[i].Name = path + ":0" + rng
		}})
	}
	return muts
}

func slicesWith(s []string, i int, v string) []string {
	out := append([]string(nil), s...)
	out[i] = v
	return out
}

// flipHex changes the hex digit at i of a digest to another lowercase hex digit.
func flipHex(s string, i int) string {
	b, _ := hex.DecodeString(s[i&^1 : i&^1+2])
	if i%2 == 0 {
		b[0] ^= 0x10
	} else {
		b[0] ^= 0x01
	}
	return s[:i&^1] + hex.EncodeToString(b) + s[i&^1+2:]
}

// Every single change to a reference statement is rejected: by ParseStatement with a
// *StatementError, or, for renames that keep the structure, by the model not matching.
func TestParseRejectsEachChange(t *testing.T) {
	model := writeModel(t, sampleContents())
	for _, g := range goldens {
		var st statementJSON
		if err := json.Unmarshal(readFile(t, g.file), &st); err != nil {
			t.Fatal(err)
		}
		if m, err := ParseStatement(remarshal(t, st, nil)); err != nil || verifyModel(m, model) != nil {
			t.Fatalf("%s: the unchanged statement is rejected: %v", g.file, err)
		}
		for _, mu := range mutations(st) {
			t.Run(string(g.method)+"/"+mu.name, func(t *testing.T) {
				m, err := ParseStatement(remarshal(t, st, mu.apply))
				if err == nil {
					if mu.field != "" {
						t.Fatalf("accepted; want a *StatementError on %s", mu.field)
					}
					if err := verifyModel(m, model); err == nil {
						t.Fatal("the changed statement is accepted and still matches the model")
					}
					return
				}
				var se *StatementError
				if !errors.As(err, &se) || !errors.Is(err, ErrInvalidStatement) {
					t.Fatalf("error %v is not a *StatementError", err)
				}
				if mu.field != "" && se.Field != mu.field {
					t.Errorf("error on %s, want %s: %v", se.Field, mu.field, err)
				}
			})
		}
	}
}

// remarshal re-encodes a copy of st after apply changes it.
func remarshal(t *testing.T, st statementJSON, apply func(*statementJSON)) []byte {
	t.Helper()
	var cp statementJSON
	b, _ := json.Marshal(st)
	if err := json.Unmarshal(b, &cp); err != nil {
		t.Fatal(err)
	}
	if apply != nil {
		apply(&cp)
	}
	out, err := json.Marshal(cp)
	if err != nil {
		t.Fatal(err)
	}
	return out
}

func TestParseAcceptsHashTypeForms(t *testing.T) {
	golden := string(readFile(t, "sample_model_folder.shards8.json"))
	for _, form := range []string{`"hash_type": "sha256"`, `"hash_type": "sha256-sharded-8"`} {
		p := strings.Replace(golden, `"hash_type": "sha256"`, form, 1)
		if _, err := ParseStatement([]byte(p)); err != nil {
			t.Errorf("%s: %v", form, err)
		}
	}
	// shard_size 8.0 (the reference's float) and 8 are the same.
	p := strings.Replace(golden, `"shard_size": 8.0`, `"shard_size": 8`, 1)
	if _, err := ParseStatement([]byte(p)); err != nil {
		t.Errorf("shard_size 8: %v", err)
	}
}

// OMS sorts paths component by component, not by bytes: the build functions write that order and
// ParseStatement requires it.
func TestOMSPathOrder(t *testing.T) {
	paths := []string{"ab", "a.b", "a/c/d", "a-b", "a/bc", "a/b", "a/b.c", "A", "z", "é"}
	// The order Python's sorted() of PurePosixPath gives, which the reference uses.
	want := []string{"A", "a/b", "a/b.c", "a/bc", "a/c/d", "a-b", "a.b", "ab", "z", "é"}
	var files []FileSource
	for _, p := range paths {
		files = append(files, memSource(p, []byte(p)))
	}
	m, err := BuildFiles("order", files)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(want, m.Files()); diff != "" {
		t.Fatalf("order (-want +got):\n%s", diff)
	}
	st, err := m.statement()
	if err != nil {
		t.Fatal(err)
	}
	if _, err := ParseStatement(st); err != nil {
		t.Fatal(err)
	}
	// The same resources in byte order of the whole path, with the subject digest to match, are out
	// of order.
	var s statementJSON
	if err := json.Unmarshal(st, &s); err != nil {
		t.Fatal(err)
	}
	r := s.Predicate.Resources
	slices.SortFunc(r, func(a, b resourceJSON) int { return strings.Compare(a.Name, b.Name) })
	h := sha256.New()
	for _, x := range r {
		d, _ := hex.DecodeString(x.Digest)
		h.Write(d)
	}
	s.Subject[0].Digest["sha256"] = hex.EncodeToString(h.Sum(nil))
	var se *StatementError
	if _, err := ParseStatement(remarshal(t, s, nil)); !errors.As(err, &se) || !strings.HasSuffix(se.Field, ".name") {
		t.Fatalf("byte order: got %v, want an order error on a name", err)
	}
}

func TestBuildRefusesBadInput(t *testing.T) {
	ok := memSource("a", []byte("x"))
	for _, c := range []struct {
		name  string
		files []FileSource
		shard int64
	}{
		{"rooted path", []FileSource{memSource("/a", nil)}, 8},
		{"dot-dot", []FileSource{memSource("a/../b", nil)}, 8},
		{"empty element", []FileSource{memSource("a//b", nil)}, 8},
		{"model root", []FileSource{memSource(".", nil)}, 8},
		{"twice", []FileSource{ok, ok}, 8},
		{"nothing but ignored", []FileSource{memSource("model.sig", []byte("x"))}, 8},
		{"only empty files", []FileSource{memSource("e", nil)}, 8},
		{"zero shard size", []FileSource{ok}, 0},
		{"short file", []FileSource{{Path: "a", Size: 5, R: strings.NewReader("abc")}}, 2},
	} {
		t.Run(c.name, func(t *testing.T) {
			if _, err := BuildShards("m", c.files, c.shard); err == nil {
				t.Fatal("accepted")
			}
		})
	}
}

// Any statement ParseStatement accepts is written back as an equal one, which it accepts too.
func FuzzParseStatement(f *testing.F) {
	for _, g := range goldens {
		f.Add(readFile(f, g.file))
	}
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := ParseStatement(payload)
		if err != nil {
			if !errors.Is(err, ErrInvalidStatement) {
				t.Fatalf("error %v is not ErrInvalidStatement", err)
			}
			return
		}
		st, err := m.statement()
		if err != nil {
			t.Fatal(err)
		}
		m2, err := ParseStatement(st)
		if err != nil {
			t.Fatalf("the written statement is rejected: %v", err)
		}
		if m2.SubjectDigest() != m.SubjectDigest() || !cmp.Equal(m2.Files(), m.Files()) {
			t.Fatal("the written statement differs")
		}
	})
}

// A random shards manifest survives writing and reading.
func TestStatementRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var files []FileSource
	for i := range 20 {
		data := make([]byte, r.IntN(100))
		for j := range data {
			data[j] = byte(r.Uint32())
		}
		files = append(files, memSource(fmt.Sprintf("dir%d/f%d", i%3, i), data))
	}
	m, err := BuildShards("random", files, 16)
	if err != nil {
		t.Fatal(err)
	}
	st, err := m.statement()
	if err != nil {
		t.Fatal(err)
	}
	m2, err := ParseStatement(st)
	if err != nil {
		t.Fatal(err)
	}
	if diff := cmp.Diff(m, m2, cmp.AllowUnexported(Manifest{}, signedFile{})); diff != "" {
		t.Fatalf("round trip (-built +read):\n%s", diff)
	}
}
