package sglangref

import (
	"fmt"
	"slices"
	"sort"

	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
)

// Variants are the vllmref checkpoints this reference models, at every setup SGLang accepts for
// them. vllmref's qwen3moe (dense layers between sparse ones) is left out: SGLang refuses it here
// (see qwen3MoE).
var Variants = []string{"llama", "llama-tied", "qwen3", "qwen3moe-sparse", "llama-wide", "llama-wide-tied", "qwen3-wide"}

// Parallel is one rank of an SGLang deployment, in its server options.
type Parallel struct {
	TP     int // --tp-size: the TP group, all of a model's GPUs
	TPRank int // the rank in it: the N of model-rank-N-part-*.safetensors
	DP     int // --dp-size (0 means 1)

	EnableDPAttention bool // --enable-dp-attention: attention TP is TP / DP
	EP                int  // --ep-size (0 means 1): MoE TP is TP / EP
}

// Unmodelled is the error Rank returns for an input the reference does not model (as opposed to
// one SGLang refuses): a test should skip it, not expect the server to refuse it.
type Unmodelled string

func (u Unmodelled) Error() string { return string(u) }

// Rank returns the tensors ShardedStateLoader.save_model writes for that rank, keyed by the names
// _filter_subtensors keeps; a vllmref.Refusal where SGLang refuses the setup (an assertion, a
// ValueError) or would save parameters the checkpoint never fills; Unmodelled where the input is
// outside the reference.
func Rank(config []byte, tensors map[string]vllmref.Tensor, p Parallel) (out map[string]vllmref.Tensor, err error) {
	defer func() {
		if r := recover(); r != nil {
			switch e := r.(type) {
			case vllmref.Refusal:
				out, err = nil, e
			case Unmodelled:
				out, err = nil, e
			default:
				panic(r)
			}
		}
	}()
	cfg := vllmref.ParseConfig(config)
	if cfg.Has("quantization_config") && !cfg.IsNull("quantization_config") {
		panic(Unmodelled("quantized checkpoints: SGLang's quantization methods rewrite weights after loading"))
	}
	b := &builder{cfg: cfg, hf: tensors, p: makePar(p), dtype: cfg.ModelDType()}
	switch arch := cfg.Architecture(); arch {
	case "LlamaForCausalLM":
		b.llama()
	case "Qwen3ForCausalLM":
		b.qwen3(false)
	case "Qwen3MoeForCausalLM":
		b.qwen3(true)
	default:
		panic(Unmodelled("architecture " + arch + " is not modelled by the SGLang reference"))
	}
	return b.result(), nil
}

// group is one process group a layer is split over: its size and this rank's place in it.
type group struct{ size, rank int64 }

// par is what one worker's layers see of the parallel setup.
type par struct {
	tp, attn, moeTP, ep group
	dpAttention         bool
}

// makePar derives the groups: attention TP by compute_dp_attention_world_info
// (layers/dp_attention.py@2aa2e2d0ffda0a44ed9a022fdd9d5d042f365eee: attn_tp_size = tp_size //
// dp_size under DP attention, attn_tp_rank = tp_rank % attn_tp_size), MoE TP and EP by
// initialize_model_parallel
// (distributed/parallel_state.py@0005973a84f7a02787e270b6be5970d3022d07fe: moe_tp_size = tp_size //
// ep_size at the default moe_dp_size of 1, the EP group of rank r holding ranks r % moe_tp + k *
// moe_tp). Sizes that do not divide are refused: SGLang's groups would not cover the TP group.
func makePar(p Parallel) par {
	dp, ep := int64(max(p.DP, 1)), int64(max(p.EP, 1))
	tp, r := int64(p.TP), int64(p.TPRank)
	if tp < 1 || r < 0 || r >= tp {
		panic(vllmref.Refusal(fmt.Sprintf("tp_rank %d is outside a TP size of %d", p.TPRank, p.TP)))
	}
	out := par{tp: group{tp, r}, attn: group{tp, r}, dpAttention: p.EnableDPAttention}
	if p.EnableDPAttention {
		a := divide(tp, dp, "--tp-size over --dp-size under --enable-dp-attention")
		out.attn = group{a, r % a}
	}
	m := divide(tp, ep, "--tp-size over --ep-size")
	out.moeTP, out.ep = group{m, r % m}, group{ep, r / m}
	return out
}

