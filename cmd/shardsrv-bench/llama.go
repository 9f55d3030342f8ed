package main

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"log"
	"sync"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/s3"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// Llama-3-8B shapes (docs/references.md §2): two layers and the embedding, BF16, in three files.
const (
	vocab = 128256
	inter = 14336
	tp    = 8
)

type llamaTensor struct {
	name  string
	shape []int64
	file  int
}

func llamaTensors() []llamaTensor {
	ts := []llamaTensor{{"model.embed_tokens.weight", []int64{vocab, hidden}, 0}}
	for l := range 2 {
		p := fmt.Sprintf("model.layers.%d.", l)
		ts = append(ts,
			llamaTensor{p + "input_layernorm.weight", []int64{hidden}, 1 + l},
			llamaTensor{p + "self_attn.q_proj.weight", []int64{qRows, hidden}, 1 + l},
			llamaTensor{p + "self_attn.k_proj.weight", []int64{kvRows, hidden}, 1 + l},
			llamaTensor{p + "self_attn.v_proj.weight", []int64{kvRows, hidden}, 1 + l},
			llamaTensor{p + "self_attn.o_proj.weight", []int64{hidden, qRows}, 1 + l},
			llamaTensor{p + "post_attention_layernorm.weight", []int64{hidden}, 1 + l},
			llamaTensor{p + "mlp.gate_proj.weight", []int64{inter, hidden}, 1 + l},
			llamaTensor{p + "mlp.up_proj.weight", []int64{inter, hidden}, 1 + l},
			llamaTensor{p + "mlp.down_proj.weight", []int64{hidden, inter}, 1 + l})
	}
	return append(ts, llamaTensor{"model.norm.weight", []int64{hidden}, 2})
}

var llamaFiles = []string{
	"model-00001-of-00003.safetensors",
	"model-00002-of-00003.safetensors",
	"model-00003-of-00003.safetensors",
}

func uploadLlama(g *s3test.Gateway) (total int64) {
	files := make([][]safetensors.TensorData, len(llamaFiles))
	weightMap := map[string]string{}
	for i, t := range llamaTensors() {
		n := int64(2)
		for _, d := range t.shape {
			n *= d
		}
		files[t.file] = append(
			files[t.file],
			safetensors.TensorData{
				Name:  t.name,
				DType: "BF16",
				Shape: t.shape,
				Data:  randomBytes(int(n), uint64(100+i)),
			},
		)
		weightMap[t.name] = llamaFiles[t.file]
		total += n
	}
	for i, f := range files {
		must(g.PutErr(bucket, "llama3-8b-2l/"+llamaFiles[i], safetensorsFile(f...)))
	}
	index, _ := json.Marshal(map[string]any{"metadata": map[string]any{"total_size": total}, "weight_map": weightMap})
	must(g.PutErr(bucket, "llama3-8b-2l/model.safetensors.index.json", index))
	config, _ := json.Marshal(llamaConfig())
	must(g.PutErr(bucket, "llama3-8b-2l/config.json", config))
	return total
}

// llamaConfig is the config.json the server lays the model out from: Llama-3-8B cut to two
// layers. The embeddings are tied because the checkpoint holds no separate LM head: each rank
// holds the embedding once.
func llamaConfig() map[string]any {
	return map[string]any{
		"architectures": []string{"LlamaForCausalLM"}, "model_type": "llama", "torch_dtype": "bfloat16",
		"hidden_size": hidden, "num_attention_heads": qRows / 128, "num_key_value_heads": kvRows / 128, "head_dim": 128,
		"num_hidden_layers": 2, "intermediate_size": inter, "vocab_size": vocab, "tie_word_embeddings": true,
	}
}

// llamaRank is one TP=8 rank's whole request: the server lays the model out as vLLM holds it
// (vocabulary-parallel embedding, fused QKV and gate/up, row-parallel o and down, replicated norms).
func llamaRank(rank int64) api.ShardRequest {
	size := int64(tp)
	return api.ShardRequest{
		Checkpoint: "llama3-8b-2l",
		Layout:     &api.EngineLayout{Engine: api.Vllm, TensorParallelSize: &size, TpRank: &rank},
	}
}

