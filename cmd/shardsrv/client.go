package main

import (
	"bytes"
	"cmp"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/oms"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// clientFlags are what every client subcommand takes.
type clientFlags struct {
	server, token, caFile string
	noDigest              bool
}

func (c *clientFlags) register(fs *flag.FlagSet) {
	fs.StringVar(
		&c.server,
		"server",
		envOr("SHARDSRV_SERVER", "http://localhost:8080"),
		"shardsrv `URL` (SHARDSRV_SERVER)",
	)
	fs.StringVar(
		&c.token,
		"token",
		os.Getenv("SHARDSRV_TOKEN"),
		"bearer `TOKEN`, if the server wants one (SHARDSRV_TOKEN)",
	)
	fs.StringVar(&c.caFile, "ca-file", os.Getenv("SHARDSRV_CA_FILE"), "trust the CA certificates in this PEM `FILE` "+
		"for an https:// server, in place of the system's (SHARDSRV_CA_FILE)")
}

// registerDigest registers --no-digest, for the commands that receive shards.
func (c *clientFlags) registerDigest(fs *flag.FlagSet) {
	fs.BoolVar(&c.noDigest, "no-digest", false, "decline the server's Repr-Digest of each shard "+
		"(bodies are then checked for length only; the server may send local files without copying)")
}

func (c *clientFlags) client() (*api.Client, error) {
	cl := api.NewClient(c.server)
	cl.Token = c.token
	cl.NoDigest = c.noDigest
	if c.caFile != "" {
		var err error
		if cl.HTTP, err = api.NewHTTPClientWithCA(c.caFile); err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
	}
	return cl, nil
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

// layoutFlags are an engine's rank, as the server lays it out (api.EngineLayout).
type layoutFlags struct {
	engine, version string
	tp, dp          int64
	rank            string // a TP rank, or "all" where a command takes every rank
	dpRank          int64
	ep              bool
	dtype           string
	// vLLM's MoE options, nil unless their flag is given: the server has their defaults and refuses
	// them on the lines without them.
	pcp, pcpRank, redundantExperts *int64
	eplb                           *bool
	placement                      *string
	// SGLang's options, nil unless their flag is given.
	epSize      *int64
	dpAttention *bool
}

// givenFlag is a flag that sets *p only when it is given, to the value it parses.
type givenFlag[T any] struct {
	p      **T
	parse  func(string) (T, error)
	isBool bool
}

func (g givenFlag[T]) String() string {
	if g.p == nil || *g.p == nil {
		return ""
	}
	return fmt.Sprint(**g.p)
}

func (g givenFlag[T]) Set(s string) error {
	v, err := g.parse(s)
	if err != nil {
		return err
	}
	*g.p = &v
	return nil
}

func (g givenFlag[T]) IsBoolFlag() bool { return g.isBool }

func givenInt(p **int64) flag.Value {
	return givenFlag[int64]{p: p, parse: func(s string) (int64, error) { return strconv.ParseInt(s, 10, 64) }}
}

// engines are the engines the server lays out (docs/engines.md); the server has the last word.
const engines = "vllm, sglang (Llama, Qwen3, Qwen3-MoE) or megatron (Llama family)"

func (l *layoutFlags) register(fs *flag.FlagSet, engineFlag, engineDefault, rankHelp string) {
	fs.StringVar(
		&l.engine,
		engineFlag,
		engineDefault,
		"inference `ENGINE` whose per-rank parameters to serve: "+engines,
	)
	fs.StringVar(&l.version, "engine-version", "", "the engine's release `LINE` whose rules to follow "+
		"(vLLM: 0.29 or 0.10; default the newest the server lays out)")
	fs.Int64Var(&l.tp, "tp", 1, "tensor-parallel size (vLLM's tensor_parallel_size)")
	fs.StringVar(&l.rank, "rank", "0", rankHelp)
	fs.Int64Var(&l.dp, "dp", 1, "data-parallel size (data_parallel_size); with --ep, experts spread over TP x DP ranks")
	fs.Int64Var(&l.dpRank, "dp-rank", 0, "data-parallel rank (dp_rank)")
	fs.BoolVar(
		&l.ep,
		"ep",
		false,
		"expert parallelism (enable_expert_parallel): each rank holds whole experts, spread over the TP x PCP x DP "+
			"ranks;\nwithout it every expert is split by TP like the other weights, as vLLM does by default",
	)
	fs.StringVar(
		&l.dtype,
		"dtype",
		"",
		"`DTYPE` the engine runs in: BF16, F16 or F32, any case (default the checkpoint's torch_dtype)",
	)
	// vLLM's own flag names, sent as the layout's fields of the same names when given.
	fs.Var(givenInt(&l.pcp), "prefill-context-parallel-size", "vLLM's prefill-context-parallel `SIZE` "+
		"(prefill_context_parallel_size, default 1): the PCP ranks of a TP rank hold its attention and dense "+
		"weights;\nwith --ep the MoE group spans the TP x PCP x DP ranks")
	fs.Var(givenInt(&l.pcpRank), "pcp-rank", "the prefill-context-parallel `RANK` (pcp_rank, default 0)")
	fs.Var(givenFlag[bool]{p: &l.eplb, parse: strconv.ParseBool, isBool: true}, "enable-eplb",
		"vLLM's expert-parallel load balancing (enable_eplb), with --ep;\nthe table is the placement EPLB "+
			"starts from, before it moves experts")
	fs.Var(givenInt(&l.redundantExperts), "num-redundant-experts", "`N` redundant physical experts "+
		"(num_redundant_experts, default 0; vLLM takes them only with --enable-eplb):\nslot E+j holds logical expert j")
	fs.Var(givenFlag[string]{p: &l.placement, parse: func(s string) (string, error) { return s, nil }},
		"expert-placement-strategy", "how vLLM places experts over the EP ranks (expert_placement_strategy): "+
			"`STRATEGY`\nlinear (a contiguous run each, the default) or round_robin (rank r holds r, r+EP, ...; "+
			"vLLM applies it only to models that group their experts)")
	// SGLang's own flag names, sent as the layout's fields when given.
	fs.Var(givenInt(&l.epSize), "ep-size", "SGLang's expert-parallel `SIZE` (expert_parallel_size, default 1): "+
		"MoE experts spread over groups of SIZE ranks\nwithin the TP group, each expert split over --tp / SIZE ranks")
	fs.Var(givenFlag[bool]{p: &l.dpAttention, parse: strconv.ParseBool, isBool: true}, "enable-dp-attention",
		"SGLang's DP attention (enable_dp_attention), with --dp: Qwen3's attention splits over --tp / --dp "+
			"ranks\nand its embedding is whole on every rank")
}

// ranks reads --rank: one TP rank, or where a command takes several, a list (0,3,5) or all of --tp.
func (l *layoutFlags) ranks(several bool) ([]int64, error) {
	if several && l.rank == "all" {
		var out []int64
		for r := range l.tp {
			out = append(out, r)
		}
		return out, nil
	}
	fields := []string{l.rank}
	if several {
		fields = strings.Split(l.rank, ",")
	}
	var out []int64
	for _, f := range fields {
		r, err := strconv.ParseInt(strings.TrimSpace(f), 10, 64)
		if err != nil {
			if several {
				return nil, fmt.Errorf("--rank %q: a TP rank, a list of them (0,3,5) or all", l.rank)
			}
			return nil, fmt.Errorf("--rank %q: a TP rank", l.rank)
		}
		if slices.Contains(out, r) {
			return nil, fmt.Errorf("--rank %q: rank %d twice", l.rank, r)
		}
		out = append(out, r)
	}
	return out, nil
}

// layout is the rank's api.EngineLayout; the server checks the numbers against the model.
func (l *layoutFlags) layout(tpRank int64) api.EngineLayout {
	el := api.EngineLayout{Engine: api.EngineLayoutEngine(l.engine), TensorParallelSize: &l.tp, TpRank: &tpRank,
		DataParallelSize: &l.dp, DpRank: &l.dpRank, EnableExpertParallel: &l.ep}
	if l.version != "" {
		el.EngineVersion = &l.version
	}
	if l.dtype != "" {
		dt := api.DType(strings.ToUpper(l.dtype)) // the contract spells dtypes in capitals; people type bf16
		el.Dtype = &dt
	}
	el.PrefillContextParallelSize, el.PcpRank = l.pcp, l.pcpRank
	el.EnableEplb, el.NumRedundantExperts = l.eplb, l.redundantExperts
	el.ExpertPlacementStrategy = (*api.EngineLayoutExpertPlacementStrategy)(l.placement)
	el.ExpertParallelSize, el.EnableDpAttention = l.epSize, l.dpAttention
	return el
}

// newFlagSet is a subcommand's flag set whose -h prints usage (what it does and an example),
// then the flags.
func newFlagSet(name, usage string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stderr, usage, "\nFlags:\n")
		fs.PrintDefaults()
	}
	return fs
}

