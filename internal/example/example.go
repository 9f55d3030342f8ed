// Package example writes the checkpoint `make run` serves: small but Llama-shaped (separate q/k/v
// with grouped KV heads, gate/up/down, an embedding, norms) with one Qwen-MoE-style layer of a few
// experts, as two indexed safetensors files, and request files that show the remaps engines use.
package example

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// Name is the example checkpoint's folder.
const Name = "llama-tiny"

// The example model's dimensions.
const (
	Hidden       = 64
	Heads        = 4
	KVHeads      = 2
	HeadDim      = 16
	Intermediate = 128
	Vocab        = 256
	Experts      = 4
	ExpertInter  = 32
)

func bf16Tensor(name string, r *rand.Rand, shape ...int64) safetensors.TensorData {
	n := int64(1)
	for _, d := range shape {
		n *= d
	}
	data := make([]byte, 2*n)
	for i := range n {
		v := float32(r.NormFloat64() * 0.02)
		if len(shape) == 1 { // norms: ones, as a fresh checkpoint has them
			v = 1
		}
		binary.LittleEndian.PutUint16(data[2*i:], tensor.BF16FromF32(v))
	}
	return safetensors.TensorData{Name: name, DType: "BF16", Shape: shape, Data: data}
}

// Generate writes the checkpoint under dir/Name and the example requests under dir/../requests.
func Generate(dir string) (requests []string, err error) {
	r := rand.New(rand.NewPCG(7, 7))
	attn := func(l int) []safetensors.TensorData {
		p := fmt.Sprintf("model.layers.%d.", l)
		return []safetensors.TensorData{
			bf16Tensor(p+"input_layernorm.weight", r, Hidden),
			bf16Tensor(p+"self_attn.q_proj.weight", r, Heads*HeadDim, Hidden),
			bf16Tensor(p+"self_attn.k_proj.weight", r, KVHeads*HeadDim, Hidden),
			bf16Tensor(p+"self_attn.v_proj.weight", r, KVHeads*HeadDim, Hidden),
			bf16Tensor(p+"self_attn.o_proj.weight", r, Hidden, Heads*HeadDim),
			bf16Tensor(p+"post_attention_layernorm.weight", r, Hidden),
		}
	}
	file1 := append([]safetensors.TensorData{bf16Tensor("model.embed_tokens.weight", r, Vocab, Hidden)}, attn(0)...)
	file1 = append(file1,
		bf16Tensor("model.layers.0.mlp.gate_proj.weight", r, Intermediate, Hidden),
		bf16Tensor("model.layers.0.mlp.up_proj.weight", r, Intermediate, Hidden),
		bf16Tensor("model.layers.0.mlp.down_proj.weight", r, Hidden, Intermediate))
	file2 := append(attn(1), bf16Tensor("model.layers.1.mlp.gate.weight", r, Experts, Hidden))
	for e := range Experts {
		p := fmt.Sprintf("model.layers.1.mlp.experts.%d.", e)
		file2 = append(file2,
			bf16Tensor(p+"gate_proj.weight", r, ExpertInter, Hidden),
			bf16Tensor(p+"up_proj.weight", r, ExpertInter, Hidden),
			bf16Tensor(p+"down_proj.weight", r, Hidden, ExpertInter))
	}
	file2 = append(file2, bf16Tensor("model.norm.weight", r, Hidden), bf16Tensor("lm_head.weight", r, Vocab, Hidden))

	ckdir := filepath.Join(dir, Name)
	if err := os.MkdirAll(ckdir, 0o755); err != nil {
		return nil, err
	}
	index := map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": map[string]string{}}
	for i, f := range [][]safetensors.TensorData{file1, file2} {
		name := fmt.Sprintf("model-%05d-of-00002.safetensors", i+1)
		var buf bytes.Buffer
		if err := safetensors.Write(&buf, f, map[string]string{"format": "pt"}); err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(ckdir, name), buf.Bytes(), 0o644); err != nil {
			return nil, err
		}
		for _, t := range f {
			index["weight_map"].(map[string]string)[t.Name] = name
		}
	}
	if err := writeJSON(filepath.Join(ckdir, "model.safetensors.index.json"), index); err != nil {
		return nil, err
	}
	reqdir := filepath.Join(filepath.Dir(filepath.Clean(dir)), "requests")
	if err := os.MkdirAll(reqdir, 0o755); err != nil {
		return nil, err
	}
	for name, req := range Requests() {
		path := filepath.Join(reqdir, name+".json")
		if err := writeJSON(path, req); err != nil {
			return nil, err
		}
		requests = append(requests, path)
	}
	return requests, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