func divide(n, d int64, what string) int64 {
	if d <= 0 || n%d != 0 {
		panic(vllmref.Refusal(fmt.Sprintf("%s: %d is not divisible by %d", what, n, d)))
	}
	return n / d
}

// param is one entry of model.state_dict(): a tensor and every name that reaches it.
type param struct {
	names []string
	t     vllmref.Tensor
}

type builder struct {
	cfg    vllmref.HFConfig
	hf     map[string]vllmref.Tensor
	p      par
	dtype  string
	params []param
}

func (b *builder) add(t vllmref.Tensor, names ...string) {
	b.params = append(b.params, param{names: names, t: t})
}

// result is _filter_subtensors (model_loader/loader.py@005cbe0ea796446e420b6aab62ce51a488f5e7c7):
// tensors with no element are dropped, and of the names sharing one tensor the smallest is kept
// ("if k2 < k: break").
func (b *builder) result() map[string]vllmref.Tensor {
	out := map[string]vllmref.Tensor{}
	for _, p := range b.params {
		n := int64(1)
		for _, d := range p.t.Shape {
			n *= d
		}
		if n == 0 {
			continue
		}
		names := slices.Clone(p.names)
		sort.Strings(names)
		if _, dup := out[names[0]]; dup {
			panic("sglangref: two parameters named " + names[0])
		}
		out[names[0]] = p.t
	}
	return out
}

// get is a checkpoint tensor of the expected shape, copied into the model dtype
// (default_weight_loader and the layers' loaders do param.data.copy_(loaded_weight)).
func (b *builder) get(name string, shape ...int64) vllmref.Tensor {
	t, ok := b.hf[name]
	if !ok {
		panic(vllmref.Refusal("the checkpoint has no tensor " + name))
	}
	if !slices.Equal(t.Shape, shape) {
		panic(vllmref.Refusal(fmt.Sprintf("%s has shape %v, the config says %v", name, t.Shape, shape)))
	}
	return vllmref.Convert(t, b.dtype)
}

// llama is LlamaForCausalLM (models/llama.py@bf7a0e237e8d5b2ce5402f5d2fafce31e012dbdf, the same at
// @00239548f1cd1a06ca145a5447a86738090a48f1). LlamaAttention: qkv_proj = QKVParallelLinear and
// o_proj = RowParallelLinear over the full TP group (it reads get_tensor_model_parallel_world_size
// and passes no tp_size), head_dim = getattr(config, "head_dim", hidden // heads), bias =
// attention_bias or config.bias on both; LlamaMLP: gate_up_proj = MergedColumnParallelLinear([I,
// I], bias=False), down_proj = RowParallelLinear; LlamaModel.embed_tokens = VocabParallelEmbedding
// (TP); lm_head = model.embed_tokens when tie_word_embeddings, else ParallelLMHead (TP,
// use_attn_tp_group = enable_dp_lm_head, off).
func (b *builder) llama() {
	c := b.cfg
	hidden, heads := c.Int("hidden_size"), c.Int("num_attention_heads")
	kv := c.IntOr("num_key_value_heads", heads)
	headDim := c.IntOr("head_dim", hidden/heads)
	bias := c.BoolOr("attention_bias", false) || c.BoolOr("bias", false)
	if c.BoolOr("mlp_bias", false) {
		// LlamaMLP builds its linears with bias=False: the checkpoint's MLP biases would be dropped.
		panic(vllmref.Refusal("llama mlp_bias: SGLang's LlamaMLP has no biases and would drop the checkpoint's"))
	}
	vocab := c.Int("vocab_size")
	b.vocab("model.embed_tokens.weight", vocab, hidden, b.p.tp)
	for i := int64(0); i < c.Int("num_hidden_layers"); i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		b.norm(l+"input_layernorm.weight", hidden)
		b.norm(l+"post_attention_layernorm.weight", hidden)
		b.qkv(l+"self_attn.", b.p.tp, bias, heads, kv, headDim, hidden)
		b.row(l+"self_attn.o_proj", l+"self_attn.o_proj", b.p.tp, bias, hidden, heads*headDim)
		b.mlp(l+"mlp.", c.Int("intermediate_size"), hidden)
	}
	b.norm("model.norm.weight", hidden)
	b.lmHead(vocab, hidden)
}

