package oms

import (
	"crypto/sha256"
	"fmt"
	"io"
	"slices"
	"strings"
)

// Method is an OMS serialization method: how a model's bytes are cut into signed resources.
type Method string

const (
	// MethodFiles signs one SHA-256 per file.
	MethodFiles Method = "files"
	// MethodShards signs one SHA-256 per ShardSize-byte range of each file (the last one shorter).
	MethodShards Method = "shards"
)

// UnknownEnd is the End of the one Shard of a file in a files-method manifest: the range runs to the
// end of the file, whose size such a manifest does not record.
const UnknownEnd int64 = -1

// Shard is one signed range [Start, End) of a file and the SHA-256 of its bytes.
type Shard struct {
	Start, End int64
	Digest     [sha256.Size]byte
}

// SignatureFile is where OMS keeps a model's signature: model.sig at the model's root.
const SignatureFile = "model.sig"

// defaultIgnore are the paths, relative to the model root, that the reference implementation leaves
// out of a signature by default: its own signature file and git's files. A directory's whole subtree
// is left out. Sorted.
var defaultIgnore = []string{".git", ".gitattributes", ".github", ".gitignore", SignatureFile}

// DefaultIgnored reports whether OMS leaves path (relative to the model root, '/'-separated) out of a
// signature by default: model.sig, .gitattributes and .gitignore at the root, and everything under
// .git/ and .github/ at the root. Nested ones (sub/.gitignore) are signed, as by the reference.
func DefaultIgnored(path string) bool { return under(path, defaultIgnore) }

// under reports whether path is one of dirs or inside one of them.
func under(path string, dirs []string) bool {
	for _, d := range dirs {
		if path == d || strings.HasPrefix(path, d+"/") {
			return true
		}
	}
	return false
}

// comparePaths orders paths as OMS does: component by component ('/' sorts before any other byte),
// each component by its bytes (the code points of its UTF-8), a path before the paths inside it. So
// "a/b" < "a-b" < "a.b", unlike plain byte order.
func comparePaths(a, b string) int {
	for i := range min(len(a), len(b)) {
		ca, cb := a[i], b[i]
		if ca == cb {
			continue
		}
		if ca == '/' {
			return -1
		}
		if cb == '/' {
			return 1
		}
		return int(ca) - int(cb)
	}
	return len(a) - len(b)
}

type signedFile struct {
	path   string
	shards []Shard
}

// Manifest is what an OMS signature vouches for: a digest per file or per shard of each file. It is
// immutable and safe for concurrent use.
type Manifest struct {
	name          string
	method        Method
	shardSize     int64 // 0 for MethodFiles
	allowSymlinks bool
	ignorePaths   []string // sorted
	files         []signedFile
	index         map[string]int
	subject       [sha256.Size]byte
}

// newManifest indexes files, which are in OMS order, and computes the subject digest: the SHA-256 of
// all resource digests concatenated in that order.
func newManifest(name string, method Method, shardSize int64, allowSymlinks bool, ignore []string,
	files []signedFile) *Manifest {
	m := &Manifest{
		name: name, method: method, shardSize: shardSize, allowSymlinks: allowSymlinks,
		ignorePaths: ignore, files: files, index: make(map[string]int, len(files)),
	}
	h := sha256.New()
	for i, f := range files {
		m.index[f.path] = i
		for _, s := range f.shards {
			h.Write(s.Digest[:])
		}
	}
	h.Sum(m.subject[:0])
	return m
}

// Name is the model's name as signed (the subject's name); OMS treats it as informative only.
func (m *Manifest) Name() string { return m.name }

// Method is the serialization method.
func (m *Manifest) Method() Method { return m.method }

// ShardSize is the size of every shard but a file's last in a shards manifest; 0 in a files one.
func (m *Manifest) ShardSize() int64 { return m.shardSize }

// SubjectDigest is the statement's subject digest: it identifies the signed content as a whole.
func (m *Manifest) SubjectDigest() [sha256.Size]byte { return m.subject }

// IgnorePaths are the paths the signer left out (the statement's ignore_paths, sorted), if it says.
func (m *Manifest) IgnorePaths() []string { return slices.Clone(m.ignorePaths) }

// Ignored reports whether path is left out of the signature: DefaultIgnored, or under IgnorePaths.
// Verifying a whole model means every file not Ignored is covered and matches.
func (m *Manifest) Ignored(path string) bool {
	return DefaultIgnored(path) || under(path, m.ignorePaths)
}

// Files lists the covered files, relative to the model root, '/'-separated, in OMS order.
func (m *Manifest) Files() []string {
	out := make([]string, len(m.files))
	for i, f := range m.files {
		out[i] = f.path
	}
	return out
}

// Covers reports whether the manifest has digests for file. A shards manifest does not cover an empty
// file: OMS signs no shard of it.
func (m *Manifest) Covers(file string) bool {
	_, ok := m.index[file]
	return ok
}

// Shards returns file's signed ranges in offset order (nil if not covered): contiguous from 0 in a
// shards manifest; one range with End UnknownEnd in a files one.
func (m *Manifest) Shards(file string) []Shard {
	i, ok := m.index[file]
	if !ok {
		return nil
	}
	return slices.Clone(m.files[i].shards)
}

