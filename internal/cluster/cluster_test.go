package cluster_test

import (
	"bytes"
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

const (
	chunk = 4 << 10
	token = "peer-secret"
)

// replica is one server's store stack — chunk cache over the cluster store over the shared
// storage — and its peer route as internal/server mounts it: the token checked, then
// cluster.Handler, its errors written as statuses.
type replica struct {
	cl   *cluster.Store
	top  *cache.Store
	h    *cluster.Handler
	srv  *httptest.Server
	hold chan struct{} // when not nil, the peer route waits on it: a stalled peer
}

func newReplica(t *testing.T, storage store.Store, timeout time.Duration) *replica {
	return newReplicaOn(t, nil, storage, timeout, 0)
}

// newReplicaOn is newReplica serving on ln (nil: a listener of its own), connecting to its peers
// within connect (0: the default).
func newReplicaOn(t *testing.T, ln net.Listener, storage store.Store, timeout, connect time.Duration) *replica {
	t.Helper()
	r := &replica{}
	r.srv = httptest.NewUnstartedServer(http.HandlerFunc(r.serve))
	if ln != nil {
		r.srv.Listener.Close()
		r.srv.Listener = ln
	}
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	var err error
	r.cl, err = cluster.New(storage, cluster.Options{Self: r.srv.URL, ChunkBytes: chunk, StripeBytes: chunk,
		Timeout: timeout, ConnectTimeout: connect, Token: func() string { return token }})
	if err != nil {
		t.Fatal(err)
	}
	if r.top, err = cache.New(r.cl, cache.Config{Bytes: 64 << 20, ChunkBytes: chunk}, nil); err != nil {
		t.Fatal(err)
	}
	r.h = cluster.NewHandler(r.cl, r.top)
	return r
}

func (r *replica) serve(w http.ResponseWriter, req *http.Request) {
	if r.hold != nil {
		select {
		case <-r.hold:
		case <-req.Context().Done():
			return
		}
	}
	if req.URL.Path != cluster.PeerPath || req.Header.Get("Authorization") != "Bearer "+token {
		http.Error(w, "no", http.StatusUnauthorized)
		return
	}
	if err := r.h.ServeChunk(w, req, 0); err != nil {
		var qerr *cluster.QueryError
		status := http.StatusBadGateway
		switch {
		case errors.As(err, &qerr):
			status = http.StatusBadRequest
		case errors.Is(err, cluster.ErrNotOwner):
			status = http.StatusMisdirectedRequest
		case errors.Is(err, store.ErrChanged):
			status = http.StatusConflict
		}
		http.Error(w, err.Error(), status)
	}
}

// cluster starts n replicas over one counting local store holding data as "m/f".
func newCluster(t *testing.T, n int, timeout time.Duration, data []byte) ([]*replica, *storetest.Counting,
	func(string, []byte)) {
	local, put := storetest.Local(t)
	put("m/f", data)
	counting := storetest.NewCounting(local)
	var rs []*replica
	var urls []string
	for range n {
		r := newReplica(t, counting, timeout)
		rs = append(rs, r)
		urls = append(urls, r.srv.URL)
	}
	for _, r := range rs {
		r.cl.SetPeers(urls)
	}
	return rs, counting, put
}

func pattern(n int) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31 + i/7)
	}
	return b
}

func version(t *testing.T, s store.Store) string {
	info, err := s.Stat(context.Background(), "m/f")
	if err != nil {
		t.Fatal(err)
	}
	return info.Version
}

func TestEveryChunkIsReadFromStorageOnce(t *testing.T) {
	data := pattern(100_003)
	rs, counting, _ := newCluster(t, 3, 5*time.Second, data)
	v := version(t, rs[0].top)
	var wg sync.WaitGroup
	for i := range 12 { // four clients on each replica, all at once
		wg.Go(func() {
			p := make([]byte, len(data))
			if err := rs[i%3].top.ReadAt(context.Background(), "m/f", v, p, 0); err != nil || !bytes.Equal(p, data) {
				t.Errorf("client %d: %v (bytes equal: %v)", i, err, bytes.Equal(p, data))
			}
		})
	}
	wg.Wait()
	if got := counting.Bytes(); got != int64(len(data)) {
		t.Errorf("storage read %d bytes for a file of %d on three replicas", got, len(data))
	}
	for i, r := range rs {
		if st := r.cl.Stats(); st.PeerLoads == 0 || st.StorageLoads == 0 || st.PeerErrors != 0 || st.Peers != 3 {
			t.Errorf("replica %d: %+v; each owns a share and gets the rest from its peers", i, st)
		}
	}
}

