// Package executor runs plans: it produces a plan's body in order, a bounded window of segments at
// a time, reading each segment's byte ranges from the store in parallel into pooled buffers,
// gathering and converting them into the output, and handing the finished segments to the caller
// in body order.
package executor

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/bits"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/errgroup"
	"golang.org/x/sync/semaphore"

	"github.com/shardsrv/shardsrv/internal/bytesize"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// Executor reads from one store. It is safe for concurrent use.
type Executor struct {
	store store.Store
	// window is how many segments of one stream are in flight or waiting to be written.
	window  int
	maxRead int64
	// memory holds the bytes of every segment buffer and read buffer of every stream.
	memory      *semaphore.Weighted
	memoryBytes int64
	inFlight    atomic.Int64
	// admitWait is how long a new stream waits for memory before it is refused.
	admitWait time.Duration
	tracer    trace.Tracer
}

// ErrBusy is a stream refused because the memory budget is spent: come back later.
var ErrBusy = errors.New("the server's memory budget for streams is spent")

// Config sizes an executor.
type Config struct {
	// Window is how many segments of one stream are read ahead of the writer.
	Window int
	// MaxRead splits longer reads into parallel requests.
	MaxRead int64
	// MemoryBytes bounds the segment and read buffers of all streams together. Its flag is the
	// whole process's budget; the server hands the executor what the cache does not take.
	MemoryBytes int64
	// AdmitWait is how long a new stream may wait for memory before it is refused (ErrBusy).
	AdmitWait time.Duration
	// Tracer records a span per segment's gather; nil records nothing.
	Tracer trace.Tracer
}

// The defaults of the tunables a flag sets.
const (
	DefaultWindow      = 4
	DefaultAdmitWait   = 5 * time.Second
	DefaultMemoryBytes = 1536 << 20
)

// RegisterFlags registers the executor's tunables on fs, with their defaults; the read size comes
// from the planner's flags.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.MemoryBytes = DefaultMemoryBytes
	fs.Var(bytesize.Value{P: &c.MemoryBytes}, "memory-bytes",
		"memory budget (`SIZE`) for the cache, every stream's buffers and the plans being built, together; "+
			"a request that finds it spent waits --admit-wait, then gets a 503")
	fs.IntVar(&c.Window, "window", DefaultWindow,
		"segments of one response read ahead of the writer; memory per stream is about window x "+
			"(segment-bytes + segment-read-bytes)")
	fs.DurationVar(&c.AdmitWait, "admit-wait", DefaultAdmitWait,
		"how long a new stream waits for memory before it is refused with 503 and Retry-After")
}

// Validate reports settings no stream can run with.
func (c *Config) Validate() error {
	if c.Window < 1 || c.AdmitWait < 0 || c.MemoryBytes <= 0 {
		return errors.New("--window and --memory-bytes must be positive, --admit-wait at least 0")
	}
	return nil
}

// New returns an executor over s.
func New(s store.Store, cfg Config) *Executor {
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	return &Executor{
		store:       s,
		window:      max(1, cfg.Window),
		maxRead:     cfg.MaxRead,
		memory:      semaphore.NewWeighted(cfg.MemoryBytes),
		memoryBytes: cfg.MemoryBytes,
		admitWait:   cfg.AdmitWait,
		tracer:      cfg.Tracer,
	}
}

// Budget is the memory budget, in bytes.
func (e *Executor) Budget() int64 { return e.memoryBytes }

// BytesInFlight is how much of the memory budget buffers hold now.
func (e *Executor) BytesInFlight() int64 { return e.inFlight.Load() }

// weight is the memory a segment holds while it is produced: its output and its read buffers,
// never more than the whole budget (a segment bigger than the budget runs alone).
func (e *Executor) weight(seg *planner.Segment) int64 {
	w := seg.Bytes
	for _, r := range seg.Spans {
		w += r.Length
	}
	return min(w, e.memoryBytes)
}

func (e *Executor) acquire(ctx context.Context, w int64) error {
	if err := e.memory.Acquire(ctx, w); err != nil {
		return err
	}
	e.inFlight.Add(w)
	return nil
}

