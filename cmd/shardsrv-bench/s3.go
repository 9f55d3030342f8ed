package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"
	"golang.org/x/sync/errgroup"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/api/layout"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

const bucket = "bench"

// Llama-3-8B attention shapes (docs/references.md §2).
const (
	hidden  = 4096
	qRows   = 4096
	kvRows  = 1024
	tpRanks = 8
)

func randomBytes(n int, seed uint64) []byte {
	r := rand.New(rand.NewPCG(seed, seed))
	b := make([]byte, n)
	for i := 0; i+8 <= n; i += 8 {
		v := r.Uint64() & 0x3F7F3F7F3F7F3F7F // finite BF16 values
		for j := range 8 {
			b[i+j] = byte(v >> (8 * j))
		}
	}
	return b
}

func safetensorsFile(tensors ...safetensors.TensorData) []byte {
	var buf bytes.Buffer
	safetensors.Write(&buf, tensors, map[string]string{"format": "pt"})
	return buf.Bytes()
}

func s3Scenarios(r *report, bin, dir string) {
	gw, err := exec.LookPath("versitygw")
	if err != nil {
		log.Printf("versitygw not found (make tools): skipping the S3 scenarios")
		return
	}
	must(os.MkdirAll(filepath.Join(dir, "s3"), 0o755))
	g, err := s3test.Run(gw, filepath.Join(dir, "s3"))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Stop()
	ctx := context.Background()
	if _, err := g.Client.CreateBucket(ctx, &s3.CreateBucketInput{Bucket: aws.String(bucket)}); err != nil {
		log.Fatal(err)
	}
	log.Printf("uploading the S3 fixtures to versitygw")
	layer := safetensorsFile(
		safetensors.TensorData{
			Name:  "model.layers.0.self_attn.q_proj.weight",
			DType: "BF16",
			Shape: []int64{qRows, hidden},
			Data:  randomBytes(qRows*hidden*2, 1),
		},
		safetensors.TensorData{
			Name:  "model.layers.0.self_attn.k_proj.weight",
			DType: "BF16",
			Shape: []int64{kvRows, hidden},
			Data:  randomBytes(kvRows*hidden*2, 2),
		},
		safetensors.TensorData{
			Name:  "model.layers.0.self_attn.v_proj.weight",
			DType: "BF16",
			Shape: []int64{kvRows, hidden},
			Data:  randomBytes(kvRows*hidden*2, 3),
		},
	)
	must(g.PutErr(bucket, "llama-layer/model.safetensors", layer))
	big := safetensorsFile(safetensors.TensorData{
		Name:  "w",
		DType: "BF16",
		Shape: []int64{bigRows, bigCols},
		Data:  randomBytes(bigRows*bigCols*2, 4),
	})
	must(g.PutErr(bucket, "big/model.safetensors", big))
	env := []string{
		"AWS_ACCESS_KEY_ID=" + s3test.AccessKey,
		"AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey,
		"AWS_REGION=us-east-1",
	}

	// TP=8 fused QKV through a counting proxy: what shardsrv asks S3 for.
	proxy := g.NewProxy()
	srv := startServerEnv(bin, "s3://"+bucket, env, "--s3-endpoint", proxy.URL)
	var needed int64
	for rank := range int64(tpRanks) {
		req := fusedQKV(rank)
		needed += plan(srv.addr, req).Summary.NeededBytes
		fetch("http://"+srv.addr+"/v1/shards", req)
	}
	srv.stop()
	proxy.Close()
	readBytes, requests := rangeTotals(proxy.Ranges)
	perRankLimit := needed/tpRanks/(8<<20) + 3*3
	r.add(
		"S3 (versitygw on loopback): all 8 ranks of a TP=8 fused-QKV layout over one Llama-3-8B layer "+
			"(q 4096×4096, k and v 1024×4096, BF16)",
		row{
			"bytes the 8 shards need",
			fmt.Sprintf("%.1f MiB", float64(needed)/(1<<20)),
			"sum of `needed_bytes` of the 8 plans",
		},
		row{
			"bytes read from S3 (headers included)",
			fmt.Sprintf("%.1f MiB", float64(readBytes)/(1<<20)),
			fmt.Sprintf("%.3f× needed (goal ≤ 1.05×)", float64(readBytes)/float64(needed)),
		},
		row{
			"S3 requests (ranged GETs)",
			fmt.Sprint(requests),
			fmt.Sprintf(
				"%.1f per rank (goal ≤ needed/8 MiB + 3 per source tensor = %d per rank)",
				float64(requests)/tpRanks,
				perRankLimit,
			),
		},
	)

	// One direct 512 MiB shard: shardsrv against a plain reverse proxy relaying the same bytes
	// from the same S3 server to the same client, and against the SDK's parallel ranged download.
	srv = startServerEnv(bin, "s3://"+bucket, env, "--s3-endpoint", g.Endpoint, "--cache-bytes", "0")
	shard, first := bodyFile(bigSlab(bigRows)), firstReads(bigSlab(bigRows))
	size := int64(bigRows * bigCols * 2)
	start := int64(len(big)) - size
	proxied := reverseProxy(g, "big/model.safetensors")
	rangeHeader := fmt.Sprintf("Range: bytes=%d-%d", start, start+size-1)
	const parts, concurrency = 8 << 20, 8
	ds := interleaved(
		func() { parallelDownload(g.Client, "big/model.safetensors", start, size, parts, concurrency) },
		func() { curlRange(proxied.url, size, rangeHeader) },
		func() { curl("http://"+srv.addr+"/v1/shards", shard, size, declined) },
		func() { curl("http://"+srv.addr+"/v1/shards", first(), size) },
		func() { curl("http://"+srv.addr+"/v1/shards", shard, size) },
	)
	sdk, relay, off, on, later := ds[0], ds[1], ds[2], ds[3], ds[4]
	// shardsrv's store stage alone: the same parts through internal/s3reader, no HTTP hop.
	for _, kv := range env {
		k, v, _ := strings.Cut(kv, "=")
		os.Setenv(k, v)
	}
	st, err := s3reader.New(ctx, s3reader.Config{Bucket: bucket, Endpoint: g.Endpoint})
	must(err)
	stage := timed(func() {
		buf := make([]byte, size)
		eg, ctx := errgroup.WithContext(ctx)
		eg.SetLimit(concurrency)
		for off := int64(0); off < size; off += parts {
			eg.Go(func() error {
				return st.ReadAt(ctx, "big/model.safetensors", "", buf[off:off+min(parts, size-off)], start+off)
			})
		}
		must(eg.Wait())
	})
	proxied.stop()
	srv.stop()
	r.add(
		"S3 (versitygw on loopback): one 512 MiB direct shard, curl as the client",
		row{"plain Go reverse proxy (net/http/httputil) relaying one ranged GET of the same bytes",
			throughput(size, relay), ""},
		row{
			"shardsrv (cache off), digest declined",
			throughput(size, off),
			fmt.Sprintf("%.2f× the reverse proxy (goal ≥ 0.9×)", ratio(relay, off)),
		},
		row{
			"shardsrv (cache off), digest on, first read (hashed, Repr-Digest trailer)",
			throughput(size, on),
			fmt.Sprintf("%.2f× the reverse proxy; %.2f× without the digest", ratio(relay, on), ratio(off, on)),
		},
		row{
			"shardsrv (cache off), digest on, later reads (memoised, Repr-Digest header)",
			throughput(size, later),
			fmt.Sprintf("%.2f× the reverse proxy; %.2f× without the digest", ratio(relay, later), ratio(off, later)),
		},
		row{
			fmt.Sprintf(
				"AWS SDK parallel ranged download into memory, in process (%d MiB parts, %d in flight)",
				parts>>20,
				concurrency,
			),
			throughput(size, sdk),
			fmt.Sprintf("shardsrv (declined) is %.2f× it", ratio(sdk, off)),
		},
		row{
			"shardsrv's store stage alone (internal/s3reader, same parts, no HTTP hop)",
			throughput(size, stage),
			fmt.Sprintf("%.2f× the SDK download", ratio(sdk, stage)),
		},
	)
	podsScenario(r, bin, g, env)
	cacheScenarios(r, bin, g, env)
	startupScenario(r, bin, g, env)
}