// qwen3 is Qwen3ForCausalLM (models/qwen3.py@01b5f572b7b678e2fa5a727881f1ff3ab4dd3c6d) and, with
// moe, Qwen3MoeForCausalLM (models/qwen3_moe.py@008af3a6f95b956ea4d50986f9a921f13dced28b).
// Qwen3Attention / Qwen3MoeAttention: qkv_proj and o_proj over the attention TP group
// (tp_rank=attn_tp_rank, tp_size=attn_tp_size), bias = config.attention_bias on both, head_dim =
// config.head_dim or hidden // heads, q_norm and k_norm = RMSNorm(head_dim). The model is
// Qwen2Model / Qwen2MoeModel, whose embed_tokens is VocabParallelEmbedding with enable_tp = not
// enable_dp_attention (models/qwen2_moe.py@0115497da8f2340cdce444597387cf2a4d499f5c; the one
// qwen2.py with DP attention found has no commit the index names, and Qwen3 is held to the same
// rule). Qwen3's MLP is Qwen2MLP (models/qwen2.py, every copy the index holds:
// MergedColumnParallelLinear and RowParallelLinear over the full TP group). The LM head: Qwen3 ties
// it to the embedding when tie_word_embeddings (and one pipeline stage), else ParallelLMHead over
// the full TP group; Qwen3-MoE always builds a ParallelLMHead.
func (b *builder) qwen3(moe bool) {
	c := b.cfg
	hidden, heads := c.Int("hidden_size"), c.Int("num_attention_heads")
	kv := c.IntOr("num_key_value_heads", heads)
	headDim := c.IntOr("head_dim", hidden/heads)
	bias := c.BoolOr("attention_bias", false)
	vocab := c.Int("vocab_size")
	embedTP := b.p.tp
	if b.p.dpAttention {
		embedTP = group{1, 0}
	}
	b.vocab("model.embed_tokens.weight", vocab, hidden, embedTP)
	for i := int64(0); i < c.Int("num_hidden_layers"); i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		b.norm(l+"input_layernorm.weight", hidden)
		b.norm(l+"post_attention_layernorm.weight", hidden)
		b.qkv(l+"self_attn.", b.p.attn, bias, heads, kv, headDim, hidden)
		b.row(l+"self_attn.o_proj", l+"self_attn.o_proj", b.p.attn, bias, hidden, heads*headDim)
		b.norm(l+"self_attn.q_norm.weight", headDim)
		b.norm(l+"self_attn.k_norm.weight", headDim)
		if moe {
			b.qwen3MoE(i, l+"mlp.", hidden)
		} else {
			b.mlp(l+"mlp.", c.Int("intermediate_size"), hidden)
		}
	}
	b.norm("model.norm.weight", hidden)
	if moe && c.BoolOr("tie_word_embeddings", false) {
		// Qwen3MoeForCausalLM builds lm_head = ParallelLMHead whatever the flag, and its
		// load_weights fills lm_head.weight only from a checkpoint tensor of that name: a tied
		// checkpoint leaves it uninitialized.
		panic(vllmref.Refusal("Qwen3-MoE with tie_word_embeddings: SGLang's Qwen3MoeForCausalLM never fills lm_head.weight"))
	}
	b.lmHead(vocab, hidden)
}

// qwen3MoE is Qwen3MoeSparseMoeBlock
// (models/qwen3_moe.py@008af3a6f95b956ea4d50986f9a921f13dced28b). Qwen3MoeDecoderLayer builds one
// in every layer ("Qwen3MoE all layers are sparse", is_layer_sparse = True): it does not read
// decoder_sparse_step or mlp_only_layers, and load_weights skips what has no parameter, so a
// checkpoint with dense layers would leave their experts uninitialized — refused here. The block: a
// ValueError when moe_tp_size > num_experts; experts = FusedMoE(num_experts +
// ep_num_redundant_experts (0 without EPLB), moe_intermediate_size) from
// experts.N.{gate,up,down}_proj (FusedMoE.make_expert_params_mapping); gate =
// ReplicatedLinear(hidden, num_experts, bias=False, quant_config=None), in the model dtype.
func (b *builder) qwen3MoE(layer int64, p string, hidden int64) {
	c := b.cfg
	if c.IntOr("decoder_sparse_step", 1) != 1 || slices.Contains(c.IntsOr("mlp_only_layers"), layer) {
		panic(vllmref.Refusal(fmt.Sprintf("Qwen3-MoE layer %d is dense in the checkpoint (decoder_sparse_step, "+
			"mlp_only_layers); SGLang's Qwen3MoeDecoderLayer makes every layer sparse", layer)))
	}
	experts := c.Int("num_experts")
	if b.p.moeTP.size > experts {
		panic(vllmref.Refusal(fmt.Sprintf("Tensor parallel size %d is greater than the number of experts %d.",
			b.p.moeTP.size, experts)))
	}
	b.fusedMoE(p+"experts.", experts, c.Int("moe_intermediate_size"), hidden, func(e int64) (string, string, string) {
		x := fmt.Sprintf("%sexperts.%d.", p, e)
		return x + "gate_proj.weight", x + "up_proj.weight", x + "down_proj.weight"
	})
	b.add(b.get(p+"gate.weight", experts, hidden), p+"gate.weight")
}