func rows(dstRow, rows, cols int64, source string, srcRow int64) api.Block {
	return api.Block{Offsets: []int64{dstRow, 0}, Lengths: []int64{rows, cols}, Source: source,
		Base: []int64{srcRow, 0}, Coeff: [][]int64{{1, 0}, {0, 1}}}
}

// FusedQKV is layer l's q, k and v fused rank-major as vLLM holds them at tensor parallelism tp:
// rank r's rows are [q_r; k_r; v_r]. The request asks for rank's rows only.
func FusedQKV(l, tp, rank int64) api.TensorRequest {
	p := fmt.Sprintf("model.layers.%d.self_attn.", l)
	q, kv := Heads*HeadDim/tp, KVHeads*HeadDim/tp
	per := q + 2*kv
	var blocks []api.Block
	for r := range tp {
		blocks = append(blocks,
			rows(r*per, q, Hidden, p+"q_proj.weight", r*q),
			rows(r*per+q, kv, Hidden, p+"k_proj.weight", r*kv),
			rows(r*per+q+kv, kv, Hidden, p+"v_proj.weight", r*kv))
	}
	return api.TensorRequest{Name: p + "qkv_proj.weight", Dtype: api.BF16, Shape: []int64{tp * per, Hidden},
		Boxes: []api.Box{{Offsets: []int64{rank * per, 0}, Lengths: []int64{per, Hidden}}}, Blocks: &blocks}
}

// StackedExperts is layer 1's experts' gate and up projections stacked as vLLM's w13
// [experts, 2*inter, hidden] (gate then up), with the box of one expert-parallel rank.
func StackedExperts(ep, rank int64) api.TensorRequest {
	var blocks []api.Block
	for e := range int64(Experts) {
		for i, proj := range []string{"gate_proj", "up_proj"} {
			blocks = append(blocks, api.Block{
				Offsets: []int64{e, int64(i) * ExpertInter, 0}, Lengths: []int64{1, ExpertInter, Hidden},
				Source: fmt.Sprintf("model.layers.1.mlp.experts.%d.%s.weight", e, proj),
				Base:   []int64{0, 0}, Coeff: [][]int64{{0, 1, 0}, {0, 0, 1}}})
		}
	}
	per := Experts / ep
	return api.TensorRequest{Name: "model.layers.1.mlp.experts.w13_weight", Dtype: api.BF16,
		Shape: []int64{Experts, 2 * ExpertInter, Hidden},
		Boxes: []api.Box{{Offsets: []int64{rank * per, 0, 0}, Lengths: []int64{per, 2 * ExpertInter, Hidden}}}, Blocks: &blocks}
}

// Requests are the example requests, by file name.
func Requests() map[string]api.ShardRequest {
	st := api.Safetensors
	norm := []api.Block{{Offsets: []int64{0}, Lengths: []int64{Hidden}, Source: "model.norm.weight", Base: []int64{0}, Coeff: [][]int64{{1}}}}
	return map[string]api.ShardRequest{
		"qkv-tp2-rank1":     {Checkpoint: Name, Tensors: []api.TensorRequest{FusedQKV(0, 2, 1)}},
		"experts-ep2-rank0": {Checkpoint: Name, Format: &st, Tensors: []api.TensorRequest{StackedExperts(2, 0)}},
		"norm-f32": {Checkpoint: Name, Tensors: []api.TensorRequest{{Name: "model.norm.weight", Dtype: api.F32, Shape: []int64{Hidden},
			Boxes: []api.Box{{Offsets: []int64{0}, Lengths: []int64{Hidden}}}, Blocks: &norm}}},
	}
}

// CurlExamples returns ready-to-paste commands against a server at addr.
func CurlExamples(addr string, requests []string) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "  curl -s http://%s/v1/checkpoints\n", addr)
	fmt.Fprintf(&b, "  curl -s 'http://%s/v1/tensors?checkpoint=%s'\n", addr, Name)
	for _, path := range requests {
		base := filepath.Base(path)
		base = base[:len(base)-len(filepath.Ext(base))]
		fmt.Fprintf(&b, "  curl -s -X POST http://%s/v1/plan -H 'Content-Type: application/json' -d @%s\n", addr, path)
		fmt.Fprintf(&b, "  curl -s -X POST http://%s/v1/shards -H 'Content-Type: application/json' -d @%s -o %s.bin\n", addr, path, base)
	}
	return b.String()
}
