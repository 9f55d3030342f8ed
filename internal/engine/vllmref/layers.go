package vllmref

import (
	"fmt"
	"math"
	"sort"
)

// par is what the layers of one worker see of the parallel setup.
type par struct {
	tp, tpRank int64 // get_tensor_model_parallel_world_size / _rank: attention and dense layers

	// FusedMoEParallelConfig.make (vllm/model_executor/layers/fused_moe/config.py).
	moeTP, moeTPRank int64
	ep, epRank       int64

	// sequenceParallel is ParallelConfig.use_sequence_parallel_moe on a line that has it (release).
	sequenceParallel bool

	// redundant is num_redundant_experts (EPLB); roundRobin the requested placement, which
	// fusedMoE applies only where vLLM does.
	redundant  int64
	roundRobin bool
	dp         int64
}

// makePar follows FusedMoEParallelConfig.make of v0.10.2:
//
//	flatten_tp_across_dp: tp_size = dp_size * tp_size_, tp_rank = dp_rank * tp_size_ + tp_rank
//	use_ep = dp_size_ * tp_size_ > 1 and enable_expert_parallel
//	not use_ep: MoE TP over the flattened group, ep_size 1
//	use_ep:     ep_size, ep_rank = the flattened tp_size, tp_rank; MoE tp_size 1
//
// (No sequence-parallel MoE in v0.10.2: the dense and shared-expert layers always use the
// attention TP group.) From "0.29" the flattening takes prefill-context parallelism as a third
// factor: flatten_tp_across_dp_and_pcp gives dp_size * pcp_size * tp_size and dp_rank * pcp_size *
// tp_size + pcp_rank * tp_size + tp_rank (fused_moe/config.py), while the attention and dense
// layers keep the TP split, alike on every PCP rank.
func makePar(p Parallel) par {
	pcp := max(p.PCP, 1)
	if p.TP < 1 || p.DP < 1 {
		panic(Refusal(fmt.Sprintf("tensor_parallel_size %d and data_parallel_size %d must be at least 1", p.TP, p.DP)))
	}
	if p.TPRank < 0 || p.TPRank >= p.TP {
		panic(Refusal(fmt.Sprintf("tp_rank %d is outside [0, %d)", p.TPRank, p.TP)))
	}
	if p.DPRank < 0 || p.DPRank >= p.DP {
		panic(Refusal(fmt.Sprintf("dp_rank %d is outside [0, %d)", p.DPRank, p.DP)))
	}
	if p.PCPRank < 0 || p.PCPRank >= pcp {
		panic(Refusal(fmt.Sprintf("pcp_rank %d is outside [0, %d)", p.PCPRank, pcp)))
	}
	if p.RedundantExperts < 0 {
		panic(Refusal("num_redundant_experts must not be negative"))
	}
	tp, dp := int64(p.TP), int64(p.DP)
	out := par{tp: tp, tpRank: int64(p.TPRank), redundant: int64(p.RedundantExperts), roundRobin: p.RoundRobin, dp: dp}
	flatTP := dp * int64(pcp) * tp
	flatRank := int64(p.DPRank)*int64(pcp)*tp + int64(p.PCPRank)*tp + int64(p.TPRank)
	if flatTP > 1 && p.EnableEP {
		out.moeTP, out.moeTPRank, out.ep, out.epRank = 1, 0, flatTP, flatRank
	} else {
		out.moeTP, out.moeTPRank, out.ep, out.epRank = flatTP, flatRank, 1, 0
	}
	return out
}

// localExperts is determine_expert_map (fused_moe/layer.py) with placement "linear": experts
// spread as evenly as possible, the first global%ep ranks holding one more.
func localExperts(ep, epRank, global int64) (start, count int64) {
	if ep == 1 {
		return 0, global
	}
	base, rem := global/ep, global%ep
	count = base
	if epRank < rem {
		count++
	}
	return epRank*base + min(epRank, rem), count
}

