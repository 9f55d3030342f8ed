package checkpoint

import (
	"encoding/json"
	"sort"
	"strings"
	"sync"

	"github.com/shardsrv/shardsrv/api"
)

// listingChunkLen is how many entries of a listing are encoded at once, on first use.
const listingChunkLen = 1024

// Listing is the JSON of a checkpoint's tensors (api.TensorInfo) in name order, the entries of
// GET /v1/tensors: encoded a chunk at a time on first use and kept with the resolution (one per
// checkpoint version), so paging through a large checkpoint encodes each entry once.
type Listing struct {
	ck     *Checkpoint
	names  []string
	chunks []listingChunk
}

type listingChunk struct {
	once sync.Once
	json []byte
	ends []int // entry j of the chunk is json[ends[j-1]:ends[j]]
}

// Listing returns the checkpoint's listing, built once for this resolution.
func (c *Checkpoint) Listing() *Listing {
	c.listingOnce.Do(func() {
		names := c.Names()
		c.listing = &Listing{ck: c, names: names,
			chunks: make([]listingChunk, (len(names)+listingChunkLen-1)/listingChunkLen)}
	})
	return c.listing
}

// Len is the number of entries.
func (l *Listing) Len() int { return len(l.names) }

// Name is the name of entry i.
func (l *Listing) Name(i int) string { return l.names[i] }

// After is the index of the first entry whose name sorts after name.
func (l *Listing) After(name string) int {
	i := sort.SearchStrings(l.names, name)
	if i < len(l.names) && l.names[i] == name {
		i++
	}
	return i
}

// Entry is the JSON of entry i; the bytes are shared and must not be modified.
func (l *Listing) Entry(i int) []byte {
	c := &l.chunks[i/listingChunkLen]
	c.once.Do(func() {
		lo := i / listingChunkLen * listingChunkLen
		for _, name := range l.names[lo:min(lo+listingChunkLen, len(l.names))] {
			t := l.ck.Tensors[name]
			b, _ := json.Marshal(api.TensorInfo{
				Name: name, Dtype: t.DTypeName, Shape: t.Shape, File: strings.TrimPrefix(t.Key, l.ck.Name+"/"),
			})
			c.json = append(c.json, b...)
			c.ends = append(c.ends, len(c.json))
		}
	})
	j := i % listingChunkLen
	from := 0
	if j > 0 {
		from = c.ends[j-1]
	}
	return c.json[from:c.ends[j]]
}