// parse parses args and refuses stray arguments, which the flag package would silently ignore.
func parse(fs *flag.FlagSet, args []string) error {
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q (see 'shardsrv %s -h')", fs.Name(), fs.Arg(0), fs.Name())
	}
	return nil
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

// size prints a byte count in the largest unit it holds one of, so small shards do not read 0.0 MiB.
func size(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}

// eta is how long the rest takes at the rate so far.
func eta(done, total int64, elapsed time.Duration) string {
	if done <= 0 || total <= 0 || elapsed <= 0 {
		return "?"
	}
	return time.Duration(float64(elapsed) * float64(total-done) / float64(done)).Round(time.Second).String()
}

// bar draws a fetch's progress on a terminal, at most ten times a second.
type bar struct {
	w           io.Writer
	start, last time.Time
	drawn       bool
}

// newBar returns a bar on stderr when it is a terminal, else nil (which draws nothing).
func newBar(stderr io.Writer) *bar {
	f, ok := stderr.(*os.File)
	if !ok {
		return nil
	}
	if fi, err := f.Stat(); err != nil || fi.Mode()&os.ModeCharDevice == 0 {
		return nil
	}
	return &bar{w: stderr, start: time.Now()}
}

func (b *bar) progress() api.Progress {
	if b == nil {
		return nil
	}
	return func(done, total int64) { b.draw("", done, total) }
}