// proxy is a plain reverse proxy in front of one object of the S3 server.
type proxy struct {
	url  string
	stop func()
}

// reverseProxy is what a service between S3 and a client costs at the least: net/http/httputil's
// ReverseProxy, every request sent on to key by a presigned URL (the Range header passes through,
// unsigned), the answer relayed as it comes.
func reverseProxy(g *s3test.Gateway, key string) proxy {
	signed, err := s3.NewPresignClient(g.Client).PresignGetObject(context.Background(),
		&s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key)})
	must(err)
	target, err := url.Parse(signed.URL)
	must(err)
	rp := &httputil.ReverseProxy{Rewrite: func(r *httputil.ProxyRequest) {
		r.Out.URL = target
		r.Out.Host = target.Host
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	must(err)
	hs := &http.Server{Handler: rp}
	go hs.Serve(ln)
	return proxy{url: "http://" + ln.Addr().String() + "/", stop: func() { hs.Shutdown(context.Background()) }}
}

// curlRange GETs a range through curl, which must answer 206 with want bytes.
func curlRange(url string, want int64, rangeHeader string) {
	out, err := exec.Command("curl", "-sS", "-o", "/dev/null", "-w", "%{http_code} %{size_download}", "-H",
		rangeHeader, url).Output()
	var status, n int64
	fmt.Sscanf(string(out), "%d %d", &status, &n)
	if err != nil || status != 206 || n != want {
		log.Fatalf("curl %s: %v: status %d, %d of %d bytes", url, err, status, n, want)
	}
}

// podsScenario: 64 pods fetch their 32 MiB row slabs of one 256 MiB weight over S3 at once (8
// slabs, 8 pods each), from a fresh server with the default settings — the cache on, and cold —
// against a plain handler serving the same 64 × 32 MiB from a 256 MiB buffer in RAM, curl the
// client of both.
func podsScenario(r *report, bin string, g *s3test.Gateway, env []string) {
	const pods, slabs, wRows, wCols = 64, 8, 8192, 16384
	const slab = wRows / slabs * wCols * 2
	weight := randomBytes(wRows*wCols*2, 5)
	must(g.PutErr(bucket, "weight/model.safetensors",
		safetensorsFile(safetensors.TensorData{Name: "w", DType: "BF16", Shape: []int64{wRows, wCols}, Data: weight})))
	plain, stop := plainServer(weight)
	reqs := make([]string, slabs)
	for i := range reqs {
		blocks := []api.Block{{Offsets: []int64{0, 0}, Lengths: []int64{wRows / slabs, wCols}, Source: "w",
			Base: []int64{int64(i) * wRows / slabs, 0}, Coeff: [][]int64{{1, 0}, {0, 1}}}}
		shape := []int64{wRows / slabs, wCols}
		reqs[i] = bodyFile(api.ShardRequest{Checkpoint: "weight", Tensors: []api.TensorRequest{{Name: "w",
			Dtype: api.BF16, Shape: shape, Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: shape}},
			Blocks: &blocks}}})
	}
	fleet := func(fetch func(pod int)) func() {
		return func() {
			calls := make([]func(), pods)
			for p := range calls {
				calls[p] = func() { fetch(p) }
			}
			curlAll(calls)
		}
	}
	// A fresh server for each run of shardsrv, so its cache starts cold; only the fleet is timed.
	var rssOff, rssOn, hits, misses int64
	cold := func(rss *int64, header ...string) func() time.Duration {
		return func() time.Duration {
			srv := startServerEnv(bin, "s3://"+bucket, env, "--s3-endpoint", g.Endpoint)
			defer srv.stop()
			start := time.Now()
			fleet(func(p int) { curl("http://"+srv.addr+"/v1/shards", reqs[p%slabs], slab, header...) })()
			took := time.Since(start)
			*rss = max(*rss, srv.peakRSS())
			h, m := digestLookups(srv.addr)
			hits, misses = hits+h, misses+m
			return took
		}
	}
	runs := []func() time.Duration{
		func() time.Duration {
			start := time.Now()
			fleet(func(p int) { curl(fmt.Sprintf("%s/?off=%d&n=%d", plain, p%slabs*slab, slab), "", slab) })()
			return time.Since(start)
		},
		cold(&rssOff, declined),
		cold(&rssOn),
	}
	ds := make([][]time.Duration, len(runs))
	for rep := range *reps + 1 { // the first round warms up, the S3 server's page cache too
		for i, run := range runs {
			if took := run(); rep > 0 {
				ds[i] = append(ds[i], took)
			}
		}
	}
	for _, d := range ds {
		sortDurations(d)
	}
	stop()
	base, off, on := ds[0], ds[1], ds[2]
	wall := func(ds []time.Duration) string { return fmt.Sprintf("%.0f ms wall", ds[len(ds)/2].Seconds()*1000) }
	r.goal(goal{"64 pods × 32 MiB over S3, default flags (digest on), wall time", wall(on),
		"plain handler 64 × 32 MiB: " + wall(base), fmt.Sprintf("%.2f×", 1/ratio(base, on)), "≤ 1.5×"})
	r.goal(goal{"the same, digest declined", wall(off), "plain handler 64 × 32 MiB: " + wall(base),
		fmt.Sprintf("%.2f×", 1/ratio(base, off)), "≤ 1.3×"})
	r.add(
		"64 pods × their 32 MiB row slab of one 256 MiB BF16 weight over S3 (versitygw on loopback), all at once, "+
			"curl as the client",
		row{"plain Go handler serving 64 × 32 MiB from a 256 MiB buffer in RAM", wall(base), ""},
		row{
			"shardsrv, default settings (cache on, cold: a fresh server each run), digest declined",
			wall(off),
			fmt.Sprintf("%.2f× the plain handler's wall time (goal ≤ 1.3×); peak RSS %d MiB",
				1/ratio(base, off), rssOff>>20),
		},
		row{
			// All 64 start at once on a fresh server: a pod finds its slab's digest memoised only
			// when another pod's stream of it finished before its own began.
			fmt.Sprintf("shardsrv, the same with the digest on: %d streams hashed with a trailer, %d memoised "+
				"with a header, over every run", misses, hits),
			wall(on),
			fmt.Sprintf("%.2f× the plain handler's wall time; peak RSS %d MiB", 1/ratio(base, on), rssOn>>20),
		},
	)
}

