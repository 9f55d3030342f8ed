// Package checkpoint is the catalog: it resolves a checkpoint name to its files
// (model.safetensors.index.json's weight_map, or a single model.safetensors) and their tensors,
// reading only the header bytes of each file, and caches what it read per file version, with what
// is derived from a resolution (its tensor listing, Listing); it also remembers, per file version,
// the bytes reads found corrupt (KnownCorrupt), and whether its store answered the last readiness
// check (Check).
package checkpoint

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unicode/utf8"

	lru "github.com/hashicorp/golang-lru/v2"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/singleflight"

	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// The files that make a folder a checkpoint.
const (
	IndexFile  = "model.safetensors.index.json"
	SingleFile = "model.safetensors"
)

// maxIndexLen bounds the index JSON we read (DeepSeek-V3's is about 9 MB).
const maxIndexLen = 64 << 20

// indexMemoryFactor is the memory an index takes while it is read and decoded, as a multiple of
// its length: the bytes, and the 2.4 times them encoding/json allocates decoding a weight_map
// (measured on a 35 MB index of 400,000 entries).
const indexMemoryFactor = 4

// Reserve holds n bytes of the process's memory budget, waiting for them or failing
// (budget.Budget.Reserve); release gives them back.
type Reserve func(ctx context.Context, n int64) (release func(n int64), err error)

// speculativeRead is the first read of a file: it usually holds the whole header, so a header costs
// one request, at most two.
const speculativeRead = 64 << 10

// ErrNotFound is an unknown checkpoint.
var ErrNotFound = errors.New("unknown checkpoint")

// Error is a checkpoint that cannot be served as it is stored: a malformed index or file, or a
// tensor in two files. It names the file and, where one is at fault, the tensor.
type Error struct{ Msg string }

func (e *Error) Error() string { return e.Msg }

// Tensor is a checkpoint tensor and where its bytes are.
type Tensor struct {
	safetensors.Tensor
	// Key is the store key of the file holding the tensor; Version the file version its header
	// was read at, which every read of its data must match.
	Key     string
	Version string
}

// Checkpoint is a resolved checkpoint. A resolution is immutable: a checkpoint that changes is
// resolved again into a new Checkpoint, so what is derived from one (Names, Listing) is per
// version.
type Checkpoint struct {
	Name    string
	Tensors map[string]*Tensor

	namesOnce   sync.Once
	names       []string
	listingOnce sync.Once
	listing     *Listing
}

// Names returns the tensor names, sorted; the slice is shared and must not be modified.
func (c *Checkpoint) Names() []string {
	c.namesOnce.Do(func() {
		names := make([]string, 0, len(c.Tensors))
		for n := range c.Tensors {
			names = append(names, n)
		}
		sort.Strings(names)
		c.names = names
	})
	return c.names
}

// Catalog resolves checkpoints over a store.
type Catalog struct {
	// Revalidate is how long a resolution is served before the store is asked again whether every
	// file of it, the index and each data file alike, is still the version resolved (zero: on
	// every Open). Data reads carry their file's version, but a cache under the catalog serves the
	// chunks of that version without asking the store: only revalidation catches a data file
	// replaced under the same key.
	Revalidate time.Duration

	store   store.Store
	reserve Reserve // nil: reads are not charged to a budget
	group   singleflight.Group
	headers *lru.Cache[string, *safetensors.Header] // by key + "@" + version
	opened  *lru.Cache[string, *opened]             // by checkpoint name
	corrupt *corruptions
	reach   reachability // what the last Check learned of the store
}

type opened struct {
	rootVersion string // version of the index (or of model.safetensors)
	ckpt        *Checkpoint
	files       map[string]string // every data file's key → the version resolved
	checked     atomic.Int64      // when the store was last asked for every version (Unix nanoseconds)
}

// New returns a catalog over s.
func New(s store.Store) *Catalog {
	headers, _ := lru.New[string, *safetensors.Header](4096)
	ckpts, _ := lru.New[string, *opened](256)
	return &Catalog{store: s, headers: headers, opened: ckpts, corrupt: newCorruptions()}
}

// ChargeTo makes the catalog hold the memory of the metadata it reads (the index) against a
// budget while it reads it.
func (c *Catalog) ChargeTo(r Reserve) { c.reserve = r }

