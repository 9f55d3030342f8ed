package main

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// The cluster fan-in: 64 pods (TP=8 × 8 model replicas) load the 8 row-parallel
// ranks of one 256 MiB BF16 weight through 1, 2 or 3 replicas that share one cache.
const (
	clusterRows, clusterCols = 8192, 16384
	clusterPods              = 64
)

// clusterScenarios measures replicas sharing one cache (docs/cluster.md) over versitygw behind the
// counting proxy: storage bytes per unique byte and the fan-in's aggregate throughput with 1, 2 and
// 3 replicas, and one client's read amplification with the cache on.
func clusterScenarios(r *report, bin, dir string) {
	gw, err := exec.LookPath("versitygw")
	if err != nil {
		log.Printf("versitygw not found (make tools): skipping the cluster scenarios")
		return
	}
	must(os.MkdirAll(filepath.Join(dir, "s3-cluster"), 0o755))
	g, err := s3test.Run(gw, filepath.Join(dir, "s3-cluster"))
	if err != nil {
		log.Fatal(err)
	}
	defer g.Stop()
	_, err = g.Client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: aws.String(bucket)})
	must(err)
	log.Printf("uploading the cluster fixtures to versitygw")
	weight := safetensorsFile(safetensors.TensorData{Name: "w", DType: "BF16",
		Shape: []int64{clusterRows, clusterCols}, Data: randomBytes(clusterRows*clusterCols*2, 5)})
	must(g.PutErr(bucket, "weight/model.safetensors", weight))
	must(g.PutErr(bucket, "llama-layer/model.safetensors", safetensorsFile(
		safetensors.TensorData{Name: "model.layers.0.self_attn.q_proj.weight", DType: "BF16",
			Shape: []int64{qRows, hidden}, Data: randomBytes(qRows*hidden*2, 1)},
		safetensors.TensorData{Name: "model.layers.0.self_attn.k_proj.weight", DType: "BF16",
			Shape: []int64{kvRows, hidden}, Data: randomBytes(kvRows*hidden*2, 2)},
		safetensors.TensorData{Name: "model.layers.0.self_attn.v_proj.weight", DType: "BF16",
			Shape: []int64{kvRows, hidden}, Data: randomBytes(kvRows*hidden*2, 3)})))
	env := []string{"AWS_ACCESS_KEY_ID=" + s3test.AccessKey, "AWS_SECRET_ACCESS_KEY=" + s3test.SecretKey,
		"AWS_REGION=us-east-1"}
	secret := filepath.Join(dir, "peer-token")
	must(os.WriteFile(secret, []byte("bench-peers\n"), 0o600))

	var rows []row
	served := int64(clusterRows * clusterCols * 2 / tpRanks * clusterPods)
	for _, n := range []int{1, 2, 3} {
		proxy := g.NewProxy()
		addrs := make([]string, n)
		peers := make([]string, n)
		for i := range addrs {
			ln, err := net.Listen("tcp", "127.0.0.1:0")
			must(err)
			addrs[i], peers[i] = ln.Addr().String(), "http://"+ln.Addr().String()
			ln.Close()
		}
		var replicas []*server
		for i, addr := range addrs {
			extra := []string{"--s3-endpoint", proxy.URL}
			if n > 1 {
				extra = append(extra, "--peers", strings.Join(peers, ","), "--advertise", peers[i],
					"--peer-token-file", secret)
			}
			replicas = append(replicas, startServerAt(bin, "s3://"+bucket, addr, env, extra...))
		}
		start := time.Now()
		var wg sync.WaitGroup
		for pod := range clusterPods {
			wg.Go(func() {
				fetch("http://"+addrs[pod%n]+"/v1/shards", clusterRank(int64(pod%tpRanks)))
			})
		}
		wg.Wait()
		took := time.Since(start)
		for _, s := range replicas {
			s.stop()
		}
		proxy.Close()
		_, origin := proxy.Traffic()
		rows = append(rows,
			row{fmt.Sprintf("%d replica(s): bytes read from S3", n),
				fmt.Sprintf("%.3f× the unique bytes", float64(origin)/float64(len(weight))),
				fmt.Sprintf("%.1f MiB for a %.1f MiB file (goal ≤ 1.1×)", float64(origin)/(1<<20),
					float64(len(weight))/(1<<20))},
			row{fmt.Sprintf("%d replica(s): aggregate fan-in throughput", n),
				fmt.Sprintf("%.0f MiB/s", float64(served)/took.Seconds()/(1<<20)),
				fmt.Sprintf("%d pods, %.0f MiB served in %.2fs, all on one 2-core machine", clusterPods,
					float64(served)/(1<<20), took.Seconds())})
	}

	// One client, one 6 MiB fused-QKV rank, the cache on with its object-store defaults.
	proxy := g.NewProxy()
	srv := startServerEnv(bin, "s3://"+bucket, env, "--s3-endpoint", proxy.URL)
	req := fusedQKV(3)
	needed := plan(srv.addr, req).Summary.NeededBytes
	header, headerRequests := rangeTotals(proxy.Ranges) // the catalog's, while planning
	fetch("http://"+srv.addr+"/v1/shards", req)
	srv.stop()
	proxy.Close()
	read, requests := rangeTotals(proxy.Ranges)
	read, requests = read-header, requests-headerRequests
	rows = append(rows, row{"one client's read amplification, cache on (TP=8 rank 3 of a fused QKV)",
		fmt.Sprintf("%.3f×", float64(read)/float64(needed)),
		fmt.Sprintf("%.1f MiB read in %d requests for %.1f MiB needed, after the header (goal ≤ 1.25×)",
			float64(read)/(1<<20), requests, float64(needed)/(1<<20))})
	r.add(fmt.Sprintf("Replicas sharing one cache (versitygw on loopback): %d pods × 8 TP ranks of a %d MiB "+
		"BF16 weight, round-robin over the replicas", clusterPods, clusterRows*clusterCols*2>>20), rows...)
}

// clusterRank is a TP rank's row slab of the cluster weight.
func clusterRank(rank int64) api.ShardRequest {
	rowsPer := int64(clusterRows / tpRanks)
	shape := []int64{clusterRows, clusterCols}
	return api.ShardRequest{Checkpoint: "weight", Tensors: []api.TensorRequest{{Name: "w", Dtype: api.BF16,
		Shape: shape, Boxes: []api.Box{{Offsets: []int64{rank * rowsPer, 0}, Lengths: []int64{rowsPer, clusterCols}}},
		Blocks: &[]api.Block{{Offsets: []int64{0, 0}, Lengths: shape, Source: "w", Base: []int64{0, 0},
			Coeff: [][]int64{{1, 0}, {0, 1}}}}}}}
}
