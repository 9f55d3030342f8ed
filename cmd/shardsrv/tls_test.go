package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"io"
	"log"
	"math/big"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/example"
)

// testCA issues certificates for 127.0.0.1.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newTestCA(t *testing.T) *testCA {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), IsCA: true,
		KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &testCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// issue writes a leaf certificate with serial for names (IP addresses or DNS names), for servers
// and clients, and its key to certFile and keyFile.
func (ca *testCA) issue(t *testing.T, serial int64, certFile, keyFile string, names ...string) {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: "shardsrv"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage:    x509.KeyUsageDigitalSignature,
		ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}}
	for _, name := range names {
		if ip := net.ParseIP(name); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else {
			tmpl.DNSNames = append(tmpl.DNSNames, name)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	// Key first, then the certificate: the server meets a pair that does not match in between.
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
		0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		0o644); err != nil {
		t.Fatal(err)
	}
}

// freeAddr is a loopback address nothing listens on as it returns.
func freeAddr(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}

// logBuffer is a process's log, read while the process writes it.
type logBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *logBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *logBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startServe runs `shardsrv serve --addr addr args...` over TLS as a process of its own until the
// test ends, and returns once addr completes TLS handshakes; the log is what the process wrote.
func startServe(t *testing.T, addr string, args ...string) *logBuffer {
	t.Helper()
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), runMainEnv+"="+strings.Join(append([]string{"serve", "--addr", addr}, args...), "\n"))
	logs := &logBuffer{}
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(50 * time.Millisecond) {
		if c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true}); err == nil {
			c.Close()
			return logs
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server did not start:\n%s", logs.String())
		}
	}
}

// servedSerial is the serial of the certificate a new connection to addr is shown, and the HTTP
// version the server answered in.
func servedSerial(t *testing.T, caFile, url string) (int64, int) {
	t.Helper()
	c, err := api.NewHTTPClientWithCA(caFile)
	if err != nil {
		t.Fatal(err)
	}
	defer c.CloseIdleConnections()
	res, err := c.Get(url + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	res.Body.Close()
	return res.TLS.PeerCertificates[0].SerialNumber.Int64(), res.ProtoMajor
}

// The server over TLS, end to end: HTTP/2, the CLI with --ca-file (and refused without it, once,
// not retried), and a certificate rotated in place while serving.
func TestTLSEndToEndWithARotatedCertificate(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "checkpoints")
	if _, err := example.Generate(store); err != nil {
		t.Fatal(err)
	}
	ca := newTestCA(t)
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	os.WriteFile(caFile, ca.pem, 0o644)
	ca.issue(t, 100, certFile, keyFile, "127.0.0.1")
	addr := freeAddr(t)
	logs := startServe(t, addr, "--store", store, "--tls-cert-file", certFile, "--tls-key-file", keyFile)
	url := "https://" + addr
	if serial, proto := servedSerial(t, caFile, url); serial != 100 || proto != 2 {
		t.Errorf("served certificate %d over HTTP/%d, want 100 over HTTP/2", serial, proto)
	}

	out := filepath.Join(dir, "rank1")
	var errs bytes.Buffer
	fetchArgs := []string{"--server", url, "--checkpoint", example.Name, "--layout", "vllm", "--tp", "2",
		"--rank", "1", "--out", out}
	if err := fetch(append(fetchArgs, "--ca-file", caFile), &bytes.Buffer{}, &errs); err != nil {
		t.Fatalf("fetch over TLS: %v\n%s", err, errs.String())
	}
	if !strings.Contains(errs.String(), "digest verified") {
		t.Errorf("the digest rule holds over HTTP/2: %s", errs.String())
	}
	errs.Reset()
	if err := fetch(fetchArgs, &bytes.Buffer{}, &errs); err == nil ||
		!strings.Contains(err.Error(), "certificate") || strings.Contains(errs.String(), "retrying") {
		t.Errorf("without --ca-file: %v, %s; want a certificate error, not retried", err, errs.String())
	}

	ca.issue(t, 101, certFile, keyFile, "127.0.0.1") // as cert-manager renews the Secret's files
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(100 * time.Millisecond) {
		serial, _ := servedSerial(t, caFile, url)
		if serial == 101 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("still serving certificate %d a minute after the rotation:\n%s", serial, logs.String())
		}
	}
	// The rotated certificate serves whole shards too.
	if err := fetch(append(fetchArgs, "--ca-file", caFile, "--rank", "0"), &bytes.Buffer{}, &errs); err != nil {
		t.Errorf("fetch after the rotation: %v", err)
	}
	if res, err := http.Get(url + "/healthz"); err == nil {
		res.Body.Close()
		t.Error("a client without the CA was served")
	}
}

