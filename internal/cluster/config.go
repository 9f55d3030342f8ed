package cluster

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"slices"
	"strings"
	"time"
)

// Config is how a replica finds its peers and talks to them (serve's --peers flags). A duration
// left at zero takes its default.
type Config struct {
	Peers      []string      // every replica's base URL, this one included
	PeersDNS   string        // a name whose addresses are the replicas (a headless Service)
	DNSRefresh time.Duration // how often PeersDNS is resolved again (zero: DefaultDNSRefresh)
	Advertise  string        // this replica's base URL as its peers reach it
	TokenFile  string        // the shared secret peers present to each other
	Timeout    time.Duration // one chunk fetch from a peer (zero: DefaultTimeout)
	Connect    time.Duration // connecting to a peer (zero: DefaultConnectTimeout)

	// lookup resolves PeersDNS; net.DefaultResolver.LookupHost unless a test replaces it.
	lookup func(ctx context.Context, host string) ([]string, error)
}

// The defaults of the durations. A fetch includes the owner's own storage read, queued behind a
// fan-in's: on a loaded machine 5 s marked busy replicas down (3 replicas of a 64-pod fan-in on 2
// cores then read 2.3× the file). A killed replica is found sooner: its connections break, and new
// ones are refused. A lost host refuses nothing, it drops the packets: it is found down once
// connecting has taken DefaultConnectTimeout, which leaves a live replica too busy to accept at
// once (over 1 s on a loaded 2-core machine, which 1 s found down) room for a few SYN retries.
const (
	DefaultDNSRefresh     = 10 * time.Second
	DefaultTimeout        = 30 * time.Second
	DefaultConnectTimeout = 5 * time.Second
)

func (c *Config) refresh() time.Duration {
	if c.DNSRefresh == 0 {
		return DefaultDNSRefresh
	}
	return c.DNSRefresh
}

// RegisterFlags registers the cluster's flags on fs, with their defaults.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	fs.Func("peers", "comma-separated base `URLs` of every replica, this one included: the replicas share one "+
		"cache, each chunk read from storage by its owner only (needs --advertise, --peer-token-file and the cache)",
		func(v string) error {
			c.Peers = nil
			for p := range strings.SplitSeq(v, ",") {
				if p = strings.TrimSpace(p); p != "" {
					c.Peers = append(c.Peers, p)
				}
			}
			return nil
		})
	fs.StringVar(&c.PeersDNS, "peers-dns", "", "`NAME` whose addresses are the replicas (a Kubernetes headless "+
		"Service), resolved again every --peers-dns-refresh; each peer is --advertise's scheme and port at one")
	fs.DurationVar(&c.DNSRefresh, "peers-dns-refresh", DefaultDNSRefresh, "how often --peers-dns is resolved again")
	fs.StringVar(&c.Advertise, "advertise", "", "this replica's base `URL` as its peers reach it "+
		"(http://POD_IP:8080); it must be one of --peers")
	fs.StringVar(&c.TokenFile, "peer-token-file", "", "`FILE` holding the secret the replicas share: the first "+
		"token is sent to peers, any token in it is accepted from them (re-read when it changes; client tokens "+
		"do not open the peer route)")
	fs.DurationVar(&c.Timeout, "peer-timeout", DefaultTimeout, "longest a chunk fetch from a peer may take, "+
		"its storage read included; past it, or when the peer is found down, the replica reads storage itself")
	fs.DurationVar(&c.Connect, "peer-connect-timeout", DefaultConnectTimeout, "longest connecting to a peer may "+
		"take within --peer-timeout; past it the peer is found down (a lost host drops connections, it does not "+
		"refuse them) and the replica reads storage itself")
}

// Enabled reports whether the replica has peers to share its cache with.
func (c *Config) Enabled() bool { return len(c.Peers) > 0 || c.PeersDNS != "" }

// Validate reports settings a cluster cannot run with.
func (c *Config) Validate() error {
	if !c.Enabled() {
		if c.Advertise != "" || c.TokenFile != "" {
			return errors.New("--advertise and --peer-token-file need --peers or --peers-dns")
		}
		return nil
	}
	var errs []error
	if len(c.Peers) > 0 && c.PeersDNS != "" {
		errs = append(errs, errors.New("give --peers or --peers-dns, not both"))
	}
	if c.TokenFile == "" {
		errs = append(errs, errors.New("--peers and --peers-dns need --peer-token-file: the peer route is never open"))
	}
	if c.Timeout < 0 || c.Connect < 0 || c.DNSRefresh < 0 {
		errs = append(errs, errors.New("--peer-timeout, --peer-connect-timeout and --peers-dns-refresh must not be negative"))
	}
	self, err := Normalize(c.Advertise)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("--advertise: %v", err))...)
	}
	if c.PeersDNS != "" {
		if u, _ := url.Parse(self); u.Port() == "" {
			errs = append(errs, errors.New("--advertise needs a port with --peers-dns: every peer is reached on it"))
		}
	}
	var peers []string
	for _, p := range c.Peers {
		n, err := Normalize(p)
		if err != nil {
			errs = append(errs, fmt.Errorf("--peers: %v", err))
		}
		peers = append(peers, n)
	}
	if len(c.Peers) > 0 && !slices.Contains(peers, self) {
		errs = append(errs, fmt.Errorf("--advertise %s is not one of --peers: list every replica, this one "+
			"included, as the others reach it", self))
	}
	return errors.Join(errs...)
}

// Discover sets s's peers now — --peers, or the addresses --peers-dns resolves to — and returns
// what keeps them current: its owner runs it for as long as the replica serves.
func (c *Config) Discover(ctx context.Context, s *Store, log *slog.Logger) *Discovery {
	d := &Discovery{c: c, s: s, log: log}
	if c.PeersDNS == "" {
		s.SetPeers(c.Peers)
	} else {
		d.resolve(ctx)
	}
	return d
}

// Discovery keeps a Store's peers as --peers-dns names them.
type Discovery struct {
	c   *Config
	s   *Store
	log *slog.Logger
}

// Run resolves --peers-dns again every DNSRefresh until ctx ends, then returns; with --peers,
// whose list never changes, it returns at once. A lookup that fails keeps the peers found before.
func (d *Discovery) Run(ctx context.Context) {
	if d.c.PeersDNS == "" {
		return
	}
	t := time.NewTicker(d.c.refresh())
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			d.resolve(ctx)
		}
	}
}

func (d *Discovery) resolve(ctx context.Context) {
	peers, err := d.c.resolve(ctx)
	if err != nil {
		if ctx.Err() == nil {
			d.log.Warn("cluster peers: the lookup failed; the peers found before stay", "name", d.c.PeersDNS, "err", err)
		}
		return
	}
	d.s.SetPeers(peers)
}

// resolve returns the peers PeersDNS names: --advertise's scheme and port at each address.
func (c *Config) resolve(ctx context.Context) ([]string, error) {
	lookup := c.lookup
	if lookup == nil {
		lookup = net.DefaultResolver.LookupHost
	}
	ctx, cancel := context.WithTimeout(ctx, c.refresh())
	defer cancel()
	addrs, err := lookup(ctx, c.PeersDNS)
	if err != nil {
		return nil, err
	}
	u, err := url.Parse(c.Advertise)
	if err != nil {
		return nil, err
	}
	peers := make([]string, len(addrs))
	for i, a := range addrs {
		peers[i] = u.Scheme + "://" + net.JoinHostPort(a, u.Port())
	}
	return peers, nil
}
