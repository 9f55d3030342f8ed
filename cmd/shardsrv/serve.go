package main

import (
	"cmp"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/shardsrv/shardsrv/internal/auth"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/telemetry"
	"github.com/shardsrv/shardsrv/internal/verify"
)

// config is serve's configuration, from flags with SHARDSRV_* fallbacks. Each package's part
// registers its own flags and validates itself, and in every part zero is the default but where
// zero is itself a setting (docs/configuration.md); this file only checks what spans parts.
type config struct {
	addr  string
	store string
	// objectStores are the configs of objectStores' entries, in its order.
	objectStores []objectStoreConfig
	budget       budget.Config
	executor     executor.Config
	cache        cache.Config
	limits       server.Limits
	planner      planner.Options
	verify       verify.Config
	cluster      cluster.Config
	tls          tlsFlags
	tokensFile   string
	grace        time.Duration
	drainDelay   time.Duration
	storeGrace   time.Duration
	idleTimeout  time.Duration
	logLevel     string
}

// The defaults of serve's own durations, which zero also means.
const (
	defaultIdleTimeout   = 2 * time.Minute
	defaultShutdownGrace = 25 * time.Second
)

// newServeFlags returns serve's flags over a fresh config whose defaults suit the store url names:
// a local directory, or an object store, with its own read size where it has one.
func newServeFlags(url string, stderr io.Writer) (*config, *flag.FlagSet) {
	c := &config{planner: planner.DefaultOptions(), cache: cache.DefaultConfig(), objectStores: newObjectStoreConfigs()}
	if i := objectStoreOf(url); i >= 0 {
		c.planner, c.cache = planner.ObjectStoreOptions(), cache.ObjectStoreConfig()
		if n := objectStores[i].readBytes; n > 0 {
			c.planner.SegmentBytes, c.planner.MaxRead = n, n
		}
	}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", ":8080", "`HOST:PORT` to listen on")
	fs.StringVar(&c.store, "store", "", "the `STORE` the checkpoints are in: "+storeForms()+
		"; each checkpoint is a folder (key prefix) in it (required)")
	for _, o := range c.objectStores {
		o.RegisterFlags(fs)
	}
	c.budget.RegisterFlags(fs)
	c.executor.RegisterFlags(fs)
	c.cache.RegisterFlags(fs)
	c.planner.RegisterFlags(fs)
	c.limits.RegisterFlags(fs)
	c.verify.RegisterFlags(fs)
	c.cluster.RegisterFlags(fs)
	c.tls.register(fs)
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.DurationVar(&c.idleTimeout, "idle-timeout", defaultIdleTimeout, "how long an idle keep-alive connection stays open")
	fs.StringVar(&c.tokensFile, "auth-tokens-file", "", "`FILE` of bearer tokens, one per line, re-read when it "+
		"changes; every route but /healthz, /readyz and /metrics then needs one (default: no auth)")
	fs.DurationVar(&c.grace, "shutdown-grace", defaultShutdownGrace,
		"after --drain-delay, how long in-flight streams may take to finish once the listener is closed")
	fs.DurationVar(&c.drainDelay, "drain-delay", 5*time.Second, "on SIGTERM, how long /readyz answers 503 "+
		"while new requests are still served, so load balancers stop sending first")
	fs.DurationVar(&c.storeGrace, "ready-store-grace", server.DefaultStoreGrace, "how long the store may be "+
		"unreachable before /readyz answers 503; with a cache (--cache-bytes) it never does, the cache serving "+
		"what it holds")
	return c, fs
}

// objectStoreDefaults lists the flags whose defaults differ for object stores, as serve -h shows.
func objectStoreDefaults() string { return defaultsBeside("", anyObjectStore) }

// anyObjectStore names an object store of the defaults all of them share.
const anyObjectStore = "s3://"

// defaultsBeside lists the flags whose defaults differ for the store url names from those for the
// store base names.
func defaultsBeside(base, url string) string {
	_, before := newServeFlags(base, io.Discard)
	_, after := newServeFlags(url, io.Discard)
	var diffs []string
	after.VisitAll(func(f *flag.Flag) {
		if f.DefValue != before.Lookup(f.Name).DefValue {
			diffs = append(diffs, "--"+f.Name+" "+f.DefValue)
		}
	})
	return strings.Join(diffs, " ")
}

