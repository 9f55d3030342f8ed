// Package sglangref is an independent reference of what SGLang's ShardedStateLoader.save_model
// writes for one rank, used only by tests (a conformance helper kept in non-_test files, like
// vllmref, so the server's tests can import it).
//
// It is written from SGLang's own source (sgl-project/sglang), not from the server's layout code,
// and builds every rank tensor naively from the full Hugging Face tensors with vllmref's torch
// operations (narrow, cat, stack, zero padding, dtype copy), the way SGLang's weight loaders narrow
// and copy them. The tiny checkpoints are vllmref's (vllmref.Checkpoint); Variants lists the ones
// this reference models. Each rule names the SGLang file and function and the commit its text was
// read at. The search index holds each file at one commit, not one snapshot of the repository, so
// the files were read at different commits (named beside each rule, and below); no rule could be
// pinned to a release tag.
//
// What SGLang saves (model_loader/loader.py@005cbe0ea796446e420b6aab62ce51a488f5e7c7,
// ShardedStateLoader): save_model writes _filter_subtensors(model.state_dict()) of the worker's
// model to model-rank-{rank}-part-{part}.safetensors, rank = get_tensor_model_parallel_rank(), the
// rank in the --tp-size group (so under DP attention the ranks of every attention-DP group share
// one numbering, and without it every DP replica writes the same files). _filter_subtensors is
// vLLM's: tensors with no element are dropped and of the names that share one tensor the
// lexicographically smallest is kept (tied embeddings save "lm_head.weight"). load_model runs
// process_weights_after_loading on every module before it copies the files in and raises "Missing
// keys" for a parameter they lack, so the files must hold exactly the state dict of a model whose
// post-load processing is the identity: BF16 or F16 weights on CUDA with the default MoE runner
// (quantization/unquant.py@0038b2b5e53cc1b322a6ca86041f6f303adf872b: UnquantizedLinearMethod and
// UnquantizedFusedMoEMethod rewrite weights only on CPU with AMX, under ROCm's aiter, or with the
// flashinfer MoE runners). The model dtype is the config's torch_dtype (bfloat16 or float16;
// vllmref.HFConfig.ModelDType).
//
// The parallel knobs (Parallel):
//   - --tp-size: every linear layer, the embedding and the LM head are split over the TP group
//     (layers/linear.py@0079fcc18b3ee44bfeaaea8a9268c1d50b57b3e1: ColumnParallelLinear narrows the
//     output dimension at tp_rank * shard, RowParallelLinear the input dimension, its bias whole;
//     QKVParallelLinear replicates KV heads when tp >= kv heads and reads k and v at tp_rank //
//     replicas; MergedColumnParallelLinear stacks the rank's slice of gate, then of up).
//   - --dp-size with --enable-dp-attention: the attention TP size is tp / dp and a rank's
//     attention-TP rank tp_rank % (tp / dp)
//     (layers/dp_attention.py@2aa2e2d0ffda0a44ed9a022fdd9d5d042f365eee,
//     compute_dp_attention_world_info: the rank layout is (dp, tp), tp fastest). Qwen3's and
//     Qwen3-MoE's attention (qkv_proj, o_proj) take the attention TP group; their embedding is
//     built with enable_tp = not enable_dp_attention (whole on every rank); the dense MLPs and the
//     LM head keep the full TP group (enable_dp_lm_head is off by default). Llama's modules take
//     the full TP group whatever the flag (models/llama.py@bf7a0e237e8d5b2ce5402f5d2fafce31e012dbdf
//     and @00239548f1cd1a06ca145a5447a86738090a48f1: LlamaAttention reads
//     get_tensor_model_parallel_world_size, LlamaModel's embedding has no enable_tp), so DP
//     attention does not change what a Llama rank holds. Without --enable-dp-attention, --dp-size
//     starts independent replicas and changes nothing either.
//   - --ep-size: the MoE groups split the TP group: MoE TP = tp / ep, a rank's MoE-TP rank tp_rank
//     % (tp / ep) and its EP rank tp_rank // (tp / ep)
//     (distributed/parallel_state.py@0005973a84f7a02787e270b6be5970d3022d07fe,
//     initialize_model_parallel: EP groups are ranks j, j + moe_tp, ...; MoE-TP groups contiguous).
//     FusedMoE (layers/moe/fused_moe_triton/layer.py@008d7d0e947e436a572cf8243674adf264dc8836)
//     holds num_experts // ep experts, EP rank e holding experts [e * local, (e + 1) * local) (it
//     asserts num_experts % ep == 0), each split by MoE TP: w13_weight [local, 2 * I / moe_tp, H]
//     is the rank's slice of gate_proj then of up_proj (_load_w13), w2_weight [local, H, I /
//     moe_tp] the rank's columns of down_proj (_load_w2).
//
// The architectures: LlamaForCausalLM, Qwen3ForCausalLM, Qwen3MoeForCausalLM (rank.go names each
// module's source). Everything else, DeepSeek's MLA among it, is Unmodelled: no reading of
// deepseek_v2.py was done with the confidence the rules above have.
package sglangref
