package storetest

import (
	"context"
	"sync/atomic"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Counting wraps a store and counts the data it reads: for tests that check how many bytes and
// requests reach storage, exactly.
type Counting struct {
	store.Forwarder
	reads, bytes atomic.Int64
}

// NewCounting counts the reads of s.
func NewCounting(s store.Store) *Counting { return &Counting{Forwarder: store.Forwarder{Next: s}} }

// ReadAt implements store.Store.
func (c *Counting) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	c.reads.Add(1)
	c.bytes.Add(int64(len(p)))
	return c.Next.ReadAt(ctx, key, version, p, off)
}

// Reads is how many ReadAt calls reached the store.
func (c *Counting) Reads() int64 { return c.reads.Load() }

// Bytes is how many bytes those calls asked for.
func (c *Counting) Bytes() int64 { return c.bytes.Load() }

// Reset zeroes the counters.
func (c *Counting) Reset() { c.reads.Store(0); c.bytes.Store(0) }
