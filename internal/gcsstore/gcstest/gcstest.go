// Package gcstest starts a real GCS emulator for tests and benchmarks: fake-gcs-server on
// 127.0.0.1, installed by `make` at a pinned version (Makefile `tools`). It does not check
// credentials, so no test here can show a refused one except through the fault proxy.
package gcstest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"cloud.google.com/go/storage"
	"google.golang.org/api/iterator"
	"google.golang.org/api/option"

	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/store/objstore/faultproxy"
)

// Server is a running fake-gcs-server.
type Server struct {
	// Endpoint is the emulator's URL, for gcsstore.Config.Endpoint.
	Endpoint string
	// Client is an SDK client of the emulator.
	Client *storage.Client
	cmd    *exec.Cmd
}

// Binary finds fake-gcs-server: $FAKE_GCS_SERVER, the module's .tools/bin, or PATH.
func Binary() (string, error) {
	if p := os.Getenv("FAKE_GCS_SERVER"); p != "" {
		return p, nil
	}
	_, file, _, _ := runtime.Caller(0)
	local := filepath.Join(filepath.Dir(file), "..", "..", "..", ".tools", "bin", "fake-gcs-server")
	if _, err := os.Stat(local); err == nil {
		return local, nil
	}
	return exec.LookPath("fake-gcs-server")
}

// Start runs an emulator in memory for the test (skipped without fake-gcs-server unless
// SHARDSRV_REQUIRE_GCS is set, as `make test` does).
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("SHARDSRV_REQUIRE_GCS") != "" {
			t.Fatalf("fake-gcs-server not found (run 'make tools'): %v", err)
		}
		t.Skip("fake-gcs-server not found; 'make test' installs it")
	}
	s, err := Run(bin, "")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Stop)
	return s
}

// Run starts fake-gcs-server on a free loopback port, keeping objects in dir, or in memory when
// dir is "".
func Run(bin, dir string) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	args := []string{"-scheme", "http", "-host", "127.0.0.1", "-port", fmt.Sprint(port), "-log-level", "error",
		// Its XML-API routes, which the SDK reads through by default, answer only the public host.
		"-public-host", "127.0.0.1"}
	if dir == "" {
		args = append(args, "-backend", "memory")
	} else {
		args = append(args, "-backend", "filesystem", "-filesystem-root", dir)
	}
	cmd := exec.Command(bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	s3test.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{Endpoint: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd}
	if s.Client, err = storage.NewClient(context.Background(), ClientOptions(s.Endpoint)...); err != nil {
		s.Stop()
		return nil, err
	}
	for range 200 {
		if res, err := http.Get(s.Endpoint + "/_internal/healthcheck"); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return s, nil
			}
		}
		time.Sleep(25 * time.Millisecond)
	}
	s.Stop()
	return nil, fmt.Errorf("fake-gcs-server did not start: %s", logs.String())
}

// ClientOptions point an SDK client at the emulator at endpoint, without credentials.
func ClientOptions(endpoint string) []option.ClientOption {
	return []option.ClientOption{option.WithEndpoint(endpoint + "/storage/v1/"), option.WithoutAuthentication()}
}

// Stop ends the emulator.
func (s *Server) Stop() {
	if s.Client != nil {
		s.Client.Close()
	}
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// CreateBucket makes a bucket.
func (s *Server) CreateBucket(t testing.TB, bucket string) {
	t.Helper()
	if err := s.Client.Bucket(bucket).Create(context.Background(), "test-project", nil); err != nil {
		t.Fatal(err)
	}
}

// DeleteBucket deletes a bucket and every object in it.
func (s *Server) DeleteBucket(t testing.TB, bucket string) {
	t.Helper()
	ctx := context.Background()
	b := s.Client.Bucket(bucket)
	for it := b.Objects(ctx, nil); ; {
		o, err := it.Next()
		if err == iterator.Done {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		if err := b.Object(o.Name).Delete(ctx); err != nil {
			t.Fatal(err)
		}
	}
	if err := b.Delete(ctx); err != nil {
		t.Fatal(err)
	}
}

// Put writes (or replaces) an object.
func (s *Server) Put(t testing.TB, bucket, key string, data []byte) {
	t.Helper()
	if err := s.PutErr(bucket, key, data); err != nil {
		t.Fatal(err)
	}
}

// PutErr writes (or replaces) an object, as one request.
func (s *Server) PutErr(bucket, key string, data []byte) error {
	w := s.Client.Bucket(bucket).Object(key).NewWriter(context.Background())
	w.ChunkSize = 0 // one multipart request, however large: no resumable session to drive
	if _, err := w.Write(data); err != nil {
		w.Close()
		return err
	}
	return w.Close()
}

// NewProxy starts a fault proxy in front of the emulator.
func (s *Server) NewProxy() *faultproxy.Proxy { return faultproxy.Start(s.Endpoint, gcsErrors) }

// gcsErrors writes GCS's answers to the faults: 429 when it sheds load.
func gcsErrors(w http.ResponseWriter, f faultproxy.Fault) {
	if f == faultproxy.Forbidden {
		jsonError(w, http.StatusForbidden, "forbidden", "Access denied.")
		return
	}
	jsonError(w, http.StatusTooManyRequests, "rateLimitExceeded", "The rate of requests is too high.")
}

func jsonError(w http.ResponseWriter, status int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"code":%d,"message":%q,"errors":[{"domain":"global","reason":%q,"message":%q}]}}`,
		status, msg, reason, msg)
}
