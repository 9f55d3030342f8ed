// Package example writes the checkpoint `make run` serves: a tiny Qwen2-MoE (separate q/k/v with
// biases and grouped KV heads, a dense gate/up/down layer, a sparse layer of a few experts with a
// shared expert and its gate, an embedding, norms), as two indexed safetensors files with the
// small files `vllm serve DIR` reads (config, generation config, a byte-level tokenizer), and
// request files that show the remaps engines use.
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
	"github.com/shardsrv/shardsrv/api/layout"
	"github.com/shardsrv/shardsrv/internal/engine"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// Name is the example checkpoint's folder.
const Name = "qwen2-moe-tiny"

// RequestsDir is the folder beside the checkpoint that the example requests are written into.
const RequestsDir = "requests"

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
	SharedInter  = 64
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

// files are the checkpoint's two files, each the tensors it holds, drawn from one seed.
func files() [][]safetensors.TensorData {
	r := rand.New(rand.NewPCG(7, 7))
	attn := func(l int) []safetensors.TensorData {
		p := fmt.Sprintf("model.layers.%d.", l)
		return []safetensors.TensorData{
			bf16Tensor(p+"input_layernorm.weight", r, Hidden),
			bf16Tensor(p+"self_attn.q_proj.weight", r, Heads*HeadDim, Hidden),
			bf16Tensor(p+"self_attn.k_proj.weight", r, KVHeads*HeadDim, Hidden),
			bf16Tensor(p+"self_attn.v_proj.weight", r, KVHeads*HeadDim, Hidden),
			bf16Tensor(p+"self_attn.q_proj.bias", r, Heads*HeadDim),
			bf16Tensor(p+"self_attn.k_proj.bias", r, KVHeads*HeadDim),
			bf16Tensor(p+"self_attn.v_proj.bias", r, KVHeads*HeadDim),
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
	// Drawn last, so the tensors above keep their bytes.
	file2 = append(file2,
		bf16Tensor("model.layers.1.mlp.shared_expert.gate_proj.weight", r, SharedInter, Hidden),
		bf16Tensor("model.layers.1.mlp.shared_expert.up_proj.weight", r, SharedInter, Hidden),
		bf16Tensor("model.layers.1.mlp.shared_expert.down_proj.weight", r, Hidden, SharedInter),
		bf16Tensor("model.layers.1.mlp.shared_expert_gate.weight", r, 1, Hidden))
	return [][]safetensors.TensorData{file1, file2}
}

// Generate writes the checkpoint into dir/Name and the example requests into dir/RequestsDir,
// nothing outside dir, so that dir is a store to serve: the catalog lists only directories
// holding an index or a model.safetensors, which RequestsDir does not.
func Generate(dir string) (requests []string, err error) {
	ckdir := filepath.Join(dir, Name)
	if err := os.MkdirAll(ckdir, 0o755); err != nil {
		return nil, err
	}
	index := map[string]any{"metadata": map[string]any{"total_size": 0}, "weight_map": map[string]string{}}
	for i, f := range files() {
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
	for name, v := range map[string]any{
		"config.json":            Config(),
		"generation_config.json": map[string]any{"do_sample": false, "eos_token_id": 0},
		"tokenizer.json":         tokenizer(),
		"tokenizer_config.json": map[string]any{
			"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": byteLevel()[0],
			"model_max_length": 2048, "clean_up_tokenization_spaces": false,
		},
	} {
		if err := writeJSON(filepath.Join(ckdir, name), v); err != nil {
			return nil, err
		}
	}
	reqdir := filepath.Join(dir, RequestsDir)
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

// Config is the example's config.json: a Qwen2-MoE whose first layer is dense, so a layout
// request ("layout": {"engine": "vllm", ...}) shows fused QKV with biases, gate_up, stacked experts
// and the padded vocabulary.
func Config() map[string]any {
	return map[string]any{
		"architectures": []string{"Qwen2MoeForCausalLM"}, "model_type": "qwen2_moe", "torch_dtype": "bfloat16",
		"hidden_size": Hidden, "num_attention_heads": Heads, "num_key_value_heads": KVHeads, "num_hidden_layers": 2,
		"intermediate_size": Intermediate, "vocab_size": Vocab, "tie_word_embeddings": false,
		"num_experts": Experts, "moe_intermediate_size": ExpertInter, "num_experts_per_tok": 2, "decoder_sparse_step": 1,
		"mlp_only_layers": []int{0}, "shared_expert_intermediate_size": SharedInter,
		"hidden_act": "silu", "rms_norm_eps": 1e-6, "max_position_embeddings": 2048, "eos_token_id": 0,
	}
}

// tokenizer is a Hugging Face tokenizers file for a byte-level BPE without merges: token i is byte
// i, so the Vocab ids cover every input and the NUL byte serves as the end of text.
func tokenizer() map[string]any {
	vocab := map[string]int{}
	for i, tok := range byteLevel() {
		vocab[tok] = i
	}
	byteLevelStep := map[string]any{"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true}
	return map[string]any{
		"version": "1.0", "truncation": nil, "padding": nil, "added_tokens": []any{}, "normalizer": nil,
		"pre_tokenizer": byteLevelStep, "post_processor": nil, "decoder": byteLevelStep,
		"model": map[string]any{
			"type": "BPE", "dropout": nil, "unk_token": nil, "continuing_subword_prefix": nil,
			"end_of_word_suffix": nil, "fuse_unk": false, "byte_fallback": false, "ignore_merges": false,
			"vocab": vocab, "merges": []any{},
		},
	}
}

// byteLevel is the ByteLevel pre-tokenizer's alphabet by byte (GPT-2's bytes_to_unicode): printable
// Latin-1 bytes stand for themselves, the others for U+0100 onwards in byte order.
func byteLevel() []string {
	out := make([]string, 256)
	next := rune(256)
	for b := range 256 {
		if ('!' <= b && b <= '~') || (0xA1 <= b && b <= 0xAC) || (0xAE <= b && b <= 0xFF) {
			out[b] = string(rune(b))
		} else {
			out[b] = string(next)
			next++
		}
	}
	return out
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// shapes are the example checkpoint's tensor shapes, as GET /v1/tensors lists them.
func shapes() layout.Shapes {
	s := layout.Shapes{}
	for _, f := range files() {
		for _, t := range f {
			s[t.Name] = t.Shape
		}
	}
	return s
}

// vllmTensor is tensor name as TP rank rank of tp holds it in vLLM: taken from the server's own
// vLLM layout of the example (internal/engine, what POST /v1/layouts answers).
func vllmTensor(name string, tp, rank int64) api.TensorRequest {
	config, err := json.Marshal(Config())
	if err != nil {
		panic(err)
	}
	infos := map[string]engine.TensorInfo{}
	for _, f := range files() {
		for _, t := range f {
			infos[t.Name] = engine.TensorInfo{DType: t.DType, Shape: t.Shape}
		}
	}
	spec := engine.Spec{Engine: "vllm", Parallel: engine.Parallel{TP: tp, TPRank: rank, DP: 1, PCP: 1}}
	table, err := engine.Build(spec, config, infos)
	if err != nil {
		panic(err) // the checkpoint is this package's own
	}
	for _, t := range table.Tensors {
		if t.Name == name {
			return t
		}
	}
	panic("example: vLLM's layout holds no " + name)
}

// Requests are the example requests, by file name: rank 1 of a TP=2 fused QKV as vLLM holds it
// (vLLM's layout, vllmTensor), and two built with api/layout's generic builders: expert-parallel
// rank 0 of 2 of layer 1's stacked gate and up projections in the safetensors format, and the final
// norm widened to F32.
func Requests() map[string]api.ShardRequest {
	s := shapes()
	qkv := vllmTensor("model.layers.0.self_attn.qkv_proj.weight", 2, 1)
	var parts [][]string
	for e := range Experts {
		ex := fmt.Sprintf("model.layers.1.mlp.experts.%d.", e)
		parts = append(parts, []string{ex + "gate_proj.weight", ex + "up_proj.weight"})
	}
	w13, err := layout.StackedExperts(s, parts, "model.layers.1.mlp.experts.w13_weight", api.BF16,
		layout.Rank{Size: 2, Index: 0})
	if err != nil {
		panic(err)
	}
	norm, err := layout.Replicated(s, "model.norm.weight", "model.norm.weight", api.F32)
	if err != nil {
		panic(err)
	}
	st := api.Safetensors
	return map[string]api.ShardRequest{
		"qkv-tp2-rank1":     {Checkpoint: Name, Tensors: []api.TensorRequest{qkv}},
		"experts-ep2-rank0": {Checkpoint: Name, Format: &st, Tensors: []api.TensorRequest{w13}},
		"norm-f32":          {Checkpoint: Name, Tensors: []api.TensorRequest{norm}},
	}
}

// CurlExamples returns ready-to-paste commands against a server at addr.
func CurlExamples(addr string, requests []string) string {
	var b bytes.Buffer
	fmt.Fprintf(&b, "  curl -s http://%s/v1/checkpoints\n", addr)
	fmt.Fprintf(&b, "  curl -s 'http://%s/v1/tensors?checkpoint=%s'\n", addr, Name)
	layout := fmt.Sprintf(
		`{"checkpoint": %q, "layout": {"engine": "vllm", "tensor_parallel_size": 2, "tp_rank": 1}}`,
		Name,
	)
	fmt.Fprintf(
		&b,
		"  curl -s -X POST http://%s/v1/layouts -H 'Content-Type: application/json' -d '%s'\n",
		addr,
		layout,
	)
	fmt.Fprintf(
		&b,
		"  curl -s -X POST http://%s/v1/shards -H 'Content-Type: application/json' -d '%s' -o vllm-tp2-rank1.bin\n",
		addr,
		layout,
	)
	for _, path := range requests {
		base := filepath.Base(path)
		base = base[:len(base)-len(filepath.Ext(base))]
		fmt.Fprintf(&b, "  curl -s -X POST http://%s/v1/plan -H 'Content-Type: application/json' -d @%s\n", addr, path)
		fmt.Fprintf(
			&b,
			"  curl -s -X POST http://%s/v1/shards -H 'Content-Type: application/json' -d @%s -o %s.bin\n",
			addr,
			path,
			base,
		)
	}
	return b.String()
}