// readWithin is the deadline of a read in these tests: far past what a read takes and far below
// the hour-long peer time-outs some of them set, so a read that waited for one fails with it.
const readWithin = 30 * time.Second

func TestADeadPeerCostsBytesNotAFailure(t *testing.T) {
	data := pattern(64 * chunk)
	rs, counting, put := newCluster(t, 2, time.Hour, data)
	put("m/g", data)
	rs[1].srv.CloseClientConnections()
	rs[1].srv.Close()
	ctx, cancel := context.WithTimeout(context.Background(), readWithin)
	defer cancel()
	var errs int64
	for _, key := range []string{"m/f", "m/g"} {
		info, _ := rs[0].top.Stat(context.Background(), key)
		p := make([]byte, len(data))
		if err := rs[0].top.ReadAt(ctx, key, info.Version, p, 0); err != nil || !bytes.Equal(p, data) {
			t.Fatalf("ReadAt with a dead peer: %v; a dead peer is skipped at once, not waited for", err)
		}
		if key == "m/f" {
			errs = rs[0].cl.Stats().PeerErrors
		}
	}
	// The fetches in flight when the peer was found dead fail; once it is out, none is tried.
	st := rs[0].cl.Stats()
	if st.Peers != 1 || errs == 0 || st.PeerErrors != errs || counting.Bytes() != int64(2*len(data)) {
		t.Errorf("%+v, %d bytes read: the dead peer is left out after its first failures", st, counting.Bytes())
	}
}

// The stalled peer never answers: the read ends, within its deadline, only by the 200 ms peer
// time-out, which leaves the peer out.
func TestASlowPeerIsSkippedWithinTheTimeout(t *testing.T) {
	data := pattern(64 * chunk) // 64 stripes: the stalled peer owns some
	rs, _, _ := newCluster(t, 2, 200*time.Millisecond, data)
	rs[1].hold = make(chan struct{})
	defer close(rs[1].hold)
	v := version(t, rs[0].top)
	ctx, cancel := context.WithTimeout(context.Background(), readWithin)
	defer cancel()
	p := make([]byte, len(data))
	if err := rs[0].top.ReadAt(ctx, "m/f", v, p, 0); err != nil || !bytes.Equal(p, data) {
		t.Fatalf("ReadAt with a stalled peer: %v", err)
	}
	if st := rs[0].cl.Stats(); st.PeerErrors == 0 || st.Peers != 1 {
		t.Errorf("%+v: the fetches from the stalled peer time out and leave it out", st)
	}
}

// A replica waiting for a hung peer refuses that chunk to its own peers (Waits) until the hung
// peer is found down — told by another replica — or leaves the peers; then the fetch ends at once,
// not at the time-out, and the replica reads the chunk itself.
func TestAWaitForAHungPeerEndsWhenItIsFoundDown(t *testing.T) {
	for _, how := range []string{"found down", "gone from the peers"} {
		t.Run(how, func(t *testing.T) {
			data := pattern(8 * chunk)
			rs, _, _ := newCluster(t, 2, time.Hour, data)
			rs[1].hold = make(chan struct{})
			defer close(rs[1].hold)
			v := version(t, rs[0].top)
			var c cluster.Chunk // one of rs[1]'s
			for off := int64(0); off < int64(len(data)); off += chunk {
				if owner, self := rs[0].cl.Owner(cluster.Chunk{Key: "m/f", Version: v, Offset: off}); !self &&
					owner == rs[1].srv.URL {
					c = cluster.Chunk{Key: "m/f", Version: v, Offset: off, Length: chunk}
					break
				}
			}
			if c.Length == 0 {
				t.Fatal("the second replica owns no chunk")
			}
			// The peer time-out is an hour: a read that ends within its deadline ended because
			// the peer was found down.
			ctx, cancel := context.WithTimeout(context.Background(), readWithin)
			defer cancel()
			done := make(chan error, 1)
			p := make([]byte, chunk)
			go func() { done <- rs[0].top.ReadAt(ctx, c.Key, v, p, c.Offset) }()
			for deadline := time.Now().Add(30 * time.Second); !rs[0].cl.Waits(c); time.Sleep(time.Millisecond) {
				if time.Now().After(deadline) {
					t.Fatal("the replica never waited for its peer")
				}
			}
			if how == "found down" {
				rs[0].cl.Heard(rs[1].srv.URL)
			} else {
				rs[0].cl.SetPeers([]string{rs[0].srv.URL})
			}
			if rs[0].cl.Waits(c) {
				t.Error("still refusing the chunk after its owner was " + how)
			}
			if err := <-done; err != nil || !bytes.Equal(p, data[c.Offset:c.Offset+chunk]) {
				t.Errorf("read: %v; the wait for a peer %s ends at once", err, how)
			}
		})
	}
}