// localSlots are the physical expert slots this rank holds, in local order. Slot p < E holds
// logical expert p and slot E + j logical expert j % E (EplbState.
// build_initial_global_physical_to_logical_map, and RoutedExperts.build_expert_params_mapping loads
// each slot from its logical expert's checkpoint tensors;
// routed_experts.py@002d6073aa034d4f5545d45021b0e56d1f3c3593).
//
// The E + R slots go over the EP ranks by determine_expert_map (fused_moe/expert_map_manager.py
// @04d26335ddf7fb894244a56de9dc3b841323b0ae): linear by default; round_robin (slots r, r + ep, ...)
// only where determine_expert_placement_strategy allows it — num_expert_group > 1, no redundant
// experts, no EPLB, and not with all2all kernels (DP > 1 under EP) on the default
// allgather_reducescatter backend, which needs DeepEP low-latency or NIXL-EP routing tables — and
// linear otherwise, with a warning. EPLB needs expert parallelism (ParallelConfig) and an even
// split ("EPLB currently only supports even distribution of experts across ranks",
// FusedMoEFactory).
func (b *builder) localSlots(numExperts int64) []int64 {
	global := numExperts + b.p.redundant
	if b.p.redundant > 0 {
		if b.p.ep == 1 {
			panic(Refusal("EPLB (num_redundant_experts) requires expert parallelism"))
		}
		if global%b.p.ep != 0 {
			panic(Refusal(fmt.Sprintf("EPLB currently only supports even distribution of experts across ranks. "+
				"Got %d experts and %d EP ranks.", global, b.p.ep)))
		}
	}
	groups := b.cfg.IntOr("n_group", 1)
	roundRobin := b.p.roundRobin && b.p.ep > 1 && groups > 1 && b.p.redundant == 0 && b.p.dp == 1
	var slots []int64
	if roundRobin {
		for s := b.p.epRank; s < global; s += b.p.ep {
			slots = append(slots, s)
		}
		return slots
	}
	start, count := localExperts(b.p.ep, b.p.epRank, global)
	for s := start; s < start+count; s++ {
		slots = append(slots, s)
	}
	return slots
}

// param is one entry of model.state_dict(): a tensor and every name that reaches it.
type param struct {
	names []string
	t     Tensor
}

type builder struct {
	cfg    HFConfig
	hf     map[string]Tensor
	p      par
	dtype  string // the model dtype of unquantized parameters
	bn, bk int64  // weight_block_size when the checkpoint is block fp8
	fp8    bool
	rel    release
	params []param
}

// add records a parameter under its names (aliases).
func (b *builder) add(t Tensor, names ...string) {
	t.check()
	b.params = append(b.params, param{names: names, t: t})
}

// result is ShardedStateLoader._filter_subtensors over the state dict: tensors with no element
// are dropped (`if tensor.numel()`), and of the names sharing one tensor the smallest is kept
// ("if k2 < k: break  # Same tensors, keep the one with the smaller key").
func (b *builder) result() map[string]Tensor {
	out := map[string]Tensor{}
	for _, p := range b.params {
		if numel(p.t.Shape) == 0 {
			continue
		}
		names := append([]string(nil), p.names...)
		sort.Strings(names)
		if _, dup := out[names[0]]; dup {
			panic(Refusal("reference bug: two parameters named " + names[0]))
		}
		out[names[0]] = p.t
	}
	return out
}

func suffixed(prefixes []string, suffix string) []string {
	out := make([]string, len(prefixes))
	for i, p := range prefixes {
		out[i] = p + suffix
	}
	return out
}

// get is a checkpoint tensor of the expected shape.
func (b *builder) get(name string, shape ...int64) Tensor {
	t, ok := b.hf[name]
	if !ok {
		panic(Refusal("the checkpoint has no tensor " + name))
	}
	t.check()
	if fmt.Sprint(t.Shape) != fmt.Sprint(shape) {
		panic(Refusal(fmt.Sprintf("%s has shape %v, the config says %v", name, t.Shape, shape)))
	}
	return t
}

// unquantized is a checkpoint tensor copied into a parameter of the model dtype.
func (b *builder) unquantized(name string, shape ...int64) Tensor {
	return Convert(b.get(name, shape...), b.dtype)
}

// divide is vllm.distributed.utils.divide: it asserts divisibility.
func divide(n, d int64, what string) int64 {
	if d <= 0 || n%d != 0 {
		panic(Refusal(fmt.Sprintf("%s: %d is not divisible by %d", what, n, d)))
	}
	return n / d
}

