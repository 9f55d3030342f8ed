package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/auth"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

// The cluster fan-in, scaled to a 2-core machine: 64 pods (TP=8 × 8 model replicas) load
// the 8 row-parallel ranks of one 16 MiB BF16 weight through replicas that share one cache.
const (
	fanRows, fanCols = 2048, 4096
	fanTP            = 8
	fanClients       = 64
	fanChunk         = 128 << 10
	// peerTimeout is long: a test on a loaded machine must not find a live replica slow (a killed
	// one is found by its broken connections, at once).
	peerTimeout = 30 * time.Second
	peerSecret  = "replicas-only"
)

// s3Cluster is versitygw behind the counting proxy, and the replicas serving it.
type s3Cluster struct {
	t         *testing.T
	g         *s3test.Gateway
	proxy     *s3test.Proxy
	bucket    string
	peerFile  string
	replicas  []*replica
	service   *service
	clientTok *auth.Tokens
	chunk     int64 // the cache's
}

// replica is one shardsrv as serve wires it with --peers: the chunk cache over the cluster store
// over S3, its own storage reads counted.
type replica struct {
	ring    *cluster.Store
	storage *storetest.Counting
	srv     *httptest.Server
	dead    atomic.Bool // killed: its storage reads fail, as a dead process's would never finish
}

// mortal is a replica's storage, which dies with it.
type mortal struct {
	store.Store
	r *replica
}

func (m mortal) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if m.r.dead.Load() {
		return errors.New("the replica is dead")
	}
	return m.Store.ReadAt(ctx, key, version, p, off)
}

func newS3Cluster(t *testing.T, n int) *s3Cluster { return newS3ClusterChunk(t, n, fanChunk) }

func newS3ClusterChunk(t *testing.T, n int, chunk int64) *s3Cluster {
	g := s3test.Start(t)
	c := &s3Cluster{t: t, g: g, bucket: fmt.Sprintf("cluster-%d", buckets.Add(1)), service: &service{}, chunk: chunk}
	g.CreateBucket(t, c.bucket)
	c.proxy = g.NewProxy()
	t.Cleanup(c.proxy.Close)
	c.peerFile = filepath.Join(t.TempDir(), "peer-token")
	if err := os.WriteFile(c.peerFile, []byte(peerSecret+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	for range n {
		c.add()
	}
	return c
}

// add starts a replica and tells every replica the new list, as the --peers-dns watch does.
func (c *s3Cluster) add() *replica {
	t := c.t
	st, err := s3reader.New(context.Background(), s3reader.Config{Bucket: c.bucket, Endpoint: c.proxy.URL})
	if err != nil {
		t.Fatal(err)
	}
	r := &replica{storage: storetest.NewCounting(st)}
	peerTokens, err := auth.LoadTokens(c.peerFile)
	if err != nil {
		t.Fatal(err)
	}
	r.srv = httptest.NewUnstartedServer(nil)
	r.ring, err = cluster.New(mortal{r.storage, r}, cluster.Options{Self: "http://" + r.srv.Listener.Addr().String(),
		ChunkBytes: c.chunk, StripeBytes: 2 * c.chunk, Token: peerTokens.First, Timeout: peerTimeout,
		ConnectTimeout: peerTimeout}) // a loaded test machine can take seconds to connect
	if err != nil {
		t.Fatal(err)
	}
	cached, err := cache.New(r.ring, cache.Config{Bytes: 256 << 20, ChunkBytes: c.chunk}, nil)
	if err != nil {
		t.Fatal(err)
	}
	opts := planner.ObjectStoreOptions()
	opts.Align = c.chunk
	mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: 5 * time.Second})
	srv := server.New(server.Config{
		Catalog:    checkpoint.New(cached),
		Executor:   executor.New(cached, mem, executor.Config{Window: 4}),
		Budget:     mem,
		Planner:    opts,
		Limits:     server.Limits{MaxBodyBytes: 1 << 20},
		Tokens:     c.clientTok,
		Cluster:    cluster.NewHandler(r.ring, cached),
		PeerTokens: peerTokens,
	})
	r.srv.Config.Handler = srv.Handler()
	r.srv.Start()
	t.Cleanup(r.srv.Close)
	c.replicas = append(c.replicas, r)
	var urls []string
	for _, o := range c.replicas {
		urls = append(urls, o.srv.URL)
	}
	for _, o := range c.replicas {
		o.ring.SetPeers(urls)
	}
	c.service.set(urls)
	return r
}

