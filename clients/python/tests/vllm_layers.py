"""Tiny models whose weight loaders follow vLLM's, written for the tests from vLLM's sources
(model_executor/layers/linear.py, vocab_parallel_embedding.py, fused_moe/layer.py,
model_loader/weight_utils.py, models/llama.py, mixtral.py, qwen2_moe.py, deepseek_v2.py; the loader API of
v0.10 to the current main branch). Each layer is built for one rank (tp_size, tp_rank; with
expert parallelism the experts go whole over the TP ranks, linearly, and the MoE's own TP is 1),
and its parameters carry their weight_loader as vLLM's do. Nothing here knows about shardsrv."""

import math

import torch
from torch import nn

FP8 = getattr(torch, "float8_e4m3fn", torch.uint8)  # torch 1.13 has no FP8: its bit patterns then


class Rank:
    def __init__(self, tp_size=1, tp_rank=0, ep=False):
        self.tp_size, self.tp_rank, self.ep = tp_size, tp_rank, ep


DEVICE = None  # where parameters are made: the default device, or "meta" for a model without memory


def _param(shape, dtype, loader, **attrs):
    # vLLM's parameters start as torch.empty; a fixed pattern makes two loads comparable byte for byte.
    p = nn.Parameter(torch.full(shape, 3, dtype=torch.float32, device=DEVICE).to(dtype) if dtype != torch.uint8
                     else torch.full(shape, 3, dtype=dtype, device=DEVICE), requires_grad=False)
    p.weight_loader = loader
    for k, v in attrs.items():
        setattr(p, k, v)
    return p


def default_weight_loader(param, loaded_weight):
    """weight_utils.default_weight_loader."""
    if param.numel() == 1 and loaded_weight.numel() == 1:
        param.data.fill_(loaded_weight.item())
    else:
        assert param.size() == loaded_weight.size(), f"{param.size()} != {loaded_weight.size()}"
        param.data.copy_(loaded_weight)


class Replicated(nn.Module):
    """ReplicatedLinear and norms: the whole tensor."""

    def __init__(self, shape, dtype=torch.bfloat16):
        super().__init__()
        self.weight = _param(shape, dtype, default_weight_loader)