// With --tls-client-ca-file a client must present a certificate of that CA.
func TestTLSClientCertificates(t *testing.T) {
	dir := t.TempDir()
	store := filepath.Join(dir, "checkpoints")
	os.MkdirAll(store, 0o755)
	ca := newTestCA(t)
	caFile, certFile, keyFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	os.WriteFile(caFile, ca.pem, 0o644)
	ca.issue(t, 7, certFile, keyFile, "127.0.0.1")
	addr := freeAddr(t)
	startServe(t, addr, "--store", store, "--tls-cert-file", certFile, "--tls-key-file", keyFile,
		"--tls-client-ca-file", caFile)
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	pair, err := tls.LoadX509KeyPair(certFile, keyFile) // a certificate of the CA, as a client's
	if err != nil {
		t.Fatal(err)
	}
	get := func(certs []tls.Certificate) error {
		c := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, Certificates: certs}}}
		defer c.CloseIdleConnections()
		res, err := c.Get("https://" + addr + "/healthz")
		if err == nil {
			res.Body.Close()
		}
		return err
	}
	for deadline := time.Now().Add(time.Minute); get([]tls.Certificate{pair}) != nil; time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("a client with a certificate of the CA was never served: %v", get([]tls.Certificate{pair}))
		}
	}
	if err := get(nil); err == nil {
		t.Error("a client without a certificate was served")
	}
}

// leaf is a certificate of ca for dnsNames (and no address), as a tls.Certificate.
func (ca *testCA) leaf(t *testing.T, dnsNames ...string) tls.Certificate {
	t.Helper()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "peer"}, DNSNames: dnsNames,
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// How a replica checks a peer it reaches at a pod address: --peer-ca-file alone admits any
// certificate of that CA, and --peer-server-name also wants that name on it — the Service's, which
// the replicas' shared certificate names — whatever address the peer was reached at.
func TestPeerCertificateNames(t *testing.T) {
	dir := t.TempDir()
	ca, other := newTestCA(t), newTestCA(t)
	caFile := filepath.Join(dir, "ca.pem")
	os.WriteFile(caFile, ca.pem, 0o644)
	const service = "shardsrv.ml.svc"
	for _, c := range []struct {
		name       string
		serverName string
		cert       tls.Certificate
		ok         bool
	}{
		{"the CA alone, the Service's certificate", "", ca.leaf(t, service), true},
		{"the CA alone, another name of the CA", "", ca.leaf(t, "other.ml.svc"), true},
		{"the CA alone, another CA", "", other.leaf(t, service), false},
		{"the name, the Service's certificate", service, ca.leaf(t, service), true},
		{"the name, another name of the CA", service, ca.leaf(t, "other.ml.svc"), false},
		{"the name, another CA", service, other.leaf(t, service), false},
	} {
		ts := httptest.NewUnstartedServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
		ts.TLS = &tls.Config{Certificates: []tls.Certificate{c.cert}}
		ts.Config.ErrorLog = log.New(io.Discard, "", 0) // the refused handshakes
		// Reached at 127.0.0.1, which no certificate here names.
		ts.StartTLS()
		cfg, err := peerTLS(caFile, c.serverName, nil)
		if err != nil {
			t.Fatal(err)
		}
		client := &http.Client{Transport: &http.Transport{TLSClientConfig: cfg}}
		res, err := client.Get(ts.URL)
		if err == nil {
			res.Body.Close()
		}
		if (err == nil) != c.ok {
			t.Errorf("%s: %v, want admitted %v", c.name, err, c.ok)
		}
		client.CloseIdleConnections()
		ts.Close()
	}
}
