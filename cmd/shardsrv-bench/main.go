// Command shardsrv-bench measures shardsrv side by side with baselines in one run and writes the
// results to a Markdown report (make bench → docs/benchmarks.md). Ratios, not absolute times,
// are what the goals are about: the machines are small and noisy.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

var (
	out  = flag.String("out", "docs/benchmarks.md", "report to write")
	reps = flag.Int("reps", 5, "repetitions of each timed scenario")
	work = flag.String("work", "", "scratch directory (default: a temporary one)")
	only = flag.String(
		"only",
		"",
		"run only these scenarios (comma-separated: control,kernels,local,s3,gcs,azure); the report holds just them",
	)
)

func want(scenario string) bool {
	return *only == "" || slices.Contains(strings.Split(*only, ","), scenario)
}

// The local fixture: one BF16 tensor of 32768 x 32768 (2 GiB).
const (
	rows, cols = 32768, 32768
	rowBytes   = cols * 2
)

func main() {
	flag.Parse()
	log.SetFlags(0)
	dir := *work
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "shardsrv-bench-"); err != nil {
			log.Fatal(err)
		}
		defer os.RemoveAll(dir)
	}
	bin := filepath.Join(dir, "shardsrv")
	run("go", "build", "-o", bin, "./cmd/shardsrv")
	r := &report{}
	if want("control") {
		controlPlaneScenario(r)
	}
	if want("kernels") {
		kernelScenarios(r)
	}
	if want("local") {
		log.Printf("writing a 2 GiB checkpoint to %s", dir)
		writeBig(filepath.Join(dir, "store", "big"))
		localScenarios(r, bin, filepath.Join(dir, "store"))
	}
	if want("s3") {
		s3Scenarios(r, bin, dir)
	}
	if want("gcs") || want("azure") {
		objectStoreScenarios(r, bin, dir)
	}
	if err := os.WriteFile(*out, []byte(r.markdown()), 0o644); err != nil {
		log.Fatal(err)
	}
	log.Printf("wrote %s", *out)
}

func run(name string, args ...string) {
	cmd := exec.Command(name, args...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		log.Fatalf("%s %v: %v", name, args, err)
	}
}

func writeBig(dir string) {
	os.MkdirAll(dir, 0o755)
	f, err := os.Create(filepath.Join(dir, "model.safetensors"))
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	w := bufio.NewWriterSize(f, 1<<20)
	w.Write(
		safetensors.EncodeHeader(
			[]safetensors.Entry{
				{Name: "w", DType: "BF16", Shape: []int64{rows, cols}, DataOffsets: [2]int64{0, rows * rowBytes}},
			},
			nil,
		),
	)
	row := make([]byte, rowBytes)
	for i := range rows {
		for j := 0; j < len(row); j += 2 { // small finite BF16 values that vary by row and column
			row[j], row[j+1] = byte(i+j), 0x3F
		}
		w.Write(row)
	}
	if err := w.Flush(); err != nil {
		log.Fatal(err)
	}
}

// server is a shardsrv process.
type server struct {
	cmd  *exec.Cmd
	addr string
}

func startServer(bin, store string, extra ...string) *server {
	return startServerEnv(bin, store, nil, extra...)
}

func startServerEnv(bin, store string, env []string, extra ...string) *server {
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(
		bin,
		append([]string{"serve", "--store", store, "--addr", addr, "--log-level", "warn"}, extra...)...)
	cmd.Stderr = os.Stderr
	cmd.Env = append(os.Environ(), env...)
	s3test.DieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		log.Fatal(err)
	}
	for range 100 {
		if res, err := http.Get("http://" + addr + "/healthz"); err == nil {
			res.Body.Close()
			return &server{cmd: cmd, addr: addr}
		}
		time.Sleep(50 * time.Millisecond)
	}
	log.Fatal("shardsrv did not start")
	return nil
}

func (s *server) stop() { s.cmd.Process.Kill(); s.cmd.Wait() }

// peakRSS is the process's high-water resident set, in bytes.
func (s *server) peakRSS() int64 {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.cmd.Process.Pid))
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			kb, _ := strconv.ParseInt(f[1], 10, 64)
			return kb << 10
		}
	}
	return 0
}

var client = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 64, DisableCompression: true}}

// fetch posts a shard request through the Go client (which retries a 503 after its Retry-After,
// as pods do) or, when req is nil, GETs url; it returns the bytes read.
func fetch(url string, req any) int64 {
	if req != nil {
		base, _ := strings.CutSuffix(url, "/v1/shards")
		c := api.NewClient(base)
		c.HTTP = client
		r := req.(api.ShardRequest)
		n, err := c.Fetch(context.Background(), &r, io.Discard, func() error { return nil }, nil)
		if err != nil {
			log.Fatalf("%s: %v", url, err)
		}
		return n
	}
	res, err := client.Get(url)
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	n, err := drain(res.Body)
	if err != nil || res.StatusCode != 200 {
		log.Fatalf("%s: %d %v", url, res.StatusCode, err)
	}
	return n
}

// drain reads a body the way a loader fills tensors: large reads into one buffer. (io.Discard
// would read it 8 KiB at a time, and on two cores the client's syscalls would weigh on the server.)
func drain(r io.Reader) (int64, error) {
	buf := make([]byte, 4<<20)
	var n int64
	for {
		m, err := io.ReadFull(r, buf)
		n += int64(m)
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return n, nil
		}
		if err != nil {
			return n, err
		}
	}
}

