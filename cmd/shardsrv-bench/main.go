// Command shardsrv-bench measures shardsrv side by side with baselines in one run and writes the
// results to a Markdown report (make bench → docs/benchmarks.md). Ratios, not absolute times,
// are what the goals are about: the machines are small and noisy.
package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
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
	"sync"
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
		"run only these scenarios (comma-separated: control,kernels,transpose,local,verify,s3,gcs,azure,cluster; local includes verify); the report holds just them",
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
	scratch = dir
	if _, err := exec.LookPath("curl"); err != nil {
		log.Fatal("curl is the client the plain handlers are measured with: install it")
	}
	bin := filepath.Join(dir, "shardsrv")
	run("go", "build", "-o", bin, "./cmd/shardsrv")
	r := &report{load: loadAverage()}
	if want("control") {
		controlPlaneScenario(r)
	}
	if want("kernels") {
		kernelScenarios(r)
	}
	if want("transpose") {
		transposeScenario(r, bin)
	}
	if want("local") || want("verify") {
		log.Printf("writing a 2 GiB checkpoint to %s", dir)
		writeBig(filepath.Join(dir, "store", "big"))
		if want("local") {
			localScenarios(r, bin, filepath.Join(dir, "store"))
		}
		verifyScenario(r, bin, filepath.Join(dir, "store"))
	}
	if want("s3") {
		s3Scenarios(r, bin, dir)
	}
	if want("gcs") || want("azure") {
		objectStoreScenarios(r, bin, dir)
	}
	if want("cluster") {
		clusterScenarios(r, bin, dir)
	}
	log.Printf("goals (load average %s at the start, %s now):", r.load, loadAverage())
	for _, g := range r.goals {
		log.Printf("  %-58s %-34s %-46s %-8s %s", g.scenario, g.shardsrv, g.baseline, g.ratio, g.goal)
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
	return startServerAt(bin, store, addr, env, extra...)
}

// startServerAt starts shardsrv on addr: replicas must know each other's addresses before they start.
func startServerAt(bin, store, addr string, env []string, extra ...string) *server {
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
func timed(f func()) []time.Duration { return interleaved(f)[0] }

// interleaved times several things side by side: each runs once to warm up, then all of them in
// turn, reps times, so a burst of load from other processes on a small machine falls on all of
// them alike rather than on whichever ran then. It returns each one's durations, sorted.
func interleaved(fs ...func()) [][]time.Duration {
	for _, f := range fs {
		f() // warm-up: page cache, connections, buffer pools
	}
	ds := make([][]time.Duration, len(fs))
	for range *reps {
		for i, f := range fs {
			start := time.Now()
			f()
			ds[i] = append(ds[i], time.Since(start))
		}
	}
	for _, d := range ds {
		sortDurations(d)
	}
	return ds
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

// scratch holds the request bodies curl posts.
var scratch string

// declined is the request header that declines the response digest, and with it lets the server
// send direct runs of local files by sendfile.
const declined = "Want-Repr-Digest: sha-256=0"

// curl is the client wherever a plain handler is the yardstick: faster than a Go client, it
// shows the server's own cost. It fetches url into /dev/null, posting the JSON request body in
// bodyFile when that is not empty, and fails the run unless the answer is a 200 of want bytes.
func curl(url, bodyFile string, want int64, header ...string) {
	args := []string{"-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download}"}
	for _, h := range header {
		args = append(args, "-H", h)
	}
	if bodyFile != "" {
		args = append(args, "-H", "Content-Type: application/json", "--data-binary", "@"+bodyFile)
	}
	out, err := exec.Command("curl", append(args, url)...).Output()
	var status, n int64
	fmt.Sscanf(string(out), "%d %d", &status, &n)
	if err != nil || status != 200 || n != want {
		log.Fatalf("curl %s: %v: status %d, %d of %d bytes", url, err, status, n, want)
	}
}

// bodyFile writes a shard request where curl posts it from.
func bodyFile(req api.ShardRequest) string {
	f, err := os.CreateTemp(scratch, "request-*.json")
	if err != nil {
		log.Fatal(err)
	}
	defer f.Close()
	if err := json.NewEncoder(f).Encode(req); err != nil {
		log.Fatal(err)
	}
	return f.Name()
}

// curlAll runs one curl per call at once and waits for them all.
func curlAll(calls []func()) {
	var wg sync.WaitGroup
	for _, c := range calls {
		wg.Go(c)
	}
	wg.Wait()
}

// plainServer is the yardstick a server is measured against: a plain Go handler writing slices
// of mem, a buffer in RAM the size of what it serves (not a small one the CPU cache keeps), with
// their Content-Length, in 8 MiB writes. GET /?off=A&n=B serves mem[A:A+B], / all of it.
func plainServer(mem []byte) (url string, stop func()) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		log.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		off, _ := strconv.Atoi(r.URL.Query().Get("off"))
		n, err := strconv.Atoi(r.URL.Query().Get("n"))
		if err != nil {
			n = len(mem)
		}
		part := mem[off : off+n]
		w.Header().Set("Content-Length", strconv.Itoa(len(part)))
		for len(part) > 0 {
			k := min(len(part), 8<<20)
			w.Write(part[:k])
			part = part[k:]
		}
	})}
	go srv.Serve(ln)
	return "http://" + ln.Addr().String(), func() { srv.Shutdown(context.Background()) }
}

