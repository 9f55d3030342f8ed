package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// declined is the request header that turns the digest off, and with it on sendfile.
var declined = []string{"Want-Repr-Digest", "sha-256=0"}

// fileServer serves dir's local store with segments of segBytes, a memory budget of memory and
// the last socket bytes of a body not sent from the file; it returns the server's handler and
// the budget.
func fileServer(t *testing.T, dir string, segBytes, memory, socket int64) (http.Handler, *budget.Budget) {
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	opts := planner.DefaultOptions()
	opts.SegmentBytes = segBytes
	opts.MaxPlanBytes = 1 << 20
	// Plans reserve memory while they are built: let them wait.
	mem := budget.New(budget.Config{Bytes: memory, AdmitWait: budget.DefaultAdmitWait})
	ex := executor.New(st, mem, executor.Config{Window: 4, SocketBytes: socket})
	srv := server.New(server.Config{Catalog: checkpoint.New(st), Executor: ex, Budget: mem, Planner: opts,
		Limits: server.Limits{MaxBodyBytes: 1 << 20, WriteTimeout: 10 * time.Second}})
	return srv.Handler(), mem
}

// u8File writes dir/m/model.safetensors with one U8 tensor "w" of data, and returns the request
// for all of it and the file's path.
func u8File(t *testing.T, dir string, data []byte) (api.ShardRequest, string) {
	writeCheckpoint(t, &harness{put: localPut(t, dir)}, "m",
		safetensors.TensorData{Name: "w", DType: "U8", Shape: []int64{int64(len(data))}, Data: data})
	n := int64(len(data))
	return shardReq("m", api.TensorRequest{Name: "w", Dtype: api.U8, Shape: []int64{n}, Boxes: whole(n),
		Blocks: copyOf("w", n)}), filepath.Join(dir, "m", "model.safetensors")
}

// readFromWriter is a ResponseWriter with ReadFrom, as the connection's is: it notes what reaches
// ReadFrom.
type readFromWriter struct {
	header http.Header
	status int
	body   bytes.Buffer
	files  int // ReadFrom calls with a file, the reader sendfile takes
	other  int // ReadFrom calls with anything else
}

func (w *readFromWriter) Header() http.Header    { return w.header }
func (w *readFromWriter) WriteHeader(status int) { w.status = status }
func (w *readFromWriter) Write(p []byte) (int, error) {
	return w.body.Write(p)
}

func (w *readFromWriter) ReadFrom(r io.Reader) (int64, error) {
	if lr, ok := r.(*io.LimitedReader); ok {
		if _, ok := lr.R.(*os.File); ok {
			w.files++
			return w.body.ReadFrom(r)
		}
	}
	w.other++
	return w.body.ReadFrom(r)
}

// Direct runs of a local file reach the connection's ReadFrom as the file itself, through every
// middleware: sendfile's path is open when the digest is declined, wherever the client is (on
// this host too, where sendfile also measured faster than copying), and when the digest is on and
// memoised (sent as a header); it is closed when the body is hashed — the first read with the
// digest on — (the bytes are hashed on their way, and only written).
func TestFileSectionsReachTheConnectionsReadFrom(t *testing.T) {
	dir := t.TempDir()
	data := pattern(4<<20, 9)
	req, _ := u8File(t, dir, data)
	handler, _ := fileServer(t, dir, 1<<20, 1<<30, 1<<20)
	raw, _ := json.Marshal(req)
	for _, c := range []struct {
		name     string
		digest   bool
		client   string
		sendfile bool
	}{
		{"declined, another host", false, "192.0.2.1:40000", true},
		{"declined, loopback", false, "127.0.0.1:40000", true},
		{"declined, IPv6 loopback", false, "[::1]:40000", true},
		{"digest, first read", true, "192.0.2.1:40000", false},
		{"digest, a later read: memoised", true, "127.0.0.1:40000", true},
	} {
		w := &readFromWriter{header: http.Header{}}
		hreq := httptest.NewRequest("POST", "/v1/shards", bytes.NewReader(raw))
		hreq.RemoteAddr = c.client
		hreq.Header.Set("Content-Type", "application/json")
		if !c.digest {
			hreq.Header.Set(declined[0], declined[1])
		}
		handler.ServeHTTP(w, hreq)
		body := w.body.Bytes()
		if w.status != 200 || !bytes.Equal(body[len(body)-len(data):], data) {
			t.Fatalf("%s: %d, %d bytes", c.name, w.status, len(body))
		}
		switch {
		case c.sendfile && (w.files != 3 || w.other != 0): // a 1 MiB segment each, the last one copied
			t.Errorf("%s: %d file sections and %d other readers reached ReadFrom, want 3 and 0",
				c.name, w.files, w.other)
		case !c.sendfile && w.files+w.other != 0:
			t.Errorf("%s: %d readers reached ReadFrom, want the bytes copied", c.name, w.files+w.other)
		case c.digest && w.header.Get("Repr-Digest") != reprDigest(body):
			t.Errorf("%s: Repr-Digest %q, want %q", c.name, w.header.Get("Repr-Digest"), reprDigest(body))
		case c.digest && (w.header.Get("Trailer") != "") == c.sendfile:
			t.Errorf("%s: Trailer %q; want the digest trailed only when the body was hashed", c.name,
				w.header.Get("Trailer"))
		}
	}
}

