// Package executor runs plans: it produces a plan's body in order, a bounded window of segments at
// a time, reading each segment's byte ranges from the store in parallel into pooled buffers,
// gathering and converting them into the output, and handing the finished segments to the caller
// in body order.
package executor

import (
	"context"
	"fmt"
	"math/bits"
	"sort"
	"sync"

	"golang.org/x/sync/errgroup"

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
}

// New returns an executor over s that keeps window segments of each stream in flight and splits
// reads at maxRead bytes.
func New(s store.Store, window int, maxRead int64) *Executor {
	return &Executor{store: s, window: max(1, window), maxRead: maxRead}
}

// Stream is one plan being produced. Next returns the body in order; Close must be called.
type Stream struct {
	ctx     context.Context
	cancel  context.CancelFunc
	header  []byte
	results []chan result
	next    int
	slots   chan struct{}
	held    *[]byte // the buffer last returned by Next, recycled on the following call
	done    sync.WaitGroup
}

type result struct {
	buf *[]byte
	n   int64
	err error
}

// Stream starts producing a plan's body: the first window of segments begins reading at once.
func (e *Executor) Stream(ctx context.Context, p *planner.Plan) *Stream {
	ctx, cancel := context.WithCancel(ctx)
	var segs []*planner.Segment
	for i := range p.Items {
		for j := range p.Items[i].Segments {
			segs = append(segs, &p.Items[i].Segments[j])
		}
	}
	s := &Stream{ctx: ctx, cancel: cancel, header: p.Header, results: make([]chan result, len(segs)), slots: make(chan struct{}, e.window)}
	for i := range s.results {
		s.results[i] = make(chan result, 1)
	}
	s.done.Go(func() {
		for i, seg := range segs {
			select {
			case s.slots <- struct{}{}:
			case <-ctx.Done():
				for _, ch := range s.results[i:] {
					ch <- result{err: ctx.Err()}
				}
				return
			}
			s.done.Go(func() {
				buf, err := e.produce(ctx, seg)
				s.results[i] <- result{buf: buf, n: seg.Bytes, err: err}
			})
		}
	})
	return s
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
	r := <-s.results[s.next]
	s.next++
	if r.err != nil {
		if r.buf != nil {
			putBuf(r.buf)
		}
		return nil, r.err
	}
	s.held = r.buf
	return (*r.buf)[:r.n], nil
}

// Prime waits until the first segment is ready, so a failure of the first read is known before a
// response is committed. The segment is still returned by Next.
func (s *Stream) Prime() error {
	if len(s.results) == 0 {
		return nil
	}
	r := <-s.results[0]
	s.results[0] <- r
	return r.err
}

func (s *Stream) recycle() {
	if s.held != nil {
		putBuf(s.held)
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
			if r := <-ch; r.buf != nil {
				putBuf(r.buf)
			}
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
	for _, c := range seg.Copies {
		if err := tensor.Copy(c.Pipeline, out[c.Dst:], spanSource{spans: spans, key: c.Key}, c.Src, c.Layout); err != nil {
			putBuf(buf)
			return nil, fmt.Errorf("internal error: the plan did not read what a copy needs: %w", err)
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
