// Package cluster makes the replicas of one deployment share one cache: Store, a store decorator
// under each replica's chunk cache, sends every chunk the cache misses to the chunk's owner on a
// consistent-hash ring of the replicas, so only the owner reads it from storage — once, however
// many replicas ask — and the others get it from the owner.
//
// Both halves of the peer protocol live here, as groupcache keeps its HTTPPool's ServeHTTP beside
// its getter: Store fetches chunks from their owners, Handler answers the peer route from this
// replica's cache and warms chunks on their owners for prefetches, so a change to the protocol is
// made in one package. internal/server only mounts Handler behind the peers' secret and writes its
// errors as problems. Discovery keeps a Store's peers current, run by serve's lifecycle.
//
// # The engine: github.com/golang/groupcache
//
// The engine is an existing one, weighed against what shardsrv needs: a byte-bounded
// LRU, context cancellation, per-peer time-outs, peers that change at run time, MiB-sized values
// and metrics.
//
//   - golang/groupcache does the load this needs — pick the key's owner, ask it, and on any peer
//     failure load locally — in Group, with a singleflight per key, a ring (consistenthash),
//     pluggable PeerPicker and ProtoGetter interfaces, contexts passed down to both, and Stats.
//     Where it falls short: its LRU is bounded in bytes but holds no references (an evicted value
//     in use lives on past the bound) and copies values in and out; a waiter cannot leave its
//     singleflight, whose leader's context is every waiter's; its HTTPPool can be made once per
//     process (a global peer picker), checks no credential, bounds nothing, answers every error
//     as a 500 and frames each value in protobuf; nothing times out one peer or counts per peer.
//     Peers do change at run time (HTTPPool.Set).
//   - Its maintained forks, which remove the global state and add per-peer options and metrics —
//     mailgun/groupcache/v2, its successor groupcache/groupcache-go/v3, vimeo/galaxycache — are
//     not served by the module proxy this project builds from: they are out.
//
// So shardsrv builds on golang/groupcache's Group, ring and interfaces, and brings the rest:
//
//   - One LRU per replica, internal/cache's, above this store: the group caches nothing itself
//     (cacheBytes 0). An owner keeps its chunks in its chunk cache, bounded in bytes with reference
//     counts, and the peer route (Handler) reads them through it, so a chunk is held once
//     per replica and concurrent asks for it share the cache's one fill.
//   - The transport: a PeerPicker over the ring whose peers are set at run time (SetPeers; the
//     --peers-dns watch) and which leaves a peer that failed to answer out for DownFor, telling
//     the peers it asks (DownHeader), and a ProtoGetter that speaks the peer route (PeerPath): a
//     bearer shared secret, raw bytes of an exact length, a time-out per fetch, per-peer metrics
//     and a span. The unit asked for is a run of adjacent chunks with one owner (the cache cuts
//     its runs there: Split), so the owner reads a run from storage in one request.
//   - The group is registered under a name of its own through groupcache's per-group picker hook,
//     so several Stores (the replicas of a test) live in one process.
//   - Cancellation: the cache's fills, this store's callers, run detached from any one client, so
//     the context a singleflight shares is never a client's that may leave.
//
// Versions hold: a chunk is named by key, version and range, and its owner reads it with that
// version (If-Match on object stores), so a peer answers with the bytes of the version asked or an
// error, never another version's bytes. A chunk a peer asks for is read here from storage, never
// sent on (forPeer), and a replica refuses chunks it does not own (Owns) or waits for a peer in
// its ring to give (Waits). A fill waits for one stripe's owner only (Split), and a wait for a
// peer ends the moment that peer is found down or leaves the peers. So replicas that disagree
// about the ring for a moment cost a read, never a loop or two fills waiting for each other, and
// when a replica dies its peers take its stripes over without reading any twice: a survivor whose
// fetch broke asks the stripe's new owner, and the new owner, told the dead replica is down, ends
// its own wait for it and lets the asker join the read it then makes.
package cluster

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/binary"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/golang/groupcache"
	"github.com/golang/groupcache/consistenthash"
	pb "github.com/golang/groupcache/groupcachepb"
	"go.opentelemetry.io/otel/metric"
	metricnoop "go.opentelemetry.io/otel/metric/noop"
	"go.opentelemetry.io/otel/trace"
	tracenoop "go.opentelemetry.io/otel/trace/noop"
	"golang.org/x/sync/errgroup"

	"github.com/shardsrv/shardsrv/internal/store"
)

