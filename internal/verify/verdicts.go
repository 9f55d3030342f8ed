package verify

import (
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"
)

// verdicts are what the store has found of the file versions it hashed, so that what checked out
// is not hashed again: a files-manifest file that matched whole, or the shards of a file that
// matched one by one. They are keyed by key@version, where the version names the signature too
// (versionSep), so a file rewritten or signed anew starts with none.
//
// Shard verdicts are kept only over stores of files on this host (a store.Sectioner): their
// version changes with every write (size, mtime, ctime, inode), so bytes read later at the same
// version are the bytes that were hashed. An object store's version is whatever the storage
// answers, and the storage is what a signature does not trust: there every read is hashed.
type verdicts struct {
	mu    sync.Mutex // makes finding or adding a file's verdict one step
	files *lru.Cache[string, *fileVerdict]
}

// fileVerdict is one file version's verdict.
type fileVerdict struct {
	mu     sync.Mutex
	whole  bool     // a files manifest's digest matched the whole file
	shards []uint64 // bit i set: shard i matched its signed digest
}

// verdictFiles is how many file versions keep a verdict. A file's shard verdict is a bit a shard:
// a 685 GB checkpoint in 1 MiB shards keeps 85 KB.
const verdictFiles = 16384

func newVerdicts() *verdicts {
	files, _ := lru.New[string, *fileVerdict](verdictFiles)
	return &verdicts{files: files}
}

func verdictID(key, version string) string { return key + "@" + version }

func (v *verdicts) of(id string) *fileVerdict {
	v.mu.Lock()
	defer v.mu.Unlock()
	if f, ok := v.files.Get(id); ok {
		return f
	}
	f := &fileVerdict{}
	v.files.Add(id, f)
	return f
}

// whole reports whether the file version matched whole.
func (v *verdicts) whole(id string) bool {
	f, ok := v.files.Get(id)
	if !ok {
		return false
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.whole
}

func (v *verdicts) markWhole(id string) {
	f := v.of(id)
	f.mu.Lock()
	f.whole = true
	f.mu.Unlock()
}

// unchecked returns the shards in [first, last] not yet found intact, in order.
func (v *verdicts) unchecked(id string, first, last int64) []int64 {
	var out []int64
	f, ok := v.files.Get(id)
	if !ok {
		for i := first; i <= last; i++ {
			out = append(out, i)
		}
		return out
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for i := first; i <= last; i++ {
		if w := i / 64; w >= int64(len(f.shards)) || f.shards[w]&(1<<(i%64)) == 0 {
			out = append(out, i)
		}
	}
	return out
}

// markShards records shards [first, last] as found intact.
func (v *verdicts) markShards(id string, first, last int64) {
	f := v.of(id)
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := last/64 + 1; n > int64(len(f.shards)) {
		f.shards = append(f.shards, make([]uint64, n-int64(len(f.shards)))...)
	}
	for i := first; i <= last; i++ {
		f.shards[i/64] |= 1 << (i % 64)
	}
}