func (e *Executor) release(w int64) {
	e.inFlight.Add(-w)
	e.memory.Release(w)
}

// Reserve holds n bytes of the memory budget (at most all of it) for memory that is not a
// segment's, such as a plan while it is built and streamed, waiting at most AdmitWait; release
// gives back all or part of it, once per byte. ErrBusy when the budget stays spent.
func (e *Executor) Reserve(ctx context.Context, n int64) (release func(n int64), err error) {
	n = min(max(n, 0), e.memoryBytes)
	actx, cancel := context.WithTimeout(ctx, e.admitWait)
	err = e.acquire(actx, n)
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, ErrBusy
	}
	left := n
	return func(k int64) { // called by one goroutine: the reservation's owner
		k = min(max(k, 0), left)
		left -= k
		e.release(k)
	}, nil
}

// Stream is one plan being produced. Next returns the body in order; Close must be called.
type Stream struct {
	e       *Executor
	ctx     context.Context // the stream's: done when the request's is, or at Close
	cancel  context.CancelFunc
	header  []byte
	results []chan result // one per segment, each written exactly once
	next    int
	slots   chan struct{} // the window: a slot per segment read but not yet written
	held    *result       // the segment last returned by Next, released on the following call
}

type result struct {
	buf    *[]byte
	n      int64
	weight int64 // memory the segment holds until it is written
	err    error
}

// Stream starts producing a plan's body: the first window of segments begins reading at once.
// It returns ErrBusy when the memory budget cannot take the first segment within AdmitWait; later
// segments wait for memory (backpressure).
func (e *Executor) Stream(ctx context.Context, p *planner.Plan) (*Stream, error) {
	var segs []*planner.Segment
	for i := range p.Items {
		for j := range p.Items[i].Segments {
			segs = append(segs, &p.Items[i].Segments[j])
		}
	}
	var first int64
	if len(segs) > 0 {
		first = e.weight(segs[0])
		actx, cancel := context.WithTimeout(ctx, e.admitWait)
		err := e.acquire(actx, first)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			return nil, ErrBusy
		}
	}
	ctx, cancel := context.WithCancel(ctx)
	s := &Stream{
		e:       e,
		ctx:     ctx,
		cancel:  cancel,
		header:  p.Header,
		results: make([]chan result, len(segs)),
		slots:   make(chan struct{}, e.window),
	}
	for i := range s.results {
		s.results[i] = make(chan result, 1)
	}
	go func() {
		for i, seg := range segs {
			w := e.weight(seg)
			var err error
			select {
			case s.slots <- struct{}{}:
				if i > 0 {
					err = e.acquire(ctx, w)
				}
			case <-ctx.Done():
				err = ctx.Err()
			}
			if err != nil {
				if i == 0 {
					e.release(first)
				}
				for _, ch := range s.results[i:] {
					ch <- result{err: err}
				}
				return
			}
			go func() {
				buf, err := e.produce(ctx, seg)
				s.results[i] <- result{buf: buf, n: seg.Bytes, weight: w, err: err}
			}()
		}
	}()
	return s, nil
}

// Next returns the next part of the body, valid until the following call, and nil at the end. A
// storage failure is returned as an error; the stream is then unusable.
func (s *Stream) Next() ([]byte, error) {
	s.recycle()
	if s.header != nil {
		h := s.header
		s.header = nil
		return h, nil
	}
	if s.next == len(s.results) {
		return nil, nil
	}
	// A read that never returns (a hung mount) must not hold the caller past its context: the
	// result is then drained by Close whenever it comes.
	var r result
	select {
	case r = <-s.results[s.next]:
	case <-s.ctx.Done():
		return nil, s.ctx.Err()
	}
	s.next++
	if r.err != nil {
		s.e.free(r)
		return nil, r.err
	}
	s.held = &r
	return (*r.buf)[:r.n], nil
}

// free returns what a produced segment holds: its buffer and its memory (the caller gives back
// its window slot).
func (e *Executor) free(r result) {
	if r.buf != nil {
		putBuf(r.buf)
	}
	if r.weight > 0 {
		e.release(r.weight)
	}
}