// linWeight is a linear's weight: the model dtype, or for a block-fp8 checkpoint the F8_E4M3
// bytes as stored (Fp8LinearMethod.create_weights: weight dtype float8_e4m3fn for
// is_checkpoint_fp8_serialized; process_weights_after_loading keeps it on the plain CUDA path).
func (b *builder) linWeight(hf string, quant bool, out, in int64) Tensor {
	if !quant {
		return b.unquantized(hf+".weight", out, in)
	}
	w := b.get(hf+".weight", out, in)
	if w.DType != "F8_E4M3" {
		panic(Refusal(fmt.Sprintf("%s.weight is %s; a block-fp8 checkpoint stores F8_E4M3", hf, w.DType)))
	}
	return w
}

// linScale is the checkpoint's weight_scale_inv: F32 [ceil(out/block_n), ceil(in/block_k)].
func (b *builder) linScale(hf string, out, in int64) Tensor {
	s := b.get(hf+".weight_scale_inv", CeilDiv(out, b.bn), CeilDiv(in, b.bk))
	return Convert(s, "F32")
}

// validateBlock is the block-shape check of Fp8LinearMethod.create_weights in v0.10.2 (moved to
// fp8_utils.validate_fp8_block_shape later, same logic). tp is the layer's tp_size (1 when
// disable_tp or replicated).
func (b *builder) validateBlock(name string, tp, inputSize, outputSize, inPP int64, outPartSizes []int64) {
	// "Required by row parallel"
	if tp > 1 && inputSize/inPP == tp && inPP%b.bk != 0 {
		panic(
			Refusal(
				fmt.Sprintf(
					"%s: weight input_size_per_partition = %d is not divisible by weight quantization block_k = %d",
					name,
					inPP,
					b.bk,
				),
			),
		)
	}
	// "Required by column parallel or enabling merged weights"
	var sum int64
	for _, s := range outPartSizes {
		sum += s
	}
	isTPSplit := tp > 1 && outputSize/sum == tp
	isMerged := len(outPartSizes) > 1
	if isTPSplit || isMerged {
		check := outPartSizes
		if !isTPSplit && isMerged {
			// "In case of merged matrices, we allow the last matrix to not be a multiple of
			// block size" (this is what lets DeepSeek's fused_qkv_a_proj end in a partial block).
			check = outPartSizes[:len(outPartSizes)-1]
		}
		for _, s := range check {
			if s%b.bn != 0 {
				panic(
					Refusal(
						fmt.Sprintf(
							"%s: weight output_partition_size = %d is not divisible by weight quantization block_n = %d",
							name,
							s,
							b.bn,
						),
					),
				)
			}
		}
	}
}

// norm is an RMSNorm weight (layers/layernorm.py): replicated, model dtype, default_weight_loader.
func (b *builder) norm(names []string, hf string, n int64) {
	b.add(b.unquantized(hf, n), names...)
}

// replicated is ReplicatedLinear (layers/linear.py): every rank holds the whole weight; its block
// scale is whole too and no block check can fail (tp_size 1).
func (b *builder) replicated(names []string, hf string, quant bool, out, in int64) {
	b.add(b.linWeight(hf, quant, out, in), suffixed(names, ".weight")...)
	if quant {
		b.add(b.linScale(hf, out, in), suffixed(names, ".weight_scale_inv")...)
	}
}

// column is ColumnParallelLinear: output_size_per_partition = divide(output_size, tp); the weight
// loader narrows dim 0 at tp_rank * shard_size (weight_loader / load_column_parallel_weight). The
// block scale parameter has ceil(out_pp/block_n) rows and is narrowed the same way in its own
// units (BlockQuantScaleParameter.load_column_parallel_weight).
func (b *builder) column(names []string, hf string, quant, bias bool, out, in int64) {
	tp, r := b.p.tp, b.p.tpRank
	outPP := divide(out, tp, hf+" output_size")
	if quant {
		b.validateBlock(hf, tp, in, out, in, []int64{outPP})
	}
	w := b.linWeight(hf, quant, out, in)
	b.add(NarrowRows(w, r*outPP, outPP, hf+".weight"), suffixed(names, ".weight")...)
	if bias {
		bb := b.unquantized(hf+".bias", out)
		b.add(NarrowRows(bb, r*outPP, outPP, hf+".bias"), suffixed(names, ".bias")...)
	}
	if quant {
		rows := CeilDiv(outPP, b.bn)
		b.add(
			NarrowRows(b.linScale(hf, out, in), r*rows, rows, hf+".weight_scale_inv"),
			suffixed(names, ".weight_scale_inv")...)
	}
}

