// Package budget is the process's memory budget (--memory-bytes): every part that holds memory for
// a request — its body, its plan, a /v1/plan report, a stream's buffers, an index being decoded, a
// signature being checked — takes the bytes from the budget before it holds them and gives them
// back after, so that together they stay under one bound. A part that bounds its own memory (the
// chunk cache) takes a share of it up front; the rest is shared.
//
// A reservation that finds the budget spent waits at most AdmitWait, then fails with ErrBusy (a 503
// with Retry-After): a request is refused before it is begun rather than the heap grown past the
// bound. Acquire waits as long as its context lasts: a stream already under way waits for memory
// (backpressure) rather than failing half-way.
//
// The budget also sets what its configuration implies for the Go runtime: the heap's soft limit
// (SetGoMemoryLimit).
package budget

import (
	"context"
	"errors"
	"flag"
	"os"
	"runtime/debug"
	"sync/atomic"
	"time"

	"golang.org/x/sync/semaphore"

	"github.com/shardsrv/shardsrv/internal/bytesize"
)

// ErrBusy is a reservation refused because the budget is spent: come back later.
var ErrBusy = errors.New("the server's memory budget for streams is spent")

// Config sizes the budget. A field left at zero takes its default, but for the two whose zero is
// itself a setting, which say so (docs/configuration.md).
type Config struct {
	// Bytes is the whole process's budget, the cache's share included (zero: DefaultBytes).
	Bytes int64
	// CacheBytes is set aside up front for the chunk cache, which keeps its memory within it;
	// reservations share the rest (zero: no share, there is no cache). serve sets it from
	// --cache-bytes.
	CacheBytes int64
	// AdmitWait is how long a reservation may wait for memory before it is refused (ErrBusy);
	// zero: not at all (the flag's default is DefaultAdmitWait).
	AdmitWait time.Duration
}

// The defaults of the flags. 1.5 GiB holds the default cache of an object store (see
// cache.ObjectStoreConfig) and 256 streams of local file sections six times over.
const (
	DefaultBytes     = 1536 << 20
	DefaultAdmitWait = 5 * time.Second
)

// RegisterFlags registers --memory-bytes and --admit-wait on fs, with their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.Bytes = DefaultBytes
	fs.Var(bytesize.Value{P: &c.Bytes}, "memory-bytes",
		"memory budget (`SIZE`) for the cache, every stream's buffers and the plans being built, together; "+
			"a request that finds it spent waits --admit-wait, then gets a 503")
	fs.DurationVar(&c.AdmitWait, "admit-wait", DefaultAdmitWait,
		"how long a new stream waits for memory before it is refused with 503 and Retry-After")
}

func (c Config) withDefaults() Config {
	if c.Bytes == 0 {
		c.Bytes = DefaultBytes
	}
	return c
}

// Validate reports settings no budget can run with.
func (c *Config) Validate() error {
	d := c.withDefaults()
	var errs []error
	if d.Bytes < 0 || d.AdmitWait < 0 || d.CacheBytes < 0 {
		errs = append(errs, errors.New("--memory-bytes, --cache-bytes and --admit-wait must not be negative"))
	}
	if d.CacheBytes >= d.Bytes {
		errs = append(errs, errors.New("--cache-bytes must be less than --memory-bytes"))
	}
	return errors.Join(errs...)
}

// Shared is what reservations share: the budget less the cache's share.
func (c Config) Shared() int64 {
	d := c.withDefaults()
	return d.Bytes - d.CacheBytes
}

// runtimeHeadroom is what the Go heap may hold beyond the budget: the runtime, request metadata
// and garbage not yet collected.
const runtimeHeadroom = 256 << 20

// SetGoMemoryLimit keeps the Go heap near the budget, so the garbage collector works harder before
// the pod's memory limit is reached, unless GOMEMLIMIT sets the limit; it returns the limit in
// effect.
func (c Config) SetGoMemoryLimit() int64 {
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(c.withDefaults().Bytes + runtimeHeadroom)
	}
	return debug.SetMemoryLimit(-1)
}

// Budget is the memory budget. It is safe for concurrent use.
type Budget struct {
	memory    *semaphore.Weighted
	bytes     int64 // what reservations share: the budget less the cache's share
	held      atomic.Int64
	admitWait time.Duration
}

// New returns a budget of cfg.Bytes less cfg.CacheBytes, nothing held. It panics on a Config that
// Validate refuses: a program validates its configuration before it builds anything.
func New(cfg Config) *Budget {
	if err := cfg.Validate(); err != nil {
		panic("budget: " + err.Error())
	}
	return &Budget{memory: semaphore.NewWeighted(cfg.Shared()), bytes: cfg.Shared(), admitWait: cfg.AdmitWait}
}

// Bytes is what reservations share: the budget less its shares.
func (b *Budget) Bytes() int64 { return b.bytes }

// Held is how much of Bytes is reserved now.
func (b *Budget) Held() int64 { return b.held.Load() }

// Idle reports whether less than half of Bytes is held: a part may then take more than it needs
// (a stream's read-ahead) and take no more once it is not, leaving the other half to new requests.
// One atomic load: cheap enough to ask before every segment.
func (b *Budget) Idle() bool { return 2*b.held.Load() < b.bytes }

// Acquire takes n bytes (at most Bytes), waiting while ctx lasts.
func (b *Budget) Acquire(ctx context.Context, n int64) error {
	if err := b.memory.Acquire(ctx, n); err != nil {
		return err
	}
	b.held.Add(n)
	return nil
}

// Release gives back n bytes taken by Acquire or Admit.
func (b *Budget) Release(n int64) {
	b.held.Add(-n)
	b.memory.Release(n)
}

// Admit takes n bytes (at most Bytes), waiting at most AdmitWait (none: at once or never): ErrBusy
// after it, or ctx's error when ctx ended first.
func (b *Budget) Admit(ctx context.Context, n int64) error {
	if b.memory.TryAcquire(n) {
		b.held.Add(n)
		return nil
	}
	actx, cancel := context.WithTimeout(ctx, b.admitWait)
	err := b.Acquire(actx, n)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return ErrBusy
	}
	return nil
}

// Reserve holds n bytes (at most Bytes: a reservation larger than the budget waits for all of it),
// waiting at most AdmitWait; release gives back all or part of them, once per byte. ErrBusy when
// the budget stays spent.
func (b *Budget) Reserve(ctx context.Context, n int64) (release func(n int64), err error) {
	n = min(max(n, 0), b.bytes)
	if err := b.Admit(ctx, n); err != nil {
		return nil, err
	}
	left := n
	return func(k int64) { // called by one goroutine: the reservation's owner
		k = min(max(k, 0), left)
		left -= k
		b.Release(k)
	}, nil
}
