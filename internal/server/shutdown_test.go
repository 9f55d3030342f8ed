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
// then the listener closes and the stream in flight finishes within the grace. The delay is an
// hour, ended by cancelling Shutdown's context, so the requests made during it are served however
// slowly a loaded machine runs them.
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

	delayCtx, endDelay := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- e.srv.Shutdown(delayCtx, hs, time.Hour, time.Minute) }()
	fresh := &http.Client{Transport: &http.Transport{DisableKeepAlives: true}} // a new connection each time
	var r *http.Response
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if r, err = fresh.Get(url + "/readyz"); err != nil || r.StatusCode == 503 || time.Now().After(deadline) {
			break
		}
		r.Body.Close()
	}
	if err != nil || r.StatusCode != 503 || r.Header.Get("Retry-After") == "" {
		t.Errorf("/readyz during the drain delay, on a new connection: %v %v; want 503", r, err)
	}
	if r, err := fresh.Post(url+"/v1/plan", "application/json", bytes.NewReader(raw)); err != nil ||
		r.StatusCode != 200 {
		t.Errorf("a request during the drain delay: %v %v; want it served", r, err)
	}
	endDelay()
	for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		r, err := fresh.Get(url + "/healthz")
		if err != nil {
			break
		}
		r.Body.Close()
		if time.Now().After(deadline) {
			t.Fatal("the listener still accepts new connections 30 s after the drain delay")
		}
	}
	rest, err := io.ReadAll(res.Body)
	if err != nil || !bytes.Equal(append(first, rest...), e.data) {
		t.Errorf("the stream in flight did not finish whole: %v", err)
	}
	if err := <-done; err != nil {
		t.Errorf("Shutdown: %v", err)
	}
}