// row is RowParallelLinear: input_size_per_partition = divide(input_size, tp); the loader narrows
// dim 1 (input_dim) at tp_rank * shard_size; the block scale likewise in block_k units
// (load_row_parallel_weight). The bias is not split (it has no input_dim).
func (b *builder) row(names []string, hf string, quant, bias bool, out, in int64) {
	tp, r := b.p.tp, b.p.tpRank
	inPP := divide(in, tp, hf+" input_size")
	if quant {
		b.validateBlock(hf, tp, in, out, inPP, []int64{out})
	}
	w := b.linWeight(hf, quant, out, in)
	b.add(NarrowCols(w, r*inPP, inPP, hf+".weight"), suffixed(names, ".weight")...)
	if bias {
		b.add(b.unquantized(hf+".bias", out), suffixed(names, ".bias")...)
	}
	if quant {
		cols := CeilDiv(inPP, b.bk)
		b.add(
			NarrowCols(b.linScale(hf, out, in), r*cols, cols, hf+".weight_scale_inv"),
			suffixed(names, ".weight_scale_inv")...)
	}
}

// merged is MergedColumnParallelLinear (gate_up_proj = [gate_r; up_r], DeepSeek's
// fused_qkv_a_proj with disable_tp=True): every output size must divide by tp (it asserts);
// shard k goes to rows [sum(sizes[:k])/tp, ...) of the parameter and is read from rows
// tp_rank * sizes[k]/tp of its checkpoint tensor (weight_loader_v2 / load_merged_column_weight).
// The block scale is created with ceil(sum(out_pp)/block_n) rows filled with float32 min, and shard
// k lands at ceil(sum(sizes[:k])/block_n) // tp, ceil(sizes[k]/block_n) // tp rows, read from rows
// tp_rank * that size of its checkpoint scale (weight_loader_v2's BlockQuantScaleParameter branch).
func (b *builder) merged(names []string, hfs []string, quant, disableTP bool, sizes []int64, in int64) {
	tp, r := b.p.tp, b.p.tpRank
	if disableTP {
		tp, r = 1, 0
	}
	outPPs := make([]int64, len(sizes))
	var total int64
	for k, s := range sizes {
		outPPs[k] = divide(s, tp, hfs[k]+" output_size")
		total += s
	}
	if quant {
		b.validateBlock(names[0], tp, in, total, in, outPPs)
	}
	var parts []Tensor
	for k, hf := range hfs {
		w := b.linWeight(hf, quant, sizes[k], in)
		parts = append(parts, NarrowRows(w, r*outPPs[k], outPPs[k], hf+".weight"))
	}
	b.add(CatRows(parts...), suffixed(names, ".weight")...)
	if quant {
		scale := filledF32(-math.MaxFloat32, CeilDiv(total/tp, b.bn), CeilDiv(in, b.bk))
		var before int64
		for k, hf := range hfs {
			off := CeilDiv(before, b.bn) / tp
			size := CeilDiv(sizes[k], b.bn) / tp
			src := NarrowRows(b.linScale(hf, sizes[k], in), r*size, size, hf+".weight_scale_inv")
			copyRowsInto(&scale, off, src, names[0]+".weight_scale_inv")
			before += sizes[k]
		}
		b.add(scale, suffixed(names, ".weight_scale_inv")...)
	}
}

