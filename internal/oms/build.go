package oms

import (
	"crypto/sha256"
	"fmt"
	"io"
	"io/fs"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
)

// maxSize bounds file sizes and shard sizes: 2^53 bytes (8 PiB), the largest integer a JSON number
// holds exactly, so no offset arithmetic here overflows.
const maxSize int64 = 1 << 53

// maxWorkers bounds the goroutines hashing one manifest, file or buffer (and GOMAXPROCS does too).
const maxWorkers = 8

// readChunk is the most a hashing goroutine reads at once.
const readChunk = 1 << 20

// FileSource is one file of a model to hash: its path relative to the model root ('/'-separated) and
// its Size bytes, read from R.
type FileSource struct {
	Path string
	Size int64
	R    io.ReaderAt
}

// BuildShards hashes files into a shards manifest as the reference implementation does: each file
// cut into shardSize-byte shards from offset 0 (the last one shorter; an empty file has none and so
// is not covered), in OMS order, on a few goroutines. Files DefaultIgnored are skipped, and recorded
// as the manifest's IgnorePaths. name is the model's name (the reference uses its directory's).
func BuildShards(name string, files []FileSource, shardSize int64) (*Manifest, error) {
	if shardSize <= 0 || shardSize > maxSize {
		return nil, fmt.Errorf("oms: shard size %d is not in [1, 2^53]", shardSize)
	}
	return build(name, files, MethodShards, shardSize)
}

// BuildFiles hashes files into a files manifest: one SHA-256 per file, as BuildShards does otherwise.
func BuildFiles(name string, files []FileSource) (*Manifest, error) {
	return build(name, files, MethodFiles, 0)
}

func build(name string, sources []FileSource, method Method, shardSize int64) (*Manifest, error) {
	var kept []FileSource
	for _, f := range sources {
		if !validPath(f.Path) {
			return nil, fmt.Errorf("oms: %q is not a relative '/'-separated path without . or .. parts", f.Path)
		}
		if f.Size < 0 || f.Size > maxSize {
			return nil, fmt.Errorf("oms: %s: size %d is not in [0, 2^53]", f.Path, f.Size)
		}
		if !DefaultIgnored(f.Path) && (method == MethodFiles || f.Size > 0) {
			kept = append(kept, f)
		}
	}
	if len(kept) == 0 {
		return nil, fmt.Errorf("oms: no file to sign")
	}
	slices.SortFunc(kept, func(a, b FileSource) int { return comparePaths(a.Path, b.Path) })
	var jobs []span
	for i, f := range kept {
		if i > 0 && f.Path == kept[i-1].Path {
			return nil, fmt.Errorf("oms: %s is listed twice", f.Path)
		}
		if method == MethodFiles {
			jobs = append(jobs, span{path: f.Path, r: f.R, start: 0, end: f.Size})
			continue
		}
		for start := int64(0); start < f.Size; start += shardSize {
			jobs = append(jobs, span{path: f.Path, r: f.R, start: start, end: min(start+shardSize, f.Size)})
		}
	}
	sums, err := hashSpans(jobs)
	if err != nil {
		return nil, err
	}
	files := make([]signedFile, 0, len(kept))
	for i, j := range jobs {
		if len(files) == 0 || files[len(files)-1].path != j.path {
			files = append(files, signedFile{path: j.path})
		}
		end := j.end
		if method == MethodFiles {
			end = UnknownEnd
		}
		f := &files[len(files)-1]
		f.shards = append(f.shards, Shard{Start: j.start, End: end, Digest: sums[i]})
	}
	return newManifest(name, method, shardSize, false, slices.Clone(defaultIgnore), files), nil
}

// validPath reports whether p names a file inside a model: unrooted, '/'-separated, no empty, . or ..
// element, no NUL (which would break comparePaths' order), and not the model root itself.
func validPath(p string) bool {
	return p != "." && fs.ValidPath(p) && strings.IndexByte(p, 0) < 0
}

// span is a range [start, end) of the file path, read from r.
type span struct {
	path       string
	r          io.ReaderAt
	start, end int64
}

// hashSpans returns the SHA-256 of each span, hashed on a few goroutines, each reading readChunk
// bytes at a time. A short read is io.ErrUnexpectedEOF.
func hashSpans(jobs []span) ([][sha256.Size]byte, error) {
	sums := make([][sha256.Size]byte, len(jobs))
	var bufs [maxWorkers][]byte
	err := forEach(len(jobs), func(w, i int) error {
		j := jobs[i]
		if bufs[w] == nil {
			bufs[w] = make([]byte, readChunk)
		}
		h := sha256.New()
		for off := j.start; off < j.end; {
			b := bufs[w][:min(readChunk, j.end-off)]
			n, err := j.r.ReadAt(b, off)
			if n < len(b) {
				if err == nil || err == io.EOF {
					err = io.ErrUnexpectedEOF
				}
				return fmt.Errorf("oms: reading %s at %d: %w", j.path, off+int64(n), err)
			}
			h.Write(b)
			off += int64(n)
		}
		h.Sum(sums[i][:0])
		return nil
	})
	return sums, err
}

// forEach calls fn(w, i) for every i in [0, n) on up to maxWorkers goroutines (and GOMAXPROCS); w,
// below maxWorkers, names the goroutine, for fn to keep a buffer per goroutine. Once a call fails no
// new one starts, and the error of the lowest failing i is returned.
func forEach(n int, fn func(w, i int) error) error {
	errs := make([]error, n)
	var next atomic.Int64
	var failed atomic.Bool
	var wg sync.WaitGroup
	for w := range min(n, maxWorkers, runtime.GOMAXPROCS(0)) {
		wg.Go(func() {
			for !failed.Load() {
				i := int(next.Add(1) - 1)
				if i >= n {
					return
				}
				if errs[i] = fn(w, i); errs[i] != nil {
					failed.Store(true)
				}
			}
		})
	}
	wg.Wait()
	for _, err := range errs {
		if err != nil {
			return err
		}
	}
	return nil
}