// naiveRank is today's loader: download every file the rank touches whole, parse it, slice.
func naiveRank(c *s3.Client, rank int64) {
	for _, f := range llamaFiles {
		out, err := c.GetObject(
			context.Background(),
			&s3.GetObjectInput{Bucket: aws.String(bucket), Key: aws.String("llama3-8b-2l/" + f)},
		)
		must(err)
		data := make([]byte, aws.ToInt64(out.ContentLength)) // into memory, as torch.load of a downloaded file would
		_, err = io.ReadFull(out.Body, data)
		out.Body.Close()
		must(err)
		n := int64(binary.LittleEndian.Uint64(data))
		h, err := safetensors.Parse(f, data[8:8+n], int64(len(data)))
		must(err)
		for _, t := range h.Tensors { // the rank's part: a row slab of each matrix (a stand-in for the real slicing)
			rows := t.Shape[0]
			part := (t.End - t.Begin) / max(1, rows) * max(1, rows/tp)
			shard := make([]byte, part)
			copy(shard, data[t.Begin+rank*part:])
		}
	}
}

func startupScenario(r *report, bin string, g *s3test.Gateway, env []string) {
	log.Printf("uploading two Llama-3-8B layers and the embedding")
	total := uploadLlama(g)
	run := func(f func(rank int64)) time.Duration {
		start := time.Now()
		var wg sync.WaitGroup
		for rank := range int64(tp) {
			wg.Go(func() { f(rank) })
		}
		wg.Wait()
		return time.Since(start)
	}
	measure := func(f func(rank int64), proxy *s3test.Proxy) ([]time.Duration, int64, int64) {
		g0, b0 := proxy.Traffic()
		ds := []time.Duration{run(f)}
		g1, b1 := proxy.Traffic()
		for range min(*reps, 3) - 1 { // each naive run moves 15 GiB: three runs are plenty
			ds = append(ds, run(f))
		}
		return sortDurations(ds), g1 - g0, b1 - b0
	}
	naiveProxy := g.NewProxy()
	defer naiveProxy.Close()
	naiveClient := s3.New(s3.Options{
		Region:       "us-east-1",
		BaseEndpoint: aws.String(naiveProxy.URL),
		UsePathStyle: true,
		Credentials:  g.Client.Options().Credentials,
	})
	naive, naiveGets, naiveBytes := measure(func(rank int64) { naiveRank(naiveClient, rank) }, naiveProxy)

	proxy := g.NewProxy()
	defer proxy.Close()
	// Defaults (the cache on): the first run starts cold, as a fleet's startup does, and the ranks'
	// row-parallel column slabs, which each read whole rows, share the cache's chunks.
	srv := startServerEnv(bin, "s3://"+bucket, env, "--s3-endpoint", proxy.URL)
	defer srv.stop()
	got, gets, bytes := measure(func(rank int64) { fetch("http://"+srv.addr+"/v1/shards", llamaRank(rank)) }, proxy)
	r.add(
		fmt.Sprintf(
			"TP=8 startup over S3: all 8 ranks of two Llama-3-8B layers and the embedding (%.2f GiB of BF16), "+
				"each rank's shard in one request",
			float64(total)/(1<<30),
		),
		row{
			"naive loader (each rank downloads every file whole with the AWS SDK, parses, slices)",
			p50(naive) + " wall",
			fmt.Sprintf("%.2f GiB from S3 in %d requests (first run)", float64(naiveBytes)/(1<<30), naiveGets),
		},
		row{
			"shardsrv (default settings, cache on)",
			p50(got) + " wall",
			fmt.Sprintf("%.2f GiB from S3 in %d requests (first run)", float64(bytes)/(1<<30), gets),
		},
		row{
			"ratios",
			fmt.Sprintf(
				"bytes %.3f×, wall time %.2f×",
				float64(bytes)/float64(naiveBytes),
				got[len(got)/2].Seconds()/naive[len(naive)/2].Seconds(),
			),
			"goals: bytes ≤ 1/6 (0.167×), wall time ≤ 1/3 (0.333×) of naive",
		},
	)
}