// parseServe parses serve's flags. It parses twice when --store names an object store: the
// second time over the object-store defaults, so a flag left unset takes the default that suits it.
func parseServe(args []string, stderr io.Writer) (*config, error) {
	c, err := parseServeOnce(args, "", stderr)
	if err == nil && isObjectStore(c.store) {
		c, err = parseServeOnce(args, c.store, stderr)
	}
	if err != nil {
		return nil, err
	}
	if err := parseStoreURL(c); err != nil {
		return nil, fmt.Errorf("--store: %v", err)
	}
	c.derive()
	return c, c.validate()
}

// derive sets the settings that follow from others, here only; the serving line prints them with
// the two their packages derive at run time (the plan's share of the budget, the Go memory limit).
func (c *config) derive() {
	c.budget.CacheBytes = c.cache.Bytes // the cache keeps its memory within its share
	if c.cache.Bytes > 0 {
		c.planner.Align = c.cache.Chunk() // reads of different clients meet in the same chunks
	}
}

func parseServeOnce(args []string, url string, stderr io.Writer) (*config, error) {
	c, fs := newServeFlags(url, stderr)
	fs.Usage = func() {
		fmt.Fprintf(stderr, "Usage: shardsrv serve --store %s [flags]\n\n"+
			"Runs the HTTP service. Every flag can also be set as SHARDSRV_<FLAG> (e.g. SHARDSRV_STORE).\n"+
			"S3 credentials and region come from the standard AWS chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,\n"+
			"AWS_PROFILE and the shared files, or web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, as IRSA "+
			"sets).\nGCS credentials are Application Default Credentials (Workload Identity on GKE); "+
			"STORAGE_EMULATOR_HOST\nor --gcs-endpoint for an emulator. Azure: AZURE_STORAGE_CONNECTION_STRING, "+
			"else AZURE_STORAGE_KEY,\nelse DefaultAzureCredential (Workload Identity on AKS).\n"+
			"For object stores the defaults become %s unless given%s.\n"+
			"Sizes take units: 16777216, 16MiB, 16Mi, 1.5GiB.\n\nFlags:\n", storeForms(), objectStoreDefaults(),
			ownReadSizes())
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var envErr error
	fs.VisitAll(func(f *flag.Flag) {
		env := "SHARDSRV_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(env); ok && !set[f.Name] {
			if err := f.Value.Set(v); err != nil && envErr == nil {
				envErr = fmt.Errorf("%s=%q: %v", env, v, err)
			}
		}
	})
	return c, envErr
}

func (c *config) validate() error {
	var errs []error
	if c.store == "" {
		errs = append(errs, errors.New(
			"--store is required: the directory holding checkpoint folders (try 'make run' for an example)"))
	}
	if c.idleTimeout < 0 || c.drainDelay < 0 || c.grace < 0 || c.storeGrace < 0 {
		errs = append(errs, errors.New(
			"--idle-timeout, --shutdown-grace, --drain-delay and --ready-store-grace must not be negative"))
	}
	if shared := c.budget.Shared(); shared > 0 && c.planner.MaxPlanBytes > shared {
		errs = append(errs, errors.New("--max-plan-bytes must fit in --memory-bytes minus --cache-bytes"))
	}
	for _, o := range c.objectStores {
		errs = append(errs, o.Validate())
	}
	errs = append(errs, c.limits.Validate(), c.planner.Validate(), c.budget.Validate(), c.executor.Validate(), c.cache.Validate(), c.verify.Validate(),
		c.cluster.Validate(), c.tls.validate())
	if c.cluster.Enabled() && c.cache.Bytes == 0 {
		errs = append(errs, errors.New("--peers and --peers-dns share the cache: they need --cache-bytes"))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %v", err))
	}
	return errors.Join(errs...)
}