// A live peer slow to take connections — its process too busy to accept them, its accept queue
// full — is waited for within the peer time-out, however long connecting takes: it is not found
// down, and the chunk it owns is read from storage once, by it.
func TestAPeerSlowToConnectIsNotFoundDown(t *testing.T) {
	data := pattern(8 * chunk)
	local, put := storetest.Local(t)
	put("m/f", data)
	counting := storetest.NewCounting(local)
	ln, accept := queueOfOne(t)
	rs := []*replica{newReplica(t, counting, time.Hour), newReplicaOn(t, ln, counting, time.Hour, 0)}
	for _, r := range rs {
		r.cl.SetPeers([]string{rs[0].srv.URL, rs[1].srv.URL})
	}
	v := version(t, rs[0].top)
	var c cluster.Chunk // one of rs[1]'s
	for off := int64(0); off < int64(len(data)) && c.Length == 0; off += chunk {
		if owner, _ := rs[0].cl.Owner(cluster.Chunk{Key: "m/f", Version: v, Offset: off}); owner == rs[1].srv.URL {
			c = cluster.Chunk{Key: "m/f", Version: v, Offset: off, Length: chunk}
		}
	}
	if c.Length == 0 {
		t.Fatal("the second replica owns no chunk")
	}
	// The one connection the accept queue holds is taken: the fetch's connection is pending until
	// the peer accepts, 2 s into the fetch (a connect bounded by 1 s of its own failed here).
	filler, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	ctx, cancel := context.WithTimeout(context.Background(), readWithin)
	defer cancel()
	done := make(chan error, 1)
	p := make([]byte, chunk)
	go func() { done <- rs[0].top.ReadAt(ctx, c.Key, v, p, c.Offset) }()
	for deadline := time.Now().Add(30 * time.Second); !rs[0].cl.Waits(c); time.Sleep(time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the replica never asked its peer")
		}
	}
	time.Sleep(2 * time.Second)
	close(accept)
	if err := <-done; err != nil || !bytes.Equal(p, data[c.Offset:c.Offset+chunk]) {
		t.Fatalf("read: %v", err)
	}
	if st := rs[0].cl.Stats(); st.PeerErrors != 0 || st.PeerLoads != 1 || st.Peers != 2 || counting.Bytes() != chunk {
		t.Errorf("%+v, storage read %d bytes: the slow peer gives its chunk, read once", st, counting.Bytes())
	}
}

// A peer that takes no connection — its host lost, the packets dropped — is found down once
// connecting has taken the connect time-out, far inside the fetch's: the chunk it owns is read
// from storage here, and the peer leaves the ring.
func TestAPeerThatNeverConnectsIsFoundDown(t *testing.T) {
	data := pattern(8 * chunk)
	local, put := storetest.Local(t)
	put("m/f", data)
	counting := storetest.NewCounting(local)
	ln, accept := queueOfOne(t)
	asker := newReplicaOn(t, nil, counting, time.Hour, 200*time.Millisecond)
	lost := newReplicaOn(t, ln, counting, time.Hour, 0)
	t.Cleanup(func() { close(accept) }) // before the servers close: closing one waits for its Accept
	asker.cl.SetPeers([]string{asker.srv.URL, lost.srv.URL})
	v := version(t, asker.top)
	var c cluster.Chunk // one of the lost replica's
	for off := int64(0); off < int64(len(data)) && c.Length == 0; off += chunk {
		if owner, _ := asker.cl.Owner(cluster.Chunk{Key: "m/f", Version: v, Offset: off}); owner == lost.srv.URL {
			c = cluster.Chunk{Key: "m/f", Version: v, Offset: off, Length: chunk}
		}
	}
	if c.Length == 0 {
		t.Fatal("the lost replica owns no chunk")
	}
	filler, err := net.Dial("tcp", ln.Addr().String()) // the accept queue's one place: later connects wait
	if err != nil {
		t.Fatal(err)
	}
	defer filler.Close()
	ctx, cancel := context.WithTimeout(context.Background(), readWithin)
	defer cancel()
	p := make([]byte, chunk)
	if err := asker.top.ReadAt(ctx, c.Key, v, p, c.Offset); err != nil || !bytes.Equal(p, data[c.Offset:c.Offset+chunk]) {
		t.Fatalf("read: %v", err)
	}
	if st := asker.cl.Stats(); st.PeerErrors != 1 || st.PeerLoads != 0 || st.Peers != 1 || counting.Bytes() != chunk {
		t.Errorf("%+v, storage read %d bytes: the lost peer is found down and its chunk read here", st, counting.Bytes())
	}
}