// Open resolves a checkpoint. A cached resolution is served for Revalidate; then a Stat of its
// index (or single file) and of each data file checks that it is current, and one that is not is
// resolved anew. A file replaced between two checks is caught by the version every data read
// carries (ReadFailed drops the stale resolution), unless a cache serves it: then by the next check.
// A check the store cannot answer (an outage: store.Unanswered) leaves the resolution standing.
func (c *Catalog) Open(ctx context.Context, name string) (*Checkpoint, error) {
	if err := store.ValidateKey(name); err != nil {
		return nil, err
	}
	o, cached := c.opened.Get(name)
	if cached && time.Since(time.Unix(0, o.checked.Load())) < c.Revalidate {
		return o.ckpt, nil
	}
	start := time.Now()
	rootKey, rootInfo, indexed, err := c.root(ctx, name)
	if cached && store.Unanswered(ctx, err) {
		return c.stale(o, start), nil
	}
	if err != nil {
		return nil, err
	}
	if cached && o.rootVersion == rootInfo.Version {
		current, err := c.current(ctx, o, rootKey)
		if store.Unanswered(ctx, err) {
			return c.stale(o, start), nil
		}
		if err != nil {
			return nil, err
		}
		if current {
			o.checked.Store(start.UnixNano())
			return o.ckpt, nil
		}
	}
	v, err, _ := c.group.Do(name+"@"+rootInfo.Version, func() (any, error) {
		ckpt, err := c.load(context.WithoutCancel(ctx), name, rootKey, rootInfo, indexed)
		if err != nil {
			return nil, err
		}
		o := &opened{rootVersion: rootInfo.Version, ckpt: ckpt, files: map[string]string{}}
		for _, t := range ckpt.Tensors {
			o.files[t.Key] = t.Version
		}
		o.checked.Store(start.UnixNano())
		c.opened.Add(name, o)
		return ckpt, nil
	})
	if err != nil {
		return nil, err
	}
	return v.(*Checkpoint), nil
}

// stale answers a resolution the store could not be asked about (an outage): the last one it
// confirmed stands until it can say otherwise, so a cache under the catalog serves what it holds
// of that version; reads the cache misses fail as the store fails. The next check is a Revalidate
// away, so an outage costs one failed Stat a checkpoint per Revalidate, not one per request.
func (c *Catalog) stale(o *opened, start time.Time) *Checkpoint {
	o.checked.Store(start.UnixNano())
	return o.ckpt
}

// current reports whether every data file of a resolution is still the version resolved (the
// root, just checked, aside). A file gone is not current: resolving anew says what is missing.
func (c *Catalog) current(ctx context.Context, o *opened, rootKey string) (bool, error) {
	var changed atomic.Bool
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for key, version := range o.files {
		if key == rootKey {
			continue
		}
		g.Go(func() error {
			info, err := c.store.Stat(gctx, key)
			switch {
			case errors.Is(err, store.ErrNotFound):
				changed.Store(true)
			case err != nil:
				return err
			case info.Version != version:
				changed.Store(true)
			}
			return nil
		})
	}
	err := g.Wait()
	return !changed.Load(), err
}

// ReadFailed tells the catalog that reading checkpoint name's data failed with err. When the error
// says a file changed or vanished since the catalog resolved it, the resolution is stale and is
// dropped, so the next request reads the new files; bytes found corrupt are remembered for their
// file version (KnownCorrupt); other failures leave it.
func (c *Catalog) ReadFailed(name string, err error) {
	var corrupt *store.CorruptError
	switch {
	case errors.Is(err, store.ErrChanged) || errors.Is(err, store.ErrNotFound):
		c.opened.Remove(name)
	case errors.As(err, &corrupt):
		c.corrupt.add(corrupt)
	}
}

// KnownCorrupt returns the error an earlier read of key at version met in bytes overlapping the n
// at off, or nil: a retry is answered before it reads, and a new version of the file starts clean.
func (c *Catalog) KnownCorrupt(key, version string, off, n int64) error {
	return c.corrupt.overlapping(key, version, off, n)
}

func (c *Catalog) root(ctx context.Context, name string) (string, store.Info, bool, error) {
	for _, f := range []string{IndexFile, SingleFile} {
		key := name + "/" + f
		info, err := c.store.Stat(ctx, key)
		if err == nil {
			return key, info, f == IndexFile, nil
		}
		if !errors.Is(err, store.ErrNotFound) {
			return "", store.Info{}, false, err
		}
	}
	// A store that cannot be read at all (a missing bucket answers every key with 404) is the
	// problem to report, not the checkpoint.
	if err := c.store.Check(ctx); err != nil {
		return "", store.Info{}, false, err
	}
	return "", store.Info{}, false, fmt.Errorf(
		"%w %q: the folder holds neither %s nor %s",
		ErrNotFound,
		name,
		IndexFile,
		SingleFile,
	)
}