// qkv is QKVParallelLinear: num_heads = divide(total_num_heads, tp); if tp >= total_num_kv_heads
// then num_kv_heads = 1 and num_kv_head_replicas = divide(tp, total_num_kv_heads), else
// num_kv_heads = divide(total_num_kv_heads, tp). weight_loader puts q, k, v at offsets 0,
// num_heads*head_size, (num_heads+num_kv_heads)*head_size and reads q from tp_rank, k and v from
// shard_rank = tp_rank // num_kv_head_replicas. Biases (Qwen2) load the same way. A block-fp8
// checkpoint keeps the F8_E4M3 rows and places each part's block scale as qkvScale says, after the
// block-shape check of a merged layer with output partitions [q, k, v].
func (b *builder) qkv(names []string, hfq, hfk, hfv string, quant, bias bool, heads, kvHeads, headDim, hidden int64) {
	tp, r := b.p.tp, b.p.tpRank
	numHeads := divide(heads, tp, "num_attention_heads")
	numKV, replicas := int64(1), int64(1)
	if tp >= kvHeads {
		replicas = divide(tp, kvHeads, "tensor_parallel_size over num_key_value_heads")
	} else {
		numKV = divide(kvHeads, tp, "num_key_value_heads")
	}
	kvRank := r / replicas
	qs, kvs := numHeads*headDim, numKV*headDim
	if quant {
		b.validateBlock(names[0], tp, hidden, (heads+2*kvHeads)*headDim, hidden, []int64{qs, kvs, kvs})
	}
	rows := func(t Tensor, suffix string) Tensor {
		return CatRows(
			NarrowRows(t, r*qs, qs, hfq+suffix),
			NarrowRows(t, heads*headDim+kvRank*kvs, kvs, hfk+suffix),
			NarrowRows(t, (heads+kvHeads)*headDim+kvRank*kvs, kvs, hfv+suffix),
		)
	}
	w := CatRows(b.linWeight(hfq, quant, heads*headDim, hidden), b.linWeight(hfk, quant, kvHeads*headDim, hidden),
		b.linWeight(hfv, quant, kvHeads*headDim, hidden))
	b.add(rows(w, ".weight"), suffixed(names, ".weight")...)
	if bias {
		bb := CatRows(b.unquantized(hfq+".bias", heads*headDim), b.unquantized(hfk+".bias", kvHeads*headDim),
			b.unquantized(hfv+".bias", kvHeads*headDim))
		b.add(rows(bb, ".bias"), suffixed(names, ".bias")...)
	}
	if quant {
		kvOut := kvHeads * headDim
		b.add(b.qkvScale([3]string{hfq, hfk, hfv}, [3]int64{heads * headDim, kvOut, kvOut}, [3]int64{qs, kvs, kvs},
			[3]int64{r, kvRank, kvRank}, hidden), suffixed(names, ".weight_scale_inv")...)
	}
}

// vocab is VocabParallelEmbedding / ParallelLMHead (layers/vocab_parallel_embedding.py) without
// LoRA: num_embeddings_padded = pad_vocab_size(vocab, 64) (DEFAULT_VOCAB_PADDING_SIZE),
// num_embeddings_per_partition = divide(padded, tp); the shard reads checkpoint rows
// [min(rank*per, vocab), min((rank+1)*per, vocab)) (_get_indices) and weight_loader copies them to
// the top of the parameter and fills the rest with 0.
//
// From the release that pads to lcm(64, TP) (release.lcmVocabPadding) the padding is that multiple
// instead, so the padded vocabulary always divides by TP.
func (b *builder) vocab(names []string, hf string, vocabSize, hidden int64) {
	tp, r := b.p.tp, b.p.tpRank
	pad := int64(64)
	if b.rel.lcmVocabPadding {
		pad = lcm(64, tp)
	}
	padded := CeilDiv(vocabSize, pad) * pad
	per := divide(padded, tp, "padded vocab size")
	start, end := min(r*per, vocabSize), min((r+1)*per, vocabSize)
	e := b.unquantized(hf, vocabSize, hidden)
	b.add(PadRows(NarrowRows(e, start, end-start, hf), per), names...)
}

// attentionScales are the buffers an Attention module registers from the release that keeps them
// in the state dict (release.attentionScales): _init_kv_cache_quant calls
// set_default_quant_scales(layer, register_buffer=True), which registers _k_scale, _v_scale,
// _q_scale and _prob_scale as torch.tensor(1.0, dtype=torch.float32), persistent (the default of
// register_buffer). With the model's dtype and no checkpoint scales they stay 1.0 after loading.
func (b *builder) attentionScales(prefix string) {
	if !b.rel.attentionScales {
		return
	}
	for _, s := range []string{"_k_scale", "_v_scale", "_q_scale", "_prob_scale"} {
		b.add(filledF32(1), prefix+"."+s)
	}
}