// DownFor is how long a peer that failed to answer is left out of the ring: its chunks go to the
// next owner meanwhile, so a dead replica costs the fetches in flight when it died, not a time-out
// per chunk.
const DownFor = 10 * time.Second

// DefaultStripeBytes is the unit of ownership unless Options say otherwise (see Store.stripe).
const DefaultStripeBytes = 4 << 20

// ringReplicas is the points each peer takes on the ring: enough that three peers own shares
// within a few percent of a third.
const ringReplicas = 160

// ringHash places peers and chunks on the ring. consistenthash's default, CRC-32, is linear: peers
// whose URLs differ in a digit or two (the ports of one host) land on correlated points and own
// lopsided shares. SHA-256 spreads them; every replica computes the same.
func ringHash(b []byte) uint32 {
	h := sha256.Sum256(b)
	return binary.BigEndian.Uint32(h[:4])
}

// Options configure a Store. A field left at zero takes its default, but ChunkBytes, which is
// required.
type Options struct {
	// Self is this replica's base URL as its peers reach it (--advertise); "" when it runs alone.
	Self string
	// ChunkBytes is the chunk cache's chunk above this store. It has no default: it must be the
	// chunk of the cache above, which New cannot know.
	ChunkBytes int64
	// StripeBytes is the unit of ownership, rounded up to whole chunks (0: DefaultStripeBytes).
	StripeBytes int64
	// Token is the shared secret presented to peers (nil: none, for a replica alone).
	Token func() string
	// Timeout bounds one fetch from a peer, from dialling to the last byte; past it the chunk is
	// read from storage here (zero: DefaultTimeout).
	Timeout time.Duration
	// ConnectTimeout bounds connecting to a peer, within Timeout; a peer not connected by then is
	// found down (zero: DefaultConnectTimeout).
	ConnectTimeout time.Duration
	// TLS is how https:// peers are reached (nil: the system's roots, no client certificate).
	TLS *tls.Config
	// Tracer and Meter default to no-ops, Logger to discarding what it is given.
	Tracer trace.TracerProvider
	Meter  metric.MeterProvider
	Logger *slog.Logger
}

// Validate reports options no Store can run with: no chunk, negative sizes and time-outs, a Self
// that is no base URL.
func (o *Options) Validate() error {
	if o.ChunkBytes <= 0 || o.StripeBytes < 0 || o.Timeout < 0 || o.ConnectTimeout < 0 {
		return fmt.Errorf("cluster: chunk size %d must be positive, stripe %d and peer time-outs %s and %s "+
			"not negative", o.ChunkBytes, o.StripeBytes, o.Timeout, o.ConnectTimeout)
	}
	if o.Self != "" {
		if _, err := Normalize(o.Self); err != nil {
			return err
		}
	}
	return nil
}

// Store reads chunks through their owners. Reads without a version pass through: without one, no
// two replicas can know they mean the same bytes.
type Store struct {
	// Forwarder is the store below: Stat, List, Check and its alignment pass to it, and every
	// chunk this replica reads itself is a ReadAt of it.
	store.Forwarder
	opts Options
	// stripe is the unit of ownership: the chunks of one stripe have one owner, so a run is asked
	// of one replica in one request however small the chunks, and a signed shard (a power of two
	// up to verify.MaxShardBytes, the verifying store's unit of reading) lies in one stripe, never
	// read whole by two owners. Small enough that a tensor's stripes spread over the replicas.
	stripe int64
	group  *groupcache.Group
	client *http.Client
	tracer trace.Tracer
	m      *metrics

	mu      sync.Mutex
	peers   []string                // as set, normalized and sorted
	down    map[string]time.Time    // peer → when it rejoins the ring
	waiting map[string][]*fetchWait // chunk → the fetches from peers under way for it
	ring    *consistenthash.Map     // over the peers that are not down
	shared  bool                    // the ring holds a peer besides this replica
	revive  time.Time               // the earliest down mark that ends; zero when none

	peerLoads, storageLoads, storageBytes, peerErrors atomic.Int64
}