func serve(args []string, stderr io.Writer) error {
	c, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	level.UnmarshalText([]byte(c.logLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	goMemoryLimit := c.budget.SetGoMemoryLimit()
	tel, err := telemetry.New(context.Background(), "shardsrv", version)
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	tlsConfig, certs, err := c.tls.serverConfig(log)
	if err != nil {
		return err
	}
	raw, err := openStore(context.Background(), c)
	if err != nil {
		return err
	}
	var st store.Store = telemetry.InstrumentStore(raw, tel.Tracer, tel.Meter)
	keys, err := c.verify.Keys()
	if err != nil {
		return err
	}
	// Verification sits under the cache: what the cache holds was verified once, when it was read.
	verifier := verify.New(st, c.verify.Mode, keys, tel.Meter)
	if verifier.Mode() != c.verify.Mode {
		log.Warn("no --trust-key: signatures are not checked", "verify", string(c.verify.Mode))
	}
	if verifier.Mode() != verify.ModeOff {
		st = verifier.AsStore()
	}
	var tokens *auth.Tokens
	if c.tokensFile != "" {
		if tokens, err = auth.LoadTokens(c.tokensFile, auth.TokensOptions{Logger: log}); err != nil {
			return err
		}
	}
	mem := budget.New(c.budget)
	// What runs beside the listener (peer discovery) stops with it.
	background, stopBackground := context.WithCancel(context.Background())
	var running sync.WaitGroup
	defer running.Wait()
	defer stopBackground()
	var peers *cluster.Handler
	var peerTokens *auth.Tokens
	if c.cache.Bytes > 0 {
		shared, err := openCluster(background, c, st, tel, tokens, certs, log)
		if err != nil {
			return err
		}
		running.Go(func() { shared.discovery.Run(background) })
		st, peers, peerTokens = shared.cache, shared.handler, shared.peerTokens
	}
	executorConfig := c.executor
	executorConfig.Tracer = tel.Tracer.Tracer("shardsrv/executor")
	exec := executor.New(st, mem, executorConfig)
	catalog := checkpoint.New(st)
	// Every file of a checkpoint is asked for its version at most once a second: a replaced file
	// is served new within a second, cache or not, at one Stat per file per second.
	catalog.Revalidate = time.Second
	// The metadata the catalog and the verifier read and decode is held against the same budget.
	catalog.ChargeTo(mem.Reserve)
	verifier.Reserve = mem.Reserve
	srv := server.New(server.Config{
		Catalog:    catalog,
		Executor:   exec,
		Budget:     mem,
		Planner:    c.planner,
		Limits:     c.limits,
		Tokens:     tokens,
		Logger:     log,
		Tracer:     tel.Tracer,
		Meter:      tel.Meter,
		Metrics:    tel.Metrics,
		Cluster:    peers,
		PeerTokens: peerTokens,
		StoreGrace: c.storeGrace,
	})
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	// Headers get 10 s, a body --body-timeout (a read deadline per request); idle keep-alive
	// connections are closed after --idle-timeout.
	httpSrv := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: cmp.Or(c.idleTimeout, defaultIdleTimeout),
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn), TLSConfig: tlsConfig}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() {
		if tlsConfig != nil {
			errc <- httpSrv.ServeTLS(ln, "", "") // the key pair is TLSConfig's; HTTP/2 is offered
			return
		}
		errc <- httpSrv.Serve(ln)
	}()
	// One line says what the flags came to: the settings derived from them, each computed by its owner.
	log.Info("serving", "addr", ln.Addr().String(), "store", st.String(), "auth", tokens != nil,
		"tls", tlsConfig != nil, "memory_bytes", c.budget.Bytes, "cache_bytes", c.cache.Bytes,
		"shared_bytes", mem.Bytes(), "plan_bytes", srv.PlanBytes(), "align_bytes", c.planner.Align,
		"go_memory_limit", goMemoryLimit)
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	// Readiness fails at once while the listener still accepts, for --drain-delay; then the
	// listener closes and streams get the grace period. A second signal ends the drain delay.
	second, cancelSecond := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer cancelSecond()
	stop()
	if err := srv.Shutdown(second, httpSrv, c.drainDelay, cmp.Or(c.grace, defaultShutdownGrace)); err != nil {
		log.Warn("shutdown", "err", err)
	}
	return nil
}