func (c *Catalog) load(
	ctx context.Context,
	name, rootKey string,
	rootInfo store.Info,
	indexed bool,
) (*Checkpoint, error) {
	files := map[string][]string{SingleFile: nil} // file → tensors the index puts there
	versions := map[string]store.Info{name + "/" + SingleFile: rootInfo}
	if indexed {
		var err error
		if files, err = c.readIndex(ctx, rootKey, rootInfo); err != nil {
			return nil, err
		}
		versions = map[string]store.Info{}
	}
	names := make([]string, 0, len(files))
	for f := range files {
		names = append(names, f)
	}
	sort.Strings(names)
	headers := make([]*safetensors.Header, len(names))
	infos := make([]store.Info, len(names))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(16)
	for i, f := range names {
		g.Go(func() error {
			key := name + "/" + f
			info, ok := versions[key]
			if !ok {
				var err error
				if info, err = c.store.Stat(gctx, key); err != nil {
					if errors.Is(err, store.ErrNotFound) {
						return &Error{fmt.Sprintf("%s names %s, which is missing", rootKey, key)}
					}
					return err
				}
			}
			h, err := c.header(gctx, key, info)
			headers[i], infos[i] = h, info
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	ckpt := &Checkpoint{Name: name, Tensors: map[string]*Tensor{}}
	for i, f := range names {
		key := name + "/" + f
		for _, t := range headers[i].Tensors {
			if prev, dup := ckpt.Tensors[t.Name]; dup {
				return nil, &Error{fmt.Sprintf("tensor %q is in two files: %s and %s", t.Name, prev.Key, key)}
			}
			ckpt.Tensors[t.Name] = &Tensor{Tensor: t, Key: key, Version: infos[i].Version}
		}
		for _, want := range files[f] {
			if t, ok := ckpt.Tensors[want]; !ok || t.Key != key {
				return nil, &Error{
					fmt.Sprintf("%s puts tensor %q in %s, whose header does not hold it", rootKey, want, key),
				}
			}
		}
	}
	return ckpt, nil
}

// readIndex returns the files the weight_map names, each with the tensors it puts there.
func (c *Catalog) readIndex(ctx context.Context, key string, info store.Info) (map[string][]string, error) {
	if info.Size > maxIndexLen {
		return nil, &Error{
			fmt.Sprintf("%s is %d bytes, more than the %d this service reads", key, info.Size, maxIndexLen),
		}
	}
	if c.reserve != nil {
		cost := info.Size * indexMemoryFactor
		release, err := c.reserve(ctx, cost)
		if err != nil {
			return nil, err
		}
		defer release(cost)
	}
	buf := make([]byte, info.Size)
	if err := c.store.ReadAt(ctx, key, info.Version, buf, 0); err != nil {
		return nil, err
	}
	if !utf8.Valid(buf) { // encoding/json would read invalid bytes as U+FFFD, and two names as one
		return nil, &Error{fmt.Sprintf("%s is not UTF-8", key)}
	}
	var index struct {
		WeightMap map[string]string `json:"weight_map"`
	}
	if err := json.Unmarshal(buf, &index); err != nil {
		return nil, &Error{fmt.Sprintf("%s is not valid JSON: %v", key, err)}
	}
	if len(index.WeightMap) == 0 {
		return nil, &Error{fmt.Sprintf("%s has no weight_map: it must map tensor names to file names", key)}
	}
	files := map[string][]string{}
	for tensor, file := range index.WeightMap {
		if err := store.ValidateKey(file); err != nil {
			return nil, &Error{
				fmt.Sprintf(
					"%s puts tensor %q in %q, which is not a file name inside the checkpoint",
					key,
					tensor,
					file,
				),
			}
		}
		files[file] = append(files[file], tensor)
	}
	return files, nil
}

// header returns the parsed header of one file version, reading it in at most two reads.
func (c *Catalog) header(ctx context.Context, key string, info store.Info) (*safetensors.Header, error) {
	cacheKey := key + "@" + info.Version
	if h, ok := c.headers.Get(cacheKey); ok {
		return h, nil
	}
	first := make([]byte, min(info.Size, speculativeRead))
	if err := c.store.ReadAt(ctx, key, info.Version, first, 0); err != nil {
		return nil, err
	}
	n, err := safetensors.HeaderLen(key, first, info.Size)
	if err != nil {
		return nil, &Error{err.Error()}
	}
	hdr := first[min(int64(len(first)), safetensors.PrefixLen):min(int64(len(first)), safetensors.PrefixLen+n)]
	if int64(len(hdr)) < n { // n was checked against the file size, so this allocation is bounded by it
		rest := make([]byte, n-int64(len(hdr)))
		if err := c.store.ReadAt(ctx, key, info.Version, rest, int64(len(first))); err != nil {
			return nil, err
		}
		hdr = append(hdr[:len(hdr):len(hdr)], rest...)
	}
	h, err := safetensors.Parse(key, hdr, info.Size)
	if err != nil {
		return nil, &Error{err.Error()}
	}
	c.headers.Add(cacheKey, h)
	return h, nil
}

// List returns the names of the checkpoints in the store: every folder holding an index or a
// single model file.
func (c *Catalog) List(ctx context.Context) ([]string, error) {
	keys, err := c.store.List(ctx, "")
	if err != nil {
		return nil, err
	}
	seen := map[string]bool{}
	var out []string
	for _, k := range keys {
		dir, file := path.Split(k)
		dir = strings.TrimSuffix(dir, "/")
		if dir != "" && (file == IndexFile || file == SingleFile) && !seen[dir] {
			seen[dir] = true
			out = append(out, dir)
		}
	}
	sort.Strings(out)
	return out, nil
}