var (
	_ store.Store           = (*Store)(nil)
	_ store.Aligner         = (*Store)(nil)
	_ groupcache.PeerPicker = (*Store)(nil)
	_ store.Splitter        = (*Store)(nil)
)

// Groups are registered once per process under unique names; the picker hook finds each one's
// Store by its group's name.
var (
	registerOnce sync.Once
	stores       sync.Map // group name → *Store
	groupSeq     atomic.Int64
)

// New wraps inner, or returns what Validate refuses. Until SetPeers names other replicas, every
// chunk is read from inner.
func New(inner store.Store, opts Options) (*Store, error) {
	if err := opts.Validate(); err != nil {
		return nil, err
	}
	if opts.Timeout == 0 {
		opts.Timeout = DefaultTimeout
	}
	if opts.ConnectTimeout == 0 {
		opts.ConnectTimeout = DefaultConnectTimeout
	}
	if opts.Self != "" {
		opts.Self, _ = Normalize(opts.Self)
	}
	if opts.Token == nil {
		opts.Token = func() string { return "" }
	}
	if opts.Tracer == nil {
		opts.Tracer = tracenoop.NewTracerProvider()
	}
	if opts.Meter == nil {
		opts.Meter = metricnoop.NewMeterProvider()
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Store{
		Forwarder: store.Forwarder{Next: inner},
		opts:      opts,
		stripe:    (cmp.Or(opts.StripeBytes, DefaultStripeBytes) + opts.ChunkBytes - 1) / opts.ChunkBytes * opts.ChunkBytes,
		client:    newClient(opts.ConnectTimeout, opts.TLS),
		tracer:    opts.Tracer.Tracer("shardsrv/cluster"),
		down:      map[string]time.Time{},
		waiting:   map[string][]*fetchWait{},
		ring:      consistenthash.New(ringReplicas, ringHash),
	}
	registerOnce.Do(func() {
		groupcache.RegisterPerGroupPeerPicker(func(name string) groupcache.PeerPicker {
			s, _ := stores.Load(name)
			return s.(*Store)
		})
	})
	name := "shardsrv-" + strconv.FormatInt(groupSeq.Add(1), 10)
	stores.Store(name, s)
	s.group = groupcache.NewGroup(name, 0, groupcache.GetterFunc(s.load))
	var err error
	if s.m, err = newMetrics(opts.Meter, s); err != nil {
		return nil, err
	}
	return s, nil
}

// newClient is the peers' HTTP client: no proxy (peers are pod addresses, never behind the one
// the object store may need), connecting bounded by connect, and enough idle connections for the
// fills one replica has in flight to one owner. A killed replica refuses connections at once; a
// lost host drops them, and connect is how long a fetch waits for it before it is found down.
func newClient(connect time.Duration, tlsConfig *tls.Config) *http.Client {
	return &http.Client{Transport: &http.Transport{
		TLSClientConfig:     tlsConfig,
		DialContext:         (&net.Dialer{Timeout: connect, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConnsPerHost: 64,
		IdleConnTimeout:     90 * time.Second,
	}}
}

// Normalize is a peer's base URL as the ring names it: scheme and host in lower case, no path.
func Normalize(raw string) (string, error) {
	scheme, rest, ok := strings.Cut(strings.TrimSpace(raw), "://")
	host := strings.TrimRight(rest, "/")
	scheme = strings.ToLower(scheme)
	if !ok || (scheme != "http" && scheme != "https") || host == "" || strings.ContainsAny(host, "/?#@ ") {
		return "", fmt.Errorf("peer %q is not a base URL such as http://10.0.0.7:8080", raw)
	}
	return scheme + "://" + strings.ToLower(host), nil
}

// SetPeers makes urls the replicas (this one included, when it owns chunks); peers that are gone
// lose their down marks, and the fetches from them under way end. Invalid URLs are skipped: what discovery finds is not trusted to parse.
func (s *Store) SetPeers(urls []string) {
	var peers []string
	for _, u := range urls {
		if p, err := Normalize(u); err == nil && !slices.Contains(peers, p) {
			peers = append(peers, p)
		}
	}
	slices.Sort(peers)
	s.mu.Lock()
	defer s.mu.Unlock()
	if slices.Equal(peers, s.peers) {
		return
	}
	s.peers = peers
	for p := range s.down {
		if !slices.Contains(peers, p) {
			delete(s.down, p)
		}
	}
	s.rebuildLocked()
	s.endWaitsLocked(func(p string) bool { return !slices.Contains(peers, p) })
	s.opts.Logger.Info("cluster peers changed", "peers", peers, "self", s.opts.Self)
}

// Peers returns the replicas as last set.
func (s *Store) Peers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Clone(s.peers)
}

// Self is this replica's base URL.
func (s *Store) Self() string { return s.opts.Self }

// rebuildLocked builds the ring over the peers that are not down; s.mu is held.
func (s *Store) rebuildLocked() {
	s.ring = consistenthash.New(ringReplicas, ringHash)
	s.shared, s.revive = false, time.Time{}
	for _, p := range s.peers {
		if until, down := s.down[p]; down {
			if s.revive.IsZero() || until.Before(s.revive) {
				s.revive = until
			}
			continue
		}
		s.ring.Add(p)
		s.shared = s.shared || p != s.opts.Self
	}
}

// reviveLocked lets peers whose down time is over back into the ring; s.mu is held.
func (s *Store) reviveLocked(now time.Time) {
	if s.revive.IsZero() || now.Before(s.revive) {
		return
	}
	for p, until := range s.down {
		if !now.Before(until) {
			delete(s.down, p)
		}
	}
	s.rebuildLocked()
}

// markDown leaves peer out of the ring for DownFor and ends the fetches from it under way: a
// peer that hangs instead of breaking its connections would otherwise hold them, and every
// replica that joined the fills waiting for them, until the time-out.
func (s *Store) markDown(peer string, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if _, down := s.down[peer]; down || !slices.Contains(s.peers, peer) {
		return
	}
	s.down[peer] = time.Now().Add(DownFor)
	s.rebuildLocked()
	s.endWaitsLocked(func(p string) bool { return p == peer })
	s.opts.Logger.Warn("cluster peer did not answer: its chunks are read elsewhere for a while", "peer", peer,
		"for", DownFor.String(), "err", err)
}

// fetchWait is a fetch from a peer under way.
type fetchWait struct {
	peer   string
	ids    []string // the chunks it fetches
	cancel context.CancelFunc
}

// fetchWaiting fetches c from peer, noting meanwhile that this replica waits for it: its peer
// route refuses c meanwhile (Waits), so that no two replicas wait for each other's fills. The
// fetch ends when the peer is marked down or leaves the peers, so whoever waits for it moves on
// at once.
func (s *Store) fetchWaiting(ctx context.Context, peer string, c Chunk) ([]byte, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	w := &fetchWait{peer: peer, ids: s.chunkIDs(c), cancel: cancel}
	s.mu.Lock()
	for _, id := range w.ids {
		s.waiting[id] = append(s.waiting[id], w)
	}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		for _, id := range w.ids {
			if ws := slices.DeleteFunc(s.waiting[id], func(o *fetchWait) bool { return o == w }); len(ws) > 0 {
				s.waiting[id] = ws
			} else {
				delete(s.waiting, id)
			}
		}
	}()
	b, _, err := s.fetch(ctx, peer, c, false)
	return b, err
}

// endWaitsLocked ends the fetches under way from the peers gone says have left; s.mu is held.
func (s *Store) endWaitsLocked(gone func(peer string) bool) {
	for _, ws := range s.waiting {
		for _, w := range ws {
			if gone(w.peer) {
				w.cancel()
			}
		}
	}
}

// Waits reports whether this replica waits for a peer in the ring to give any chunk of c. A wait
// for a peer that is down or gone ends at once (markDown), after which this replica reads the
// chunk itself if it owns it now: a peer asking for c meanwhile joins that read.
func (s *Store) Waits(c Chunk) bool {
	ids := s.chunkIDs(c)
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reviveLocked(time.Now())
	for _, id := range ids {
		for _, w := range s.waiting[id] {
			if _, down := s.down[w.peer]; !down && slices.Contains(s.peers, w.peer) {
				return true
			}
		}
	}
	return false
}

// chunkIDs names the chunks c touches.
func (s *Store) chunkIDs(c Chunk) []string {
	var ids []string
	for off := c.Offset; off < c.Offset+c.Length; off = s.chunkEnd(off) {
		ids = append(ids, c.Key+"\x00"+c.Version+"\x00"+strconv.FormatInt(off/s.opts.ChunkBytes, 10))
	}
	return ids
}

// downPeers lists the peers left out of the ring now.
func (s *Store) downPeers() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reviveLocked(time.Now())
	return slices.Sorted(maps.Keys(s.down))
}

