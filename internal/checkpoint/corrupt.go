package checkpoint

import (
	"fmt"
	"slices"
	"sync"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/shardsrv/shardsrv/internal/store"
)

// corruptions are the byte ranges reads found corrupt, by file version (key@version). Stored bytes
// that fail their signature fail again on every read until the file is replaced, and a replaced
// file has a new version, so a verdict never needs clearing: it ages out of the LRU.
type corruptions struct {
	mu    sync.Mutex // makes adding a range to a version's list one step
	files *lru.Cache[string, []*store.CorruptError]
}

// corruptFiles is how many file versions keep their corrupt ranges; corruptRanges bounds each.
const (
	corruptFiles  = 1024
	corruptRanges = 64
)

func newCorruptions() *corruptions {
	files, _ := lru.New[string, []*store.CorruptError](corruptFiles)
	return &corruptions{files: files}
}

func (c *corruptions) add(e *store.CorruptError) {
	if e.Version == "" {
		return // a read at no version names no version to remember it for
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	id := e.Key + "@" + e.Version
	found, _ := c.files.Get(id)
	if len(found) == corruptRanges || slices.ContainsFunc(found, func(f *store.CorruptError) bool {
		return f.Offset == e.Offset && f.Length == e.Length
	}) {
		return
	}
	c.files.Add(id, append(slices.Clip(found), e)) // a copy: readers hold the old list unlocked
}

func (c *corruptions) overlapping(key, version string, off, n int64) error {
	if c.files.Len() == 0 {
		return nil
	}
	found, _ := c.files.Get(key + "@" + version)
	for _, f := range found {
		if off < f.Offset+f.Length && f.Offset < off+n {
			return fmt.Errorf("%w (bytes [%d, +%d) of this version failed an earlier read)", f, f.Offset, f.Length)
		}
	}
	return nil
}