class ColumnParallel(nn.Module):
    """ColumnParallelLinear: output rows split over TP (weight_loader narrows output_dim). A block
    FP8 weight has a weight_scale_inv split the same way in blocks of block[0] rows."""

    def __init__(self, rank, out_features, in_features, bias=False, dtype=torch.bfloat16, block=None):
        super().__init__()
        self.rank = rank
        per = out_features // rank.tp_size
        self.weight = _param([per, in_features], FP8 if block else dtype, self.weight_loader, output_dim=0)
        if bias:
            self.bias = _param([per], dtype, self.weight_loader, output_dim=0)
        if block:
            self.weight_scale_inv = _param([math.ceil(per / block[0]), math.ceil(in_features / block[1])],
                                           torch.float32, self.weight_loader, output_dim=0)

    def weight_loader(self, param, loaded_weight):
        output_dim = getattr(param, "output_dim", None)
        param_data = param.data
        if output_dim is not None:
            shard_size = param_data.shape[output_dim]
            start_idx = self.rank.tp_rank * shard_size
            loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        if len(loaded_weight.shape) == 0:
            loaded_weight = loaded_weight.reshape(1)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class RowParallel(nn.Module):
    """RowParallelLinear: input columns split over TP; the bias whole."""

    def __init__(self, rank, out_features, in_features, bias=False, dtype=torch.bfloat16, block=None):
        super().__init__()
        self.rank = rank
        per = in_features // rank.tp_size
        self.weight = _param([out_features, per], FP8 if block else dtype, self.weight_loader, input_dim=1)
        if bias:
            self.bias = _param([out_features], dtype, self.weight_loader)
        if block:
            self.weight_scale_inv = _param([math.ceil(out_features / block[0]), math.ceil(per / block[1])],
                                           torch.float32, self.weight_loader, input_dim=1)

    def weight_loader(self, param, loaded_weight):
        input_dim = getattr(param, "input_dim", None)
        param_data = param.data
        if input_dim is not None:
            shard_size = param_data.shape[input_dim]
            loaded_weight = loaded_weight.narrow(input_dim, self.rank.tp_rank * shard_size, shard_size)
        if len(loaded_weight.shape) == 0:
            loaded_weight = loaded_weight.reshape(1)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class MergedColumnParallel(ColumnParallel):
    """MergedColumnParallelLinear (gate_up_proj): each part split over TP and placed at its
    offset; a block-FP8 scale's offsets are in blocks, rounded up. disable_tp (MLA's
    fused_qkv_a_proj, a MergedReplicatedLinear in later releases) loads every part whole."""

    def __init__(self, rank, output_sizes, in_features, dtype=torch.bfloat16, block=None, disable_tp=False):
        rank = Rank(1, 0) if disable_tp else rank
        super().__init__(rank, sum(output_sizes), in_features, dtype=dtype, block=block)
        self.output_sizes, self.block = output_sizes, block

    def weight_loader(self, param, loaded_weight, loaded_shard_id=None):
        if loaded_shard_id is None:
            return super().weight_loader(param, loaded_weight)
        output_dim, tp = param.output_dim, self.rank.tp_size
        shard_offset = sum(self.output_sizes[:loaded_shard_id]) // tp
        shard_size = self.output_sizes[loaded_shard_id] // tp
        if self.block and param.dtype == torch.float32:  # BlockQuantScaleParameter
            block_n = self.block[0]
            shard_offset = (shard_offset + block_n - 1) // block_n
            shard_size = (shard_size + block_n - 1) // block_n
        param_data = param.data.narrow(output_dim, shard_offset, shard_size)
        start_idx = self.rank.tp_rank * shard_size
        loaded_weight = loaded_weight.narrow(output_dim, start_idx, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


class QKVParallel(ColumnParallel):
    """QKVParallelLinear: [q_r; k_r; v_r]; when TP exceeds the KV heads, each KV head is
    replicated over tp / kv ranks (shard id tp_rank // num_kv_head_replicas)."""

    def __init__(self, rank, hidden, head_size, total_heads, total_kv_heads, bias=False, dtype=torch.bfloat16):
        tp = rank.tp_size
        self.head_size = head_size
        self.num_heads = total_heads // tp
        if tp >= total_kv_heads:
            self.num_kv_heads, self.num_kv_head_replicas = 1, tp // total_kv_heads
        else:
            self.num_kv_heads, self.num_kv_head_replicas = total_kv_heads // tp, 1
        out = (self.num_heads + 2 * self.num_kv_heads) * tp * head_size
        super().__init__(rank, out, hidden, bias=bias, dtype=dtype)

    def weight_loader(self, param, loaded_weight, loaded_shard_id=None):
        if loaded_shard_id is None:
            return super().weight_loader(param, loaded_weight)
        h, q, kv = self.head_size, self.num_heads, self.num_kv_heads
        shard_offset, shard_size = {"q": (0, q * h), "k": (q * h, kv * h), "v": ((q + kv) * h, kv * h)}[loaded_shard_id]
        param_data = param.data.narrow(param.output_dim, shard_offset, shard_size)
        shard_id = self.rank.tp_rank if loaded_shard_id == "q" else self.rank.tp_rank // self.num_kv_head_replicas
        loaded_weight = loaded_weight.narrow(param.output_dim, shard_id * shard_size, shard_size)
        assert param_data.shape == loaded_weight.shape
        param_data.copy_(loaded_weight)


def pad_vocab_size(vocab_size, pad_to=64):
    return ((vocab_size + pad_to - 1) // pad_to) * pad_to


class VocabParallelEmbedding(nn.Module):
    """VocabParallelEmbedding / ParallelLMHead: the vocabulary padded to a multiple of 64, split
    over TP; the rank's rows past the real vocabulary are zeroed by the loader."""

    def __init__(self, rank, vocab_size, dim, dtype=torch.bfloat16):
        super().__init__()
        self.rank = rank
        padded = pad_vocab_size(vocab_size)
        per = padded // rank.tp_size
        self.vocab_start = min(rank.tp_rank * per, vocab_size)
        self.vocab_end = min(self.vocab_start + per, vocab_size)
        self.weight = _param([per, dim], dtype, self.weight_loader, output_dim=0)

    def weight_loader(self, param, loaded_weight):
        start_idx, shard_size = self.vocab_start, self.vocab_end - self.vocab_start
        loaded_weight = loaded_weight.narrow(param.output_dim, start_idx, shard_size)
        param[:loaded_weight.shape[0]].data.copy_(loaded_weight)
        param[loaded_weight.shape[0]:].data.fill_(0)


def determine_expert_map(ep_size, ep_rank, global_num_experts):
    """fused_moe/layer.py's determine_expert_map, linear placement."""
    if ep_size == 1:
        return global_num_experts, None
    base, remainder = divmod(global_num_experts, ep_size)
    local = base + 1 if ep_rank < remainder else base
    expert_map = torch.full((global_num_experts,), -1, dtype=torch.int32)
    start = ep_rank * base + min(ep_rank, remainder)
    expert_map[start:start + local] = torch.arange(0, local, dtype=torch.int32)
    return local, expert_map


class FusedMoE(nn.Module):
    """FusedMoE: w13_weight [E_local, 2·I/tp, H] (each expert [w1_r; w3_r]) and w2_weight
    [E_local, H, I/tp]. With expert parallelism the MoE's TP is 1 and the experts go over the TP
    ranks (expert_map). Block-FP8 scales (w13_weight_scale_inv, w2_weight_scale_inv) load through
    the same functions in block units."""

    def __init__(self, rank, num_experts, hidden, inter, dtype=torch.bfloat16, block=None):
        super().__init__()
        if rank.ep:
            self.tp_size, self.tp_rank = 1, 0
            self.local, self.expert_map = determine_expert_map(rank.tp_size, rank.tp_rank, num_experts)
        else:
            self.tp_size, self.tp_rank = rank.tp_size, rank.tp_rank
            self.local, self.expert_map = num_experts, None
        per = inter // self.tp_size
        wdtype = FP8 if block else dtype
        self.w13_weight = _param([self.local, 2 * per, hidden], wdtype, self.weight_loader)
        self.w2_weight = _param([self.local, hidden, per], wdtype, self.weight_loader)
        if block:
            b0, b1 = block
            self.w13_weight_scale_inv = _param([self.local, 2 * math.ceil(per / b0), math.ceil(hidden / b1)],
                                               torch.float32, self.weight_loader)
            self.w2_weight_scale_inv = _param([self.local, math.ceil(hidden / b0), math.ceil(per / b1)],
                                              torch.float32, self.weight_loader)

    def weight_loader(self, param, loaded_weight, weight_name, shard_id, expert_id):
        if self.expert_map is not None:
            expert_id = int(self.expert_map[expert_id])
            if expert_id == -1:
                return
        expert_data = param.data[expert_id]
        if shard_id == "w2":
            shard_dim = 1
            shard_size = expert_data.shape[shard_dim]
            loaded_weight = loaded_weight.narrow(shard_dim, shard_size * self.tp_rank, shard_size)
            expert_data.copy_(loaded_weight)
            return
        shard_dim = 0
        shard_size = expert_data.shape[shard_dim] // 2
        loaded_weight = loaded_weight.narrow(shard_dim, shard_size * self.tp_rank, shard_size)
        if shard_id == "w1":
            expert_data = expert_data.narrow(shard_dim, 0, shard_size)
        else:
            expert_data = expert_data.narrow(shard_dim, shard_size, shard_size)
        expert_data.copy_(loaded_weight)

    @staticmethod
    def make_expert_params_mapping(prefix, w1, w2, w3, num_experts):
        """(param prefix, checkpoint name part, expert, shard id), as FusedMoE's does."""
        return [("experts.w13_" if sid in ("w1", "w3") else "experts.w2_", f"experts.{e}.{name}.", e, sid)
                for e in range(num_experts) for sid, name in (("w1", w1), ("w2", w2), ("w3", w3))]


class Config:
    vocab = 1100          # not a multiple of 64 · TP
    hidden = 64
    heads = 8
    kv_heads = 2          # replicated at TP 4 and 8
    head_dim = 8
    inter = 64
    experts = 6           # 4 and 8 EP ranks do not divide it
    layers = 2
    block = [8, 8]        # block FP8
    q_lora, kv_lora, rope = 16, 16, 8


# arch: (MoE layers, dense MLP: in layer 0 or "all", the extra loaders, block FP8 in layer 0,
# q/k/v biases (Qwen2), per-head q_norm and k_norm (Qwen3))
ARCHS = {"everything": (True, True, True, True, True, False), "llama": (False, "all", False, False, False, False),
         "qwen2": (False, "all", False, False, True, False), "qwen3": (False, "all", False, False, False, True),
         "mixtral": (True, False, False, False, False, False), "qwen3_moe": (True, False, False, False, False, True)}
# Where an architecture's MoE lives and its checkpoint's names for an expert's gate, down and up.
MOE_NAMES = {"qwen3_moe": ("mlp", "gate_proj", "down_proj", "up_proj")}
MIXTRAL_MOE_NAMES = ("block_sparse_moe", "w1", "w2", "w3")


class TinyModel(nn.Module):
    """A decoder with Llama/Mixtral's vLLM names (model.embed_tokens, layers.N.self_attn.qkv_proj,
    o_proj, block_sparse_moe.gate and experts, model.norm, lm_head), and on top the loaders the
    equivalence tests need besides ("everything"): layer 0's dense MLP and experts in block FP8,
    MLA's fused q_a + kv_a, a transposing loader, two casting loaders, one that computes on
    values and one that writes column ranges. "llama", "qwen2", "qwen3", "mixtral" and "qwen3_moe"
    (every layer sparse) are those architectures' vLLM models alone."""

    def __init__(self, rank, arch="everything", tie=False, cfg=Config):
        super().__init__()
        self.cfg, self.rank, self.tie = cfg, rank, tie
        moe, dense_mlp, extras, fp8, qkv_bias, qk_norm = ARCHS[arch]
        self.moe_names = MOE_NAMES.get(arch, MIXTRAL_MOE_NAMES)
        c = cfg
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(rank, c.vocab, c.hidden)
        self.model.layers = nn.ModuleList()
        for i in range(c.layers):
            layer = nn.Module()
            layer.input_layernorm = Replicated([c.hidden])
            layer.post_attention_layernorm = Replicated([c.hidden])
            layer.self_attn = nn.Module()
            layer.self_attn.qkv_proj = QKVParallel(rank, c.hidden, c.head_dim, c.heads, c.kv_heads, bias=qkv_bias)
            if qk_norm:
                layer.self_attn.q_norm = Replicated([c.head_dim])
                layer.self_attn.k_norm = Replicated([c.head_dim])
            layer.self_attn.o_proj = RowParallel(rank, c.hidden, c.heads * c.head_dim)
            if moe:
                sparse = nn.Module()
                setattr(layer, self.moe_names[0], sparse)
                sparse.gate = Replicated([c.experts, c.hidden])
                block = c.block if (fp8 and i == 0) else None
                sparse.experts = FusedMoE(rank, c.experts, c.hidden, c.inter, block=block)
            if dense_mlp == "all" or dense_mlp and i == 0:
                block = c.block if fp8 else None
                layer.mlp = nn.Module()
                layer.mlp.gate_up_proj = MergedColumnParallel(rank, [c.inter, c.inter], c.hidden, block=block)
                layer.mlp.down_proj = RowParallel(rank, c.hidden, c.inter, block=block)
            self.model.layers.append(layer)
        self.model.norm = Replicated([c.hidden])
        self.lm_head = self.model.embed_tokens if tie else VocabParallelEmbedding(rank, c.vocab, c.hidden)
        if extras:
            self.mla = nn.Module()
            self.mla.fused_qkv_a_proj = MergedColumnParallel(rank, [c.q_lora, c.kv_lora + c.rope], c.hidden,
                                                             disable_tp=True)
            self.mla.kv_b_proj = ColumnParallel(rank, c.heads * 2 * c.head_dim, c.kv_lora)
            self.transposed = ColumnParallel(rank, c.inter, c.hidden)
            self.transposed.weight.weight_loader = self.transposed_loader
            self.cast = Replicated([c.experts], torch.float32)
            self.cast.weight.weight_loader = self.cast_loader
            self.double_cast = Replicated([c.hidden], torch.float32)
            self.double_cast.weight.weight_loader = self.double_cast_loader
            self.ssm = nn.Module()
            self.ssm.A = _param([c.heads], torch.float32, self.value_loader)
            self.cols = nn.Module()
            self.cols.weight = _param([c.hidden, 2 * c.inter // rank.tp_size], torch.bfloat16, self.columns_loader)

    def transposed_loader(self, param, loaded_weight):
        """A checkpoint stored [in, out], as some are (gpt-oss's experts, Conv1D layers)."""
        loaded_weight = loaded_weight.t()
        shard = param.shape[0]
        param.data.copy_(loaded_weight.narrow(0, self.rank.tp_rank * shard, shard))

    def cast_loader(self, param, loaded_weight):
        """deepseek_v2's e_score_correction_bias goes to an F32 parameter."""
        param.data.copy_(loaded_weight.to(torch.float32))

    def double_cast_loader(self, param, loaded_weight):
        """Rounded to F16 on the way into an F32 parameter (not the same as a plain copy)."""
        param.data.copy_(loaded_weight.half())

    def columns_loader(self, param, loaded_weight, shard_id):
        """Gate and up side by side along the last dimension, as the MoE methods that keep w13 as
        [E, H, 2·I] place them (shard_dim 2): the rank's columns of each, into a column range
        of the parameter — a box that is not one run of its memory."""
        shard = param.shape[1] // 2
        param.data.narrow(1, shard_id * shard, shard).copy_(loaded_weight.narrow(1, self.rank.tp_rank * shard, shard))

    def value_loader(self, param, loaded_weight):
        """Mamba's A = -exp(A_log): computed on values, which no block describes."""
        param.data.copy_(-torch.exp(loaded_weight.float()))

    def load_weights(self, weights):
        """The shape of vLLM's LlamaForCausalLM / MixtralModel / DeepseekV2Model.load_weights."""
        stacked = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
                   ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1),
                   ("fused_qkv_a_proj", "q_a_proj", 0), ("fused_qkv_a_proj", "kv_a_proj_with_mqa", 1),
                   ("cols.weight", "cols.gate", 0), ("cols.weight", "cols.up", 1)]
        expert_mapping = FusedMoE.make_expert_params_mapping("", *self.moe_names[1:], self.cfg.experts)
        params = dict(self.named_parameters())
        renames = {"transposed.weight_t": "transposed.weight", "ssm.A_log": "ssm.A"}
        loaded = set()
        for name, loaded_weight in weights:
            if self.tie and name == "lm_head.weight":
                continue
            name = renames.get(name, name)
            for param_name, weight_name, shard_id in stacked:
                if weight_name not in name or "experts" in name:
                    continue
                name = name.replace(weight_name, param_name)
                param = params[name]
                param.weight_loader(param, loaded_weight, shard_id)
                break
            else:
                for param_name, weight_name, expert_id, shard_id in expert_mapping:
                    if weight_name not in name:
                        continue
                    name = name.replace(weight_name, param_name)
                    param = params[name]
                    param.weight_loader(param, loaded_weight, name, shard_id=shard_id, expert_id=expert_id)
                    break
                else:
                    param = params[name]
                    getattr(param, "weight_loader", default_weight_loader)(param, loaded_weight)
            loaded.add(name)
        return loaded


def checkpoint_shapes(arch="everything", tie=False, cfg=Config):
    """The Hugging Face tensors of TinyModel's checkpoint: {name: (shape, dtype)}."""
    moe, dense_mlp, extras, fp8_moe, qkv_bias, qk_norm = ARCHS[arch]
    where, gate, down, up = MOE_NAMES.get(arch, MIXTRAL_MOE_NAMES)
    c = cfg
    b0, b1 = c.block
    out = {"model.embed_tokens.weight": ([c.vocab, c.hidden], torch.bfloat16),
           "model.norm.weight": ([c.hidden], torch.bfloat16)}
    if not tie:
        out["lm_head.weight"] = ([c.vocab, c.hidden], torch.bfloat16)
    for i in range(c.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ([c.hidden], torch.bfloat16)
        out[p + "post_attention_layernorm.weight"] = ([c.hidden], torch.bfloat16)
        out[p + "self_attn.q_proj.weight"] = ([c.heads * c.head_dim, c.hidden], torch.bfloat16)
        out[p + "self_attn.k_proj.weight"] = ([c.kv_heads * c.head_dim, c.hidden], torch.bfloat16)
        out[p + "self_attn.v_proj.weight"] = ([c.kv_heads * c.head_dim, c.hidden], torch.bfloat16)
        out[p + "self_attn.o_proj.weight"] = ([c.hidden, c.heads * c.head_dim], torch.bfloat16)
        if qkv_bias:
            out[p + "self_attn.q_proj.bias"] = ([c.heads * c.head_dim], torch.bfloat16)
            out[p + "self_attn.k_proj.bias"] = ([c.kv_heads * c.head_dim], torch.bfloat16)
            out[p + "self_attn.v_proj.bias"] = ([c.kv_heads * c.head_dim], torch.bfloat16)
        if qk_norm:
            out[p + "self_attn.q_norm.weight"] = ([c.head_dim], torch.bfloat16)
            out[p + "self_attn.k_norm.weight"] = ([c.head_dim], torch.bfloat16)
        fp8 = fp8_moe and i == 0
        if moe:
            out[f"{p}{where}.gate.weight"] = ([c.experts, c.hidden], torch.bfloat16)
        for e in range(c.experts if moe else 0):
            ex = f"{p}{where}.experts.{e}."
            for w, shape in ((gate, [c.inter, c.hidden]), (up, [c.inter, c.hidden]), (down, [c.hidden, c.inter])):
                out[ex + w + ".weight"] = (shape, FP8 if fp8 else torch.bfloat16)
                if fp8:
                    out[ex + w + ".weight_scale_inv"] = ([math.ceil(shape[0] / b0), math.ceil(shape[1] / b1)],
                                                        torch.float32)
        if dense_mlp == "all" or dense_mlp and i == 0:
            for w, shape in (("gate_proj", [c.inter, c.hidden]), ("up_proj", [c.inter, c.hidden]),
                             ("down_proj", [c.hidden, c.inter])):
                out[f"{p}mlp.{w}.weight"] = (shape, FP8 if fp8_moe else torch.bfloat16)
                if fp8_moe:
                    out[f"{p}mlp.{w}.weight_scale_inv"] = ([math.ceil(shape[0] / b0), math.ceil(shape[1] / b1)],
                                                          torch.float32)
    if extras:
        out["mla.q_a_proj.weight"] = ([c.q_lora, c.hidden], torch.bfloat16)
        out["mla.kv_a_proj_with_mqa.weight"] = ([c.kv_lora + c.rope, c.hidden], torch.bfloat16)
        out["mla.kv_b_proj.weight"] = ([c.heads * 2 * c.head_dim, c.kv_lora], torch.bfloat16)
        out["transposed.weight_t"] = ([c.hidden, c.inter], torch.bfloat16)
        out["cast.weight"] = ([c.experts], torch.bfloat16)
        out["double_cast.weight"] = ([c.hidden], torch.float32)
        out["ssm.A_log"] = ([c.heads], torch.float32)
        out["cols.gate"] = ([c.hidden, c.inter], torch.bfloat16)
        out["cols.up"] = ([c.hidden, c.inter], torch.bfloat16)
    return out


class DeepseekConfig:
    """DeepSeek-V3's config.json fields the model reads, tiny by default."""
    vocab, hidden, layers, first_k_dense = 1100, 64, 2, 1
    inter, moe_inter, experts, n_shared = 96, 16, 6, 1
    heads, q_lora, kv_lora, rope, nope, v_head = 8, 32, 32, 4, 16, 16
    block = None  # [b0, b1] for block FP8

    @classmethod
    def hf(cls):
        """config.json."""
        cfg = {"architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3", "hidden_size": cls.hidden,
               "intermediate_size": cls.inter, "moe_intermediate_size": cls.moe_inter,
               "num_attention_heads": cls.heads, "num_key_value_heads": cls.heads, "num_hidden_layers": cls.layers,
               "vocab_size": cls.vocab, "q_lora_rank": cls.q_lora, "kv_lora_rank": cls.kv_lora,
               "qk_nope_head_dim": cls.nope, "qk_rope_head_dim": cls.rope, "v_head_dim": cls.v_head,
               "n_routed_experts": cls.experts, "n_shared_experts": cls.n_shared, "num_experts_per_tok": 2,
               "first_k_dense_replace": cls.first_k_dense, "moe_layer_freq": 1, "n_group": 1, "topk_group": 1,
               "topk_method": "noaux_tc", "scoring_func": "sigmoid", "tie_word_embeddings": False,
               "torch_dtype": "bfloat16"}
        if cls.block:
            cfg["quantization_config"] = {"quant_method": "fp8", "weight_block_size": cls.block}
        return cfg


class DeepseekMLP(nn.Module):
    def __init__(self, rank, c, inter):
        super().__init__()
        self.gate_up_proj = MergedColumnParallel(rank, [inter, inter], c.hidden, block=c.block)
        self.down_proj = RowParallel(rank, c.hidden, inter, block=c.block)


class DeepseekV3(nn.Module):
    """DeepseekV3ForCausalLM's parameters as vLLM's deepseek_v2.py builds them for a rank (MLA with
    fused_qkv_a_proj when q_lora_rank is set, else q_proj and a replicated kv_a_proj_with_mqa;
    dense first layers; DeepseekV2MoE: gate with its F32 e_score_correction_bias, FusedMoE
    experts, TP-split shared experts), named as named_parameters() gives them, and its
    load_weights' loop: stacked parameters, then experts, then the rest."""

    def __init__(self, rank, c=DeepseekConfig):
        super().__init__()
        self.c = c
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(rank, c.vocab, c.hidden)
        self.model.layers = nn.ModuleList()
        for i in range(c.layers):
            layer = nn.Module()
            layer.input_layernorm = Replicated([c.hidden])
            layer.post_attention_layernorm = Replicated([c.hidden])
            a = layer.self_attn = nn.Module()
            if c.q_lora:
                a.fused_qkv_a_proj = MergedColumnParallel(rank, [c.q_lora, c.kv_lora + c.rope], c.hidden,
                                                          block=c.block, disable_tp=True)
                a.q_a_layernorm = Replicated([c.q_lora])
                a.q_b_proj = ColumnParallel(rank, c.heads * (c.nope + c.rope), c.q_lora, block=c.block)
            else:
                a.q_proj = ColumnParallel(rank, c.heads * (c.nope + c.rope), c.hidden, block=c.block)
                a.kv_a_proj_with_mqa = ColumnParallel(Rank(1, 0), c.kv_lora + c.rope, c.hidden, block=c.block)
            a.kv_a_layernorm = Replicated([c.kv_lora])
            a.kv_b_proj = ColumnParallel(rank, c.heads * (c.nope + c.v_head), c.kv_lora, block=c.block)
            a.o_proj = RowParallel(rank, c.hidden, c.heads * c.v_head, block=c.block)
            if i < c.first_k_dense:
                layer.mlp = DeepseekMLP(rank, c, c.inter)
            else:
                layer.mlp = nn.Module()
                layer.mlp.gate = Replicated([c.experts, c.hidden])
                layer.mlp.gate.e_score_correction_bias = _param([c.experts], torch.float32, default_weight_loader)
                layer.mlp.experts = FusedMoE(rank, c.experts, c.hidden, c.moe_inter, block=c.block)
                layer.mlp.shared_experts = DeepseekMLP(rank, c, c.moe_inter * c.n_shared)
            self.model.layers.append(layer)
        self.model.norm = Replicated([c.hidden])
        self.lm_head = VocabParallelEmbedding(rank, c.vocab, c.hidden)

    def load_weights(self, weights):
        stacked = [("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]
        if self.c.q_lora:
            stacked += [("fused_qkv_a_proj", "q_a_proj", 0), ("fused_qkv_a_proj", "kv_a_proj_with_mqa", 1)]
        experts = FusedMoE.make_expert_params_mapping("", "gate_proj", "down_proj", "up_proj", self.c.experts)
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            for param_name, weight_name, shard_id in stacked:
                if weight_name not in name:
                    continue
                if "mlp.experts." in name and name not in params:
                    continue
                name = name.replace(weight_name, param_name)
                params[name].weight_loader(params[name], w, shard_id)
                break
            else:
                for param_name, weight_name, expert_id, shard_id in experts:
                    if weight_name not in name:
                        continue
                    name = name.replace(weight_name, param_name)
                    params[name].weight_loader(params[name], w, name, shard_id=shard_id, expert_id=expert_id)
                    break
                else:
                    p = params[name]
                    getattr(p, "weight_loader", default_weight_loader)(p, w)
            loaded.add(name)
        return loaded


def deepseek_checkpoint(c=DeepseekConfig):
    """DeepSeek-V3's Hugging Face tensors: {name: (shape, dtype)}."""
    out = {}

    def add(name, shape, dtype=torch.bfloat16):
        out[name] = (shape, dtype)

    def linear(name, shape):
        if c.block:
            add(name + ".weight", shape, FP8)
            add(name + ".weight_scale_inv", [math.ceil(shape[0] / c.block[0]), math.ceil(shape[1] / c.block[1])],
                torch.float32)
        else:
            add(name + ".weight", shape)

    def mlp(p, inter):
        for w, shape in (("gate_proj", [inter, c.hidden]), ("up_proj", [inter, c.hidden]),
                         ("down_proj", [c.hidden, inter])):
            linear(p + w, shape)

    add("model.embed_tokens.weight", [c.vocab, c.hidden])
    for i in range(c.layers):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", [c.hidden])
        add(p + "post_attention_layernorm.weight", [c.hidden])
        if c.q_lora:
            linear(p + "self_attn.q_a_proj", [c.q_lora, c.hidden])
            add(p + "self_attn.q_a_layernorm.weight", [c.q_lora])
            linear(p + "self_attn.q_b_proj", [c.heads * (c.nope + c.rope), c.q_lora])
        else:
            linear(p + "self_attn.q_proj", [c.heads * (c.nope + c.rope), c.hidden])
        linear(p + "self_attn.kv_a_proj_with_mqa", [c.kv_lora + c.rope, c.hidden])
        add(p + "self_attn.kv_a_layernorm.weight", [c.kv_lora])
        linear(p + "self_attn.kv_b_proj", [c.heads * (c.nope + c.v_head), c.kv_lora])
        linear(p + "self_attn.o_proj", [c.hidden, c.heads * c.v_head])
        if i < c.first_k_dense:
            mlp(p + "mlp.", c.inter)
            continue
        add(p + "mlp.gate.weight", [c.experts, c.hidden])
        add(p + "mlp.gate.e_score_correction_bias", [c.experts], torch.float32)
        for e in range(c.experts):
            mlp(f"{p}mlp.experts.{e}.", c.moe_inter)
        mlp(p + "mlp.shared_experts.", c.moe_inter * c.n_shared)
    add("model.norm.weight", [c.hidden])
    add("lm_head.weight", [c.vocab, c.hidden])
    return out


class Qwen2MoeConfig:
    """Qwen2-MoE's config.json fields the model reads, tiny: decoder_sparse_step 2 with layer 3 in
    mlp_only_layers leaves layer 1 the only sparse one; 8 experts so that TP 8 is allowed
    (Qwen2MoeSparseMoeBlock raises when tp_size > num_experts)."""
    vocab, hidden, heads, kv_heads, layers = 1100, 64, 8, 2, 4
    inter, moe_inter, shared_inter, experts = 64, 32, 48, 8
    decoder_sparse_step, mlp_only_layers = 2, [3]

    @classmethod
    def hf(cls):
        return {"architectures": ["Qwen2MoeForCausalLM"], "model_type": "qwen2_moe", "hidden_size": cls.hidden,
                "num_attention_heads": cls.heads, "num_key_value_heads": cls.kv_heads,
                "num_hidden_layers": cls.layers, "vocab_size": cls.vocab, "intermediate_size": cls.inter,
                "moe_intermediate_size": cls.moe_inter, "shared_expert_intermediate_size": cls.shared_inter,
                "num_experts": cls.experts, "num_experts_per_tok": 2, "decoder_sparse_step": cls.decoder_sparse_step,
                "mlp_only_layers": cls.mlp_only_layers, "norm_topk_prob": False, "tie_word_embeddings": False,
                "rms_norm_eps": 1e-6, "torch_dtype": "bfloat16"}

    @classmethod
    def sparse(cls, i):
        """Qwen2MoeDecoderLayer's rule for a sparse block."""
        return i not in cls.mlp_only_layers and cls.experts > 0 and (i + 1) % cls.decoder_sparse_step == 0


class Qwen2MoeMLP(nn.Module):
    def __init__(self, rank, hidden, inter):
        super().__init__()
        self.gate_up_proj = MergedColumnParallel(rank, [inter, inter], hidden)
        self.down_proj = RowParallel(rank, hidden, inter)


class Qwen2Moe(nn.Module):
    """Qwen2MoeForCausalLM as vLLM's qwen2_moe.py builds it for a rank: Qwen2MoeAttention (head_dim
    hidden // heads, q/k/v biases), a sparse block (gate, FusedMoE experts, a TP-split
    shared_expert, a whole shared_expert_gate loaded by default_weight_loader) or a dense
    Qwen2MoeMLP per Qwen2MoeConfig.sparse, and Qwen2MoeModel.load_weights' loop."""

    def __init__(self, rank, c=Qwen2MoeConfig):
        super().__init__()
        self.c = c
        head_dim = c.hidden // c.heads
        self.model = nn.Module()
        self.model.embed_tokens = VocabParallelEmbedding(rank, c.vocab, c.hidden)
        self.model.layers = nn.ModuleList()
        for i in range(c.layers):
            layer = nn.Module()
            layer.input_layernorm = Replicated([c.hidden])
            layer.post_attention_layernorm = Replicated([c.hidden])
            layer.self_attn = nn.Module()
            layer.self_attn.qkv_proj = QKVParallel(rank, c.hidden, head_dim, c.heads, c.kv_heads, bias=True)
            layer.self_attn.o_proj = RowParallel(rank, c.hidden, c.heads * head_dim)
            if c.sparse(i):
                layer.mlp = nn.Module()
                layer.mlp.gate = Replicated([c.experts, c.hidden])
                layer.mlp.shared_expert_gate = nn.Module()
                layer.mlp.shared_expert_gate.weight = nn.Parameter(torch.full([1, c.hidden], 3.0).bfloat16(),
                                                                   requires_grad=False)  # torch.nn.Linear
                layer.mlp.shared_expert = Qwen2MoeMLP(rank, c.hidden, c.shared_inter)
                layer.mlp.experts = FusedMoE(rank, c.experts, c.hidden, c.moe_inter)
            else:
                layer.mlp = Qwen2MoeMLP(rank, c.hidden, c.inter)
            self.model.layers.append(layer)
        self.model.norm = Replicated([c.hidden])
        self.lm_head = VocabParallelEmbedding(rank, c.vocab, c.hidden)

    def load_weights(self, weights):
        stacked = [("qkv_proj", "q_proj", "q"), ("qkv_proj", "k_proj", "k"), ("qkv_proj", "v_proj", "v"),
                   ("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1)]
        experts = FusedMoE.make_expert_params_mapping("", "gate_proj", "down_proj", "up_proj", self.c.experts)
        params = dict(self.named_parameters())
        loaded = set()
        for name, w in weights:
            for param_name, weight_name, shard_id in stacked:
                if weight_name not in name or "mlp.experts" in name:
                    continue
                name = name.replace(weight_name, param_name)
                params[name].weight_loader(params[name], w, shard_id)
                break
            else:
                for param_name, weight_name, expert_id, shard_id in experts:
                    if weight_name not in name:
                        continue
                    name = name.replace(weight_name, param_name)
                    params[name].weight_loader(params[name], w, name, shard_id=shard_id, expert_id=expert_id)
                    break
                else:
                    p = params[name]
                    getattr(p, "weight_loader", default_weight_loader)(p, w)
            loaded.add(name)
        return loaded


def qwen2_moe_checkpoint(c=Qwen2MoeConfig):
    """Qwen2-MoE's Hugging Face tensors: {name: (shape, dtype)}."""
    bf = torch.bfloat16
    head_dim = c.hidden // c.heads
    out = {"model.embed_tokens.weight": ([c.vocab, c.hidden], bf)}

    def mlp(p, inter):
        for w, shape in (("gate_proj", [inter, c.hidden]), ("up_proj", [inter, c.hidden]),
                         ("down_proj", [c.hidden, inter])):
            out[p + w + ".weight"] = (shape, bf)

    for i in range(c.layers):
        p = f"model.layers.{i}."
        out[p + "input_layernorm.weight"] = ([c.hidden], bf)
        out[p + "post_attention_layernorm.weight"] = ([c.hidden], bf)
        for w, n in (("q_proj", c.heads), ("k_proj", c.kv_heads), ("v_proj", c.kv_heads)):
            out[f"{p}self_attn.{w}.weight"] = ([n * head_dim, c.hidden], bf)
            out[f"{p}self_attn.{w}.bias"] = ([n * head_dim], bf)
        out[p + "self_attn.o_proj.weight"] = ([c.hidden, c.heads * head_dim], bf)
        if not c.sparse(i):
            mlp(p + "mlp.", c.inter)
            continue
        out[p + "mlp.gate.weight"] = ([c.experts, c.hidden], bf)
        out[p + "mlp.shared_expert_gate.weight"] = ([1, c.hidden], bf)
        mlp(p + "mlp.shared_expert.", c.shared_inter)
        for e in range(c.experts):
            mlp(f"{p}mlp.experts.{e}.", c.moe_inter)
    out["model.norm.weight"] = ([c.hidden], bf)
    out["lm_head.weight"] = ([c.vocab, c.hidden], bf)
    return out