// Heard takes a peer's DownHeader: the peers it found down are left out here too, but never this
// replica itself.
func (s *Store) Heard(header string) {
	for p := range strings.SplitSeq(header, ",") {
		if p, err := Normalize(p); err == nil && p != s.opts.Self {
			s.markDown(p, errors.New("a peer found it down"))
		}
	}
}

// Owner returns the replica that owns the stripe c.Offset is in, and whether it is this one (also
// when no peer is known).
func (s *Store) Owner(c Chunk) (peer string, self bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reviveLocked(time.Now())
	peer = s.ring.Get(c.Key + "\x00" + c.Version + "\x00" + strconv.FormatInt(c.Offset/s.stripe, 10))
	if peer == "" {
		peer = s.opts.Self
	}
	return peer, peer == s.opts.Self
}

// Owns reports whether this replica owns every chunk of c. A peer that asks it for a chunk it does
// not own sees the ring otherwise, as happens for a moment when a replica joins or leaves: told so
// at once, the peer reads the chunk from storage, where both could wait for each other's fill.
func (s *Store) Owns(c Chunk) bool {
	for off := c.Offset; off < c.Offset+c.Length; off = (off/s.stripe + 1) * s.stripe {
		if _, self := s.Owner(Chunk{Key: c.Key, Version: c.Version, Offset: off}); !self {
			return false
		}
	}
	return true
}