// fusedMoE is FusedMoE.__init__ and its weight_loader (layers/moe/fused_moe_triton/layer.py
// @008d7d0e947e436a572cf8243674adf264dc8836) with UnquantizedFusedMoEMethod.create_weights
// (quantization/unquant.py@0038b2b5e53cc1b322a6ca86041f6f303adf872b, gated SiLU, no triton_kernels
// transpose): num_local_experts = num_experts // moe_ep_size, intermediate_size_per_partition =
// I // moe_tp_size (both asserted), EP rank e holds experts [e * local, (e + 1) * local)
// (expert_map), w13_weight[j] = [gate rows moe_tp_rank * I_pp..; up rows moe_tp_rank * I_pp..]
// (_load_w13: w1 into the first half, w3 into the second), w2_weight[j] = down's columns
// moe_tp_rank * I_pp.. (_load_w2).
func (b *builder) fusedMoE(p string, experts, inter, hidden int64, names func(e int64) (gate, up, down string)) {
	local := divide(experts, b.p.ep.size, "num_experts over --ep-size (FusedMoE asserts it)")
	ipp := divide(inter, b.p.moeTP.size, "moe_intermediate_size over the MoE TP size (FusedMoE asserts it)")
	r := b.p.moeTP.rank
	var w13, w2 []vllmref.Tensor
	for e := b.p.ep.rank * local; e < (b.p.ep.rank+1)*local; e++ {
		gate, up, down := names(e)
		g, u, d := b.get(gate, inter, hidden), b.get(up, inter, hidden), b.get(down, hidden, inter)
		w13 = append(w13, vllmref.CatRows(vllmref.NarrowRows(g, r*ipp, ipp, gate), vllmref.NarrowRows(u, r*ipp, ipp, up)))
		w2 = append(w2, vllmref.NarrowCols(d, r*ipp, ipp, down))
	}
	b.add(vllmref.Stack(w13), p+"w13_weight")
	b.add(vllmref.Stack(w2), p+"w2_weight")
}

// norm is RMSNorm (layers/layernorm.py@000fc1a8d6aeaecbeeebbfec90d88af7262afbc0): weight =
// nn.Parameter(torch.ones(n)) in the model dtype, replicated, filled by default_weight_loader.
func (b *builder) norm(name string, n int64) { b.add(b.get(name, n), name) }

// qkv is QKVParallelLinear over group g
// (layers/linear.py@0079fcc18b3ee44bfeaaea8a9268c1d50b57b3e1): num_heads = heads / size; if size >=
// kv heads, one KV head a rank replicated size / kv times, else kv / size. weight_loader puts the
// rank's q, k, v rows one after the other, q from rows rank * q_size, k and v from rows (rank /
// replicas) * kv_size of their checkpoint tensors. Biases load the same way.
func (b *builder) qkv(p string, g group, bias bool, heads, kvHeads, headDim, hidden int64) {
	numHeads := divide(heads, g.size, "num_attention_heads over the attention TP size")
	numKV, replicas := int64(1), int64(1)
	if g.size >= kvHeads {
		replicas = divide(g.size, kvHeads, "the attention TP size over num_key_value_heads")
	} else {
		numKV = divide(kvHeads, g.size, "num_key_value_heads over the attention TP size")
	}
	qs, kvs, kvRank := numHeads*headDim, numKV*headDim, g.rank/replicas
	for _, suffix := range []string{".weight", ".bias"} {
		if suffix == ".bias" && !bias {
			continue
		}
		shape := func(rows int64) []int64 {
			if suffix == ".bias" {
				return []int64{rows}
			}
			return []int64{rows, hidden}
		}
		q := b.get(p+"q_proj"+suffix, shape(heads*headDim)...)
		k := b.get(p+"k_proj"+suffix, shape(kvHeads*headDim)...)
		v := b.get(p+"v_proj"+suffix, shape(kvHeads*headDim)...)
		b.add(vllmref.CatRows(
			vllmref.NarrowRows(q, g.rank*qs, qs, p+"q_proj"+suffix),
			vllmref.NarrowRows(k, kvRank*kvs, kvs, p+"k_proj"+suffix),
			vllmref.NarrowRows(v, kvRank*kvs, kvs, p+"v_proj"+suffix),
		), p+"qkv_proj"+suffix)
	}
}

