package server_test

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"testing"
	"time"
)

// On shutdown /readyz answers 503 for the drain delay while the listener still accepts and serves,
// then the listener closes and the stream in flight finishes within the grace.
func TestShutdownDrainsBeforeClosing(t *testing.T) {
	e := opsServer(t, nil)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	hs := &http.Server{Handler: e.srv.Handler()}
	go hs.Serve(ln)
	url := "http://" + ln.Addr().String()
	raw, _ := json.Marshal(e.req)
	res, err := http.Post(url+"/v1/shards", "application/json", bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	first := make([]byte, 1024)
	io.ReadFull(res.Body, first) // the stream is under way

	const delay = 600 * time.Millisecond
	done := make(chan error, 1)
	start := time.Now()
	go func() { done <- e.srv.Shutdown(context.Background(), hs, delay, 10*time.Second) }()
	time.Sleep(100 * time.Millisecond)
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // a new connection each time
	r, err := fresh.Get(url + "/readyz")
	if err != nil || r.StatusCode != 503 || r.Header.Get("Retry-After") == "" {
		t.Errorf("/readyz during the drain delay, on a new connection: %v %v; want 503", r, err)
	}
	if r, err := fresh.Post(url+"/v1/plan", "application/json", bytes.NewReader(raw)); err != nil ||
		r.StatusCode != 200 {
		t.Errorf("a request during the drain delay: %v %v; want it served", r, err)
	}
	for time.Since(start) < delay+200*time.Millisecond {
		time.Sleep(20 * time.Millisecond)
	}
	if _, err := fresh.Get(url + "/healthz"); err == nil {
		t.Error("a new connection was accepted after the drain delay")
	}
	rest, err := io.ReadAll(res.Body)
	if err != nil || !bytes.Equal(append(first, rest...), e.data) {
		t.Errorf("the stream in flight did not finish whole: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}
