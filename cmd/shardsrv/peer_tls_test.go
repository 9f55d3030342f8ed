package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/example"
)

// metricSum is the sum of the samples of metric whose labels contain every one of labels, as
// the replica at url answers /metrics.
func metricSum(t *testing.T, client *http.Client, url, metric string, labels ...string) float64 {
	t.Helper()
	res, err := client.Get(url + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	sum := 0.0
	lines := bufio.NewScanner(res.Body)
	for lines.Scan() {
		line := lines.Text()
		name, rest, _ := strings.Cut(line, "{")
		if name != metric || !containsAll(rest, labels) {
			continue
		}
		v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		sum += v
	}
	return sum
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// Two replicas serving HTTPS, with mutual TLS, reach each other at their addresses (127.0.0.1,
// which the certificates below do not name) over the peer route, checking each other's
// certificate for --peer-server-name. A rank is read from one replica, then from the other: every
// stripe of the checkpoint is then read once by the replica that does not own it, from its owner.
// With certificates that carry the name, the peers serve those reads; with certificates of the
// same CA for another name, every peer is refused and the reads come from storage, the bytes the
// same (docs/cluster.md: a peer that cannot be reached costs bytes, never a failed request).
func TestReplicasShareTheirCacheOverTLS(t *testing.T) {
	const service = "shardsrv.test.svc"
	plain, folder := liveWrapped(t, nil)
	request := fmt.Sprintf(`{"checkpoint": %q, "layout": {"engine": "vllm", "tensor_parallel_size": 2, "tp_rank": 1}}`,
		example.Name)
	want := postShards(t, http.DefaultClient, plain, request)
	for _, c := range []struct {
		name     string
		certName string // the name the replicas' certificates carry
		shared   bool
	}{
		{"certificates naming the Service", service, true},
		{"certificates naming another Service", "other.test.svc", false},
	} {
		t.Run(c.name, func(t *testing.T) {
			dir := t.TempDir()
			ca := newTestCA(t)
			caFile, tokenFile := filepath.Join(dir, "ca.pem"), filepath.Join(dir, "peer-token")
			os.WriteFile(caFile, ca.pem, 0o644)
			os.WriteFile(tokenFile, []byte("a secret of the replicas\n"), 0o600)
			addrs := []string{freeAddr(t), freeAddr(t)}
			urls := []string{"https://" + addrs[0], "https://" + addrs[1]}
			logs := make([]*logBuffer, len(addrs))
			var pair tls.Certificate
			for i, addr := range addrs {
				certFile, keyFile := filepath.Join(dir, fmt.Sprint(i, ".crt")), filepath.Join(dir, fmt.Sprint(i, ".key"))
				ca.issue(t, int64(10+i), certFile, keyFile, c.certName)
				if i == 0 {
					var err error
					if pair, err = tls.LoadX509KeyPair(certFile, keyFile); err != nil {
						t.Fatal(err)
					}
				}
				logs[i] = startServe(t, addr, "--store", filepath.Dir(folder), "--cache-bytes", "16Mi",
					"--tls-cert-file", certFile, "--tls-key-file", keyFile, "--tls-client-ca-file", caFile,
					"--peers", strings.Join(urls, ","), "--advertise", urls[i], "--peer-token-file", tokenFile,
					"--peer-ca-file", caFile, "--peer-server-name", service)
			}
			// The test reaches the replicas as a client of theirs, with a certificate of the CA.
			roots := x509.NewCertPool()
			roots.AddCert(ca.cert)
			client := &http.Client{Transport: &http.Transport{ForceAttemptHTTP2: true,
				TLSClientConfig: &tls.Config{RootCAs: roots, ServerName: c.certName, Certificates: []tls.Certificate{pair}}}}
			defer client.CloseIdleConnections()

			for i, url := range urls {
				if got := postShards(t, client, url, request); !bytes.Equal(got, want) {
					t.Fatalf("replica %d served %d bytes that differ from the %d of one server\n%s", i, len(got), len(want),
						logs[i].String())
				}
			}
			var fromPeers, served, refused float64
			for _, url := range urls {
				fromPeers += metricSum(t, client, url, "shardsrv_cluster_chunks_total", `source="peer"`)
				served += metricSum(t, client, url, "shardsrv_requests_total", `route="/internal/cluster/v1/chunk"`,
					`status="200"`)
				refused += metricSum(t, client, url, "shardsrv_cluster_peer_errors_total", `reason="unreachable"`)
			}
			if c.shared && (fromPeers == 0 || served != fromPeers || refused != 0) {
				t.Errorf("%v runs came from peers, the peer route served %v, %v fetches were refused; "+
					"want the same number above 0, none refused\n%s\n%s", fromPeers, served, refused, logs[0], logs[1])
			}
			if !c.shared && (fromPeers != 0 || served != 0 || refused == 0) {
				t.Errorf("%v runs came from peers, the peer route served %v, %v fetches were refused; "+
					"want none served and a refusal\n%s\n%s", fromPeers, served, refused, logs[0], logs[1])
			}
		})
	}
}

// postShards is the body POST /v1/shards answers request with at url.
func postShards(t *testing.T, client *http.Client, url, request string) []byte {
	t.Helper()
	res, err := client.Post(url+"/v1/shards", "application/json", strings.NewReader(request))
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(res.Body)
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("%s: %s %v: %.300s", url, res.Status, err, body)
	}
	return body
}