// Size returns file's signed size; ok is false if the file is not covered or the manifest is a files
// one, which records no sizes.
func (m *Manifest) Size(file string) (size int64, ok bool) {
	i, ok := m.index[file]
	if !ok || m.method != MethodShards {
		return 0, false
	}
	s := m.files[i].shards
	return s[len(s)-1].End, true
}

// lookup returns file's shards, or ErrNotCovered.
func (m *Manifest) lookup(file string) ([]Shard, error) {
	i, ok := m.index[file]
	if !ok {
		return nil, fmt.Errorf("%w: %s", ErrNotCovered, file)
	}
	return m.files[i].shards, nil
}

// CheckSize checks, before any byte is read, that file has the size it was signed at: nil, a
// *SizeError, ErrNotCovered, or ErrRange for a negative size. A files manifest records no sizes, so
// any size passes there.
func (m *Manifest) CheckSize(file string, size int64) error {
	if _, err := m.lookup(file); err != nil {
		return err
	}
	if size < 0 {
		return fmt.Errorf("%w: %s has negative size %d", ErrRange, file, size)
	}
	if signed, ok := m.Size(file); ok && size != signed {
		return &SizeError{File: file, Size: size, Signed: signed}
	}
	return nil
}

// Align widens the read [off, off+n) of file to whole signed shards: the smallest [off2, off2+n2)
// that contains it and starts and ends on shard boundaries, the last of which is the file's signed
// end. n == 0 gives (off rounded down to a boundary, 0). Errors: ErrNotCovered, ErrNotSharded, ErrRange
// if the read is negative or runs past the signed end.
func (m *Manifest) Align(file string, off, n int64) (off2, n2 int64, err error) {
	if _, err := m.lookup(file); err != nil {
		return 0, 0, err
	}
	size, ok := m.Size(file)
	if !ok {
		return 0, 0, fmt.Errorf("%w: %s", ErrNotSharded, file)
	}
	if off < 0 || n < 0 || off > size || n > size-off {
		return 0, 0, fmt.Errorf("%w: [%d, +%d) of %s, signed at %d bytes", ErrRange, off, n, file, size)
	}
	s := m.shardSize
	off2 = off - off%s
	if n == 0 {
		return off2, 0, nil
	}
	last := (off + n - 1) / s * s // start of the shard holding the last byte
	end := size
	if size-last > s {
		end = last + s
	}
	return off2, end - off2, nil
}

// Check verifies data as the bytes of file at off: data must cover whole shards, starting on a shard
// boundary and ending on one or at the file's signed end (as Align returns). Each shard is hashed and
// compared, several shards on a few goroutines. In a files manifest data must be the whole file
// (off 0). Errors: *MismatchError for the first shard that differs, ErrNotCovered, ErrRange.
func (m *Manifest) Check(file string, off int64, data []byte) error {
	shards, err := m.lookup(file)
	if err != nil {
		return err
	}
	n := int64(len(data))
	if m.method == MethodFiles {
		if off != 0 {
			return fmt.Errorf("%w: %s is signed whole; got bytes from %d", ErrRange, file, off)
		}
		return compare(file, m.sized(shards, n), [][sha256.Size]byte{sha256.Sum256(data)})
	}
	size := shards[len(shards)-1].End
	s := m.shardSize
	boundary := func(x int64) bool { return x%s == 0 || x == size }
	if off < 0 || off > size || n > size-off || !boundary(off) || !boundary(off+n) {
		return fmt.Errorf("%w: [%d, %d) of %s is not whole %d-byte shards of its %d bytes",
			ErrRange, off, off+n, file, s, size)
	}
	span := shards[(off+s-1)/s : (off+n+s-1)/s] // boundaries: shard i starts at i*s, the last ends at size
	sums := make([][sha256.Size]byte, len(span))
	// Hashing in memory fails only by mismatch, which compare reports: fn never errs.
	_ = forEach(len(span), func(_, i int) error {
		sums[i] = sha256.Sum256(data[span[i].Start-off : span[i].End-off])
		return nil
	})
	return compare(file, span, sums)
}

// CheckFile verifies all of file, read from r, size bytes long: its size (in a shards manifest) and
// every shard, hashed on a few goroutines. Errors: *SizeError, *MismatchError for the first shard
// that differs, ErrNotCovered, or r's error. Wrap r to count its reads for progress.
func (m *Manifest) CheckFile(file string, r io.ReaderAt, size int64) error {
	if err := m.CheckSize(file, size); err != nil {
		return err
	}
	shards, _ := m.lookup(file)
	shards = m.sized(shards, size)
	jobs := make([]span, len(shards))
	for i, s := range shards {
		jobs[i] = span{path: file, r: r, start: s.Start, end: s.End}
	}
	sums, err := hashSpans(jobs)
	if err != nil {
		return err
	}
	return compare(file, shards, sums)
}

// sized returns a file's shards with its size as the end of the last: in a files manifest, whose one
// shard has End UnknownEnd, the file's size as read; in a shards manifest, the shards themselves.
func (m *Manifest) sized(shards []Shard, size int64) []Shard {
	if m.method == MethodFiles {
		return []Shard{{End: size, Digest: shards[0].Digest}}
	}
	return shards
}

// compare returns a *MismatchError for the first of shards whose digest is not in sums.
func compare(file string, shards []Shard, sums [][sha256.Size]byte) error {
	for i, s := range shards {
		if sums[i] != s.Digest {
			return &MismatchError{File: file, Start: s.Start, End: s.End}
		}
	}
	return nil
}