// smallWindowClient reads responses through a small socket receive buffer, so a server cannot run
// far ahead of what the test has read.
var smallWindowClient = &http.Client{Transport: &http.Transport{
	DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := (&net.Dialer{}).DialContext(ctx, network, addr)
		if tcp, ok := c.(*net.TCPConn); ok {
			tcp.SetReadBuffer(64 << 10)
		}
		return c, err
	},
	DisableKeepAlives: true,
}}

// A file that changes while it is being sent — its status changed in place, or replaced by
// another — aborts the response: the client sees a short body and no digest trailer, sendfile or
// not; a body whose digest was memoised, sent as a header before the change, is cut short too.
func TestFileChangedDuringTheStreamAbortsIt(t *testing.T) {
	for _, change := range []string{"chmod", "replace"} {
		for _, digest := range []string{"declined", "trailer", "header"} {
			dir := t.TempDir()
			data := pattern(32<<20, 4)
			req, path := u8File(t, dir, data)
			handler, _ := fileServer(t, dir, 256<<10, 1<<30, 8<<20)
			ts := httptest.NewServer(handler)
			if digest == "header" { // a whole stream memoises the body's digest
				if res, body := postShards(t, ts.URL, req); res.StatusCode != 200 || !bytes.Equal(body, data) {
					t.Fatalf("the first read: %d, %d bytes", res.StatusCode, len(body))
				}
			}
			raw, _ := json.Marshal(req)
			hreq, _ := http.NewRequest("POST", ts.URL+"/v1/shards", bytes.NewReader(raw))
			hreq.Header.Set("Content-Type", "application/json")
			if digest == "declined" {
				hreq.Header.Set(declined[0], declined[1])
			}
			res, err := smallWindowClient.Do(hreq)
			if err != nil || res.StatusCode != 200 {
				t.Fatalf("%v %v", res, err)
			}
			if got, want := res.Header.Get("Repr-Digest"), reprDigest(data); (digest == "header") != (got == want) {
				t.Fatalf("digest %s: the Repr-Digest header is %q", digest, got)
			}
			head := make([]byte, 1<<20)
			if _, err := io.ReadFull(res.Body, head); err != nil {
				t.Fatal(err)
			}
			switch change {
			case "chmod":
				os.Chmod(path, 0o600) // sets ctime: a new version, and no lease stands in its way
			case "replace":
				os.WriteFile(path+".new", bytes.Repeat([]byte{1}, 64), 0o644)
				os.Rename(path+".new", path)
			}
			rest, err := io.ReadAll(res.Body)
			res.Body.Close()
			ts.Close()
			got := int64(len(head) + len(rest))
			if err == nil || got >= shardLength(t, res) || res.Trailer.Get("Repr-Digest") != "" {
				t.Errorf("%s, digest %s: %d of %d bytes, err %v, trailers %v; want an aborted stream",
					change, digest, got, shardLength(t, res), err, res.Trailer)
			}
		}
	}
}

// Rewritten in place (same size, same header) or replaced by rename, again and again while it is
// served by sendfile, a file never yields a whole 200 body that mixes its versions: 409s and
// aborted streams are the honest answers. The socket reads a sent file's pages after sendfile
// returns; the body's end, copied, waits for them to be read and for the file's version to hold.
func TestSendfileNeverServesTwoVersions(t *testing.T) {
	for _, inPlace := range []bool{true, false} {
		t.Run(map[bool]string{true: "in place", false: "renamed"}[inPlace], func(t *testing.T) {
			sendfileUnderWrites(t, inPlace)
		})
	}
}

