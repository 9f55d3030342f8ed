// Package aztest starts a real Azure Blob emulator for tests and benchmarks: Azurite's blob
// service on 127.0.0.1, installed by `make` at a pinned version (Makefile `tools`). Azurite checks
// shared-key signatures, so a wrong key is refused as Azure refuses it.
package aztest

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
	"sync"
	"testing"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/storage/azblob"

	"github.com/shardsrv/shardsrv/internal/azstore"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/store/objstore/faultproxy"
)

// Azurite's development account and its published key: test values, never real ones.
const (
	Account    = "devstoreaccount1"
	AccountKey = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
)

// Server is a running Azurite blob service.
type Server struct {
	// URL is the server's root, where a proxy goes; Endpoint is the account's blob service URL,
	// for azstore.Config.Endpoint.
	URL      string
	Endpoint string
	// Client is an SDK client of the account.
	Client *azblob.Client
	cmd    *exec.Cmd
}

// EndpointAt is the account's blob service URL on a server (or proxy) at root.
func EndpointAt(root string) string { return root + "/" + Account }

// Binary finds azurite-blob: $AZURITE_BLOB, the module's .tools/bin, or PATH.
func Binary() (string, error) {
	if p := os.Getenv("AZURITE_BLOB"); p != "" {
		return p, nil
	}
	_, file, _, _ := runtime.Caller(0)
	local := filepath.Join(filepath.Dir(file), "..", "..", "..", ".tools", "bin", "azurite-blob")
	if _, err := os.Stat(local); err == nil {
		return local, nil
	}
	return exec.LookPath("azurite-blob")
}

// shared is the one Azurite a test binary starts: it takes seconds to start, so tests share it,
// each in containers of its own. It ends with the test binary (DieWithParent).
var shared struct {
	once sync.Once
	s    *Server
	err  error
}

// Start returns the test binary's Azurite, in memory (skipped without Azurite unless
// SHARDSRV_REQUIRE_AZURE is set, as `make test` does), and sets the account key the store reads.
func Start(t testing.TB) *Server {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("SHARDSRV_REQUIRE_AZURE") != "" {
			t.Fatalf("azurite-blob not found (run 'make tools'): %v", err)
		}
		t.Skip("azurite-blob not found; 'make test' installs it")
	}
	shared.once.Do(func() { shared.s, shared.err = Run(bin, "") })
	if shared.err != nil {
		t.Fatal(shared.err)
	}
	t.Setenv(azstore.EnvConnectionString, "")
	t.Setenv(azstore.EnvAccountKey, AccountKey)
	return shared.s
}

// Run starts Azurite's blob service on a free loopback port, keeping blobs in dir, or in memory
// when dir is "".
func Run(bin, dir string) (*Server, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	port := ln.Addr().(*net.TCPAddr).Port
	ln.Close()
	args := []string{"--blobHost", "127.0.0.1", "--blobPort", fmt.Sprint(port),
		"--skipApiVersionCheck", "--loose", "--disableTelemetry", "--silent"}
	if dir == "" {
		args = append(args, "--inMemoryPersistence")
	} else {
		args = append(args, "--location", dir)
	}
	cmd := exec.Command(bin, args...)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	s3test.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	s := &Server{URL: fmt.Sprintf("http://127.0.0.1:%d", port), cmd: cmd}
	s.Endpoint = EndpointAt(s.URL)
	cred, err := azblob.NewSharedKeyCredential(Account, AccountKey)
	if err == nil {
		s.Client, err = azblob.NewClientWithSharedKeyCredential(s.Endpoint+"/", cred, nil)
	}
	if err != nil {
		s.Stop()
		return nil, err
	}
	for range 600 { // node takes seconds to start on a busy machine
		if res, err := http.Get(s.Endpoint); err == nil {
			res.Body.Close()
			return s, nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	s.Stop()
	return nil, fmt.Errorf("azurite did not start: %s", logs.String())
}

// Stop ends Azurite.
func (s *Server) Stop() {
	s.cmd.Process.Kill()
	s.cmd.Wait()
}

// CreateContainer makes a container.
func (s *Server) CreateContainer(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client.CreateContainer(context.Background(), name, nil); err != nil {
		t.Fatal(err)
	}
}

// DeleteContainer deletes a container and its blobs.
func (s *Server) DeleteContainer(t testing.TB, name string) {
	t.Helper()
	if _, err := s.Client.DeleteContainer(context.Background(), name, nil); err != nil {
		t.Fatal(err)
	}
}

// Put writes (or replaces) a blob.
func (s *Server) Put(t testing.TB, container, key string, data []byte) {
	t.Helper()
	if err := s.PutErr(container, key, data); err != nil {
		t.Fatal(err)
	}
}

// PutErr writes (or replaces) a blob.
func (s *Server) PutErr(container, key string, data []byte) error {
	_, err := s.Client.UploadBuffer(context.Background(), container, key, data, nil)
	return err
}

// NewProxy starts a fault proxy in front of the server; EndpointAt(proxy.URL) is the account
// behind it.
func (s *Server) NewProxy() *faultproxy.Proxy { return faultproxy.Start(s.URL, azErrors) }

// azErrors writes Azure's answers to the faults: 503 ServerBusy when it sheds load.
func azErrors(w http.ResponseWriter, f faultproxy.Fault) {
	if f == faultproxy.Forbidden {
		faultproxy.XMLError(w, http.StatusForbidden, "AuthorizationFailure",
			"This request is not authorized to perform this operation.")
		return
	}
	faultproxy.XMLError(w, http.StatusServiceUnavailable, "ServerBusy",
		"The server is currently unable to receive requests. Please retry your request.")
}