// draw redraws the bar's line (label first), unless it was drawn less than 100 ms ago.
func (b *bar) draw(label string, done, total int64) {
	if time.Since(b.last) < 100*time.Millisecond && done != total {
		return
	}
	b.last, b.drawn = time.Now(), true
	const width = 30
	filled, of := 0, "?"
	if total > 0 {
		filled, of = int(width*done/total), size(total)
	}
	elapsed := time.Since(b.start)
	rate := float64(done) / max(elapsed.Seconds(), 1e-9)
	fmt.Fprintf(
		b.w,
		"\r%s[%s%s] %s / %s  %s/s  ETA %s \033[K",
		label,
		strings.Repeat("#", filled),
		strings.Repeat(".", width-filled),
		size(done),
		of,
		size(int64(rate)),
		eta(done, total, elapsed),
	)
}

// end ends the bar's line, so what follows (a summary, an error) starts on its own.
func (b *bar) end() {
	if b != nil && b.drawn {
		fmt.Fprintln(b.w)
	}
}

// writeAtomic writes name under root through a temporary file that takes the name only once fill
// succeeded: a failed fetch leaves whatever was there untouched and no partial file behind.
func writeAtomic(root *os.Root, name string, fill func(f *os.File) error) error {
	if dir := path.Dir(name); dir != "." {
		if err := root.MkdirAll(dir, 0o755); err != nil {
			return err
		}
	}
	tmp := path.Join(path.Dir(name), "."+path.Base(name)+tempMark+rand.Text())
	f, err := root.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o644)
	if err != nil {
		return err
	}
	err = fill(f)
	if err == nil {
		err = f.Sync() // the rename must not publish a file whose bytes are not on disk yet
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = root.Rename(tmp, name)
	}
	if err != nil {
		root.Remove(tmp)
	}
	return err
}

// tempMark is in the name of every temporary file writeAtomic makes (".NAME.tmp-RANDOM").
const tempMark = ".tmp-"

// removeStaleTemps removes the temporary files a killed fetch (SIGKILL, a lost node) left in
// root: those of name, or with name "" all of them. A fetch that is interrupted otherwise removes
// its own.
func removeStaleTemps(root *os.Root, name string) error {
	prefix := "."
	if name != "" {
		prefix += name + tempMark
	}
	f, err := root.Open(".")
	if err != nil {
		return err
	}
	names, err := f.Readdirnames(-1)
	f.Close()
	if err != nil {
		return err
	}
	for _, n := range names {
		if strings.HasPrefix(n, prefix) && strings.Contains(n, tempMark) {
			if err := root.Remove(n); err != nil {
				return err
			}
		}
	}
	return nil
}

// rewind lets a retried fetch start the file over.
func rewind(f *os.File) func() error {
	return func() error {
		if err := f.Truncate(0); err != nil {
			return err
		}
		_, err := f.Seek(0, io.SeekStart)
		return err
	}
}

