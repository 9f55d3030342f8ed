// Package executor runs plans: it produces a plan's body in order, a bounded window of segments at
// a time, and writes the finished segments to the caller's writer in body order — hashing the
// body on a goroutine of its own, a little behind the writer, when asked to.
//
// A segment the plan reads straight from files (direct runs tiling it, no fill, no conversion) is
// not copied into a buffer of its own when the store can write it out itself (store.Sectioner):
// a local file goes to the socket by sendfile (or, when the body is hashed or the writer cannot
// take files, through a small buffer, two for a hashed body), cached chunks are written from the
// cache. Every other segment — gathered, converted, or direct from an object store, whose
// parallel ranged reads need buffers to land in — is read into pooled buffers and written from
// them. A gather from local files reads its sources through one section a file, a band at a
// time, and runs its kernels on each band right after it is read, while the band is still in
// the core's cache.
//
// Memory is charged for what a segment really holds: its buffers, the cached chunks its sections
// reference, or for a file section the 256 KiB it may be copied through (a hashing stream one more
// such buffer while it runs, so the hasher may lag one behind). A buffered segment is
// charged the most it may take (its output and its read buffers) while it is produced, then its
// output until it is written. Each stream holds at most StreamBytes; all streams together hold
// what the process's memory budget (internal/budget) lets them, beside the bodies and plans it
// holds too.
//
// While the budget is idle (budget.Idle: less than half of it held), a stream reads further ahead
// — up to readAheadGrowth times its window and its StreamBytes — the segments whose reads land in
// memory (an object store's ranged GETs, a cache's chunks, gathers), so that one large shard keeps
// as many requests in flight as an SDK's parallel download does. The extra segments are charged as
// any other; once the budget is more than half held, a stream starts no segment past its window
// and StreamBytes, and so gives the extra back as its writer writes it. File sections never grow:
// they are pinned at once, each holding a file open, and more of them in flight gains nothing.
package executor

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"math/bits"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/errgroup"

	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/bytesize"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// Executor reads from one store. It is safe for concurrent use.
type Executor struct {
	store     store.Store
	sectioner store.Sectioner // the store, when it can write ranges out itself
	// window is how many segments of one stream are in flight or waiting to be written.
	window int
	// streamBytes is the most memory one stream holds.
	streamBytes int64
	socketBytes int64
	sendfile    bool
	// memory holds the bytes of every segment buffer and read buffer of every stream.
	memory *budget.Budget
	tracer trace.Tracer
}

// Config sizes an executor. A field left at zero takes its default.
type Config struct {
	// Window is how many segments of one stream are read ahead of the writer, at most (zero:
	// DefaultWindow), but for the growth while the budget is idle.
	Window int
	// StreamBytes is the most memory one stream's segments hold at once (0: DefaultStreamBytes);
	// a segment bigger than it runs alone.
	StreamBytes int64
	// SocketBytes is the most of a body the kernel may hold between a socket write and the
	// client's read (0: this host's TCP buffer maxima); that much of a body's end is not sent
	// from files.
	SocketBytes int64
	// NoSendfile copies file sections through a buffer even to a writer that could take them by
	// sendfile.
	NoSendfile bool
	// Tracer records a span per segment's gather; nil records nothing.
	Tracer trace.Tracer
}

// The defaults of the tunables a flag sets. 16 MiB a stream holds four of the object-store
// segments (planner.ObjectStoreOptions) in flight, or a local gather segment and its reads while
// the one before it is written; 256 streams of file sections (1 MiB each) fit the default budget
// six times over.
const (
	DefaultWindow      = 4
	DefaultStreamBytes = 16 << 20
)

// RegisterFlags registers the executor's tunables on fs, with their defaults. The read size is the
// planner's (a plan's reads come cut to it), the memory budget internal/budget's.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.StreamBytes = DefaultStreamBytes
	fs.Var(bytesize.Value{P: &c.StreamBytes}, "stream-bytes",
		"most memory (`SIZE`) one response's buffers hold: segments are read ahead of the writer while they fit; "+
			"segments sent from local files hold 256 KiB at most; while less than half of --memory-bytes is held, "+
			"segments read into memory (an object store's) are read ahead up to 4 times this and --window")
	fs.BoolVar(&c.NoSendfile, "no-sendfile", false,
		"copy byte ranges of local files to every client that declines the digest through a 256 KiB buffer "+
			"instead of sending them by sendfile (to a client over a veth pair copying can be faster)")
	fs.IntVar(&c.Window, "window", DefaultWindow,
		"most segments of one response read ahead of the writer (--stream-bytes bounds their memory, and says "+
			"when both grow)")
}

// Validate reports settings no stream can run with: negative ones (zero is the default).
func (c *Config) Validate() error {
	if c.Window < 0 || c.StreamBytes < 0 || c.SocketBytes < 0 {
		return errors.New("--window and --stream-bytes must not be negative")
	}
	return nil
}

