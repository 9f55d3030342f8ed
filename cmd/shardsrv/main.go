// Command shardsrv serves remapped tensor shards from safetensors checkpoints.
//
//	shardsrv serve   --addr HOST:PORT --store DIR|file://DIR
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
	"strings"
	"syscall"
	"time"

	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/example"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

const usage = `shardsrv serves remapped tensor shards from safetensors checkpoints.

Usage:
  shardsrv serve   [flags]    run the HTTP service (see 'shardsrv serve -h')
  shardsrv example --out DIR  write the example checkpoint and requests, print curl commands

A client POSTs the boxes of destination tensors it holds and the remap table (blocks) to
/v1/shards; the service reads only the byte ranges it needs and streams back the bytes.
See README.md and openapi.yaml.
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
	case "help", "-h", "--help":
		fmt.Print(usage)
		return
	default:
		fmt.Fprintf(os.Stderr, "shardsrv: unknown command %q\n\n%s", os.Args[1], usage)
		os.Exit(2)
	}
	if err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "shardsrv:", err)
		}
		os.Exit(1)
	}
}

// config is serve's configuration, from flags with SHARDSRV_* fallbacks.
type config struct {
	addr         string
	store        string
	maxBodyBytes int64
	window       int
	planner      planner.Options
	logLevel     string
}

func parseServe(args []string, stderr io.Writer) (*config, error) {
	c := &config{planner: planner.DefaultOptions()}
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.addr, "addr", ":8080", "`HOST:PORT` to listen on")
	fs.StringVar(&c.store, "store", "", "where checkpoints are: a directory, `DIR` or file://DIR; each checkpoint is a folder in it (required)")
	fs.Int64Var(&c.maxBodyBytes, "max-body-bytes", 64<<20, "largest request body accepted, in bytes (413 above)")
	fs.IntVar(&c.window, "window", 4, "segments of one response read ahead of the writer; memory per stream is about window x (segment-bytes + segment-read-bytes)")
	fs.Int64Var(&c.planner.SegmentBytes, "segment-bytes", c.planner.SegmentBytes, "output bytes produced at once per stream")
	fs.Int64Var(&c.planner.SegmentReadBytes, "segment-read-bytes", c.planner.SegmentReadBytes, "most bytes one segment reads into gather buffers; bigger segments are cut")
	fs.Int64Var(&c.planner.MaxGap, "max-gap", c.planner.MaxGap, "what one more read request costs, in bytes: runs closer than this are read as one")
	fs.Int64Var(&c.planner.MaxRead, "max-read", c.planner.MaxRead, "reads longer than this are split into parallel requests")
	fs.Int64Var(&c.planner.MaxReads, "max-reads", c.planner.MaxReads, "refuse (422) a request whose plan needs more reads or segments than this")
	fs.StringVar(&c.logLevel, "log-level", "info", "debug, info, warn or error")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: shardsrv serve --store DIR [flags]\n\nRuns the HTTP service. Every flag can also be set as SHARDSRV_<FLAG> (e.g. SHARDSRV_STORE).\n\nFlags:\n")
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
	return c, c.validate()
}

func (c *config) validate() error {
	var errs []error
	if c.store == "" {
		errs = append(errs, errors.New("--store is required: the directory holding checkpoint folders (try 'make run' for an example)"))
	}
	if c.maxBodyBytes <= 0 || c.window <= 0 || c.planner.SegmentBytes <= 0 || c.planner.SegmentReadBytes <= 0 || c.planner.MaxRead <= 0 || c.planner.MaxReads <= 0 || c.planner.MaxGap < 0 {
		errs = append(errs, errors.New("sizes and counts must be positive (--max-gap may be 0)"))
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.logLevel)); err != nil {
		errs = append(errs, fmt.Errorf("--log-level: %v", err))
	}
	return errors.Join(errs...)
}

func openStore(url string) (store.Store, error) {
	dir, isFile := strings.CutPrefix(url, "file://")
	if !isFile && strings.Contains(url, "://") {
		return nil, fmt.Errorf("--store %q: only a directory or file://DIR is supported", url)
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
	st, err := openStore(c.store)
	if err != nil {
		return err
	}
	srv := server.New(server.Config{
		Catalog:      checkpoint.New(st),
		Executor:     executor.New(st, c.window, c.planner.MaxRead),
		Planner:      c.planner,
		MaxBodyBytes: c.maxBodyBytes,
		Logger:       log,
	})
	ln, err := net.Listen("tcp", c.addr)
	if err != nil {
		return err
	}
	httpSrv := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second, ErrorLog: slog.NewLogLogger(log.Handler(), slog.LevelWarn)}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	defer stop()
	errc := make(chan error, 1)
	go func() { errc <- httpSrv.Serve(ln) }()
	log.Info("serving", "addr", ln.Addr().String(), "store", st.String())
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down")
	shutdownCtx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return httpSrv.Shutdown(shutdownCtx)
}

func writeExample(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("example", flag.ContinueOnError)
	out := fs.String("out", ".run/checkpoints", "`DIR` to write the example checkpoint folder into; requests go next to it")
	addr := fs.String("addr", "localhost:8080", "server address the printed curl commands use")
	if err := fs.Parse(args); err != nil {
		return err
	}
	requests, err := example.Generate(*out)
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "Wrote checkpoint %q to %s. Try:\n%s", example.Name, *out, example.CurlExamples(*addr, requests))
	return nil
}