func sendfileUnderWrites(t *testing.T, inPlace bool) {
	const n = 16 << 20
	dir := t.TempDir()
	versions := make([][]byte, 2)
	for v, fill := range []byte{0x11, 0x22} {
		var f bytes.Buffer
		safetensors.Write(&f, []safetensors.TensorData{{Name: "w", DType: "U8", Shape: []int64{n},
			Data: bytes.Repeat([]byte{fill}, n)}}, nil)
		versions[v] = f.Bytes()
	}
	path := filepath.Join(dir, "m", "model.safetensors")
	os.MkdirAll(filepath.Dir(path), 0o755)
	os.WriteFile(path, versions[0], 0o644)
	// The client's small receive buffer and this host's largest send buffer (4 MiB by default)
	// hold less than the 5 MiB of the body's end not sent from the file.
	handler, _ := fileServer(t, dir, 512<<10, 1<<30, 5<<20)
	ts := httptest.NewServer(handler)
	defer ts.Close()
	var stop atomic.Bool
	done := make(chan struct{})
	go func() { // the writer: a version in 256 KiB writes or renamed into place, a pause, the other
		defer close(done)
		for i := 1; !stop.Load(); i++ {
			src := versions[i%2]
			if !inPlace {
				os.WriteFile(path+".tmp", src, 0o644)
				os.Rename(path+".tmp", path)
				time.Sleep(10 * time.Millisecond)
				continue
			}
			f, err := os.OpenFile(path, os.O_WRONLY, 0)
			if err != nil {
				t.Error(err)
				return
			}
			for off := 0; off < len(src); off += 256 << 10 {
				f.WriteAt(src[off:min(len(src), off+256<<10)], int64(off))
			}
			f.Close()
			time.Sleep(10 * time.Millisecond)
		}
	}()
	defer func() { stop.Store(true); <-done }()
	req := shardReq("m", api.TensorRequest{Name: "w", Dtype: api.U8, Shape: []int64{n}, Boxes: whole(n),
		Blocks: copyOf("w", n)})
	raw, _ := json.Marshal(req)
	statuses, mixed, short := map[int]int{}, 0, 0
	for range 50 {
		hreq, _ := http.NewRequest("POST", ts.URL+"/v1/shards", bytes.NewReader(raw))
		hreq.Header.Set("Content-Type", "application/json")
		hreq.Header.Set(declined[0], declined[1])
		res, err := smallWindowClient.Do(hreq)
		if err != nil {
			t.Fatal(err)
		}
		body, rerr := io.ReadAll(res.Body)
		res.Body.Close()
		statuses[res.StatusCode]++
		switch {
		case res.StatusCode == 409:
			time.Sleep(2 * time.Millisecond) // as a client backs off
		case res.StatusCode != 200:
			t.Errorf("%d: %s", res.StatusCode, body)
		case rerr != nil || len(body) != n:
			short++ // aborted after the headers: the client knows
		case !bytes.Equal(body, versions[0][len(versions[0])-n:]) &&
			!bytes.Equal(body, versions[1][len(versions[1])-n:]):
			mixed++
		}
	}
	t.Logf("50 requests: statuses %v, %d aborted streams, %d whole 200 bodies with bytes of both versions",
		statuses, short, mixed)
	if mixed > 0 {
		t.Errorf("%d responses were 200, whole, and mixed two versions of the file", mixed)
	}
}

// Streams hold what they really hold: 32 clients reading a 64 MiB direct shard slowly, all at
// once, are all admitted under a 32 MiB budget. Before, each held its window of 8 MiB segments,
// and the second got a 503. Sent by sendfile they hold nothing; with the digest, the buffer it
// hashes through, about 1 MiB: the 16 that ask for it take 16 MiB, and the budget leaves the
// others as much again for their plans (a 16 MiB budget refused some under a loaded CI).
func TestManySlowStreamsFitASmallBudget(t *testing.T) {
	dir := t.TempDir()
	const n = 64 << 20
	path := filepath.Join(dir, "m", "model.safetensors")
	os.MkdirAll(filepath.Dir(path), 0o755)
	header := safetensors.EncodeHeader(
		[]safetensors.Entry{{Name: "w", DType: "U8", Shape: []int64{n}, DataOffsets: [2]int64{0, n}}}, nil)
	if err := os.WriteFile(path, header, 0o644); err != nil {
		t.Fatal(err)
	}
	os.Truncate(path, int64(len(header))+n) // "w" is a hole: n zero bytes, none on disk
	req := shardReq("m", api.TensorRequest{Name: "w", Dtype: api.U8, Shape: []int64{n}, Boxes: whole(n),
		Blocks: copyOf("w", n)})
	handler, mem := fileServer(t, dir, 4<<20, 32<<20, 8<<20)
	ts := httptest.NewServer(handler)
	defer ts.Close()
	raw, _ := json.Marshal(req)
	const clients = 32
	var admitted, finished sync.WaitGroup
	admitted.Add(clients)
	var peak atomic.Int64
	for i := range clients {
		finished.Go(func() {
			hreq, _ := http.NewRequest("POST", ts.URL+"/v1/shards", bytes.NewReader(raw))
			hreq.Header.Set("Content-Type", "application/json")
			if i%2 == 0 {
				hreq.Header.Set(declined[0], declined[1])
			}
			res, err := smallWindowClient.Do(hreq)
			if err != nil {
				admitted.Done()
				t.Error(err)
				return
			}
			defer res.Body.Close()
			io.CopyN(io.Discard, res.Body, 1<<20)
			admitted.Done()
			admitted.Wait() // every stream is under way before any goes on
			peak.Store(max(peak.Load(), mem.Held()))
			got, err := io.Copy(io.Discard, res.Body)
			if res.StatusCode != 200 || err != nil || got+1<<20 != shardLength(t, res) {
				t.Errorf("client %d: %d, %v after %d bytes", i, res.StatusCode, err, got+1<<20)
			}
		})
	}
	finished.Wait()
	t.Logf("%d streams at once held at most %d KiB of the budget", clients, peak.Load()>>10)
}
