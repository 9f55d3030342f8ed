package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/api/layout"
)

// clientFlags are what every client subcommand takes.
type clientFlags struct {
	server, token string
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&c.server, "server", envOr("SHARDSRV_SERVER", "http://localhost:8080"), "shardsrv `URL` (SHARDSRV_SERVER)")
	fs.StringVar(&c.token, "token", os.Getenv("SHARDSRV_TOKEN"), "bearer token, if the server wants one (SHARDSRV_TOKEN)")
}

func (c *clientFlags) client() *api.Client {
	cl := api.NewClient(c.server)
	cl.Token = c.token
	return cl
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

func readRequest(path string) (*api.ShardRequest, error) {
	var r io.Reader = os.Stdin
	if path != "-" {
		f, err := os.Open(path)
		if err != nil {
			return nil, err
		}
		defer f.Close()
		r = f
	}
	var req api.ShardRequest
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return nil, fmt.Errorf("%s is not a shard request: %w", path, err)
	}
	return &req, nil
}

func isTerminal(f *os.File) bool {
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

func mib(n int64) string { return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20)) }

// fetch: shardsrv fetch --request FILE -o OUT
func fetch(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("fetch", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	reqPath := fs.String("request", "", "shard request `FILE` (JSON; - for stdin)")
	out := fs.String("o", "", "output `FILE` (raw bytes, or a safetensors file with \"format\": \"safetensors\")")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: shardsrv fetch --server URL --request FILE -o OUT\n\nFetches a shard, retrying what is safe to retry; shows progress on a terminal.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *reqPath == "" || *out == "" {
		fs.Usage()
		return errors.New("--request and -o are required")
	}
	req, err := readRequest(*reqPath)
	if err != nil {
		return err
	}
	f, err := os.Create(*out)
	if err != nil {
		return err
	}
	defer f.Close()
	reset := func() error {
		if err := f.Truncate(0); err != nil {
			return err
		}
		_, err := f.Seek(0, io.SeekStart)
		return err
	}
	start := time.Now()
	tty := isTerminal(os.Stderr)
	var last time.Time
	progress := func(done, total int64) {
		if !tty || time.Since(last) < 100*time.Millisecond && done != total {
			return
		}
		last = time.Now()
		elapsed := time.Since(start).Seconds()
		rate := float64(done) / max(elapsed, 1e-9)
		eta := "?"
		if total > 0 && rate > 0 {
			eta = (time.Duration(float64(total-done)/rate) * time.Second / time.Second).Round(time.Second).String()
		}
		width := 30
		filled := 0
		if total > 0 {
			filled = int(float64(width) * float64(done) / float64(total))
		}
		fmt.Fprintf(stderr, "\r[%s%s] %s / %s  %.1f MiB/s  ETA %s ", strings.Repeat("#", filled), strings.Repeat(".", width-filled), mib(done), mib(total), rate/(1<<20), eta)
	}
	n, err := cf.client().Fetch(context.Background(), req, f, reset, progress)
	if tty {
		fmt.Fprintln(stderr)
	}
	if err != nil {
		return err
	}
	took := time.Since(start)
	fmt.Fprintf(stderr, "fetched %s into %s in %.2fs (%.1f MiB/s)\n", mib(n), *out, took.Seconds(), float64(n)/(1<<20)/took.Seconds())
	return f.Close()
}

// plan: shardsrv plan --request FILE
func planCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("plan", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	reqPath := fs.String("request", "", "shard request `FILE` (JSON; - for stdin)")
	asJSON := fs.Bool("json", false, "print the server's plan as JSON instead of a table")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *reqPath == "" {
		return errors.New("--request is required")
	}
	req, err := readRequest(*reqPath)
	if err != nil {
		return err
	}
	plan, err := cf.client().Plan(context.Background(), req)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(plan)
	}
	tw := tabwriter.NewWriter(stdout, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "tensor\tboxes\toutput\treads\tbytes read\t")
	for _, t := range plan.Tensors {
		var out, reads, read int64
		for _, b := range t.Boxes {
			out += b.OutputBytes
			reads += int64(len(b.Reads))
			for _, r := range b.Reads {
				read += r.Length
			}
		}
		fmt.Fprintf(tw, "%s\t%d\t%s\t%d\t%s\t\n", t.Name, len(t.Boxes), mib(out), reads, mib(read))
	}
	s := plan.Summary
	amp := 0.0
	if s.NeededBytes > 0 {
		amp = float64(s.ReadBytes) / float64(s.NeededBytes)
	}
	fmt.Fprintf(tw, "total\t\t%s\t%d\t%s\t\n", mib(s.OutputBytes), s.ReadRequests, mib(s.ReadBytes))
	tw.Flush()
	fmt.Fprintf(stdout, "\nneeded %s, read %s in %d requests: amplification %.3f\n", mib(s.NeededBytes), mib(s.ReadBytes), s.ReadRequests, amp)
	return nil
}

// layoutCmd: shardsrv layout PRESET --checkpoint NAME --tp N --rank R
func layoutCmd(args []string, stdout, stderr io.Writer) error {
	fs := flag.NewFlagSet("layout", flag.ContinueOnError)
	fs.SetOutput(stderr)
	var cf clientFlags
	cf.register(fs)
	ckpt := fs.String("checkpoint", "", "checkpoint `NAME` on the server")
	tp := fs.Int64("tp", 1, "tensor-parallel size")
	ep := fs.Int64("ep", 0, "expert-parallel size for MoE layers (0: experts whole on every rank)")
	rank := fs.Int64("rank", 0, "this rank (its TP rank; its EP rank is rank % ep)")
	headDim := fs.Int64("head-dim", 128, "attention head dimension")
	dtype := fs.String("dtype", "BF16", "dtype the engine holds weights in")
	format := fs.String("format", "raw", "raw or safetensors")
	fs.Usage = func() {
		fmt.Fprint(stderr, "Usage: shardsrv layout llama|qwen-moe --checkpoint NAME --tp N --rank R [flags]\n\n"+
			"Prints the shard request of one rank of a whole model as vLLM lays it out: fused QKV and gate/up,\n"+
			"row-parallel o and down projections, vocabulary-parallel embedding and LM head, replicated norms,\n"+
			"and for MoE layers (qwen-moe) the router replicated and experts stacked as w13 and w2.\n\nFlags:\n")
		fs.PrintDefaults()
	}
	if len(args) == 0 || strings.HasPrefix(args[0], "-") {
		fs.Usage()
		return errors.New("name a preset: llama or qwen-moe")
	}
	preset := args[0]
	if err := fs.Parse(args[1:]); err != nil {
		return err
	}
	if preset != "llama" && preset != "qwen-moe" {
		return fmt.Errorf("unknown preset %q: llama or qwen-moe", preset)
	}
	if *ckpt == "" {
		return errors.New("--checkpoint is required")
	}
	list, err := cf.client().Tensors(context.Background(), *ckpt)
	if err != nil {
		return err
	}
	p := layout.Preset{HeadDim: *headDim, DType: api.DType(*dtype), VocabPad: 64, TP: layout.Rank{Size: *tp, Index: *rank}}
	if *ep > 0 {
		p.EP = layout.Rank{Size: *ep, Index: *rank % *ep}
	}
	tensors, err := p.Build(layout.ShapesOf(list))
	if err != nil {
		return err
	}
	f := api.ShardRequestFormat(*format)
	enc := json.NewEncoder(stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(api.ShardRequest{Checkpoint: *ckpt, Format: &f, Tensors: tensors})
}