// expertNames are the checkpoint names of one expert's gate (w1), up (w3) and down (w2) linears.
type expertNames func(e int64) (gate, up, down string)

// fusedMoE is FusedMoE (fused_moe/layer.py) and its create_weights / weight_loader:
//
//	intermediate_size_per_partition = intermediate_size // moe tp_size (asserted divisible);
//	w13_weight [local, 2*I_pp, H]: per expert [w1 rows tp_rank*I_pp..; w3 rows tp_rank*I_pp..]
//	  (_load_w13: shard_size = expert_data.shape[0] // 2, w1 into the first half, w3 the second);
//	w2_weight [local, H, I_pp]: columns tp_rank*I_pp.. of w2 (_load_w2 narrows dim 1);
//	experts outside this EP rank's block are skipped (expert_map -1).
//
// For block fp8 (Fp8MoEMethod.create_weights): I_pp % block_n must be 0, and I_pp % block_k too when
// the attention tp_size (get_tensor_model_parallel_world_size) is above 1; w13_weight_scale_inv
// [local, 2*ceil(I_pp/bn), ceil(H/bk)] and w2_weight_scale_inv [local, ceil(H/bn), ceil(I_pp/bk)],
// loaded by _load_model_weight_or_group_weight_scale with the same narrows in block units.
// A rank with no local expert holds empty tensors, which _filter_subtensors drops.
func (b *builder) fusedMoE(prefixes []string, numExperts, inter, hidden int64, quant bool, hf expertNames) {
	if inter%b.p.moeTP != 0 {
		panic(
			Refusal(
				fmt.Sprintf(
					"moe intermediate size %d is not divisible by the MoE tensor parallel size %d (TP x DP)",
					inter,
					b.p.moeTP,
				),
			),
		)
	}
	ipp := inter / b.p.moeTP
	r := b.p.moeTPRank
	if quant {
		if ipp%b.bn != 0 {
			panic(
				Refusal(
					fmt.Sprintf(
						"%s: the output_size of gate's and up's weight = %d is not divisible by weight quantization block_n = %d",
						prefixes[0],
						ipp,
						b.bn,
					),
				),
			)
		}
		if b.p.tp > 1 && ipp%b.bk != 0 {
			panic(
				Refusal(
					fmt.Sprintf(
						"%s: the input_size of down's weight = %d is not divisible by weight quantization block_k = %d",
						prefixes[0],
						ipp,
						b.bk,
					),
				),
			)
		}
	}
	var w13, w2, s13, s2 []Tensor
	for _, slot := range b.localSlots(numExperts) {
		gate, up, down := hf(slot % numExperts)
		g := b.linWeight(gate, quant, inter, hidden)
		u := b.linWeight(up, quant, inter, hidden)
		d := b.linWeight(down, quant, hidden, inter)
		w13 = append(w13, CatRows(NarrowRows(g, r*ipp, ipp, gate), NarrowRows(u, r*ipp, ipp, up)))
		w2 = append(w2, NarrowCols(d, r*ipp, ipp, down))
		if quant {
			rows := CeilDiv(ipp, b.bn)
			cols := CeilDiv(ipp, b.bk)
			gs := b.linScale(gate, inter, hidden)
			us := b.linScale(up, inter, hidden)
			ds := b.linScale(down, hidden, inter)
			s13 = append(
				s13,
				CatRows(
					NarrowRows(gs, r*rows, rows, gate+".weight_scale_inv"),
					NarrowRows(us, r*rows, rows, up+".weight_scale_inv"),
				),
			)
			s2 = append(s2, NarrowCols(ds, r*cols, cols, down+".weight_scale_inv"))
		}
	}
	if len(w13) == 0 {
		return // torch.empty((0, ...)): numel 0, dropped by _filter_subtensors
	}
	b.add(Stack(w13), suffixed(prefixes, ".w13_weight")...)
	b.add(Stack(w2), suffixed(prefixes, ".w2_weight")...)
	if quant {
		b.add(Stack(s13), suffixed(prefixes, ".w13_weight_scale_inv")...)
		b.add(Stack(s2), suffixed(prefixes, ".w2_weight_scale_inv")...)
	}
}