func must(err error) {
	if err != nil {
		log.Fatal(err)
	}
}

// fusedQKV is rank's box of the fused QKV at TP=8: with one KV head a rank, each rank's KV group
// (api/layout's interleave, [q_r; k_r; v_r]) is what vLLM's rank-major QKV holds too.
func fusedQKV(rank int64) api.ShardRequest {
	const p = "model.layers.0.self_attn."
	shapes := layout.Shapes{
		p + "q_proj.weight": {qRows, hidden},
		p + "k_proj.weight": {kvRows, hidden},
		p + "v_proj.weight": {kvRows, hidden},
	}
	t, err := layout.InterleavedQKV(shapes, p+"q_proj.weight", p+"k_proj.weight", p+"v_proj.weight",
		p+"qkv_proj.weight", api.BF16, 128, layout.Rank{Size: tpRanks, Index: rank})
	must(err)
	return api.ShardRequest{Checkpoint: "llama-layer", Tensors: []api.TensorRequest{t}}
}

func plan(addr string, req api.ShardRequest) api.PlanResponse {
	body, _ := json.Marshal(req)
	res, err := client.Post("http://"+addr+"/v1/plan", "application/json", bytes.NewReader(body))
	must(err)
	defer res.Body.Close()
	var p api.PlanResponse
	must(json.NewDecoder(res.Body).Decode(&p))
	return p
}