// New returns an executor over s whose streams take their memory from mem. It panics on a Config
// that Validate refuses: a program validates its configuration before it builds anything.
func New(s store.Store, mem *budget.Budget, cfg Config) *Executor {
	if err := cfg.Validate(); err != nil {
		panic("executor: " + err.Error())
	}
	if cfg.Tracer == nil {
		cfg.Tracer = noop.NewTracerProvider().Tracer("")
	}
	if cfg.Window == 0 {
		cfg.Window = DefaultWindow
	}
	if cfg.StreamBytes == 0 {
		cfg.StreamBytes = DefaultStreamBytes
	}
	if cfg.SocketBytes == 0 {
		cfg.SocketBytes = hostSocketBytes
	}
	sc, _ := s.(store.Sectioner)
	return &Executor{
		store:       s,
		sectioner:   sc,
		window:      cfg.Window,
		streamBytes: cfg.StreamBytes,
		socketBytes: cfg.SocketBytes,
		sendfile:    !cfg.NoSendfile,
		memory:      mem,
		tracer:      cfg.Tracer,
	}
}

// weight is the most memory a segment takes while it is produced: its output and its read
// buffers.
func weight(seg *planner.Segment) int64 {
	w := seg.Bytes
	for _, r := range seg.Spans {
		w += r.Length
	}
	return w
}

// Stream is one plan being produced. WriteTo writes the body; Close must be called.
type Stream struct {
	e       *Executor
	ctx     context.Context // the stream's: done when the request's is, or at Close
	cancel  context.CancelFunc
	header  []byte
	results []chan result // one per segment, each written exactly once
	next    int
	ahead   readAhead // the window and the stream's share of memory
	body    int64     // the body's length
	// sendfile is whether the writer takes file sections by ReadFrom (a socket's sendfile);
	// otherwise they are copied.
	sendfile bool
	hash     *hasher // nil unless the body is hashed
	// sent is the last section sent of each file by sendfile, kept open: its Close confirms the
	// file's version once the socket can no longer read the file's pages.
	sent map[string]store.Section
}

// copyBytes is the buffer a file section is copied through when it does not go by sendfile:
// reads of this size cost little beside writing them. A stream that hashes its body holds up to
// copyChunks of them, so the hasher can hash one while the writer reads and writes the next: the
// segment being copied is charged one, the stream the others, from its admission until its
// hashing ends.
const (
	copyBytes  = 256 << 10
	copyChunks = 2
)

// charge is memory a segment holds against the whole budget and against its stream's share, each
// capped at its bound: a segment bigger than either runs alone.
type charge struct{ all, own int64 }

func (s *Stream) chargeOf(n int64) charge {
	return charge{min(n, s.e.memory.Bytes()), min(n, s.e.streamBytes)}
}

func (s *Stream) release(c charge) {
	s.e.memory.Release(c.all)
	s.ahead.give(c.own, 0)
}

// readAheadGrowth is how many times its window and its StreamBytes a stream may read ahead while
// the budget is idle: 4 × 4 segments of 4 MiB from an object store are 16 ranged GETs and 64 MiB,
// the 8 × 8 MiB the SDKs' parallel downloads keep in flight.
const readAheadGrowth = 4

// readAhead is what a stream holds ahead of its writer: the segments started and not yet written,
// and their charge against the stream's share of memory. The stream's producer takes, its writer
// gives back.
type readAhead struct {
	mu       sync.Mutex
	segments int
	bytes    int64
	freed    chan struct{} // a token once something is given back, for the producer waiting
}