func (s *Store) isShared() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.reviveLocked(time.Now())
	return s.shared
}

// PickPeer implements groupcache.PeerPicker.
func (s *Store) PickPeer(key string) (groupcache.ProtoGetter, bool) {
	c, err := parseGroupKey(key)
	if err != nil {
		return nil, false
	}
	peer, self := s.Owner(c)
	if self {
		return nil, false
	}
	return peerGetter{s: s, peer: peer, c: c}, true
}

// peerGetter fetches one chunk from its owner for the group; a failure makes the group read it here.
type peerGetter struct {
	s    *Store
	peer string
	c    Chunk
}

func (g peerGetter) Get(ctx context.Context, _ *pb.GetRequest, out *pb.GetResponse) error {
	b, err := g.s.fetchWaiting(ctx, g.peer, g.c)
	// A peer found gone has left the ring: the run's new owner is asked, once, where each replica
	// that found the peer gone would otherwise read the run from storage.
	if next, self := g.s.Owner(g.c); err != nil && !self && next != g.peer {
		b, err = g.s.fetchWaiting(ctx, next, g.c)
	}
	if err != nil {
		g.s.peerErrors.Add(1)
		return err
	}
	g.s.peerLoads.Add(1)
	g.s.m.chunk(ctx, "peer")
	out.Value = b
	return nil
}

// Warm asks peer to bring chunk c into its cache, sending nothing back, and returns the bytes the
// peer read from storage for it: 0 when it had the chunk, or another fill of it was under way.
func (s *Store) Warm(ctx context.Context, peer string, c Chunk) (int64, error) {
	_, filled, err := s.fetch(ctx, peer, c, true)
	return filled, err
}