const fetchUsage = `Usage:
  shardsrv fetch --request FILE -o OUT|-
  shardsrv fetch --checkpoint NAME --layout vllm|sglang --tp N --rank R|R,R,...|all [--parallel N]
                 [--dp N --dp-rank R --ep] [vLLM's MoE options, as 'shardsrv layout -h' lists them]
                 [SGLang's --dp N --enable-dp-attention --ep-size N] [--dtype DTYPE] --out DIR
  shardsrv fetch --checkpoint NAME --small-files --out DIR

The first form POSTs a shard request (JSON, such as 'shardsrv layout' prints) to /v1/shards and
writes the body (raw bytes, or a safetensors file when the request says "format": "safetensors")
to OUT, or with -o - to stdout when it is not a terminal. OUT is written through a temporary file
renamed once the body is whole: when the fetch fails, OUT is left as it was.

The second writes a directory vLLM (or with --layout sglang, SGLang) loads with --load-format
sharded_state: for each TP rank R
(a list of ranks for one node of a multi-node TP group, or every rank of --tp with all),
DIR/model-rank-R-part-0.safetensors holding the parameters the engine holds on that rank, as the server
lays them out from the checkpoint's config.json, --parallel ranks at a time; then the checkpoint's
small files (config.json, generation_config.json, tokenizer files), last: a DIR holding
config.json is complete. Each file appears whole or not at all. With --ep and --dp (or
--prefill-context-parallel-size) above 1 the DP (PCP) ranks hold different experts under the same
file names: give each DP (PCP) rank its own DIR.

The third writes the small files only, no weights: the model directory of a vLLM that loads its
weights through the shardsrv plugin (--load-format shardsrv).

Interrupted (Ctrl-C, SIGTERM), fetch removes its temporary files; a rerun removes those a killed
one left, and skips each rank file already complete: .NAME.fetched beside it records the request,
the size and the SHA-256, checked against the file before it is skipped.

Overload (408, 409 for a file replaced meanwhile, 429), storage trouble (a 502, 503 or 504 whose
problem does not say "retryable": false), broken connections and digest mismatches are retried
with jittered backoff, each retry logged on stderr; no other refusal is. A progress bar shows on
a terminal.

Examples:
  shardsrv fetch --server http://localhost:8080 --request rank1.json -o rank1.bin
  shardsrv layout --checkpoint qwen2-moe-tiny --tp 2 --rank 1 | shardsrv fetch --request - -o - | xxd | head
  shardsrv fetch --server http://localhost:8080 --checkpoint qwen2-moe-tiny --layout vllm --tp 2 --rank all \
    --out /models/qwen2-moe-tiny-tp2
  vllm serve /models/qwen2-moe-tiny-tp2 --load-format sharded_state --tensor-parallel-size 2
  shardsrv fetch --checkpoint llama-3-70b --layout vllm --tp 16 --rank 8,9,10,11,12,13,14,15 --out /models/l70
  shardsrv fetch --checkpoint glm-4.6 --layout vllm --tp 8 --rank all --ep --enable-eplb --num-redundant-experts 32 \
    --out /models/glm-4.6-ep8
  shardsrv fetch --checkpoint qwen3-30b-a3b --layout sglang --tp 8 --rank all --dp 2 --enable-dp-attention \
    --ep-size 8 --out /models/qwen3-30b-a3b-sglang
  python -m sglang.launch_server --model-path /models/qwen3-30b-a3b-sglang --load-format sharded_state \
    --tp-size 8 --dp-size 2 --enable-dp-attention --ep-size 8
  shardsrv fetch --checkpoint qwen2-moe-tiny --small-files --out /models/qwen2-moe-tiny
`

// defaultParallel is how many rank files fetch --layout fetches at a time, which --parallel 0 also
// means.
const defaultParallel = 4

// fetch: shardsrv fetch --request FILE -o OUT, or --checkpoint NAME --layout ENGINE ... --out DIR.
func fetch(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("fetch", fetchUsage, stderr)
	var cf clientFlags
	cf.register(fs)
	cf.registerDigest(fs)
	reqPath := fs.String("request", "", "shard request `FILE` (JSON; - for stdin)")
	out := fs.String("o", "", "with --request: output `FILE`, or - for stdout")
	ckpt := fs.String("checkpoint", "", "with --layout or --small-files: checkpoint `NAME` on the server")
	dir := fs.String(
		"out",
		"",
		"with --layout: `DIR` to write the rank files and the checkpoint's small files into (created if missing)",
	)
	smallOnly := fs.Bool("small-files", false, "with --checkpoint and --out, no --layout: write the checkpoint's "+
		"small files only (config.json, tokenizer and generation config), the model directory a vLLM with the "+
		"shardsrv plugin loads")
	parallel := fs.Int("parallel", defaultParallel, "with --layout: how many rank files are fetched at once (`N`)")
	var lf layoutFlags
	lf.register(fs, "layout", "", "with --layout: the TP `RANK` to fetch, a list (0,3,5), or all")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *parallel < 0 {
		return fmt.Errorf("fetch: --parallel %d must not be negative", *parallel)
	}
	*parallel = cmp.Or(*parallel, defaultParallel)
	// SIGINT and SIGTERM (Ctrl-C, a pod's deletion) cancel the fetch, so its temporary files go.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	c, err := cf.client()
	if err != nil {
		return err
	}
	switch {
	case *reqPath != "" && *out != "" && lf.engine == "" && *dir == "" && !*smallOnly:
		err = fetchRequest(ctx, c, *reqPath, *out, stdout, stderr)
	case lf.engine != "" && *ckpt != "" && *dir != "" && *reqPath == "" && *out == "" && !*smallOnly:
		err = fetchLayout(ctx, c, *ckpt, &lf, *dir, *parallel, stderr)
	case *smallOnly && *ckpt != "" && *dir != "" && lf.engine == "" && *reqPath == "" && *out == "":
		err = fetchSmallFiles(ctx, c, *ckpt, *dir, stderr)
	default:
		return errors.New("fetch: give --request FILE -o OUT, --checkpoint NAME --layout vllm --out DIR, or " +
			"--checkpoint NAME --small-files --out DIR (see 'shardsrv fetch -h')")
	}
	if err != nil && ctx.Err() != nil {
		return errors.New("fetch: interrupted; its temporary files are removed, complete rank files kept " +
			"(run it again to finish)")
	}
	return err
}