// row is RowParallelLinear over group g: the weight's input columns rank * in / size.., the bias
// (not parallelized) whole.
func (b *builder) row(name, hf string, g group, bias bool, out, in int64) {
	ipp := divide(in, g.size, hf+" input size over its TP size")
	b.add(vllmref.NarrowCols(b.get(hf+".weight", out, in), g.rank*ipp, ipp, hf), name+".weight")
	if bias {
		b.add(b.get(hf+".bias", out), name+".bias")
	}
}

// mlp is LlamaMLP / Qwen2MLP over the full TP group: gate_up_proj = MergedColumnParallelLinear
// (hidden, [I, I]) holding the rank's gate rows then its up rows (stacked_params_mapping
// gate_proj -> shard 0, up_proj -> shard 1), down_proj = RowParallelLinear(I, hidden).
func (b *builder) mlp(p string, inter, hidden int64) {
	g := b.p.tp
	ipp := divide(inter, g.size, "intermediate_size over the TP size")
	gate, up := b.get(p+"gate_proj.weight", inter, hidden), b.get(p+"up_proj.weight", inter, hidden)
	b.add(vllmref.CatRows(vllmref.NarrowRows(gate, g.rank*ipp, ipp, p+"gate_proj"),
		vllmref.NarrowRows(up, g.rank*ipp, ipp, p+"up_proj")), p+"gate_up_proj.weight")
	b.row(p+"down_proj", p+"down_proj", g, false, hidden, inter)
}

// vocab is VocabParallelEmbedding / ParallelLMHead over group g without LoRA
// (layers/vocab_parallel_embedding.py@04d5e392629c53b9db96052947733bd434ea00a2):
// num_embeddings_padded = pad_vocab_size(vocab, 64) (DEFAULT_VOCAB_PADDING_SIZE; no lcm with the TP
// size in the copy read), num_embeddings_per_partition = divide(padded, size) (asserted), the
// rank's checkpoint rows [min(rank * per, vocab), min((rank + 1) * per, vocab)) copied to the top
// and the rest zero (weight_loader: param[:n].copy_, param[n:].fill_(0)). enable_tp=False is a
// group of one.
func (b *builder) vocab(name string, vocab, hidden int64, g group) {
	padded := vllmref.CeilDiv(vocab, 64) * 64
	per := divide(padded, g.size, "the padded vocabulary over its TP size")
	start, end := min(g.rank*per, vocab), min((g.rank+1)*per, vocab)
	rows := vllmref.NarrowRows(b.get(name, vocab, hidden), start, end-start, name)
	b.add(vllmref.PadRows(rows, per), name)
}

// lmHead is the LM head: with tie_word_embeddings the models set lm_head = model.embed_tokens,
// one parameter named "lm_head.weight" and "model.embed_tokens.weight", of which
// _filter_subtensors keeps "lm_head.weight"; else a ParallelLMHead over the full TP group.
func (b *builder) lmHead(vocab, hidden int64) {
	if b.cfg.BoolOr("tie_word_embeddings", false) {
		i := slices.IndexFunc(b.params, func(p param) bool { return slices.Contains(p.names, "model.embed_tokens.weight") })
		b.params[i].names = append(b.params[i].names, "lm_head.weight")
		return
	}
	b.vocab("lm_head.weight", vocab, hidden, b.p.tp)
}
