package cluster

import (
	"context"
	"flag"
	"io"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func parseConfig(t *testing.T, args ...string) (*Config, error) {
	t.Helper()
	var c Config
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	c.RegisterFlags(fs)
	if err := fs.Parse(args); err != nil {
		t.Fatal(err)
	}
	return &c, c.Validate()
}

func TestConfigValidate(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // "" for valid
	}{
		{nil, ""},
		{[]string{"--peers", "http://a:1, http://b:1", "--advertise", "http://A:1/", "--peer-token-file", "f"}, ""},
		{[]string{"--peers-dns", "shardsrv-peers", "--advertise", "http://10.0.0.1:8080", "--peer-token-file", "f"}, ""},
		{[]string{"--advertise", "http://a:1"}, "need --peers"},
		{[]string{"--peers", "http://a:1", "--advertise", "http://a:1"}, "--peer-token-file"},
		{[]string{"--peers", "http://a:1,http://b:1", "--advertise", "http://c:1", "--peer-token-file", "f"},
			"not one of --peers"},
		{[]string{"--peers", "a:1", "--advertise", "a:1", "--peer-token-file", "f"}, "not a base URL"},
		{[]string{"--peers-dns", "x", "--advertise", "http://a", "--peer-token-file", "f"}, "needs a port"},
		{[]string{"--peers-dns", "x", "--peers", "http://a:1", "--advertise", "http://a:1", "--peer-token-file", "f"},
			"not both"},
		{[]string{"--peers", "http://a:1", "--advertise", "http://a:1", "--peer-token-file", "f",
			"--peer-timeout", "-1s"}, "must not be negative"},
	} {
		_, err := parseConfig(t, c.args...)
		if (c.want == "") != (err == nil) || err != nil && !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want %q", c.args, err, c.want)
		}
	}
}

// --peers-dns: each address the name resolves to is a peer at --advertise's scheme and port, and
// the list follows the name as it changes.
func TestDiscoverFollowsTheName(t *testing.T) {
	c, err := parseConfig(t, "--peers-dns", "shardsrv-peers", "--advertise", "http://10.0.0.1:8080",
		"--peer-token-file", "f", "--peers-dns-refresh", "20ms")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	addrs := []string{"10.0.0.1", "10.0.0.2"}
	c.lookup = func(_ context.Context, host string) ([]string, error) {
		mu.Lock()
		defer mu.Unlock()
		return slices.Clone(addrs), nil
	}
	s, err := New(nil, Options{Self: c.Advertise, ChunkBytes: 1 << 20, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	d := c.Discover(ctx, s, slog.New(slog.DiscardHandler))
	go d.Run(ctx)
	if got := s.Peers(); !slices.Equal(got, []string{"http://10.0.0.1:8080", "http://10.0.0.2:8080"}) {
		t.Errorf("peers %v", got)
	}
	mu.Lock()
	addrs = []string{"10.0.0.1", "fd00::3"}
	mu.Unlock()
	want := []string{"http://10.0.0.1:8080", "http://[fd00::3]:8080"}
	for deadline := time.Now().Add(30 * time.Second); !slices.Equal(s.Peers(), want); {
		if time.Now().After(deadline) {
			t.Fatalf("peers %v after the name changed, want %v", s.Peers(), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// Discovery is owned: Run returns once its context ends, and with --peers at once, the peers set.
func TestDiscoveryStopsWithItsContext(t *testing.T) {
	c, err := parseConfig(t, "--peers-dns", "shardsrv-peers", "--advertise", "http://10.0.0.1:8080",
		"--peer-token-file", "f", "--peers-dns-refresh", "1ms")
	if err != nil {
		t.Fatal(err)
	}
	var lookups atomic.Int64
	c.lookup = func(context.Context, string) ([]string, error) {
		lookups.Add(1)
		return []string{"10.0.0.1"}, nil
	}
	s, err := New(nil, Options{Self: c.Advertise, ChunkBytes: 1 << 20, Timeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	d := c.Discover(ctx, s, slog.New(slog.DiscardHandler))
	done := make(chan struct{})
	go func() { d.Run(ctx); close(done) }()
	for lookups.Load() < 3 { // Run is resolving again
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done

	c, err = parseConfig(t, "--peers", "http://10.0.0.1:8080,http://10.0.0.2:8080", "--advertise",
		"http://10.0.0.1:8080", "--peer-token-file", "f")
	if err != nil {
		t.Fatal(err)
	}
	c.Discover(context.Background(), s, slog.New(slog.DiscardHandler)).Run(context.Background())
	if got := s.Peers(); !slices.Equal(got, []string{"http://10.0.0.1:8080", "http://10.0.0.2:8080"}) {
		t.Errorf("peers %v", got)
	}
}

// Options follow the one zero-value rule: a zero time-out or stripe is the default, negatives are
// refused, and the chunk, which must be the cache's above, is required.
func TestOptionsZeroIsTheDefault(t *testing.T) {
	s, err := New(nil, Options{ChunkBytes: 64 << 10})
	if err != nil {
		t.Fatal(err)
	}
	if s.opts.Timeout != DefaultTimeout || s.stripe != DefaultStripeBytes {
		t.Errorf("zero options: time-out %s, stripe %d; want %s and %d", s.opts.Timeout, s.stripe, DefaultTimeout,
			DefaultStripeBytes)
	}
	for _, o := range []Options{{}, {ChunkBytes: 64 << 10, Timeout: -time.Second}, {ChunkBytes: 64 << 10, StripeBytes: -1},
		{ChunkBytes: 64 << 10, Self: "10.0.0.7:8080"}} {
		if _, err := New(nil, o); err == nil {
			t.Errorf("New(%+v) accepted", o)
		}
	}
}