// openDir opens dir, created if missing, as the root every file of a fetch is written under, and
// removes the temporary files a killed fetch left in it.
func openDir(dir string) (*os.Root, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, err
	}
	if err := removeStaleTemps(root, ""); err != nil {
		root.Close()
		return nil, err
	}
	return root, nil
}

// openModelDir opens dir as openDir does and lists the checkpoint's files, which a model
// directory holds beside the weights.
func openModelDir(ctx context.Context, c *api.Client, ckpt, dir string) (*os.Root, *api.FileList, error) {
	root, err := openDir(dir)
	if err != nil {
		return nil, nil, err
	}
	files, err := c.Files(ctx, ckpt)
	if err != nil {
		root.Close()
		return nil, nil, err
	}
	return root, files, nil
}

// writeSmallFiles writes the checkpoint's small files an engine loads beside the weights: all the
// files route lists but the signature, which covers the checkpoint's own weight files, not these.
func writeSmallFiles(ctx context.Context, c *api.Client, root *os.Root, ckpt string, files *api.FileList) (
	int, error) {
	n := 0
	for _, fi := range files.Files {
		if fi.Name == oms.SignatureFile {
			continue
		}
		err := writeAtomic(root, fi.Name, func(f *os.File) error {
			_, err := c.File(ctx, ckpt, fi.Name, f)
			return err
		})
		if err != nil {
			return n, fmt.Errorf("%s: %w", fi.Name, err)
		}
		n++
	}
	return n, nil
}

// fetchSmallFiles writes a model directory without weights, for an engine that streams them.
func fetchSmallFiles(ctx context.Context, c *api.Client, ckpt, dir string, stderr io.Writer) error {
	root, files, err := openModelDir(ctx, c, ckpt, dir)
	if err != nil {
		return err
	}
	defer root.Close()
	n, err := writeSmallFiles(ctx, c, root, ckpt, files)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %d checkpoint files into %s\n", n, dir)
	return nil
}

func fetchRequest(ctx context.Context, c *api.Client, reqPath, out string, stdout, stderr io.Writer) error {
	if out == "-" && isTerminal(stdout) {
		return errors.New("fetch: -o - would write binary to the terminal; redirect stdout or give -o FILE")
	}
	req, err := readRequest(reqPath)
	if err != nil {
		return err
	}
	start := time.Now()
	b := newBar(stderr)
	var got api.Fetched
	if out == "-" {
		// stdout cannot start over: the client retries only failures before the first byte.
		got, err = c.FetchVerified(ctx, req, stdout, nil, b.progress())
	} else {
		root, rerr := os.OpenRoot(filepath.Dir(out))
		if rerr != nil {
			return rerr
		}
		defer root.Close()
		name := filepath.Base(out)
		if err := removeStaleTemps(root, name); err != nil {
			return err
		}
		err = writeAtomic(root, name, func(f *os.File) (err error) {
			got, err = c.FetchVerified(ctx, req, f, rewind(f), b.progress())
			return err
		})
	}
	b.end()
	if err != nil {
		return err
	}
	fetched(stderr, out, got, time.Since(start))
	return nil
}

// isTerminal reports whether w is a terminal.
func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}

// fetched reports a fetch, with the digest its body matched.
func fetched(stderr io.Writer, what string, got api.Fetched, took time.Duration) {
	if what == "-" {
		what = "stdout"
	}
	digest := "not checked: the server sent no digest"
	if got.Digest != "" {
		digest = "verified, " + got.Digest
	}
	fmt.Fprintf(stderr, "fetched %s into %s in %.2fs (%s/s); digest %s\n", size(got.Bytes), what,
		took.Seconds(), size(int64(float64(got.Bytes)/max(took.Seconds(), 1e-9))), digest)
}