// queueOfOne listens on loopback with an accept queue of one connection (backlog 0), and accepts
// none until accept is closed: connecting to it, once the queue is full, waits.
func queueOfOne(t *testing.T) (ln net.Listener, accept chan struct{}) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	f := os.NewFile(uintptr(fd), "listener")
	defer f.Close()
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Listen(fd, 0); err != nil {
		t.Fatal(err)
	}
	inner, err := net.FileListener(f)
	if err != nil {
		t.Fatal(err)
	}
	accept = make(chan struct{})
	return gatedListener{inner, accept}, accept
}

type gatedListener struct {
	net.Listener
	open chan struct{}
}

func (l gatedListener) Accept() (net.Conn, error) {
	<-l.open
	return l.Listener.Accept()
}

func TestAPeerNeverServesAnotherVersion(t *testing.T) {
	data := pattern(16 * chunk)
	rs, _, put := newCluster(t, 3, 5*time.Second, data)
	old := version(t, rs[0].top)
	put("m/f", pattern(16*chunk+1))
	for i, r := range rs {
		err := r.top.ReadAt(context.Background(), "m/f", old, make([]byte, len(data)), 0)
		if !errors.Is(err, store.ErrChanged) {
			t.Errorf("replica %d read the old version of a replaced file: %v, want ErrChanged", i, err)
		}
	}
}

func TestWarmFillsTheOwnerOnce(t *testing.T) {
	data := pattern(4 * chunk)
	rs, counting, _ := newCluster(t, 2, 5*time.Second, data)
	c := cluster.Chunk{Key: "m/f", Version: version(t, rs[0].top), Offset: chunk, Length: chunk}
	asker, owner := rs[0], rs[1] // the owner is asked: another replica would refuse the chunk
	if _, self := rs[0].cl.Owner(c); self {
		asker, owner = rs[1], rs[0]
	}
	for _, want := range []int64{chunk, 0} {
		filled, err := asker.cl.Warm(context.Background(), owner.srv.URL, c)
		if err != nil || filled != want {
			t.Errorf("Warm = %d, %v; want %d", filled, err, want)
		}
	}
	if counting.Bytes() != chunk {
		t.Errorf("storage read %d bytes for one chunk warmed twice", counting.Bytes())
	}
	c.Version = "other"
	if _, err := asker.cl.Warm(context.Background(), owner.srv.URL, c); err == nil {
		t.Error("a chunk of a version the file does not have was warmed")
	}
}

func TestOwnershipIsSharedAndMovesLittle(t *testing.T) {
	urls := []string{"http://127.0.0.1:40001", "http://127.0.0.1:40002", "http://127.0.0.1:40003"}
	s, err := cluster.New(nil, cluster.Options{Self: urls[0], ChunkBytes: chunk, StripeBytes: chunk, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	s.SetPeers(urls)
	const chunks = 3000
	owners := func() map[int64]string {
		out := map[int64]string{}
		for i := range int64(chunks) {
			out[i], _ = s.Owner(cluster.Chunk{Key: "m/model-00001.safetensors", Version: "etag", Offset: i * chunk})
		}
		return out
	}
	before := owners()
	share := map[string]int{}
	for _, o := range before {
		share[o]++
	}
	for _, u := range urls {
		if f := float64(share[u]) / chunks; f < 0.28 || f > 0.39 {
			t.Errorf("%s owns %.2f of the chunks, want about a third", u, f)
		}
	}
	s.SetPeers(append(urls, "http://127.0.0.1:40004"))
	moved, toNew := 0, 0
	for i, o := range owners() {
		if o != before[i] {
			moved++
			if o == "http://127.0.0.1:40004" {
				toNew++
			}
		}
	}
	if f := float64(toNew) / chunks; moved != toNew || f < 0.15 || f > 0.35 {
		t.Errorf("adding a fourth replica moved %d chunks, %d of them to it; want only its share, about a quarter",
			moved, toNew)
	}
}

// The clustered store is a store like any other: storage behind two replicas that share chunks.
func TestConformance(t *testing.T) {
	storetest.Run(t, storetest.Harness{New: func(t *testing.T) (store.Store, func(string, []byte)) {
		local, put := storetest.Local(t)
		a, b := newReplica(t, local, 5*time.Second), newReplica(t, local, 5*time.Second)
		for _, r := range []*replica{a, b} {
			r.cl.SetPeers([]string{a.srv.URL, b.srv.URL})
		}
		return a.cl, put
	}})
}