// ReadAt implements store.Store: the part in each stripe from the stripe's owner, in one request.
// The cache above asks for one stripe at a time (Split).
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if version == "" || len(p) == 0 || fromPeer(ctx) || !s.isShared() {
		return s.readStorage(ctx, key, version, p, off)
	}
	g, gctx := errgroup.WithContext(ctx)
	end := off + int64(len(p))
	for lo := off; lo < end; {
		hi := min(end, (lo/s.stripe+1)*s.stripe)
		dst := p[lo-off : hi-off]
		c := Chunk{Key: key, Version: version, Offset: lo, Length: hi - lo}
		g.Go(func() error { return s.group.Get(gctx, c.groupKey(), groupcache.TruncatingByteSliceSink(&dst)) })
		lo = hi
	}
	return g.Wait()
}

// chunkEnd is where the chunk holding off ends.
func (s *Store) chunkEnd(off int64) int64 { return (off/s.opts.ChunkBytes + 1) * s.opts.ChunkBytes }

// Stripe is the unit of ownership: the most a peer is asked for in one request.
func (s *Store) Stripe() int64 { return s.stripe }

// Split implements store.Splitter: a run ends where a stripe does. A fill then waits for one
// owner only, so the peer route, which joins the fills under way, never makes a replica wait for
// a fill that waits for the asker in turn. Cut only where the owner changes, a run could span two
// stripes whose owners change when a replica dies, and two survivors' fills would wait for each
// other; cut only while there are peers, a fill begun alone could span two owners found since.
func (s *Store) Split(_, _ string, off int64) bool { return off%s.stripe == 0 }

// load is the group's getter: a chunk this replica owns, or one its owner did not give, read from
// storage.
func (s *Store) load(ctx context.Context, key string, dest groupcache.Sink) error {
	c, err := parseGroupKey(key)
	if err != nil {
		return err
	}
	buf := make([]byte, c.Length)
	if err := s.readStorage(ctx, c.Key, c.Version, buf, c.Offset); err != nil {
		return err
	}
	return dest.SetBytes(buf)
}

// readStorage reads from the store below, counting what it read, also into the context's fill
// counter (countFills).
func (s *Store) readStorage(ctx context.Context, key, version string, p []byte, off int64) error {
	if err := s.Next.ReadAt(ctx, key, version, p, off); err != nil {
		return err
	}
	s.storageLoads.Add(1)
	s.storageBytes.Add(int64(len(p)))
	if n, ok := ctx.Value(fillsKey{}).(*atomic.Int64); ok {
		n.Add(int64(len(p)))
	}
	s.m.chunk(ctx, "storage")
	return nil
}

// Stats are the store's counters since it started.
type Stats struct {
	PeerLoads    int64 // runs of chunks a peer gave
	PeerErrors   int64 // peer fetches that failed, whose runs were then read here
	StorageLoads int64 // reads from the store below
	StorageBytes int64
	Peers        int // replicas in the ring now, this one included
}

// Stats returns the counters.
func (s *Store) Stats() Stats {
	s.mu.Lock()
	peers := len(s.peers) - len(s.down)
	s.mu.Unlock()
	return Stats{
		PeerLoads:    s.peerLoads.Load(),
		PeerErrors:   s.peerErrors.Load(),
		StorageLoads: s.storageLoads.Load(),
		StorageBytes: s.storageBytes.Load(),
		Peers:        peers,
	}
}

type fromPeerKey struct{}

// forPeer marks a read a peer asked for: it is read from storage here, never sent on.
func forPeer(ctx context.Context) context.Context {
	return context.WithValue(ctx, fromPeerKey{}, true)
}

func fromPeer(ctx context.Context) bool { return ctx.Value(fromPeerKey{}) != nil }

type fillsKey struct{}

// countFills returns a context under which the bytes a Store reads from storage are added to n:
// what a prefetch filled, as opposed to found cached or already on its way. The cache's fills keep
// their caller's context values, so the count reaches through it.
func countFills(ctx context.Context, n *atomic.Int64) context.Context {
	return context.WithValue(ctx, fillsKey{}, n)
}