// fetchLayout writes the sharded_state directory of a layout's ranks: the rank files, parallel at
// a time, then the small files, so that a directory holding config.json is complete.
func fetchLayout(ctx context.Context, c *api.Client, ckpt string, lf *layoutFlags, dir string, parallel int,
	stderr io.Writer) error {
	if lf.engine != string(api.Vllm) && lf.engine != string(api.Sglang) {
		// The directory is vLLM's or SGLang's sharded_state; another engine's rank is a request to fetch.
		return fmt.Errorf(
			"fetch: --out DIR writes vLLM's or SGLang's sharded_state, not a %s checkpoint; fetch another "+
				"engine's rank with 'shardsrv layout --engine %[1]s' and --request",
			lf.engine,
		)
	}
	ranks, err := lf.ranks(true)
	if err != nil {
		return err
	}
	// Listed first, written last: a wrong checkpoint fails before any rank is fetched.
	root, files, err := openModelDir(ctx, c, ckpt, dir)
	if err != nil {
		return err
	}
	defer root.Close()
	p := newRanksProgress(stderr, len(ranks))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(parallel)
	var skipped atomic.Int64
	for i, r := range ranks {
		l := lf.layout(r)
		st := api.Safetensors
		req := &api.ShardRequest{Checkpoint: ckpt, Format: &st, Layout: &l}
		// vLLM's and SGLang's ShardedStateLoader read model-rank-{tp rank}-part-{part}.safetensors.
		name := fmt.Sprintf("model-rank-%d-part-0.safetensors", r)
		g.Go(func() error {
			start := time.Now()
			got, done, err := fetchRank(gctx, c, root, name, req, p.rank(i))
			switch {
			case err != nil:
				return fmt.Errorf("%s: %w", name, err)
			case done:
				p.log(func(w io.Writer) {
					fmt.Fprintf(w, "%s is complete (%s, as recorded in %s): skipped\n", filepath.Join(dir, name),
						size(got.Bytes), recordName(name))
				})
				skipped.Add(1)
			default:
				p.log(func(w io.Writer) { fetched(w, filepath.Join(dir, name), got, time.Since(start)) })
			}
			return nil
		})
	}
	err = g.Wait()
	p.end()
	if err != nil {
		return err
	}
	nFiles, err := writeSmallFiles(ctx, c, root, ckpt, files)
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "wrote %d rank files (%d complete already) and %d checkpoint files into %s\n",
		int64(len(ranks))-skipped.Load(), skipped.Load(), nFiles, dir)
	return nil
}

// fetchRecord is what .NAME.fetched says of a complete rank file: the request it answers, its
// size and SHA-256. A rerun skips the file when all three still hold.
type fetchRecord struct {
	Request json.RawMessage `json:"request"`
	Bytes   int64           `json:"bytes"`
	SHA256  string          `json:"sha256"`
}

func recordName(name string) string { return "." + name + ".fetched" }

// fetchRank writes one rank file, unless its record says it is complete already (done).
func fetchRank(ctx context.Context, c *api.Client, root *os.Root, name string, req *api.ShardRequest,
	progress api.Progress) (got api.Fetched, done bool, err error) {
	reqJSON, err := json.Marshal(req)
	if err != nil {
		return got, false, err
	}
	if n, ok := complete(root, name, reqJSON); ok {
		return api.Fetched{Bytes: n}, true, nil
	}
	if err := root.Remove(recordName(name)); err != nil && !errors.Is(err, os.ErrNotExist) {
		return got, false, err
	}
	h := sha256.New()
	err = writeAtomic(root, name, func(f *os.File) (err error) {
		restart := func() error { h.Reset(); return rewind(f)() }
		got, err = c.FetchVerified(ctx, req, io.MultiWriter(f, h), restart, progress)
		return err
	})
	if err != nil {
		return got, false, err
	}
	rec, err := json.Marshal(fetchRecord{Request: reqJSON, Bytes: got.Bytes, SHA256: hex.EncodeToString(h.Sum(nil))})
	if err != nil {
		return got, false, err
	}
	err = writeAtomic(root, recordName(name), func(f *os.File) error { _, err := f.Write(rec); return err })
	return got, false, err
}

// complete reports whether name holds the whole answer to the request, as its record says: the
// same request, and a file of the recorded size and SHA-256.
func complete(root *os.Root, name string, reqJSON []byte) (int64, bool) {
	raw, err := root.ReadFile(recordName(name))
	if err != nil {
		return 0, false
	}
	var rec fetchRecord
	if json.Unmarshal(raw, &rec) != nil || !bytes.Equal(rec.Request, reqJSON) {
		return 0, false
	}
	f, err := root.Open(name)
	if err != nil {
		return 0, false
	}
	defer f.Close()
	h := sha256.New()
	n, err := io.Copy(h, f)
	return n, err == nil && n == rec.Bytes && hex.EncodeToString(h.Sum(nil)) == rec.SHA256
}

// ranksProgress is one progress line for the ranks of a fetch on a terminal: the bytes of all of
// them together, and how many are done.
type ranksProgress struct {
	mu          sync.Mutex
	b           *bar
	w           io.Writer
	done, total []int64
	finished    int
}

func newRanksProgress(stderr io.Writer, ranks int) *ranksProgress {
	return &ranksProgress{b: newBar(stderr), w: stderr, done: make([]int64, ranks), total: make([]int64, ranks)}
}