// kill stops a replica as a node failure does: connections cut, the listener gone, and the
// Service's endpoints no longer listing it.
func (c *s3Cluster) kill(i int) {
	r := c.replicas[i]
	var live []string
	for _, o := range c.replicas {
		if o != r {
			live = append(live, o.srv.URL)
		}
	}
	c.service.set(live)
	r.dead.Store(true)
	r.srv.Listener.Close()
	r.srv.CloseClientConnections()
}

// origin is the bytes the proxy has carried from the object store.
func (c *s3Cluster) origin() int64 {
	_, n := c.proxy.Traffic()
	return n
}

// putWeight writes checkpoint ckpt holding the weight "w" and returns the file's bytes and the
// weight's.
func (c *s3Cluster) putWeight(ckpt string, seed byte) (file, data []byte) {
	data = pattern(fanRows*fanCols*2, seed)
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, []safetensors.TensorData{{Name: "w", DType: "BF16",
		Shape: []int64{fanRows, fanCols}, Data: data}}, nil); err != nil {
		c.t.Fatal(err)
	}
	c.g.Put(c.t, c.bucket, ckpt+"/model.safetensors", buf.Bytes())
	return buf.Bytes(), data
}

// service spreads requests over the live replicas in turn, as a Kubernetes Service does.
type service struct {
	mu   sync.Mutex
	urls []string
	next int
}

func (s *service) set(urls []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.urls = urls
}

func (s *service) RoundTrip(req *http.Request) (*http.Response, error) {
	s.mu.Lock()
	u, _ := url.Parse(s.urls[s.next%len(s.urls)])
	s.next++
	s.mu.Unlock()
	req = req.Clone(req.Context())
	req.URL.Host, req.Host = u.Host, u.Host
	return http.DefaultTransport.RoundTrip(req)
}

func rankRequest(ckpt string, rank int64) *api.ShardRequest {
	rows := int64(fanRows / fanTP)
	return &api.ShardRequest{Checkpoint: ckpt, Tensors: []api.TensorRequest{{Name: "w", Dtype: api.BF16,
		Shape: []int64{fanRows, fanCols}, Blocks: copyOf("w", fanRows, fanCols),
		Boxes: []api.Box{{Offsets: []int64{rank * rows, 0}, Lengths: []int64{rows, fanCols}}}}}}
}

func rankBytes(data []byte, rank int) []byte {
	n := len(data) / fanTP
	return data[rank*n : (rank+1)*n]
}

// fanIn runs the 64 clients through the Go client, retries and all; each must get its rank exactly.
// mid, when not nil, is called once a quarter of the file has come from storage: the fan-in is then
// in full swing, the replicas' storage reads and their streams to the clients.
func (c *s3Cluster) fanIn(ckpt string, data []byte, mid func()) {
	quarter := c.origin() + int64(len(data))/4
	var wg sync.WaitGroup
	for i := range fanClients {
		wg.Go(func() {
			cl := api.NewClient("http://shardsrv")
			cl.HTTP = &http.Client{Transport: c.service}
			cl.Backoff, cl.Logger = 50*time.Millisecond, slog.New(slog.DiscardHandler)
			body, err := cl.FetchBytes(context.Background(), rankRequest(ckpt, int64(i%fanTP)))
			if err != nil || !bytes.Equal(body, rankBytes(data, i%fanTP)) {
				c.t.Errorf("client %d (rank %d): %v; exact bytes: %v", i, i%fanTP, err,
					bytes.Equal(body, rankBytes(data, i%fanTP)))
			}
		})
	}
	if mid != nil {
		for c.origin() < quarter {
			time.Sleep(time.Millisecond)
		}
		mid()
	}
	wg.Wait()
}

func TestClusterReadsEachByteFromStorageOnce(t *testing.T) {
	for _, n := range []int{1, 2, 3} {
		t.Run(fmt.Sprintf("%d-replicas", n), func(t *testing.T) {
			c := newS3Cluster(t, n)
			file, data := c.putWeight("m", 1)
			before := c.origin()
			start := time.Now()
			c.fanIn("m", data, nil)
			took := time.Since(start)
			ratio := float64(c.origin()-before) / float64(len(file))
			t.Logf("%d replica(s), %d clients, %d ranks of a %d MiB weight: storage read %.3f× the file; "+
				"%.0f MiB/s served", n, fanClients, fanTP, len(data)>>20, ratio,
				float64(fanClients*len(data)/fanTP)/took.Seconds()/(1<<20))
			if ratio > 1.1 {
				t.Errorf("storage read %.3f× the unique bytes (goal ≤ 1.1×)", ratio)
			}
			for i, r := range c.replicas {
				if st := r.ring.Stats(); n > 1 && (st.PeerLoads == 0 || st.StorageLoads == 0) {
					t.Errorf("replica %d: %+v; each reads its share from storage and the rest from its peers", i, st)
				}
			}
		})
	}
}

