// Package vllmref is an independent reference of what vLLM's ShardedStateLoader.save_model writes
// for one rank of an engine, used only by tests (it is a conformance helper, like
// s3test or storetest, kept in non-_test files so other test packages can import it).
//
// It is written from vLLM's own source, not from the server's layout code, and it is deliberately
// naive: every rank tensor is built by slicing, concatenating, zero-padding and stacking the bytes
// of the full Hugging Face tensors, row by row, the way vLLM's weight loaders narrow and copy them.
// Each rule carries a comment naming the vLLM file and function it comes from.
//
// RankAt models a release line (Releases): "0.10" is vLLM v0.10.2 as described here; later lines
// are these rules with what release.go lists changed, each change citing the vLLM file it was read
// from (and saying where the release could not be pinned). "0.29" also models the architectures
// the "0.10" line leaves out, GLM-4.x-MoE and gpt-oss (glm4moe_gptoss.go). Its Mixtral, Qwen2-MoE,
// Qwen3-MoE and gpt-oss are read from vllm-project copies of those models from before
// FusedMoEFactory (the index holds none after it), with the arguments they pass carried over to the
// factory (mixtralMoE and qwenMoE in rank.go say why that holds and what confirms it).
//
// Target of "0.10": vLLM v0.10.2, the plain CUDA path (no ROCm weight shuffles, no DeepGEMM E8M0
// requantization, no sequence-parallel MoE, expert placement "linear", no EPLB, no LoRA padding).
// Where the vLLM source this was read from is newer than v0.10.2 and differs, the comment says so
// and the v0.10.2 (older) behaviour is what the code does.
//
// Names follow _filter_subtensors (vllm/model_executor/model_loader/sharded_state_loader.py):
// model.state_dict() lists a parameter under every module path that reaches it, and of the names
// that cover the same memory the lexicographically smallest is kept; empty tensors are dropped.
// So the reference builds each parameter with all its aliases and keeps min(aliases): tied
// embeddings save "lm_head.weight", DeepSeek's shared experts save
// "mlp.experts._shared_experts.*" (SharedFusedMoE also registers them), its correction bias saves
// "mlp.experts.e_score_correction_bias" (FusedMoE also registers it), and the MLA projections
// that MultiHeadLatentAttention re-registers under "self_attn.mla_attn." save under that prefix
// when it sorts first ("mla_attn.o_proj" < "o_proj"; "fused_qkv_a_proj" < "mla_attn...").
package vllmref