// rank is rank i's part of the line.
func (p *ranksProgress) rank(i int) api.Progress {
	if p.b == nil {
		return nil
	}
	return func(done, total int64) {
		p.mu.Lock()
		defer p.mu.Unlock()
		p.done[i], p.total[i] = done, total
		var d, t int64
		for j := range p.done {
			d, t = d+p.done[j], t+p.total[j]
		}
		p.b.draw(fmt.Sprintf("%d/%d ranks ", p.finished, len(p.done)), d, t)
	}
}

// log prints a line above the progress line.
func (p *ranksProgress) log(print func(io.Writer)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished++
	if p.b != nil && p.b.drawn {
		fmt.Fprint(p.w, "\r\033[K")
		p.b.last = time.Time{} // redrawn at the next progress
	}
	print(p.w)
}

func (p *ranksProgress) end() { p.b.end() }

const planUsage = `Usage: shardsrv plan --request FILE [--json]

Asks the server how it would serve a shard request (POST /v1/plan), without reading tensor data,
and prints a table: per tensor, its boxes, the bytes it outputs, and the storage reads it makes and
the bytes they read; then the totals and the read amplification (bytes read / bytes needed).

Examples:
  shardsrv plan --server http://localhost:8080 --request rank1.json
  shardsrv layout --checkpoint qwen2-moe-tiny --tp 2 --rank 1 | shardsrv plan --request -
`

// plan: shardsrv plan --request FILE
func planCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("plan", planUsage, stderr)
	var cf clientFlags
	cf.register(fs)
	reqPath := fs.String("request", "", "shard request `FILE` (JSON; - for stdin)")
	asJSON := fs.Bool("json", false, "print the server's plan as JSON instead of a table")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *reqPath == "" {
		return errors.New("plan: --request is required (see 'shardsrv plan -h')")
	}
	req, err := readRequest(*reqPath)
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	plan, err := c.Plan(context.Background(), req)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(plan)
	}
	rows := [][]string{{"tensor", "boxes", "output bytes", "", "reads", "bytes read", ""}}
	for _, t := range plan.Tensors {
		var out, reads, read int64
		for _, b := range t.Boxes {
			out += b.OutputBytes
			reads += int64(len(b.Reads))
			for _, r := range b.Reads {
				read += r.Length
			}
		}
		rows = append(rows, []string{t.Name, strconv.Itoa(len(t.Boxes)), strconv.FormatInt(out, 10), size(out),
			strconv.FormatInt(reads, 10), strconv.FormatInt(read, 10), size(read)})
	}
	s := plan.Summary
	amp := 0.0
	if s.NeededBytes > 0 {
		amp = float64(s.ReadBytes) / float64(s.NeededBytes)
	}
	rows = append(rows, []string{"total", "", strconv.FormatInt(s.OutputBytes, 10), size(s.OutputBytes),
		strconv.FormatInt(s.ReadRequests, 10), strconv.FormatInt(s.ReadBytes, 10), size(s.ReadBytes)})
	printTable(stdout, rows)
	fmt.Fprintf(
		stdout,
		"\nneeded %s, read %s in %d %s: amplification %.3f\n",
		size(s.NeededBytes),
		size(s.ReadBytes),
		s.ReadRequests,
		plural(s.ReadRequests, "request", "requests"),
		amp,
	)
	return nil
}

const layoutUsage = `Usage: shardsrv layout --checkpoint NAME [--engine vllm|sglang|megatron] [--engine-version LINE]
                       --tp N --rank R [--dp N --dp-rank R --ep] [--prefill-context-parallel-size N --pcp-rank R]
                       [--enable-eplb] [--num-redundant-experts N] [--expert-placement-strategy STRATEGY]
                       [--enable-dp-attention] [--ep-size N]
                       [--dtype DTYPE] [--format json|table] [--check MANIFEST.json]

Prints the tensors an inference engine holds on one rank, as the server lays them out from the
checkpoint's config.json (POST /v1/layouts): the engine's parameter names, each tensor of the
rank's parameter shape, with the table that says where each element comes from. json (the
default) is a shard request body carrying that explicit table, ready to POST to /v1/shards (or to
'shardsrv plan' and 'shardsrv fetch') as it is or edited; table lists name, dtype and shape.
To fetch a rank without a table, 'shardsrv fetch --layout' sends the layout itself.
vLLM's MoE options (prefill-context parallelism, EPLB and its redundant experts, the expert
placement) take vLLM's own flag names, so a deployment's flags carry over; each one given goes to
the server as the layout field of the same name, unchecked here. What vLLM refuses the server
refuses, with the field it points at: a redundant expert without --enable-eplb, EPLB without --ep
or for a model vLLM does not balance, PCP with --dp above 1, any of them set on --engine-version
0.10, which has none of them. SGLang's options (--enable-dp-attention with --dp, --ep-size) go
the same way with --engine sglang; an engine refuses the other engine's options.
--check compares the table with a manifest a live engine dumped for the same rank (a JSON list of
{name, shape, dtype}; clients/python's shardsrv.manifest writes it), prints every difference, and
fails if there is one: how to learn, before any weights move, that a release renamed a tensor.

Examples:
  shardsrv layout --server http://localhost:8080 --checkpoint qwen2-moe-tiny --tp 2 --rank 1 --format table
  shardsrv layout --checkpoint qwen2-moe-tiny --tp 2 --rank 1 --ep --dtype bf16 > rank1.json
  shardsrv layout --checkpoint glm-4.6 --tp 4 --rank 3 --ep --enable-eplb --num-redundant-experts 16 --format table
  shardsrv layout --checkpoint deepseek-v3 --tp 8 --rank 0 --ep --expert-placement-strategy round_robin
  shardsrv layout --checkpoint qwen3-30b-a3b --tp 2 --rank 1 --prefill-context-parallel-size 2 --pcp-rank 1 --ep
  shardsrv layout --checkpoint qwen3-30b-a3b --engine sglang --tp 8 --rank 5 --dp 2 --enable-dp-attention --ep-size 4
`