func TestClusterSurvivesAReplicaKilledMidFanIn(t *testing.T) {
	c := newS3Cluster(t, 3)
	file, data := c.putWeight("m", 2)
	// S3's first-byte latency, so the kill lands while storage reads are under way, as it would.
	c.proxy.SetDecide(func(int, *http.Request) s3test.Fault { time.Sleep(20 * time.Millisecond); return s3test.Pass })
	before := c.origin()
	c.fanIn("m", data, func() { c.kill(2) })
	ratio := float64(c.origin()-before) / float64(len(file))
	// What the killed replica read from storage before it died — its stripes' share of the ring,
	// which the replicas' ports decide, and as much of it as the fan-in had reached — is lost with
	// its cache and read again by the survivors: nothing else may be read twice.
	lost := float64(c.replicas[2].storage.Bytes()) / float64(len(file))
	t.Logf("one of 3 replicas killed mid fan-in: storage read %.3f× the file, %.3f× by the killed replica",
		ratio, lost)
	if ratio > 1.1+lost {
		t.Errorf("storage read %.3f× the unique bytes with a replica killed that had read %.3f× (goal ≤ 1.1× + that)",
			ratio, lost)
	}
}

func TestClusterReplicaAddedAtRunTimeTakesItsShare(t *testing.T) {
	c := newS3Cluster(t, 3)
	_, first := c.putWeight("m", 3)
	c.fanIn("m", first, nil)
	added := c.add()
	file, data := c.putWeight("m2", 4)
	before := c.origin()
	c.fanIn("m2", data, nil)
	ratio := float64(c.origin()-before) / float64(len(file))
	share := float64(added.storage.Bytes()) / float64(len(file))
	t.Logf("a 4th replica added: storage read %.3f× the new file, %.2f of it by the new replica", ratio, share)
	if ratio > 1.1 || share < 0.1 || share > 0.45 {
		t.Errorf("storage read %.3f× the file, the added replica %.2f of it; want ≤ 1.1× and about a quarter",
			ratio, share)
	}
}

func TestClusterNeverMixesVersions(t *testing.T) {
	c := newS3Cluster(t, 3)
	_, old := c.putWeight("m", 5)
	// The object is replaced once the first chunks came from storage, before the others are read.
	gate := make(chan struct{})
	c.proxy.SetDecide(func(n int, _ *http.Request) s3test.Fault {
		if n > 4 {
			<-gate
		}
		return s3test.Pass
	})
	var replaced atomic.Bool
	var newData []byte
	var statuses sync.Map
	var wg sync.WaitGroup
	for i := range fanClients {
		wg.Go(func() {
			raw, _ := json.Marshal(rankRequest("m", int64(i%fanTP)))
			res, err := (&http.Client{Transport: c.service}).Post("http://shardsrv/v1/shards", "application/json",
				bytes.NewReader(raw))
			if err != nil {
				t.Errorf("client %d: %v", i, err)
				return
			}
			defer res.Body.Close()
			body, err := io.ReadAll(res.Body)
			n, _ := statuses.LoadOrStore(fmt.Sprint(res.StatusCode, err != nil), new(atomic.Int64))
			n.(*atomic.Int64).Add(1)
			switch {
			case res.StatusCode == http.StatusConflict || err != nil: // refused, or aborted: never wrong bytes
			case res.StatusCode != http.StatusOK:
				t.Errorf("client %d: %d", i, res.StatusCode)
			case !bytes.Equal(body, rankBytes(old, i%fanTP)) &&
				!(replaced.Load() && bytes.Equal(body, rankBytes(newData, i%fanTP))):
				t.Errorf("client %d got a body of neither version", i)
			}
		})
	}
	for c.origin() < fanChunk {
		time.Sleep(time.Millisecond)
	}
	_, newData = c.putWeight("m", 6)
	replaced.Store(true)
	close(gate)
	wg.Wait()
	refused := int64(0)
	statuses.Range(func(k, v any) bool {
		t.Logf("status %v (body error): %d clients", k, v.(*atomic.Int64).Load())
		if k != "200 false" {
			refused += v.(*atomic.Int64).Load()
		}
		return true
	})
	if refused == 0 {
		t.Error("every client got the old version whole: the object was not replaced during the fan-in")
	}
	c.fanIn("m", newData, nil) // and the Go client's retries then read the new version, whole
}

