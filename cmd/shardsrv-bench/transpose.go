package main

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// transposeScenario serves a whole 4096 × 4096 BF16 tensor transposed, end to end through HTTP with
// curl as the client, against the direct path of the same size (the tensor as it is stored), the
// two alternated on one server, each with the digest declined and with the defaults (the digest on),
// the first read of a request (hashed, trailed) apart from later ones (the digest memoised).
func transposeScenario(r *report, bin string) {
	const side, size = 4096, 2 * 4096 * 4096
	dir := filepath.Join(scratch, "transpose")
	must(os.MkdirAll(filepath.Join(dir, "t"), 0o755))
	must(os.WriteFile(filepath.Join(dir, "t", "model.safetensors"), safetensorsFile(
		safetensors.TensorData{Name: "t", DType: "BF16", Shape: []int64{side, side}, Data: randomBytes(size, 14)},
	), 0o644))
	whole := func(coeff [][]int64) api.ShardRequest {
		shape := []int64{side, side}
		blocks := []api.Block{{Offsets: []int64{0, 0}, Lengths: shape, Source: "t", Base: []int64{0, 0}, Coeff: coeff}}
		return api.ShardRequest{Checkpoint: "t", Tensors: []api.TensorRequest{{Name: "t", Dtype: api.BF16,
			Shape: shape, Boxes: []api.Box{{Offsets: []int64{0, 0}, Lengths: shape}}, Blocks: &blocks}}}
	}
	directReq, transposedReq := whole([][]int64{{1, 0}, {0, 1}}), whole([][]int64{{0, 1}, {1, 0}})
	direct, transposed := bodyFile(directReq), bodyFile(transposedReq)
	directFirst, transposedFirst := firstReads(directReq), firstReads(transposedReq)
	srv := startServer(bin, dir)
	defer srv.stop()
	shards := "http://" + srv.addr + "/v1/shards"
	// The digest-on requests that repeat are later reads after the warm-up: the digest memoised.
	ds := interleaved(
		func() { curl(shards, direct, size, declined) },
		func() { curl(shards, transposed, size, declined) },
		func() { curl(shards, directFirst(), size) },
		func() { curl(shards, transposedFirst(), size) },
		func() { curl(shards, direct, size) },
		func() { curl(shards, transposed, size) },
	)
	r.goal(goal{"4096 × 4096 BF16 transpose through HTTP, digest declined", throughput(size, ds[1]),
		"direct path: " + throughput(size, ds[0]), fmt.Sprintf("%.2f×", ratio(ds[0], ds[1])), "≥ 0.5×"})
	r.goal(goal{"the same, digest on (the defaults), first read: hashed, Repr-Digest trailer", throughput(size, ds[3]),
		"direct path, first read: " + throughput(size, ds[2]), fmt.Sprintf("%.2f×", ratio(ds[2], ds[3])), "≥ 0.5×"})
	r.goal(goal{"the same, digest on, later reads: memoised, Repr-Digest header", throughput(size, ds[5]),
		"direct path, later reads: " + throughput(size, ds[4]), fmt.Sprintf("%.2f×", ratio(ds[4], ds[5])), "≥ 0.5×"})
	r.add("Transpose: a whole 4096 × 4096 BF16 tensor (32 MiB) from a local file in the page cache, loopback, "+
		"curl as the client",
		row{"direct path (the tensor as stored), digest declined", throughput(size, ds[0]), ""},
		row{"transposed, digest declined", throughput(size, ds[1]),
			fmt.Sprintf("%.2f× the direct path (goal ≥ 0.5×)", ratio(ds[0], ds[1]))},
		row{"direct path, digest on (the defaults), first read: hashed, Repr-Digest trailer", throughput(size, ds[2]), ""},
		row{"transposed, digest on, first read", throughput(size, ds[3]),
			fmt.Sprintf("%.2f× the direct path's first read (goal ≥ 0.5×)", ratio(ds[2], ds[3]))},
		row{"direct path, digest on, later reads: memoised, Repr-Digest header", throughput(size, ds[4]), ""},
		row{"transposed, digest on, later reads", throughput(size, ds[5]),
			fmt.Sprintf("%.2f× the direct path's later reads (goal ≥ 0.5×)", ratio(ds[4], ds[5]))},
	)
}