// firstReads is a request body for each call of a scenario's timed function (the warm-up and
// every rep): req with its tensor renamed, so the body is the same, but the server, which memoises
// a body's digest by everything the body is made of (the request included), has none for it —
// each call is the first read of its shard at the file's version: hashed, the digest trailed.
func firstReads(req api.ShardRequest) func() string {
	files := make([]string, *reps+1)
	for i := range files {
		r := req
		r.Tensors = slices.Clone(req.Tensors)
		r.Tensors[0].Name = fmt.Sprintf("%s-first-read-%d", r.Tensors[0].Name, i)
		files[i] = bodyFile(r)
	}
	next := 0
	return func() string {
		f := files[next%len(files)]
		next++
		return f
	}
}

// digestLookups reads a server's shardsrv_digest_lookups_total counters from /metrics: how many
// responses with the digest on found it memoised (hits: a header, the body not hashed) or not.
func digestLookups(addr string) (hits, misses int64) {
	res, err := client.Get("http://" + addr + "/metrics")
	if err != nil {
		log.Fatal(err)
	}
	defer res.Body.Close()
	text, _ := io.ReadAll(res.Body)
	for line := range strings.SplitSeq(string(text), "\n") {
		name, value, ok := strings.Cut(line, " ")
		if !ok || !strings.HasPrefix(name, "shardsrv_digest_lookups_total{") {
			continue
		}
		n, _ := strconv.ParseFloat(value, 64)
		switch {
		case strings.Contains(name, `result="hit"`):
			hits += int64(n)
		case strings.Contains(name, `result="miss"`):
			misses += int64(n)
		}
	}
	return hits, misses
}