// take waits until the stream may start a segment charged own against its share, and takes its
// place: within the window and StreamBytes, or, for a segment that grows and while the budget is
// idle, within readAheadGrowth times them. A segment bigger than the share runs alone.
func (s *Stream) take(ctx context.Context, own int64, grows bool) error {
	for {
		if s.ahead.tryTake(own, s.e.window, s.e.streamBytes, grows && s.e.memory.Idle()) {
			return nil
		}
		select {
		case <-s.ahead.freed:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

func (a *readAhead) tryTake(own int64, window int, share int64, grown bool) bool {
	if grown {
		window, share = readAheadGrowth*window, readAheadGrowth*share
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.segments >= window || a.bytes > 0 && a.bytes+own > share {
		return false
	}
	a.segments++
	a.bytes += own
	return true
}

// give gives back bytes of the share and segments of the window.
func (a *readAhead) give(bytes int64, segments int) {
	if bytes == 0 && segments == 0 {
		return
	}
	a.mu.Lock()
	a.bytes -= bytes
	a.segments -= segments
	a.mu.Unlock()
	select {
	case a.freed <- struct{}{}:
	default: // the producer has a token already
	}
}

// result is a produced segment: parts to write in order, what to give back once they are.
type result struct {
	parts  []part
	buf    *[]byte    // the pooled buffer the bytes are in
	rect   *rectangle // the rectangle it was produced from, done with once it is written
	send   bool       // its sections are files the socket may take by sendfile
	slot   bool       // it holds a window slot; the segments a failed producer never started do not
	charge charge
	err    error
}

// part is bytes in memory, or a section the store writes out.
type part struct {
	b   []byte
	sec store.Section
	key string // the file and version of a section
}

// Output is what a stream's body goes to.
type Output struct {
	// Sendfile says the writer WriteTo will get takes files by ReadFrom (a socket's sendfile): file
	// sections then hold no memory; otherwise they are copied through a buffer they are charged
	// for. A stream that hashes its body copies them.
	Sendfile bool
	// Hash, when set, is fed the whole body in order (Stream.Sum), on a goroutine of its own a
	// little behind the writer: a piece of the body is handed to it as it is written, and its
	// memory given back once it is hashed, so the writer waits for the hash only when the hasher
	// is slower than the socket (and then for the memory), and no byte is copied for it.
	Hash hash.Hash
}

// Stream starts producing a plan's body: the first window of segments begins reading at once.
// It returns budget.ErrBusy when the memory budget cannot take the first segment within its
// AdmitWait; later segments wait for memory (backpressure).
func (e *Executor) Stream(ctx context.Context, p *planner.Plan, to Output) (*Stream, error) {
	var segs []*planner.Segment
	var rects []*rectangle // the rectangle each segment reads, if its item shares one
	for i := range p.Items {
		var r *rectangle
		if it := &p.Items[i]; it.Rectangle != nil {
			r = &rectangle{reads: it.Rectangle, ready: make(chan struct{})}
			r.left.Store(int64(len(it.Segments)))
			var most int64
			for _, seg := range it.Segments {
				most = max(most, seg.Bytes)
			}
			last := it.Rectangle[len(it.Rectangle)-1]
			r.bytes = min(last.Dst+last.Length+int64(e.window)*most, e.memory.Bytes())
		}
		for j := range p.Items[i].Segments {
			segs = append(segs, &p.Items[i].Segments[j])
			rects = append(rects, r)
		}
	}
	s := &Stream{
		e:        e,
		header:   p.Header,
		results:  make([]chan result, len(segs)),
		ahead:    readAhead{freed: make(chan struct{}, 1)},
		body:     p.BodyBytes,
		sendfile: to.Sendfile && to.Hash == nil && e.sendfile,
		sent:     map[string]store.Section{},
	}
	if to.Hash != nil {
		s.hash = newHasher(to.Hash)
	}
	var first job
	if len(segs) > 0 {
		first = s.job(segs[0], rects[0])
		var held int64
		if rects[0] != nil {
			held = rects[0].bytes
		}
		var lag int64 // a budget too small for it leaves the hasher no lag
		if s.hash != nil && first.charge.all+held+(copyChunks-1)*copyBytes <= e.memory.Bytes() {
			lag = (copyChunks - 1) * copyBytes
		}
		if err := e.memory.Admit(ctx, first.charge.all+held+lag); err != nil {
			return nil, err
		}
		s.ahead.tryTake(first.charge.own, e.window, e.streamBytes, false) // a new stream holds nothing yet
		if s.hash != nil {
			s.hash.lag = lag
			s.hash.chunks = make(chan struct{}, 1+lag/copyBytes)
		}
	}
	if s.hash != nil {
		go s.hash.run(e.memory)
	}
	s.ctx, s.cancel = context.WithCancel(ctx)
	for i := range s.results {
		s.results[i] = make(chan result, 1)
	}
	go s.produce(segs, rects, first)
	return s, nil
}

// job is a segment to produce: from sections of the store when runs are its direct runs, else
// in a buffer; charge is the most memory it takes while it is produced.
type job struct {
	seg  *planner.Segment
	rect *rectangle // what its kernels read, when its item shares one
	runs []planner.Read
	send bool // its sections are files the socket may take by sendfile
	// grows is whether it may be read ahead past the window while the budget is idle: its reads
	// land in memory of its own (not files; not a rectangle, whose charge counts the window).
	grows  bool
	charge charge
}

// job plans a segment. File sections in the body's last SocketBytes are copied, not sent: the
// socket reads a section's pages after sendfile returns, so a file's version is confirmed a last
// time only once the copied bytes after its sections have pushed them out of the kernel's
// buffers — which the body's last byte then waits for. A file section that is copied is charged
// the buffer it is copied through.
func (s *Stream) job(seg *planner.Segment, rect *rectangle) job {
	if runs := tiling(seg); runs != nil && s.e.sectioner != nil {
		held := s.e.sectioner.SectionMemory(seg.Bytes)
		files := held == 0
		send := files && s.sendfile && seg.Output+seg.Bytes <= s.body-s.e.socketBytes
		if files && !send {
			held = min(copyBytes, seg.Bytes)
		}
		return job{seg: seg, runs: runs, send: send, grows: !files, charge: s.chargeOf(held)}
	}
	if rect != nil { // its buffer is in the rectangle's charge, not the budget's again
		return job{seg: seg, rect: rect, charge: charge{own: min(weight(seg), s.e.streamBytes)}}
	}
	return job{seg: seg, grows: true, charge: s.chargeOf(weight(seg))}
}

// produce starts each segment once it has its place in the read-ahead and memory (the first was
// given both by Stream). A buffered segment gives back its read buffers' share once it is
// produced.
func (s *Stream) produce(segs []*planner.Segment, rects []*rectangle, first job) {
	ctx := s.ctx
	for i, seg := range segs {
		j := first
		err := ctx.Err()
		slot := i == 0 // the first segment's place was taken by Stream
		if i > 0 && err == nil {
			j = s.job(seg, rects[i])
			if err = s.take(ctx, j.charge.own, j.grows); err == nil {
				slot = true
				if err = s.e.memory.Acquire(ctx, j.charge.all); err != nil {
					s.ahead.give(j.charge.own, 0)
				}
			}
		}
		rect := rects[i]
		if err == nil && rect != nil && !rect.started {
			if i > 0 { // the first segment's was admitted with it
				if err = s.e.memory.Acquire(ctx, rect.bytes); err != nil {
					s.release(j.charge)
				}
			}
			if err == nil {
				rect.started = true
				go s.e.readRectangle(ctx, rect)
			}
		}
		if err != nil {
			if slot {
				s.ahead.give(0, 1)
			}
			if i == 0 {
				s.release(first.charge)
				if rect != nil && !rect.started {
					s.e.memory.Release(rect.bytes)
				}
			}
			for k, ch := range s.results[i:] {
				if r := rects[i+k]; r != nil && r.started {
					s.e.doneWith(r)
				}
				ch <- result{err: err}
			}
			return
		}
		go func() {
			r := s.e.produce(ctx, j)
			r.send = j.send
			r.charge = j.charge // sections hold what they were charged
			switch {
			case r.err != nil:
				r.charge = charge{}
			case j.runs == nil: // the read buffers are back in their pool, the output is held
				r.charge = s.chargeOf(seg.Bytes)
				if j.rect != nil {
					r.charge.all = 0
				}
			}
			r.rect = j.rect
			r.slot = true
			s.release(charge{j.charge.all - r.charge.all, j.charge.own - r.charge.own})
			s.results[i] <- r
		}()
	}
}

// WriteTo writes the body to w in order, each segment as soon as it is ready. A failure — of
// storage, or of w — is returned as an error, possibly after part of the body was written; the
// stream is then unusable. File sections go to w's ReadFrom (a socket's sendfile) when the stream
// was made for one, and are copied otherwise; the body's last byte is written only once every
// file sent by sendfile has confirmed its version.
func (s *Stream) WriteTo(w io.Writer) (int64, error) {
	out := &body{s: s, w: w}
	if s.header != nil {
		h := s.header
		s.header = nil
		if _, err := out.Write(h); err != nil {
			return out.n, err
		}
	}
	for s.next < len(s.results) {
		// A read that never returns (a hung mount) must not hold the caller past its context: the
		// result is then drained by Close whenever it comes.
		var r result
		select {
		case r = <-s.results[s.next]:
		case <-s.ctx.Done():
			return out.n, s.ctx.Err()
		}
		s.next++
		err := r.err
		for i := range r.parts {
			p := &r.parts[i]
			switch {
			case p.sec == nil:
				_, err = out.Write(p.b)
			case r.send:
				var m int64
				m, err = p.sec.WriteTo(w)
				if out.n += m; err == nil {
					err = s.keep(p)
				}
			default:
				_, err = p.sec.WriteTo(out)
			}
			if err != nil {
				break
			}
		}
		s.written(r)
		if err != nil {
			return out.n, err
		}
	}
	return out.n, nil
}

// written gives back what a segment holds, and its window slot, once it is written — and hashed,
// when the stream hashes its body.
func (s *Stream) written(r result) {
	s.hash.add(nil, func() {
		s.free(r)
		if r.slot {
			s.ahead.give(0, 1)
		}
	})
}

// body is the stream's writer of the body to w: it counts the bytes, hands them to the hasher,
// copies file sections through a buffer, and writes the body's last byte only once the files sent
// by sendfile have confirmed their versions. Unlike an io.Writer's, its callers keep p unchanged
// until the hasher has passed what they add after it (the segment's buffers, sections and copy
// buffers are given back through the hasher).
type body struct {
	s *Stream
	w io.Writer
	n int64
}

func (b *body) Write(p []byte) (int, error) {
	if len(p) > 0 {
		b.s.hash.add(p, nil)
	}
	if b.n+int64(len(p)) != b.s.body || len(b.s.sent) == 0 || len(p) == 0 {
		k, err := b.w.Write(p)
		b.n += int64(k)
		return k, err
	}
	k, err := b.w.Write(p[:len(p)-1])
	if b.n += int64(k); err != nil {
		return k, err
	}
	if err := b.s.confirm(); err != nil {
		return k, err
	}
	m, err := b.w.Write(p[len(p)-1:])
	b.n += int64(m)
	return k + m, err
}

// ReadFrom copies a file section through buffers its segment was charged for: one copy, and none
// of the file's pages left in the socket. A buffer is reused once it is written (and hashed).
func (b *body) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	for {
		pooled := b.s.hash.chunk()
		buf := (*pooled)[:copyBytes]
		m, err := io.ReadFull(r, buf)
		if m > 0 {
			_, werr := b.Write(buf[:m])
			b.s.hash.add(nil, func() { b.s.hash.unchunk(pooled) })
			if werr != nil {
				return n, werr
			}
			n += int64(m)
		} else {
			b.s.hash.unchunk(pooled)
		}
		if end, err := ended(err); end {
			return n, err
		}
	}
}

// ended is whether a ReadFrom's read that returned err was its last: at the reader's end (then
// no error) or failed.
func ended(err error) (bool, error) {
	switch err {
	case nil:
		return false, nil
	case io.EOF, io.ErrUnexpectedEOF:
		return true, nil
	}
	return true, err
}

// keep holds a section sent by sendfile open in place of the file's one before, which it closes.
func (s *Stream) keep(p *part) error {
	before := s.sent[p.key]
	s.sent[p.key], p.sec = p.sec, nil
	if before != nil {
		return before.Close()
	}
	return nil
}

// confirm closes the sections kept, each confirming its file's version.
func (s *Stream) confirm() error {
	var errs []error
	for key, sec := range s.sent {
		errs = append(errs, sec.Close())
		delete(s.sent, key)
	}
	return errors.Join(errs...)
}

// free returns what a produced segment holds: its sections, its buffer and its memory.
func (s *Stream) free(r result) {
	discard(r)
	s.release(r.charge)
	if r.rect != nil {
		s.e.doneWith(r.rect)
	}
}

// Prime waits until the first segment is ready, so a failure of the first read is known before a
// response is committed. The segment is still written by WriteTo.
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

// Sum waits until the body WriteTo wrote is hashed, and returns its hash (Output.Hash); nil for a
// stream that does not hash its body.
func (s *Stream) Sum() []byte {
	if s.hash == nil {
		return nil
	}
	return s.hash.sum()
}

// Close stops the stream and releases its buffers.
func (s *Stream) Close() {
	s.confirm()
	s.cancel()
	s.hash.abandon()
	go func() { // drain what is still in flight without holding up the caller
		for _, ch := range s.results[s.next:] {
			s.free(<-ch)
		}
	}()
}

// produce makes one segment: as sections of the files it is read from, or in a buffer.
func (e *Executor) produce(ctx context.Context, j job) result {
	if j.runs != nil {
		return e.sections(ctx, j.runs)
	}
	buf, err := e.gather(ctx, j.seg, j.rect)
	if err != nil {
		return result{err: err}
	}
	return result{parts: []part{{b: (*buf)[:j.seg.Bytes]}}, buf: buf}
}

// tiling is a segment's direct runs in body order when they are the whole segment, nil otherwise.
func tiling(seg *planner.Segment) []planner.Read {
	if seg.Fill != nil || len(seg.Kernels) > 0 || len(seg.Spans) > 0 || len(seg.Direct) == 0 {
		return nil
	}
	runs := slices.SortedFunc(slices.Values(seg.Direct),
		func(a, b planner.Read) int { return cmp.Compare(a.Dst, b.Dst) })
	var at int64
	for _, r := range runs {
		if r.Dst != at {
			return nil
		}
		at += r.Length
	}
	if at != seg.Bytes {
		return nil
	}
	return runs
}

// sections pins a segment's runs as sections, one for each stretch of runs of one file.
func (e *Executor) sections(ctx context.Context, runs []planner.Read) result {
	var r result
	for len(runs) > 0 {
		k := 1
		for k < len(runs) && runs[k].Key == runs[0].Key && runs[k].Version == runs[0].Version {
			k++
		}
		ranges := make([]store.Range, k)
		for j, run := range runs[:k] {
			ranges[j] = store.Range{Offset: run.Offset, Length: run.Length}
		}
		sec, err := e.sectioner.Section(ctx, runs[0].Key, runs[0].Version, ranges)
		if err != nil {
			discard(r)
			return result{err: err}
		}
		r.parts = append(r.parts, part{sec: sec, key: runs[0].Key + "@" + runs[0].Version})
		runs = runs[k:]
	}
	return r
}

// discard closes a result's sections and returns its buffer.
func discard(r result) {
	for _, p := range r.parts {
		if p.sec != nil {
			p.sec.Close()
		}
	}
	if r.buf != nil {
		putBuf(r.buf)
	}
}

// gather fills one segment's buffer: fill value, direct reads into place, span reads into the
// gather buffer (or its rectangle's), then the kernels. Every read is one request: the plan cut
// them to the store's read size. Spans of local files are read in bands instead (bandBytes)
// into a window that holds what the kernels' next parts read, each part run right after its
// bytes are in.
func (e *Executor) gather(ctx context.Context, seg *planner.Segment, rect *rectangle) (*[]byte, error) {
	buf := getBuf(seg.Bytes)
	out := (*buf)[:seg.Bytes]
	if seg.Fill != nil {
		tensor.Fill(out, seg.Fill)
	}
	if len(seg.Kernels) > 0 {
		_, span := e.tracer.Start(ctx, "gather", trace.WithAttributes(attribute.Int("kernels", len(seg.Kernels)),
			attribute.Int64("bytes", seg.Bytes)))
		defer span.End()
	}
	var spanBytes int64 // what the span reads read, laid out one after another
	if n := len(seg.Spans); n > 0 {
		spanBytes = seg.Spans[n-1].Dst + seg.Spans[n-1].Length
	}
	window := min(2*bandBytes, spanBytes)
	var bands []planner.Band
	if rect == nil && e.bandsFiles() {
		bands = bandsOf(seg.Kernels, window/2)
	}
	g, gctx := errgroup.WithContext(ctx)
	e.readAll(g, gctx, seg.Direct, out)
	var err error
	if bands != nil {
		err = errors.Join(e.readBanded(ctx, seg.Spans, bands, out, window), g.Wait())
	} else {
		pooled := getBuf(spanBytes)
		defer putBuf(pooled)
		spans := (*pooled)[:spanBytes]
		e.readAll(g, gctx, seg.Spans, spans)
		files := planner.SpanFiles(seg.Spans, spans)
		if err = g.Wait(); err == nil && rect != nil {
			files, err = rect.wait(ctx)
		}
		if err == nil {
			err = runKernels(seg.Kernels, out, files)
		}
	}
	if err != nil {
		putBuf(buf)
		return nil, err
	}
	return buf, nil
}

// readAll issues reads into buf in parallel, one request each.
func (e *Executor) readAll(g *errgroup.Group, ctx context.Context, reads []planner.Read, buf []byte) {
	for _, r := range reads {
		g.Go(func() error { return e.store.ReadAt(ctx, r.Key, r.Version, buf[r.Dst:r.Dst+r.Length], r.Offset) })
	}
}

func runKernels(kernels []planner.Kernel, out []byte, files planner.Files) error {
	for _, k := range kernels {
		if err := k.Run(out, files); err != nil {
			return fmt.Errorf("internal error: %w", err)
		}
	}
	return nil
}

// bandBytes is how much source a banded read reads before the kernels run on it, and the most a
// part of a kernel may read. The read's bytes land in a window of twice that (or of the segment's
// span bytes, when fewer: what it is charged for), reused band after band, so the read's stores,
// the kernels' loads and what the kernels write from them stay in one core's L2 cache (1.25 MiB
// on this machine's Xeon); read whole, a segment's gather buffer (MiBs) went through memory twice
// first. A band is no request of its own: a file's reads of
// one segment are one section.
const bandBytes = 512 << 10

// bandsFiles is whether span reads may be read in bands: the store writes sections from files,
// which a section reads with one open however it is consumed. An object store's read is one
// ranged request, and a cache's section holds chunks already in memory: those are read whole.
func (e *Executor) bandsFiles() bool {
	return e.sectioner != nil && e.sectioner.SectionMemory(bandBytes) == 0
}

// bandsOf cuts kernels into parts of at most most bytes of source (from a part's first byte to
// its last) in the order their bytes are read (by file, then by where they end); nil when a
// kernel cannot be cut (a completion), or a part reads more (a dimension inside the one cut spans
// more), or there are none.
func bandsOf(kernels []planner.Kernel, most int64) []planner.Band {
	var bands []planner.Band
	for _, k := range kernels {
		b, ok := k.(planner.Bander)
		if !ok {
			return nil
		}
		bands = b.Bands(most, bands)
	}
	for _, b := range bands {
		if b.End-b.Start > most {
			return nil
		}
	}
	slices.SortStableFunc(bands, func(a, b planner.Band) int {
		return cmp.Or(strings.Compare(a.Key, b.Key), cmp.Compare(a.End, b.End))
	})
	return bands
}

// filled is how far reads sorted by file and offset are read: all of reads[:read], and done
// bytes of reads[read].
type filled struct {
	read int
	done int64
}

// covers is whether every byte of key before end that the reads hold has been read.
func (f filled) covers(reads []planner.Read, key string, end int64) bool {
	if f.read == len(reads) {
		return true
	}
	r := &reads[f.read]
	return r.Key > key || r.Key == key && r.Offset+f.done >= end
}

// readBanded reads a segment's span reads (sorted by file and offset) through a section of each
// file, bandBytes at a time, into a window of window bytes (twice what a part reads at most), and
// after each band runs the kernels' parts whose bytes are all in, in order; then any left.
func (e *Executor) readBanded(ctx context.Context, reads []planner.Read, bands []planner.Band, out []byte,
	window int64,
) error {
	pooled := getBuf(window)
	defer putBuf(pooled)
	in := &bandReader{ctx: ctx, reads: reads, bands: bands, out: out, window: (*pooled)[:window]}
	for at := 0; at < len(reads); {
		k := at + 1
		for k < len(reads) && reads[k].Key == reads[at].Key && reads[k].Version == reads[at].Version {
			k++
		}
		ranges := make([]store.Range, 0, k-at)
		for _, r := range reads[at:k] {
			ranges = append(ranges, store.Range{Offset: r.Offset, Length: r.Length})
		}
		sec, err := e.sectioner.Section(ctx, reads[at].Key, reads[at].Version, ranges)
		if err != nil {
			return err
		}
		_, err = sec.WriteTo(in)
		if err = errors.Join(err, sec.Close()); err != nil {
			return err
		}
		if in.at != (filled{read: k}) { // short, or on past its ranges into the next file's
			return fmt.Errorf("%w: %q's section ended short of its ranges or past them", store.ErrChanged, reads[at].Key)
		}
		at = k
	}
	return in.run()
}

// bandReader is the writer a banded read's sections write to. Its window holds the bytes of one
// file from offset lo to hi; a byte goes in at its offset less lo (what lies between two reads is
// left as it was: no part reads it), and once the window is full it slides forward to the first
// byte a part not yet run reads. A file handed to ReadFrom is read straight into place.
type bandReader struct {
	ctx    context.Context // a stream stopped stops its reads between bands
	reads  []planner.Read
	at     filled
	bands  []planner.Band // the parts not yet run
	out    []byte
	window []byte
	key    string
	lo, hi int64
}

// place is where the next bytes go, at most n of them: the window's room at their file offset,
// no further than the read being filled.
func (b *bandReader) place(n int) []byte {
	r := &b.reads[b.at.read]
	off := r.Offset + b.at.done
	if r.Key != b.key {
		b.key, b.lo, b.hi = r.Key, off, off
	}
	if off-b.lo+int64(n) > int64(len(b.window)) {
		lo := off
		for _, band := range b.bands {
			if band.Key == b.key {
				lo = min(lo, band.Start)
			}
		}
		if lo < b.hi {
			copy(b.window, b.window[lo-b.lo:b.hi-b.lo])
		} else {
			b.hi = lo
		}
		b.lo = lo
	}
	// A part not yet run reads at most half the window, and bytes past off: the other half is
	// free.
	at := off - b.lo
	return b.window[at : at+min(int64(n), int64(len(b.window))-at, r.Length-b.at.done)]
}

// advance counts n bytes placed and runs the parts they complete.
func (b *bandReader) advance(n int) error {
	b.at.done += int64(n)
	b.hi = b.reads[b.at.read].Offset + b.at.done
	for b.at.read < len(b.reads) && b.at.done == b.reads[b.at.read].Length {
		b.at = filled{read: b.at.read + 1}
	}
	if err := b.ctx.Err(); err != nil {
		return err
	}
	return b.run()
}

// run runs the parts at the front whose bytes are all in.
func (b *bandReader) run() error {
	for len(b.bands) > 0 && b.at.covers(b.reads, b.bands[0].Key, b.bands[0].End) {
		if err := runKernels([]planner.Kernel{b.bands[0].Kernel}, b.out, b.files); err != nil {
			return err
		}
		b.bands = b.bands[1:]
	}
	return nil
}

// files finds the parts' bytes in the window.
func (b *bandReader) files(key string) tensor.Source {
	if key != b.key {
		return tensor.BytesSource{}
	}
	return tensor.BytesSource{Off: b.lo, Data: b.window[:b.hi-b.lo]}
}

func (b *bandReader) Write(p []byte) (int, error) {
	n := 0
	for n < len(p) {
		if b.at.read == len(b.reads) {
			return n, errors.New("internal error: a section wrote more than its ranges")
		}
		m := copy(b.place(len(p)-n), p[n:])
		n += m
		if err := b.advance(m); err != nil {
			return n, err
		}
	}
	return n, nil
}

func (b *bandReader) ReadFrom(r io.Reader) (int64, error) {
	var n int64
	for b.at.read < len(b.reads) {
		m, err := io.ReadFull(r, b.place(bandBytes))
		n += int64(m)
		if m > 0 {
			if err := b.advance(m); err != nil {
				return n, err
			}
		}
		if end, err := ended(err); end {
			return n, err
		}
	}
	return n, nil
}

// rectangle is the source bytes an item's segments share (planner.Item.Rectangle): read once, when
// the first of them starts, into a buffer charged to the whole budget together with the window of
// segment buffers produced from it (which then take nothing more from the budget: a stream holding
// a rectangle never waits on the budget for its segments, which would deadlock streams that hold
// rectangles), not to the stream's share; given back once the last segment is written. Its reads
// run in parallel and its segments' kernels once all are in: read in bands with the kernels
// started on each, it measured no faster (docs/performance.md).
type rectangle struct {
	reads   []planner.Read
	bytes   int64 // its charge
	started bool  // set by the stream's producer only
	ready   chan struct{}
	buf     *[]byte
	err     error
	left    atomic.Int64 // segments not yet done with it
}

// readRectangle reads a rectangle's reads in parallel, then marks it ready.
func (e *Executor) readRectangle(ctx context.Context, r *rectangle) {
	defer close(r.ready)
	last := r.reads[len(r.reads)-1]
	r.buf = getBuf(last.Dst + last.Length)
	into := (*r.buf)[:last.Dst+last.Length]
	g, gctx := errgroup.WithContext(ctx)
	e.readAll(g, gctx, r.reads, into)
	r.err = g.Wait()
}

// wait waits until the rectangle is read; its files are then its reads' bytes.
func (r *rectangle) wait(ctx context.Context) (planner.Files, error) {
	select {
	case <-r.ready:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if r.err != nil {
		return nil, r.err
	}
	return planner.SpanFiles(r.reads, (*r.buf)[:cap(*r.buf)]), nil
}

// doneWith marks one of a rectangle's segments done with it; the last gives back its buffer and
// its memory once its reads have returned, without waiting for them.
func (e *Executor) doneWith(r *rectangle) {
	if r.left.Add(-1) != 0 {
		return
	}
	go func() {
		<-r.ready
		putBuf(r.buf)
		e.memory.Release(r.bytes)
	}()
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

// hasher feeds a stream's body to a hash in order, on a goroutine of its own. The writer hands it
// each piece before writing it, then what gives the piece's memory back, which runs once every
// piece before it is hashed. Its methods on a nil hasher (a stream that does not hash) pass the
// bytes by: add runs then at once, chunk and unchunk are the pool's.
type hasher struct {
	h      hash.Hash
	todo   chan piece
	done   chan struct{}
	chunks chan struct{} // a token per copy buffer held: one, or copyChunks with the lag charged
	lag    int64         // the memory charged for the copy buffers beyond the first
	skip   atomic.Bool   // the body will not be whole: give back, do not hash
	closed bool
}

type piece struct {
	b    []byte
	then func()
}

// newHasher returns a hasher into h, to run once its stream is admitted (and charged its lag).
func newHasher(h hash.Hash) *hasher {
	return &hasher{h: h, todo: make(chan piece, 16), done: make(chan struct{}), chunks: make(chan struct{}, 1)}
}

// run hashes until the stream ends, then gives back the lag's memory to mem.
func (hs *hasher) run(mem *budget.Budget) {
	defer close(hs.done)
	defer mem.Release(hs.lag)
	for p := range hs.todo {
		if len(p.b) > 0 && !hs.skip.Load() {
			hs.h.Write(p.b)
		}
		if p.then != nil {
			p.then()
		}
	}
}

// add hands b to the hasher, to be hashed after everything added before it, and then to run after
// that.
func (hs *hasher) add(b []byte, then func()) {
	if hs == nil {
		if then != nil {
			then()
		}
		return
	}
	hs.todo <- piece{b, then}
}

// chunk is a copy buffer, once the hasher has given back enough of those before it.
func (hs *hasher) chunk() *[]byte {
	if hs != nil {
		hs.chunks <- struct{}{}
	}
	return getBuf(copyBytes)
}

func (hs *hasher) unchunk(b *[]byte) {
	putBuf(b)
	if hs != nil {
		<-hs.chunks
	}
}

// sum waits for the hashing to end and returns the hash.
func (hs *hasher) sum() []byte {
	hs.finish()
	return hs.h.Sum(nil)
}

// abandon ends the hashing without hashing what is left; what it holds is given back.
func (hs *hasher) abandon() {
	if hs != nil {
		hs.skip.Store(true)
		hs.finish()
	}
}

func (hs *hasher) finish() {
	if !hs.closed {
		hs.closed = true
		close(hs.todo)
	}
	<-hs.done
}