// timed runs f reps times and returns the durations, sorted.
func timed(f func()) []time.Duration {
	f() // warm-up: page cache, connections, buffer pools
	var ds []time.Duration
	for range *reps {
		start := time.Now()
		f()
		ds = append(ds, time.Since(start))
	}
	return sortDurations(ds)
}

func sortDurations(ds []time.Duration) []time.Duration {
	slices.Sort(ds)
	return ds
}

func rowSlab(ckpt string, from, n int64, step int64, dtype api.DType) api.ShardRequest {
	shape := []int64{n, cols}
	blocks := []api.Block{
		{
			Offsets: []int64{0, 0},
			Lengths: shape,
			Source:  "w",
			Base:    []int64{from, 0},
			Coeff:   [][]int64{{step, 0}, {0, 1}},
		},
	}
	return api.ShardRequest{Checkpoint: ckpt, Tensors: []api.TensorRequest{{Name: "slab", Dtype: dtype, Shape: shape,
		Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: shape}}, Blocks: &blocks}}}
}

func localScenarios(r *report, bin, store string) {
	const gib = 1 << 30
	// The baseline: a plain Go handler writing the same bytes from memory.
	mem := make([]byte, gib)
	for i := range mem {
		mem[i] = byte(i)
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	plain := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(len(mem)))
		for off := 0; off < len(mem); off += 8 << 20 {
			w.Write(mem[off : off+8<<20])
		}
	})}
	go plain.Serve(ln)
	defer plain.Shutdown(context.Background())

	srv := startServer(bin, store)
	direct := rowSlab("big", 0, gib/rowBytes, 1, api.BF16)  // rows [0, 16384): 1 GiB, one contiguous range
	gather := rowSlab("big", 0, gib/rowBytes/2, 2, api.F32) // every other row of the same range, widened: 1 GiB out
	base := timed(func() { fetch("http://"+ln.Addr().String()+"/", nil) })
	dir := timed(func() { fetch("http://"+srv.addr+"/v1/shards", direct) })
	gat := timed(func() { fetch("http://"+srv.addr+"/v1/shards", gather) })
	srv.stop()
	r.add(
		"Local store, 1 GiB direct-path shard (row slab of a BF16 tensor), warm page cache, loopback",
		row{"plain Go handler, same bytes from memory", throughput(gib, base), ""},
		row{
			"shardsrv direct path",
			throughput(gib, dir),
			fmt.Sprintf("%.2f× the plain handler (goal ≥ 0.7×)", ratio(base, dir)),
		},
		row{
			"shardsrv gather path (every other row, BF16 → F32, 1 GiB out)",
			throughput(gib, gat),
			fmt.Sprintf("%.2f× the direct path (goal ≥ 0.5×)", ratio(dir, gat)),
		},
	)

	// Peak RSS of a fresh server while it streams a 2 GiB shard.
	srv = startServer(bin, store)
	whole := rowSlab("big", 0, rows, 1, api.BF16)
	start := time.Now()
	n := fetch("http://"+srv.addr+"/v1/shards", whole)
	took := time.Since(start)
	rss := srv.peakRSS()
	srv.stop()
	r.add(
		"Memory: a fresh server streaming one 2 GiB shard",
		row{
			"peak RSS of the server process (VmHWM)",
			fmt.Sprintf("%d MiB", rss>>20),
			fmt.Sprintf("%d MiB streamed in %.1f s (goal ≤ 256 MiB)", n>>20, took.Seconds()),
		},
	)
}

func throughput(bytes int64, ds []time.Duration) string {
	med := ds[len(ds)/2]
	return fmt.Sprintf("%.2f GB/s (median; %.2f–%.2f)", float64(bytes)/med.Seconds()/1e9,
		float64(bytes)/ds[len(ds)-1].Seconds()/1e9, float64(bytes)/ds[0].Seconds()/1e9)
}

// ratio is the throughput of b relative to a, from median times.
func ratio(a, b []time.Duration) float64 {
	return a[len(a)/2].Seconds() / b[len(b)/2].Seconds()
}

type row struct{ what, measured, note string }

type section struct {
	title string
	rows  []row
}

type report struct{ sections []section }

func (r *report) add(title string, rows ...row) {
	r.sections = append(r.sections, section{title, rows})
	log.Printf("%s", title)
	for _, x := range rows {
		log.Printf("  %-60s %-40s %s", x.what, x.measured, x.note)
	}
}

func (r *report) markdown() string {
	var b strings.Builder
	cpu := "unknown CPU"
	if info, err := os.ReadFile("/proc/cpuinfo"); err == nil {
		for _, line := range strings.Split(string(info), "\n") {
			if name, ok := strings.CutPrefix(line, "model name\t: "); ok {
				cpu = name
				break
			}
		}
	}
	fmt.Fprintf(
		&b,
		"# Benchmarks\n\nWritten by `make bench` (`go run ./cmd/shardsrv-bench`) on %s.\n\n",
		time.Now().UTC().Format("2006-01-02"),
	)
	fmt.Fprintf(&b, "Machine: %d cores (%s), %s, %s/%s. Each timed scenario runs once to warm up, then %d times; "+
		"the table gives the median and the range. Baselines run in the same process run, so the ratios are what counts.\n\n",
		runtime.NumCPU(), cpu, runtime.Version(), runtime.GOOS, runtime.GOARCH, *reps)
	for _, s := range r.sections {
		fmt.Fprintf(&b, "## %s\n\n| | measured | note |\n|---|---|---|\n", s.title)
		for _, x := range s.rows {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", x.what, x.measured, x.note)
		}
		b.WriteString("\n")
	}
	return b.String()
}