func TestPeerRouteNeedsThePeerSecret(t *testing.T) {
	g := s3test.Start(t)
	_ = g
	dir := t.TempDir()
	clientFile := filepath.Join(dir, "tokens")
	os.WriteFile(clientFile, []byte("client-token\n"), 0o600)
	clientTok, err := auth.LoadTokens(clientFile)
	if err != nil {
		t.Fatal(err)
	}
	c := &s3Cluster{t: t, g: g, bucket: fmt.Sprintf("cluster-%d", buckets.Add(1)), service: &service{},
		clientTok: clientTok, chunk: fanChunk}
	g.CreateBucket(t, c.bucket)
	c.proxy = g.NewProxy()
	t.Cleanup(c.proxy.Close)
	c.peerFile = filepath.Join(dir, "peer")
	os.WriteFile(c.peerFile, []byte(peerSecret+"\n"), 0o600)
	r := c.add()
	file, _ := c.putWeight("m", 7)
	info, err := r.storage.Stat(context.Background(), "m/model.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	ch := cluster.Chunk{Key: "m/model.safetensors", Version: info.Version, Offset: fanChunk, Length: fanChunk}
	for _, tc := range []struct {
		token string
		want  int
	}{{"", 401}, {"client-token", 401}, {"wrong", 401}, {peerSecret, 200}} {
		req, _ := http.NewRequest("GET", r.srv.URL+cluster.PeerPath+"?"+ch.Query(false).Encode(), nil)
		if tc.token != "" {
			req.Header.Set("Authorization", "Bearer "+tc.token)
		}
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != tc.want || tc.want == 200 && !bytes.Equal(body, file[fanChunk:2*fanChunk]) {
			t.Errorf("peer route with token %q: %d, want %d", tc.token, res.StatusCode, tc.want)
		}
	}
	// Ordinary routes still want a client token, not the peer secret.
	for token, want := range map[string]int{peerSecret: 401, "client-token": 200} {
		req, _ := http.NewRequest("GET", r.srv.URL+"/v1/checkpoints", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.StatusCode != want {
			t.Errorf("/v1/checkpoints with token %q: %d, want %d", token, res.StatusCode, want)
		}
	}
}

func TestPrefetchWarmsEachChunkOnItsOwner(t *testing.T) {
	c := newS3Cluster(t, 3)
	file, data := c.putWeight("m", 8)
	before := c.origin()
	cl := api.NewClient(c.replicas[0].srv.URL)
	resp, err := cl.Prefetch(context.Background(), &api.ShardRequest{Checkpoint: "m"})
	if err != nil {
		t.Fatal(err)
	}
	// The catalog's read of the header filled the first chunk; the prefetch fills the others.
	chunks := int64((len(file) + fanChunk - 1) / fanChunk)
	warm := c.origin()
	if resp.Chunks != chunks || resp.Bytes != int64(len(file)) || resp.FilledBytes < int64(len(file))-fanChunk ||
		resp.FilledChunks < chunks-1 || len(resp.Owners) != 3 || warm-before != int64(len(file)) {
		t.Errorf("prefetch of the whole checkpoint: %+v, storage read %d bytes; want all %d chunks on 3 owners, "+
			"each read once", resp, warm-before, chunks)
	}
	t.Logf("prefetch: %d chunks in %.2fs, storage read %.3f× the file", resp.Chunks, resp.Seconds,
		float64(warm-before)/float64(len(file)))
	if again, err := cl.Prefetch(context.Background(), rankRequest("m", 3)); err != nil || again.FilledBytes != 0 ||
		again.Chunks < int64(len(data)/fanTP/fanChunk) {
		t.Errorf("a rank's prefetch after the checkpoint's: %+v, %v; want its chunks, none filled", again, err)
	}
	c.fanIn("m", data, nil)
	if got := c.origin() - warm; got > 0 {
		t.Errorf("the fan-in after the prefetch read %d bytes from storage; the cluster was warm", got)
	}
	var problem *api.ProblemError
	if _, err := cl.Prefetch(context.Background(), &api.ShardRequest{Checkpoint: "nope"}); !errors.As(err, &problem) ||
		problem.Status != 404 {
		t.Errorf("prefetch of an unknown checkpoint: %v, want 404", err)
	}
}