// rangeTotals sums the bytes and counts the requests of "bytes=a-b" headers.
func rangeTotals(ranges []string) (bytes, requests int64) {
	for _, r := range ranges {
		var a, b int64
		if _, err := fmt.Sscanf(strings.TrimPrefix(r, "bytes="), "%d-%d", &a, &b); err == nil {
			bytes += b - a + 1
			requests++
		}
	}
	return bytes, requests
}

// parallelDownload is what a careful client does without shardsrv: ranged GETs of fixed parts,
// a few in flight, into memory.
func parallelDownload(c *s3.Client, key string, start, size, part int64, concurrency int) {
	buf := make([]byte, size)
	g, ctx := errgroup.WithContext(context.Background())
	g.SetLimit(concurrency)
	for off := int64(0); off < size; off += part {
		n := min(part, size-off)
		g.Go(func() error {
			out, err := c.GetObject(ctx, &s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String(key),
				Range: aws.String(fmt.Sprintf("bytes=%d-%d", start+off, start+off+n-1))})
			if err != nil {
				return err
			}
			defer out.Body.Close()
			_, err = io.ReadFull(out.Body, buf[off:off+n])
			return err
		})
	}
	must(g.Wait())
}

// cacheScenarios: a fully cached shard against an uncached one, and fan-in of many clients.
func cacheScenarios(r *report, bin string, g *s3test.Gateway, env []string) {
	// 64 MiB: rows [0, 2048) of the 16384 x 16384 BF16 tensor.
	shard := bigSlab(2048)
	cold := startServerEnv(bin, "s3://"+bucket, env, "--s3-endpoint", g.Endpoint, "--cache-bytes", "0")
	uncached := timed(func() { fetch("http://"+cold.addr+"/v1/shards", shard) })
	cold.stop()
	warm := startServerEnv(bin, "s3://"+bucket, env, "--s3-endpoint", g.Endpoint, "--cache-bytes", "268435456")
	cached := timed(func() { fetch("http://"+warm.addr+"/v1/shards", shard) })
	warm.stop()
	r.add(
		"Cache: one 64 MiB shard over S3, latency (the Go client, digest on: after the warm-up the digest is "+
			"memoised on both servers, so neither hashes the body)",
		row{"uncached (--cache-bytes 0)", p50(uncached), ""},
		row{
			"fully cached (a warm 256 MiB cache)",
			p50(cached),
			fmt.Sprintf(
				"%.2f× the uncached p50 (goal ≤ 0.5×)",
				cached[len(cached)/2].Seconds()/uncached[len(uncached)/2].Seconds(),
			),
		},
	)

	// Fan-in through the counting proxy, on a fresh server each time so the cache starts cold.
	fanIn := func(reqs []api.ShardRequest) (storage int64, lat []time.Duration, rss int64) {
		proxy := g.NewProxy()
		defer proxy.Close()
		srv := startServerEnv(
			bin,
			"s3://"+bucket,
			env,
			"--s3-endpoint",
			proxy.URL,
			"--cache-bytes",
			"536870912",
			"--memory-bytes",
			"2147483648",
		)
		defer srv.stop()
		var mu sync.Mutex
		var wg sync.WaitGroup
		for _, req := range reqs {
			wg.Go(func() {
				start := time.Now()
				fetch("http://"+srv.addr+"/v1/shards", req)
				mu.Lock()
				lat = append(lat, time.Since(start))
				mu.Unlock()
			})
		}
		wg.Wait()
		slices.Sort(lat)
		_, storage = proxy.Traffic()
		return storage, lat, srv.peakRSS()
	}
	same := make([]api.ShardRequest, 32)
	for i := range same {
		same[i] = bigSlab(2048)
	}
	sameBytes, sameLat, sameRSS := fanIn(same)
	// Row-parallel at TP=8: each rank a column slab of rows [0, 2048) (64 MiB of unique bytes).
	var ranks []api.ShardRequest
	for rank := range int64(8) {
		req := bigSlab(2048)
		req.Tensors[0].Boxes[0] = api.Box{Offsets: []int64{0, rank * bigCols / 8}, Lengths: []int64{2048, bigCols / 8}}
		ranks = append(ranks, req)
	}
	rankBytes, rankLat, _ := fanIn(ranks)
	const unique = 2048 * bigCols * 2
	r.add(
		"Fan-in over S3 with the cache (64 MiB of unique bytes, cold cache, all clients at once)",
		row{
			"32 identical clients: storage bytes / unique bytes",
			fmt.Sprintf("%.3f", float64(sameBytes)/unique),
			"p50 " + p50(sameLat) + ", p99 " + p99(sameLat),
		},
		row{
			"8 row-parallel ranks (column slabs): storage bytes / unique bytes",
			fmt.Sprintf("%.3f", float64(rankBytes)/unique),
			"p50 " + p50(rankLat) + ", p99 " + p99(rankLat),
		},
		row{
			"peak RSS of the server during the 32-client fan-in",
			fmt.Sprintf("%d MiB", sameRSS>>20),
			"--memory-bytes 2 GiB, of which --cache-bytes 512 MiB",
		},
	)
}

const bigRows, bigCols = 16384, 16384 // 512 MiB of BF16

// bigSlab is rows [0, n) of the big tensor, as its own destination tensor.
func bigSlab(n int64) api.ShardRequest {
	blocks := []api.Block{
		{
			Offsets: []int64{0, 0},
			Lengths: []int64{n, bigCols},
			Source:  "w",
			Base:    []int64{0, 0},
			Coeff:   [][]int64{{1, 0}, {0, 1}},
		},
	}
	return api.ShardRequest{
		Checkpoint: "big",
		Tensors: []api.TensorRequest{{Name: "slab", Dtype: api.BF16, Shape: []int64{n, bigCols},
			Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: []int64{n, bigCols}}}, Blocks: &blocks}},
	}
}

func p50(ds []time.Duration) string { return fmt.Sprintf("%.0f ms", ds[len(ds)/2].Seconds()*1000) }

func p99(ds []time.Duration) string {
	return fmt.Sprintf("%.0f ms", ds[min(len(ds)-1, len(ds)*99/100)].Seconds()*1000)
}