// layoutCmd: shardsrv layout --checkpoint NAME --engine vllm --tp N --rank R
func layoutCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("layout", layoutUsage, stderr)
	var cf clientFlags
	cf.register(fs)
	ckpt := fs.String("checkpoint", "", "checkpoint `NAME` on the server (required)")
	format := fs.String("format", "json", "`FORMAT`: json (a shard request body) or table (name, dtype, shape)")
	check := fs.String("check", "", "compare the table with the `MANIFEST.json` a live engine dumped, "+
		"print every difference, and fail on any")
	var lf layoutFlags
	lf.register(fs, "engine", "vllm", "the TP `RANK` (tp_rank)")
	if err := parse(fs, args); err != nil {
		return err
	}
	if *ckpt == "" {
		return errors.New("layout: --checkpoint is required (see 'shardsrv layout -h')")
	}
	if *format != "json" && *format != "table" {
		return fmt.Errorf("layout: --format %q: json or table", *format)
	}
	ranks, err := lf.ranks(false)
	if err != nil {
		return err
	}
	c, err := cf.client()
	if err != nil {
		return err
	}
	table, err := c.Layout(context.Background(), *ckpt, lf.layout(ranks[0]))
	if err != nil {
		return err
	}
	if *check != "" {
		manifest, err := readManifest(*check)
		if err != nil {
			return fmt.Errorf("layout: --check: %w", err)
		}
		diffs := manifestDiff(table.Tensors, manifest)
		for _, d := range diffs {
			fmt.Fprintln(stdout, d)
		}
		if len(diffs) > 0 {
			return fmt.Errorf("layout: the table differs from %s in %d places", *check, len(diffs))
		}
		fmt.Fprintf(stdout, "the table matches %s: %d tensors\n", *check, len(manifest))
		return nil
	}
	if *format == "json" {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(api.ShardRequest{Checkpoint: table.Checkpoint, Tensors: table.Tensors})
	}
	rows := [][]string{{"tensor", "dtype", "shape", "bytes", "size"}}
	var total int64
	for _, t := range table.Tensors {
		n := int64(0)
		if dt, ok := tensor.ParseDType(string(t.Dtype)); ok {
			n = int64(dt.Size())
			for _, d := range t.Shape {
				n *= d
			}
		}
		total += n
		rows = append(rows, []string{t.Name, string(t.Dtype), fmt.Sprint(t.Shape), strconv.FormatInt(n, 10), size(n)})
	}
	rows = append(rows, []string{"total", fmt.Sprintf("%d %s", len(table.Tensors),
		plural(int64(len(table.Tensors)), "tensor", "tensors")), "", strconv.FormatInt(total, 10), size(total)})
	printTable(stdout, rows)
	return nil
}

// printTable prints rows (the first the header) in columns two spaces apart: the first column,
// a name, aligned left, the others, numbers and sizes, right.
func printTable(w io.Writer, rows [][]string) {
	widths := make([]int, len(rows[0]))
	for _, r := range rows {
		for i, cell := range r {
			widths[i] = max(widths[i], len(cell))
		}
	}
	for _, r := range rows {
		line := fmt.Sprintf("%-*s", widths[0], r[0])
		for i, cell := range r[1:] {
			line += fmt.Sprintf("  %*s", widths[i+1], cell)
		}
		fmt.Fprintln(w, strings.TrimRight(line, " "))
	}
}

func plural(n int64, one, many string) string {
	if n == 1 {
		return one
	}
	return many
}
