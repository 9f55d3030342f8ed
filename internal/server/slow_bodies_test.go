package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

// dripClient sends the headers of a shard request, then its body one byte a second.
func dripClient(t *testing.T, url string) net.Conn {
	conn, err := net.Dial("tcp", strings.TrimPrefix(url, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	fmt.Fprintf(
		conn,
		"POST /v1/shards HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n{",
	)
	go func() {
		for range 30 {
			time.Sleep(time.Second)
			if _, err := conn.Write([]byte(" ")); err != nil {
				return
			}
		}
	}()
	return conn
}

// Slow bodies hold a connection for at most --body-timeout and never a stream slot: with
// --max-streams 2 and four clients dripping a body a byte a second, every fast client is served,
// and the drippers get a 408 and a closed connection.
func TestSlowBodiesHoldNoSlotAndTimeOut(t *testing.T) {
	e := opsServer(t, func(c *server.Config, st store.Store) {
		c.Limits.MaxStreams = 2
		c.Limits.BodyTimeout = 1500 * time.Millisecond
	})
	var drips []net.Conn
	for range 4 {
		drips = append(drips, dripClient(t, e.url))
	}
	time.Sleep(200 * time.Millisecond)
	small := e.req // 16 rows: 128 KiB
	small.Tensors = append([]api.TensorRequest(nil), e.req.Tensors...)
	small.Tensors[0].Boxes = []api.Box{{Offsets: []int64{0, 0}, Lengths: []int64{16, 4096}}}
	busy := 0
	for range 10 {
		res, body := e.post(t, "/v1/shards", small)
		if res.StatusCode == 503 {
			busy++
		} else if res.StatusCode != 200 || len(body) != 16*4096*2 {
			t.Errorf("a fast request: %d, %d bytes", res.StatusCode, len(body))
		}
	}
	if busy > 0 {
		t.Errorf("%d of 10 fast requests got 503 while 4 clients dripped their bodies", busy)
	}
	var wg sync.WaitGroup
	for i, conn := range drips {
		wg.Go(func() {
			conn.SetReadDeadline(time.Now().Add(30 * time.Second))
			res, err := http.ReadResponse(bufio.NewReader(conn), nil)
			if err != nil {
				t.Errorf("dripping client %d: no response: %v", i, err)
				return
			}
			res.Body.Close()
			if res.StatusCode != http.StatusRequestTimeout || !res.Close {
				t.Errorf(
					"dripping client %d: %d (close %v), want a 408 and the connection closed",
					i,
					res.StatusCode,
					res.Close,
				)
			}
		})
	}
	wg.Wait()
}

// /v1/plan plans like a stream does, so it waits in the same line: 503 with Retry-After when the
// slots are taken.
func TestPlanIsAdmittedLikeAStream(t *testing.T) {
	e := opsServer(t, func(c *server.Config, st store.Store) { c.Limits.MaxStreams = 1 })
	stalledClient(t, e)
	waitFor(t, "the stalled stream to hold its slot", func() bool { return e.mem.Held() > 0 })
	res, body := e.post(t, "/v1/plan", e.req)
	if res.StatusCode != 503 || res.Header.Get("Retry-After") == "" || !strings.Contains(string(body), "busy") {
		t.Errorf("a plan while the only slot streams: %d %s", res.StatusCode, body)
	}
}

// slowStore takes its time over every data read: streams that last.
type slowStore struct{ store.Store }

func (s slowStore) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if off > 0 {
		time.Sleep(80 * time.Millisecond)
	}
	return s.Store.ReadAt(ctx, key, version, p, off)
}

// The body deadline ends with the body: a stream that lasts longer than --body-timeout finishes,
// and the connection takes another request after.
func TestBodyTimeoutDoesNotCutStreams(t *testing.T) {
	e := opsServer(t, func(c *server.Config, st store.Store) {
		c.Limits.BodyTimeout = 200 * time.Millisecond
		mem := budget.New(budget.Config{Bytes: 1 << 30, AdmitWait: time.Second})
		c.Executor = executor.New(slowStore{st}, mem, executor.Config{Window: 1})
		c.Budget = mem
	})
	req := e.req // 8 segments of 256 KiB, 80 ms each: about 0.7 s
	req.Tensors = append([]api.TensorRequest(nil), e.req.Tensors...)
	req.Tensors[0].Boxes = []api.Box{{Offsets: []int64{0, 0}, Lengths: []int64{256, 4096}}}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 1}}
	raw, _ := json.Marshal(req)
	for i := range 2 {
		start := time.Now()
		res, err := client.Post(e.url+"/v1/shards", "application/json", bytes.NewReader(raw))
		if err != nil {
			t.Fatal(err)
		}
		got, err := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != 200 || err != nil || !bytes.Equal(got, e.data[:256*4096*2]) {
			t.Fatalf("request %d: %d, %d bytes, %v after %v", i, res.StatusCode, len(got), err, time.Since(start))
		}
		time.Sleep(300 * time.Millisecond) // idle on the kept-alive connection, past the body timeout too
	}
}
