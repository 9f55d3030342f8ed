package store

import "context"

// Forwarder is what a decorator embeds: it passes every Store method, and the answers of the
// capabilities Aligner and Splitter, to Next, so a decorator writes only the methods it changes.
// Over a store that is no Aligner it answers 1, over one that is no Splitter false: what a store
// without the capability means.
//
// It does not pass Sectioner on: a section is written out by the store that made it, past every
// decorator above, so a decorator that changes or checks reads (verifying, routing to peers,
// counting) must never offer the sections of the store below, and one that offers them (the
// telemetry store, the cache) says so by implementing Section itself.
//
// Decorators trust the keys they are given: the catalog validates what clients send, the stores
// at the bottom validate what reaches them (ValidateKey), and nothing between checks again.
type Forwarder struct{ Next Store }

var (
	_ Store    = Forwarder{}
	_ Aligner  = Forwarder{}
	_ Splitter = Forwarder{}
)

// Stat implements Store.
func (f Forwarder) Stat(ctx context.Context, key string) (Info, error) { return f.Next.Stat(ctx, key) }

// ReadAt implements Store.
func (f Forwarder) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	return f.Next.ReadAt(ctx, key, version, p, off)
}

// List implements Store.
func (f Forwarder) List(ctx context.Context, prefix string) ([]string, error) {
	return f.Next.List(ctx, prefix)
}

// Check implements Store.
func (f Forwarder) Check(ctx context.Context) error { return f.Next.Check(ctx) }

// String implements Store: a decorator is named by the store it decorates.
func (f Forwarder) String() string { return f.Next.String() }

// Alignment implements Aligner: Next's, or 1.
func (f Forwarder) Alignment(ctx context.Context, key, version string) int64 {
	if a, ok := f.Next.(Aligner); ok {
		return a.Alignment(ctx, key, version)
	}
	return 1
}

// Split implements Splitter: Next's, or false.
func (f Forwarder) Split(key, version string, off int64) bool {
	if s, ok := f.Next.(Splitter); ok {
		return s.Split(key, version, off)
	}
	return false
}
