package oms

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"io"
	"math/rand/v2"
	"testing"
)

const testShard = 4096

// randomFile returns 10 whole shards and a short one of random bytes.
func randomFile() []byte {
	r := rand.New(rand.NewPCG(3, 4))
	data := make([]byte, 10*testShard+123)
	for i := range data {
		data[i] = byte(r.Uint32())
	}
	return data
}

func buildRandom(t *testing.T, method Method, data []byte) *Manifest {
	t.Helper()
	files := []FileSource{memSource("model.safetensors", data), memSource("config.json", []byte("{}"))}
	var m *Manifest
	var err error
	if method == MethodShards {
		m, err = BuildShards("m", files, testShard)
	} else {
		m, err = BuildFiles("m", files)
	}
	if err != nil {
		t.Fatal(err)
	}
	return m
}

func TestCheckShards(t *testing.T) {
	data := randomFile()
	size := int64(len(data))
	m := buildRandom(t, MethodShards, data)
	const f = "model.safetensors"
	for _, w := range [][2]int64{{0, size}, {0, testShard}, {3 * testShard, 4 * testShard}, {10 * testShard, size},
		{9 * testShard, size}, {size, size}} {
		if err := m.Check(f, w[0], data[w[0]:w[1]]); err != nil {
			t.Errorf("[%d, %d): %v", w[0], w[1], err)
		}
	}
	// One flipped bit, anywhere, is caught and located.
	for _, pos := range []int64{0, testShard*5 + 17, size - 1} {
		bad := bytes.Clone(data)
		bad[pos] ^= 1 << (pos % 8)
		var me *MismatchError
		err := m.Check(f, 0, bad)
		if !errors.As(err, &me) || !errors.Is(err, ErrMismatch) {
			t.Fatalf("byte %d: %v", pos, err)
		}
		start := pos / testShard * testShard
		if me.File != f || me.Start != start || me.End != min(start+testShard, size) {
			t.Errorf("byte %d: mismatch %+v", pos, me)
		}
	}
	for _, w := range [][2]int64{{1, testShard}, {0, testShard - 1}, {testShard, size + 1}, {-testShard, 0}} {
		if err := m.Check(f, w[0], make([]byte, max(0, w[1]-w[0]))); !errors.Is(err, ErrRange) {
			t.Errorf("[%d, %d): %v, want ErrRange", w[0], w[1], err)
		}
	}
	if err := m.Check("other", 0, nil); !errors.Is(err, ErrNotCovered) {
		t.Errorf("uncovered file: %v", err)
	}
	if m.Covers("other") || !m.Covers(f) || m.Shards("other") != nil {
		t.Error("Covers")
	}
}

func TestCheckFiles(t *testing.T) {
	data := randomFile()
	m := buildRandom(t, MethodFiles, data)
	const f = "model.safetensors"
	if err := m.Check(f, 0, data); err != nil {
		t.Fatal(err)
	}
	bad := bytes.Clone(data)
	bad[len(bad)/2] ^= 0x80
	var me *MismatchError
	if err := m.Check(f, 0, bad); !errors.As(err, &me) || me.Start != 0 || me.End != int64(len(data)) {
		t.Errorf("flipped bit: %v", err)
	}
	if err := m.Check(f, 0, data[:len(data)-1]); !errors.Is(err, ErrMismatch) {
		t.Errorf("truncated: %v", err)
	}
	if err := m.Check(f, testShard, data[testShard:]); !errors.Is(err, ErrRange) {
		t.Errorf("a range of a whole-file digest: %v", err)
	}
	if _, _, err := m.Align(f, 0, 1); !errors.Is(err, ErrNotSharded) {
		t.Errorf("Align: %v", err)
	}
	if _, ok := m.Size(f); ok {
		t.Error("a files manifest has sizes")
	}
	if s := m.Shards(f); len(s) != 1 || s[0].End != UnknownEnd || s[0].Digest != sha256.Sum256(data) {
		t.Errorf("Shards = %+v", s)
	}
}

// failingReader fails every read at or after off.
type failingReader struct {
	r   io.ReaderAt
	off int64
}

var errDisk = errors.New("disk on fire")

func (f failingReader) ReadAt(p []byte, off int64) (int, error) {
	if off+int64(len(p)) > f.off {
		return 0, errDisk
	}
	return f.r.ReadAt(p, off)
}