func localScenarios(r *report, bin, store string) {
	const gib = 1 << 30
	mem := make([]byte, gib)
	for i := range mem {
		mem[i] = byte(i)
	}
	plain, stop := plainServer(mem)
	srv := startServer(bin, store)
	directReq := rowSlab("big", 0, gib/rowBytes, 1, api.BF16)  // rows [0, 16384): 1 GiB, one range
	gatherReq := rowSlab("big", 0, gib/rowBytes/2, 2, api.F32) // every other row, widened: 1 GiB out
	direct, gather := bodyFile(directReq), bodyFile(gatherReq)
	directFirst, gatherFirst := firstReads(directReq), firstReads(gatherReq)
	shards := "http://" + srv.addr + "/v1/shards"
	// The digest-on requests of direct and gather repeat: after the warm-up they are later reads.
	ds := interleaved(
		func() { curl(plain, "", gib) },
		func() { curl(shards, direct, gib, declined) },
		func() { curl(shards, directFirst(), gib) },
		func() { curl(shards, direct, gib) },
		func() { curl(shards, gather, gib, declined) },
		func() { curl(shards, gatherFirst(), gib) },
		func() { curl(shards, gather, gib) },
	)
	base, dirOff, dirFirst, dirLater, gatOff, gatFirst, gatLater := ds[0], ds[1], ds[2], ds[3], ds[4], ds[5], ds[6]
	hits, misses := digestLookups(srv.addr)
	srv.stop()
	stop()
	r.goal(goal{"1 GiB direct shard, local, default flags (digest on), first read of the shard at its file version",
		throughput(gib, dirFirst), "plain handler from RAM: " + throughput(gib, base),
		fmt.Sprintf("%.2f×", ratio(base, dirFirst)), "≥ 0.6×"})
	r.goal(goal{"the same, later reads (the digest memoised)", throughput(gib, dirLater),
		"plain handler from RAM: " + throughput(gib, base), fmt.Sprintf("%.2f×", ratio(base, dirLater)), "≥ 0.6×"})
	r.goal(goal{"the same, digest declined", throughput(gib, dirOff),
		"plain handler from RAM: " + throughput(gib, base), fmt.Sprintf("%.2f×", ratio(base, dirOff)), "≥ 0.9×"})
	r.add(
		"Local store, 1 GiB direct-path shard (row slab of a BF16 tensor), warm page cache, loopback, "+
			"curl as the client",
		row{"plain Go handler, the same number of bytes from a 1 GiB buffer in RAM", throughput(gib, base), ""},
		row{
			"shardsrv direct path, digest declined (sendfile)",
			throughput(gib, dirOff),
			fmt.Sprintf("%.2f× the plain handler (goal ≥ 0.9×)", ratio(base, dirOff)),
		},
		row{
			"shardsrv direct path, digest on, first read of the shard at its file version " +
				"(hashed: SHA-256 on another goroutine, Repr-Digest trailer)",
			throughput(gib, dirFirst),
			fmt.Sprintf("%.2f× the plain handler; the digest costs %.0f%% of the declined throughput",
				ratio(base, dirFirst), 100*(1-ratio(dirOff, dirFirst))),
		},
		row{
			"shardsrv direct path, digest on, later reads (the digest memoised: a Repr-Digest header, " +
				"Content-Length, not hashed)",
			throughput(gib, dirLater),
			fmt.Sprintf("%.2f× the plain handler; %.2f× the declined throughput", ratio(base, dirLater),
				ratio(dirOff, dirLater)),
		},
		row{
			"shardsrv gather path (every other row, BF16 → F32, 1 GiB out), digest declined",
			throughput(gib, gatOff),
			fmt.Sprintf("%.2f× the direct path (goal ≥ 0.5×)", ratio(dirOff, gatOff)),
		},
		row{
			"shardsrv gather path, digest on, first read (hashed, Repr-Digest trailer)",
			throughput(gib, gatFirst),
			fmt.Sprintf("%.2f× the gather path without it", ratio(gatOff, gatFirst)),
		},
		row{
			"shardsrv gather path, digest on, later reads (memoised: a header, not hashed)",
			throughput(gib, gatLater),
			fmt.Sprintf("%.2f× the gather path without it", ratio(gatOff, gatLater)),
		},
		row{
			"the server's digest memo over these runs (shardsrv_digest_lookups_total)",
			fmt.Sprintf("%d hits, %d misses", hits, misses),
			"misses: the first reads and the first digest-on read of each repeated request",
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
	concurrentStreams(r, bin, store)
}

// concurrentStreams: 256 clients at once, each a 64 MiB direct shard, on a fresh server with the
// default memory budget; every answer must be a 200, and the peak RSS stay under the budget.
func concurrentStreams(r *report, bin, store string) {
	const clients, slab = 256, 64 << 20
	var rows []row
	for _, digest := range []bool{true, false} {
		srv := startServer(bin, store)
		statuses := map[string]int{} // "200", or how a stream ended without its whole body
		var mu sync.Mutex
		var wg sync.WaitGroup
		start := time.Now()
		for i := range clients {
			wg.Go(func() {
				req := rowSlab("big", int64(i%32)*slab/rowBytes, slab/rowBytes, 1, api.BF16)
				raw, _ := json.Marshal(req)
				hreq, _ := http.NewRequest("POST", "http://"+srv.addr+"/v1/shards", bytes.NewReader(raw))
				hreq.Header.Set("Content-Type", "application/json")
				if !digest {
					k, v, _ := strings.Cut(declined, ": ")
					hreq.Header.Set(k, v)
				}
				status, why := streamOutcome(hreq, slab)
				if why != "" {
					log.Printf("%d concurrent streams: stream %d: %s: %s", clients, i, status, why)
				}
				mu.Lock()
				statuses[status]++
				mu.Unlock()
			})
		}
		wg.Wait()
		took := time.Since(start)
		rss := srv.peakRSS()
		hits, misses := digestLookups(srv.addr)
		srv.stop()
		// A fresh server: every slab's first stream is hashed and trails its digest; a stream
		// admitted after one of its slab finished gets the digest as a header.
		what := fmt.Sprintf("digest on (a fresh server: %d streams hashed with a trailer, %d memoised with a header)",
			misses, hits)
		if !digest {
			what = "digest declined"
		}
		r.goal(goal{fmt.Sprintf("%d concurrent 64 MiB streams, defaults, %s", clients, what),
			fmt.Sprintf("statuses %v, peak RSS %d MiB", statuses, rss>>20), "–", "–",
			"no 503, peak RSS ≤ the budget (1536 MiB)"})
		rows = append(rows, row{
			fmt.Sprintf("%d clients at once, a 64 MiB direct shard each, %s", clients, what),
			fmt.Sprintf("statuses %v in %.1f s (%.2f GB/s)", statuses, took.Seconds(),
				float64(clients*slab)/took.Seconds()/1e9),
			fmt.Sprintf("peak RSS %d MiB; goals: no 503, peak RSS ≤ --memory-bytes (1536 MiB)", rss>>20),
		})
	}
	r.add("256 concurrent 64 MiB streams, local store, default settings (--memory-bytes 1.5 GiB)", rows...)
}

// streamOutcome posts one shard request, without retries (a 503 counts), and says how it ended:
// its status when the answer came whole (a refusal's problem included), or "no answer" or "200
// cut short", with why.
func streamOutcome(req *http.Request, want int64) (status, why string) {
	res, err := client.Do(req)
	if err != nil {
		return "no answer", err.Error()
	}
	defer res.Body.Close()
	n, err := drain(res.Body)
	switch {
	case res.StatusCode != http.StatusOK:
		return strconv.Itoa(res.StatusCode), ""
	case n != want || err != nil:
		return "200 cut short", fmt.Sprintf("%d of %d bytes: %v", n, want, err)
	}
	return "200", ""
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

// goal is one line of the summary: a scenario of the goals table, shardsrv and its baseline
// from the same run, their ratio and the goal.
type goal struct{ scenario, shardsrv, baseline, ratio, goal string }

type report struct {
	goals    []goal
	sections []section
	load     string // /proc/loadavg when the run started
}

// goal adds a line to the summary at the top of the report.
func (r *report) goal(g goal) { r.goals = append(r.goals, g) }

// loadAverage is the 1, 5 and 15 minute load averages, for the report: on a shared machine the
// ratios mean more than the rates, and the load says how shared.
func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	return strings.Join(strings.Fields(string(data))[:3], " ")
}

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
		"the table gives the median and the range. Baselines run in the same run, interleaved with what they are "+
		"compared with (one of each in turn), so the ratios are what counts. Where a goal is not met, "+
		"[performance.md](performance.md) says where the time goes and what would close it.\n\n",
		runtime.NumCPU(), cpu, runtime.Version(), runtime.GOOS, runtime.GOARCH, *reps)
	if len(r.goals) > 0 {
		fmt.Fprintf(&b, "## The goals, side by side (load average %s at the start, %s at the end)\n\n"+
			"| scenario | shardsrv | baseline in the same run | ratio | goal |\n|---|---|---|---|---|\n",
			r.load, loadAverage())
		for _, g := range r.goals {
			fmt.Fprintf(&b, "| %s | %s | %s | %s | %s |\n", g.scenario, g.shardsrv, g.baseline, g.ratio, g.goal)
		}
		b.WriteString("\n")
	}
	for _, s := range r.sections {
		fmt.Fprintf(&b, "## %s\n\n| | measured | note |\n|---|---|---|\n", s.title)
		for _, x := range s.rows {
			fmt.Fprintf(&b, "| %s | %s | %s |\n", x.what, x.measured, x.note)
		}
		b.WriteString("\n")
	}
	return b.String()
}
