// Command shardsrv serves remapped tensor shards from safetensors checkpoints.
//
//	shardsrv serve   --addr HOST:PORT --store DIR|file://DIR|s3://BUCKET/PREFIX [--s3-endpoint URL]
//	shardsrv example --out DIR
//
// Every flag of serve can also be set by an environment variable: SHARDSRV_ and the flag name in
// upper case with '-' as '_' (SHARDSRV_STORE, SHARDSRV_ADDR, ...). A flag on the command line wins.
package main

import (
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
	"runtime/debug"
	"strings"
	"syscall"
	"time"

	"github.com/shardsrv/shardsrv/internal/bytesize"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/telemetry"
)

// version is set at build time (-ldflags "-X main.version=...").
var version = "dev"

const usage = `shardsrv serves remapped tensor shards from safetensors checkpoints.

Usage:
  shardsrv serve   [flags]                      run the HTTP service (see 'shardsrv serve -h')
  shardsrv example --out DIR                    write the example checkpoint and requests, print curl commands
  shardsrv layout  --checkpoint NAME --tp N --rank R [--ep] [--format json|table]
                                                print the tensors vLLM holds on a rank (a request body, or a table)
  shardsrv plan    --request FILE               show what a request reads: a table per tensor
  shardsrv fetch   --request FILE -o OUT|-      fetch a shard into a file or stdout (progress on a terminal)
  shardsrv fetch   --checkpoint NAME --layout vllm --tp N --rank R|all --out DIR
                                                write a directory vLLM loads with --load-format sharded_state

The client commands take --server URL (SHARDSRV_SERVER, default http://localhost:8080) and --token
(SHARDSRV_TOKEN); 'shardsrv COMMAND -h' explains each command's flags, with examples.

A client POSTs the boxes of destination tensors it holds and the remap table (blocks) to
/v1/shards, or an engine's rank ("layout") that the server expands; the service reads only the
byte ranges it needs and streams back the bytes. See README.md and openapi.yaml.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "serve":
		err = serve(os.Args[2:], os.Stderr)
	case "example":
		err = writeExample(os.Args[2:], os.Stdout)
	case "fetch":
		err = fetch(os.Args[2:], os.Stdout, os.Stderr)
	case "plan":
		err = planCmd(os.Args[2:], os.Stdout, os.Stderr)
	case "layout":
		err = layoutCmd(os.Args[2:], os.Stdout, os.Stderr)
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "shardsrv: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, errorLine(err))
		}
		os.Exit(1)
	}
}

// errorLine is how a command's error is printed: prefixed once, though the client's errors
// (problems from the server) carry the prefix already, also when wrapped ("FILE: shardsrv: ...").
func errorLine(err error) string {
	msg := strings.ReplaceAll(err.Error(), ": shardsrv: ", ": ")
	return "shardsrv: " + strings.TrimPrefix(msg, "shardsrv: ")
}

// config is serve's configuration, from flags with SHARDSRV_* fallbacks.
type config struct {
	addr         string
	store        string
	s3           s3reader.Config
	maxBodyBytes int64
	executor     executor.Config
	memoryBytes  int64
	cacheBytes   int64
	cacheChunk   int64
	limits       server.Limits
	tokensFile   string
	grace        time.Duration
	drainDelay   time.Duration
	idleTimeout  time.Duration
	planner      planner.Options
	logLevel     string
}

func parseServe(args []string, stderr io.Writer) (*config, error) {
	c := &config{planner: planner.DefaultOptions()}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", ":8080", "`HOST:PORT` to listen on")
	fs.StringVar(
		&c.store,
		"store",
		"",
		"where checkpoints are: `DIR`, file://DIR or s3://BUCKET/PREFIX; each checkpoint is a folder (key prefix) in it (required)",
	)
	c.s3.RegisterFlags(fs)
	c.maxBodyBytes = 64 << 20
	fs.Var(bytesize.Value{P: &c.maxBodyBytes}, "max-body-bytes", "largest request `SIZE` accepted (413 above)")
	c.memoryBytes = 1536 << 20
	fs.Var(
		bytesize.Value{P: &c.memoryBytes},
		"memory-bytes",
		"memory budget (`SIZE`) for the cache, every stream's buffers and the plans being built, together; a request that finds it spent gets a 503",
	)
	fs.Var(
		bytesize.Value{P: &c.cacheBytes},
		"cache-bytes",
		"shared-region cache `SIZE`, taken from --memory-bytes (0 disables it; 512MiB for s3://, off for directories, which the OS page cache already caches)",
	)
	c.cacheChunk = 4 << 20
	fs.Var(
		bytesize.Value{P: &c.cacheChunk},
		"cache-chunk-bytes",
		"the cache's chunk `SIZE`: reads are aligned to it and storage is read in chunks (8MiB for s3://)",
	)
	c.executor.RegisterFlags(fs)
	c.planner.RegisterFlags(fs)
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	c.limits.RegisterFlags(fs)
	fs.DurationVar(&c.idleTimeout, "idle-timeout", 2*time.Minute, "how long an idle keep-alive connection stays open")
	fs.StringVar(
		&c.tokensFile,
		"auth-tokens-file",
		"",
		"`FILE` of bearer tokens, one per line, re-read when it changes; every route but /healthz, /readyz and /metrics then needs one (default: no auth)",
	)
	fs.DurationVar(
		&c.grace,
		"shutdown-grace",
		25*time.Second,
		"after --drain-delay, how long in-flight streams may take to finish once the listener is closed",
	)
	fs.DurationVar(
		&c.drainDelay,
		"drain-delay",
		5*time.Second,
		"on SIGTERM, how long /readyz answers 503 while new requests are still served, so load balancers stop sending first",
	)
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: shardsrv serve --store DIR|s3://BUCKET/PREFIX [flags]\n\n"+
			"Runs the HTTP service. Every flag can also be set as SHARDSRV_<FLAG> (e.g. SHARDSRV_STORE).\n"+
			"S3 credentials and region come from the standard AWS chain: AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY,\n"+
			"AWS_PROFILE and the shared files, or web identity (AWS_ROLE_ARN + AWS_WEB_IDENTITY_TOKEN_FILE, as IRSA sets).\n"+
			"For s3:// stores the defaults become --max-gap 1MiB --max-read 8MiB --segment-bytes 16MiB\n"+
			"--segment-read-bytes 32MiB --cache-bytes 512MiB --cache-chunk-bytes 8MiB unless given.\n"+
			"Sizes take units: 16777216, 16MiB, 16Mi, 1.5GiB.\n\nFlags:\n")
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
	if envErr != nil {
		return nil, envErr
	}
	if strings.HasPrefix(c.store, "s3://") {
		// Object storage: a request costs about 1 MiB of transfer (10-20 ms at 50-100 MB/s per
		// connection), so merge gaps up to that, never past 16x what a read needs; 8 MiB parts keep
		// the connections busy; bigger segments keep more of them in flight.
		s3Defaults := map[string]string{
			"max-gap":            "1048576",
			"max-read":           "8388608",
			"segment-bytes":      "16777216",
			"segment-read-bytes": "33554432",
			"cache-bytes":        "536870912",
			"cache-chunk-bytes":  "8388608",
		}
		for name, v := range s3Defaults {
			if !set[name] && os.Getenv("SHARDSRV_"+strings.ToUpper(strings.ReplaceAll(name, "-", "_"))) == "" {
				fs.Set(name, v)
			}
		}
		var err error
		if c.s3.Bucket, c.s3.Prefix, err = s3reader.ParseURL(c.store); err != nil {
			return nil, fmt.Errorf("--store: %v", err)
		}
	}
	return c, c.validate()
}

func (c *config) validate() error {
	var errs []error
	if c.store == "" {
		errs = append(
			errs,
			errors.New("--store is required: the directory holding checkpoint folders (try 'make run' for an example)"),
		)
	}
	if c.cacheBytes < 0 || c.cacheBytes >= c.memoryBytes || (c.cacheBytes > 0 && c.cacheBytes < c.cacheChunk) ||
		c.cacheChunk <= 0 {
		errs = append(
			errs,
			errors.New("--cache-bytes must be 0 or at least one --cache-chunk-bytes, and less than --memory-bytes"),
		)
	}
	if c.idleTimeout <= 0 || c.drainDelay < 0 || c.grace <= 0 {
		errs = append(
			errs,
			errors.New("--idle-timeout and --shutdown-grace must be positive, --drain-delay at least 0"),
		)
	}
	errs = append(errs, c.limits.Validate(), c.s3.Validate())
	if c.planner.MaxPlanBytes <= 0 || c.planner.MaxPlanBytes > c.memoryBytes-c.cacheBytes {
		errs = append(
			errs,
			errors.New("--max-plan-bytes must be positive and fit in --memory-bytes minus --cache-bytes"),
		)
	}
	if c.maxBodyBytes <= 0 {
		errs = append(errs, errors.New("--max-body-bytes must be positive"))
	}
	errs = append(errs, c.planner.Validate(), c.executor.Validate())
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %v", err))
	}
	return errors.Join(errs...)
}

func openStore(ctx context.Context, c *config) (store.Store, error) {
	if strings.HasPrefix(c.store, "s3://") {
		return s3reader.New(ctx, c.s3)
	}
	dir, isFile := strings.CutPrefix(c.store, "file://")
	if !isFile && strings.Contains(c.store, "://") {
		return nil, fmt.Errorf("--store %q: use a directory, file://DIR or s3://BUCKET/PREFIX", c.store)
	}
	return store.NewLocal(dir)
}

func serve(args []string, stderr io.Writer) error {
	c, err := parseServe(args, stderr)
	if err != nil {
		return err
	}
	var level slog.Level
	level.UnmarshalText([]byte(c.logLevel))
	log := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	// Keep the Go heap near the memory budget (plus room for the runtime and request metadata),
	// so the garbage collector works harder before the pod's memory limit is reached.
	if os.Getenv("GOMEMLIMIT") == "" {
		debug.SetMemoryLimit(c.memoryBytes + 256<<20)
	}
	tel, err := telemetry.New(context.Background(), "shardsrv", version)
	if err != nil {
		return err
	}
	defer tel.Shutdown(context.Background())
	raw, err := openStore(context.Background(), c)
	if err != nil {
		return err
	}
	var st store.Store = telemetry.InstrumentStore(raw, tel.Tracer, tel.Meter)
	if c.cacheBytes > 0 {
		cached, err := cache.New(st, c.cacheBytes, c.cacheChunk)
		if err != nil {
			return err
		}
		telemetry.ObserveCache(tel.Meter, cached)
		st = cached
		c.planner.Align = c.cacheChunk
	}
	var tokens *server.Tokens
	if c.tokensFile != "" {
		if tokens, err = server.LoadTokens(c.tokensFile, server.TokensOptions{Logger: log}); err != nil {
			return err
		}
	}
	srv := server.New(server.Config{
		Catalog: checkpoint.New(st),
		Executor: executor.New(st, executor.Config{Window: c.executor.Window, MaxRead: c.planner.MaxRead,
			MemoryBytes: c.memoryBytes - c.cacheBytes, AdmitWait: c.executor.AdmitWait,
			Tracer: tel.Tracer.Tracer("shardsrv/executor")}),
		Planner:      c.planner,
		MaxBodyBytes: c.maxBodyBytes,
		Limits:       c.limits,
		Tokens:       tokens,
		Logger:       log,
		Tracer:       tel.Tracer,
		Meter:        tel.Meter,
		Metrics:      tel.Metrics,
	})
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	// Headers get 10 s, a body --body-timeout (a read deadline per request); idle keep-alive
	// connections are closed after --idle-timeout.
	httpSrv := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: c.idleTimeout,
		ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- httpSrv.Serve(ln) }()
	log.Info(
		"serving",
		"addr",
		ln.Addr().String(),
		"store",
		st.String(),
		"cache_bytes",
		c.cacheBytes,
		"auth",
		tokens != nil,
	)
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
	if err := srv.Shutdown(second, httpSrv, c.drainDelay, c.grace); err != nil {
		log.Warn("shutdown", "err", err)
	}
	return nil
}

func writeExample(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	out := fs.String(
		"out",
		".run/checkpoints",
		"`DIR` to write the example checkpoint folder into; requests go next to it",
	)
	addr := fs.String("addr", "localhost:8080", "server address the printed curl commands use")
	if err := fs.Parse(args); err != nil {
		return err
	}
	requests, err := example.Generate(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(
		stdout,
		"Wrote checkpoint %q to %s. Try:\n%s",
		example.Name,
		*out,
		example.CurlExamples(*addr, requests),
	)
	return nil
}