// Prime waits until the first segment is ready, so a failure of the first read is known before a
// response is committed. The segment is still returned by Next.
func (s *Stream) Prime() error {
	if len(s.results) == 0 {
		return nil
	}
	select {
	case r := <-s.results[0]:
		s.results[0] <- r
		return r.err
	case <-s.ctx.Done():
		return s.ctx.Err()
	}
}

func (s *Stream) recycle() {
	if s.held != nil {
		s.e.free(*s.held)
		s.held = nil
		<-s.slots
	}
}

// Close stops the stream and releases its buffers.
func (s *Stream) Close() {
	s.recycle()
	s.cancel()
	go func() { // drain what is still in flight without holding up the caller
		for _, ch := range s.results[s.next:] {
			s.e.free(<-ch)
		}
	}()
}

// produce fills one segment: fill value, direct reads into place, span reads, then gathers.
func (e *Executor) produce(ctx context.Context, seg *planner.Segment) (*[]byte, error) {
	buf := getBuf(seg.Bytes)
	out := (*buf)[:seg.Bytes]
	if seg.Fill != nil {
		tensor.Fill(out, seg.Fill)
	}
	spans := make([]span, len(seg.Spans))
	defer func() {
		for _, sp := range spans {
			if sp.buf != nil {
				putBuf(sp.buf)
			}
		}
	}()
	g, gctx := errgroup.WithContext(ctx)
	for _, r := range seg.Direct {
		for _, part := range planner.SplitReads(r, e.maxRead) {
			g.Go(func() error {
				return e.store.ReadAt(gctx, part.Key, part.Version, out[part.Dst:part.Dst+part.Length], part.Offset)
			})
		}
	}
	for i, r := range seg.Spans {
		spans[i] = span{Read: r, buf: getBuf(r.Length)}
		data := (*spans[i].buf)[:r.Length]
		for _, part := range planner.SplitReads(r, e.maxRead) {
			g.Go(func() error {
				lo := part.Offset - r.Offset
				return e.store.ReadAt(gctx, part.Key, part.Version, data[lo:lo+part.Length], part.Offset)
			})
		}
	}
	if err := g.Wait(); err != nil {
		putBuf(buf)
		return nil, err
	}
	if len(seg.Kernels) > 0 {
		_, span := e.tracer.Start(ctx, "gather", trace.WithAttributes(attribute.Int("kernels", len(seg.Kernels)),
			attribute.Int64("bytes", seg.Bytes)))
		defer span.End()
	}
	files := func(key string) tensor.Source { return spanSource{spans: spans, key: key} }
	for _, k := range seg.Kernels {
		if err := k.Run(out, files); err != nil {
			putBuf(buf)
			return nil, fmt.Errorf("internal error: %w", err)
		}
	}
	return buf, nil
}

type span struct {
	planner.Read
	buf *[]byte
}

// spanSource finds a file's bytes among a segment's span buffers, which are sorted by key and offset.
type spanSource struct {
	spans []span
	key   string
}

func (s spanSource) Slice(off, n int64) []byte {
	i := sort.Search(len(s.spans), func(i int) bool {
		sp := s.spans[i]
		return sp.Key > s.key || sp.Key == s.key && sp.Offset+sp.Length > off
	})
	if i == len(s.spans) {
		return nil
	}
	sp := s.spans[i]
	if sp.Key != s.key || off < sp.Offset || off+n > sp.Offset+sp.Length {
		return nil
	}
	return (*sp.buf)[off-sp.Offset : off-sp.Offset+n]
}

// Buffers come from pools by power-of-two size class, so a stream's steady state allocates nothing.
var pools [48]sync.Pool

func sizeClass(n int64) int { return bits.Len64(uint64(max(n, 4096) - 1)) }

func getBuf(n int64) *[]byte {
	c := sizeClass(n)
	if b, ok := pools[c].Get().(*[]byte); ok {
		return b
	}
	b := make([]byte, 1<<c)
	return &b
}

func putBuf(b *[]byte) { pools[sizeClass(int64(cap(*b)))].Put(b) }