func TestCheckFile(t *testing.T) {
	data := randomFile()
	size := int64(len(data))
	const f = "model.safetensors"
	for _, method := range []Method{MethodShards, MethodFiles} {
		t.Run(string(method), func(t *testing.T) {
			m := buildRandom(t, method, data)
			if err := m.CheckFile(f, bytes.NewReader(data), size); err != nil {
				t.Fatal(err)
			}
			bad := bytes.Clone(data)
			bad[7*testShard+5] ^= 4
			var me *MismatchError
			err := m.CheckFile(f, bytes.NewReader(bad), size)
			if !errors.As(err, &me) {
				t.Fatalf("flipped bit: %v", err)
			}
			if method == MethodShards && (me.Start != 7*testShard || me.End != 8*testShard) {
				t.Errorf("mismatch %+v", me)
			}
			var se *SizeError
			err = m.CheckFile(f, bytes.NewReader(data[:size-1]), size-1)
			if method == MethodShards && (!errors.As(err, &se) || se.Size != size-1 || se.Signed != size) {
				t.Errorf("truncated: %v", err)
			}
			if !errors.Is(err, ErrMismatch) {
				t.Errorf("truncated: %v is not ErrMismatch", err)
			}
			if err := m.CheckFile(f, failingReader{bytes.NewReader(data), 5 * testShard}, size); !errors.Is(err, errDisk) {
				t.Errorf("read error: %v", err)
			}
			if err := m.CheckFile(f, bytes.NewReader(data), -1); !errors.Is(err, ErrRange) {
				t.Errorf("negative size: %v", err)
			}
		})
	}
}

func TestDefaultIgnored(t *testing.T) {
	for p, want := range map[string]bool{
		"model.sig": true, ".git": true, ".git/config": true, ".github/workflows/x.yml": true,
		".gitignore": true, ".gitattributes": true,
		"sub/model.sig": false, "sub/.gitignore": false, ".gitfoo": false, "model.sig.bak": false,
		"model.safetensors": false,
	} {
		if got := DefaultIgnored(p); got != want {
			t.Errorf("DefaultIgnored(%q) = %v", p, got)
		}
	}
}

// syntheticManifest is a shards manifest of one file, "f", with zero digests.
func syntheticManifest(size, shard int64) *Manifest {
	var shards []Shard
	for start := int64(0); start < size; start += shard {
		shards = append(shards, Shard{Start: start, End: min(start+shard, size)})
	}
	return newManifest("", MethodShards, shard, false, nil, []signedFile{{path: "f", shards: shards}})
}

// Align returns the smallest whole-shard window that holds the read, inside the file (for an empty
// read, an empty window at the boundary below it); and Check takes that window.
func FuzzAlign(f *testing.F) {
	f.Add(int64(100), int64(8), int64(3), int64(10))
	f.Add(int64(24), int64(8), int64(16), int64(8))
	f.Add(int64(1), int64(1<<20), int64(0), int64(1))
	f.Add(int64(64), int64(8), int64(64), int64(0))
	f.Add(int64(64), int64(8), int64(60), int64(5))
	f.Add(int64(64), int64(46), int64(64), int64(0))
	f.Fuzz(func(t *testing.T, size, shard, off, n int64) {
		if shard <= 0 || size <= 0 || size > maxSize || shard > maxSize || size/shard > 4096 {
			return
		}
		m := syntheticManifest(size, shard)
		off2, n2, err := m.Align("f", off, n)
		if off < 0 || n < 0 || off > size || n > size-off {
			if !errors.Is(err, ErrRange) {
				t.Fatalf("Align(%d, %d) of %d: %v, want ErrRange", off, n, size, err)
			}
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		end2 := off2 + n2
		switch {
		case off2%shard != 0 || (end2 != size && end2%shard != 0):
			t.Fatalf("[%d, %d) is not aligned to %d", off2, end2, shard)
		case off2 > off || (n > 0 && end2 < off+n):
			t.Fatalf("[%d, %d) does not hold [%d, %d)", off2, end2, off, off+n)
		case off2 < 0 || end2 > size:
			t.Fatalf("[%d, %d) is outside [0, %d)", off2, end2, size)
		case off-off2 >= shard || (n > 0 && end2-(off+n) >= shard) || (n == 0 && n2 != 0):
			t.Fatalf("[%d, %d) is not the smallest window for [%d, %d)", off2, end2, off, off+n)
		}
		// Check takes the window: it hashes it, and finds the zero digests wrong.
		if err := m.Check("f", off2, make([]byte, n2)); n2 > 0 && !errors.Is(err, ErrMismatch) {
			t.Fatalf("Check of the window: %v", err)
		}
	})
}

// BenchmarkCheck measures verifying an 8 MiB cache chunk of 1 MiB shards.
func BenchmarkCheck(b *testing.B) {
	data := make([]byte, 8<<20)
	m, err := BuildShards("bench", []FileSource{memSource("f", data)}, 1<<20)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		if err := m.Check("f", 0, data); err != nil {
			b.Fatal(err)
		}
	}
}
