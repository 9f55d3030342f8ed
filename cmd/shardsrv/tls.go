package main

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"time"
)

// tlsFlags are serve's TLS flags: the server's key pair and, optionally, the CA its clients'
// certificates must chain to.
type tlsFlags struct {
	certFile, keyFile, clientCAFile, peerCAFile, peerServerName string
}

func (f *tlsFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&f.certFile, "tls-cert-file", "", "serve HTTPS (HTTP/2 and HTTP/1.1) with the certificate "+
		"chain in this PEM `FILE`, loaded again within a second of a change (cert-manager's rotation); with "+
		"--tls-key-file")
	fs.StringVar(&f.keyFile, "tls-key-file", "", "the private key (PEM `FILE`) of --tls-cert-file")
	fs.StringVar(&f.clientCAFile, "tls-client-ca-file", "", "require every client, peers and probes included, to "+
		"present a certificate that chains to a CA in this PEM `FILE` (mutual TLS)")
	fs.StringVar(&f.peerCAFile, "peer-ca-file", "", "with https:// peers: the CA (PEM `FILE`) their certificates "+
		"chain to, in place of the system's; without --peer-server-name any certificate of that CA is a peer's")
	fs.StringVar(&f.peerServerName, "peer-server-name", "", "with https:// peers: the `NAME` every peer's certificate "+
		"must carry, checked in place of the address a peer is reached at (pod addresses, which certificates rarely "+
		"name): the Service's DNS name, which the replicas' shared certificate names")
}

func (f *tlsFlags) validate() error {
	if (f.certFile == "") != (f.keyFile == "") {
		return errors.New("--tls-cert-file and --tls-key-file go together")
	}
	if f.clientCAFile != "" && f.certFile == "" {
		return errors.New("--tls-client-ca-file needs --tls-cert-file and --tls-key-file")
	}
	return nil
}

// serverConfig is the listener's TLS configuration (nil without --tls-cert-file) and the
// reloader of its key pair, which the replica also presents to its peers as a client.
func (f *tlsFlags) serverConfig(log *slog.Logger) (*tls.Config, *certReloader, error) {
	if f.certFile == "" {
		return nil, nil, nil
	}
	r := &certReloader{certFile: f.certFile, keyFile: f.keyFile, log: log}
	if _, err := r.get(); err != nil {
		return nil, nil, err
	}
	cfg := &tls.Config{
		MinVersion:     tls.VersionTLS12,
		GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return r.get() },
	}
	if f.clientCAFile != "" {
		pool, err := loadCAs(f.clientCAFile)
		if err != nil {
			return nil, nil, err
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, r, nil
}

// loadCAs reads a PEM bundle of CA certificates.
func loadCAs(file string) (*x509.CertPool, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, fmt.Errorf("%s holds no PEM certificate", file)
	}
	return pool, nil
}

// certReloader is a key pair loaded again when its files change: a Kubernetes Secret is updated
// in place (the kubelet swaps a symlink), so a rotated certificate is served without a restart.
// The files are looked at at most once a second; a pair that does not load (the certificate
// written, its key not yet) keeps the previous one until it does.
type certReloader struct {
	certFile, keyFile string
	log               *slog.Logger

	mu      sync.Mutex
	cert    *tls.Certificate
	stamp   string // the files' sizes and modification times when cert was loaded
	checked time.Time
}

func (r *certReloader) get() (*tls.Certificate, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.cert != nil && time.Since(r.checked) < time.Second {
		return r.cert, nil
	}
	r.checked = time.Now()
	stamp, err := fileStamp(r.certFile, r.keyFile)
	if err == nil && stamp == r.stamp {
		return r.cert, nil
	}
	var cert tls.Certificate
	if err == nil {
		cert, err = tls.LoadX509KeyPair(r.certFile, r.keyFile)
	}
	if err != nil {
		if r.cert == nil {
			return nil, fmt.Errorf("--tls-cert-file, --tls-key-file: %w", err)
		}
		r.log.Warn("the TLS key pair did not load; serving the previous one", "err", err)
		return r.cert, nil
	}
	if r.cert != nil {
		r.log.Info("TLS certificate reloaded", "cert", r.certFile)
	}
	r.cert, r.stamp = &cert, stamp
	return r.cert, nil
}

func fileStamp(files ...string) (string, error) {
	stamp := ""
	for _, f := range files {
		fi, err := os.Stat(f) // through the kubelet's symlinks, to the file now in place
		if err != nil {
			return "", err
		}
		stamp += fmt.Sprintf("%d@%d;", fi.Size(), fi.ModTime().UnixNano())
	}
	return stamp, nil
}

// peerTLS is how a replica reaches its https:// peers: their certificate chains to caFile's CAs
// (the system's without it) and names serverName, whatever address they are reached at; without
// serverName, a caFile's chain alone admits a peer (the address it is reached at is a pod's, which
// its certificate rarely names), and without either the certificate must name that address. The
// replica presents its own key pair, for peers that require client certificates.
func peerTLS(caFile, serverName string, own *certReloader) (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: serverName}
	if own != nil {
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return own.get() }
	}
	if caFile == "" {
		return cfg, nil
	}
	roots, err := loadCAs(caFile)
	if err != nil {
		return nil, err
	}
	cfg.RootCAs = roots
	if serverName != "" {
		return cfg, nil // the standard check: the chain, and the name
	}
	// The chain is checked here, in place of the default check that also wants the peer's name.
	cfg.InsecureSkipVerify = true
	cfg.VerifyConnection = func(cs tls.ConnectionState) error {
		if len(cs.PeerCertificates) == 0 {
			return errors.New("the peer sent no certificate")
		}
		inter := x509.NewCertPool()
		for _, c := range cs.PeerCertificates[1:] {
			inter.AddCert(c)
		}
		_, err := cs.PeerCertificates[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter})
		return err
	}
	return cfg, nil
}
