"""Layout builders: shard requests for the layouts inference engines hold (same as Go's api/layout).

Each builder takes ``shapes`` ({name: shape}, from ``shapes(client.tensors(ckpt))``) and returns one
destination tensor of a request, with the boxes of one rank.
"""

import re

__all__ = ["shapes", "replicated", "column_parallel", "row_parallel", "vocab_parallel", "fused_qkv",
           "interleaved_qkv", "gate_up", "gate_up_per_rank", "stacked_experts", "rope_permute",
           "HF_TO_META", "META_TO_HF", "preset"]

HF_TO_META, META_TO_HF = "hf_to_meta", "meta_to_hf"


def shapes(tensor_list):
    return {t["name"]: t["shape"] for t in tensor_list["tensors"]}


def _identity(n):
    return [[1 if i == j else 0 for j in range(n)] for i in range(n)]


def _rows(src, dst, at, n, cols):
    return {"offsets": [dst, 0], "lengths": [n, cols], "source": src, "base": [at, 0], "coeff": _identity(2)}


def _check(what, n, size, rank):
    if size < 1 or not 0 <= rank < size:
        raise ValueError(f"rank {rank} of {size} is not a rank")
    if n % size:
        raise ValueError(f"{what} ({n}) does not split evenly over {size} ranks")


def _tensor(name, dtype, shape, blocks, boxes):
    return {"name": name, "dtype": dtype, "shape": list(shape), "boxes": boxes, "blocks": blocks}


def replicated(shapes_, src, dst, dtype):
    sh = list(shapes_[src])
    block = {"offsets": [0] * len(sh), "lengths": sh, "source": src, "base": [0] * len(sh), "coeff": _identity(len(sh))}
    return _tensor(dst, dtype, sh, [block], [{"offsets": [0] * len(sh), "lengths": sh}])


def _split(shapes_, src, dst, dtype, dim, tp, rank):
    t = replicated(shapes_, src, dst, dtype)
    _check(src, t["shape"][dim], tp, rank)
    box = t["boxes"][0]
    box["lengths"] = list(t["shape"])
    box["lengths"][dim] //= tp
    box["offsets"][dim] = rank * box["lengths"][dim]
    return t


def column_parallel(shapes_, src, dst, dtype, tp, rank):
    return _split(shapes_, src, dst, dtype, 0, tp, rank)


def row_parallel(shapes_, src, dst, dtype, tp, rank):
    return _split(shapes_, src, dst, dtype, 1, tp, rank)


def vocab_parallel(shapes_, src, dst, dtype, pad_to, tp, rank):
    vocab, hidden = shapes_[src]
    unit = max(1, pad_to) * tp
    padded = -(-vocab // unit) * unit
    _check("padded vocabulary", padded, tp, rank)
    per = padded // tp
    t = _tensor(dst, dtype, [padded, hidden], [_rows(src, 0, 0, vocab, hidden)], [{"offsets": [rank * per, 0], "lengths": [per, hidden]}])
    t["fill"] = 0.0
    return t


def _heads(shapes_, prefix, head_dim):
    q, k = shapes_[prefix + "q_proj.weight"], shapes_[prefix + "k_proj.weight"]
    if q[0] % head_dim or k[0] % head_dim or q[1] != k[1]:
        raise ValueError(f"{q} and {k} are not whole heads of {head_dim}")
    return q[0] // head_dim, k[0] // head_dim, q[1]


def fused_qkv(shapes_, prefix, dst, dtype, head_dim, tp, rank):
    """vLLM's QKVParallelLinear: rank r's rows are [q_r; k_r; v_r]; KV heads replicate when tp > kv."""
    heads, kv, hidden = _heads(shapes_, prefix, head_dim)
    _check("query heads", heads, tp, rank)
    if tp >= kv:
        if tp % kv:
            raise ValueError(f"{tp} ranks do not replicate {kv} KV heads evenly")
        kv_local, replicas = 1, tp // kv
    else:
        _check("KV heads", kv, tp, rank)
        kv_local, replicas = kv // tp, 1
    q_rows, kv_rows = heads // tp * head_dim, kv_local * head_dim
    per = q_rows + 2 * kv_rows
    blocks = []
    for r in range(tp):
        kv_at = r // replicas * kv_rows
        blocks += [_rows(prefix + "q_proj.weight", r * per, r * q_rows, q_rows, hidden),
                   _rows(prefix + "k_proj.weight", r * per + q_rows, kv_at, kv_rows, hidden),
                   _rows(prefix + "v_proj.weight", r * per + q_rows + kv_rows, kv_at, kv_rows, hidden)]
    return _tensor(dst, dtype, [tp * per, hidden], blocks, [{"offsets": [rank * per, 0], "lengths": [per, hidden]}])


def interleaved_qkv(shapes_, prefix, dst, dtype, head_dim, tp, rank):
    """Megatron / torchtitan: per KV group its query heads, then its k head, then its v head."""
    heads, kv, hidden = _heads(shapes_, prefix, head_dim)
    _check("KV groups", kv, tp, rank)
    per_group = heads // kv
    group = (per_group + 2) * head_dim
    blocks = []
    for g in range(kv):
        blocks += [_rows(prefix + "q_proj.weight", g * group, g * per_group * head_dim, per_group * head_dim, hidden),
                   _rows(prefix + "k_proj.weight", g * group + per_group * head_dim, g * head_dim, head_dim, hidden),
                   _rows(prefix + "v_proj.weight", g * group + (per_group + 1) * head_dim, g * head_dim, head_dim, hidden)]
    groups = kv // tp
    return _tensor(dst, dtype, [kv * group, hidden], blocks, [{"offsets": [rank * groups * group, 0], "lengths": [groups * group, hidden]}])


def gate_up(shapes_, gate, up, dst, dtype, tp, rank):
    """vLLM's w13: global [gate; up]; rank r holds two boxes, so its bytes are [gate_r; up_r]."""
    inter, hidden = shapes_[gate]
    _check("intermediate size", inter, tp, rank)
    per = inter // tp
    return _tensor(dst, dtype, [2 * inter, hidden], [_rows(gate, 0, 0, inter, hidden), _rows(up, inter, 0, inter, hidden)],
                   [{"offsets": [rank * per, 0], "lengths": [per, hidden]}, {"offsets": [inter + rank * per, 0], "lengths": [per, hidden]}])


def gate_up_per_rank(shapes_, gate, up, dst, dtype, tp, rank):
    """Megatron's linear_fc1 at TP > 1: rank-major [gate_0; up_0; gate_1; up_1; ...]."""
    inter, hidden = shapes_[gate]
    _check("intermediate size", inter, tp, rank)
    per = inter // tp
    blocks = []
    for r in range(tp):
        blocks += [_rows(gate, 2 * r * per, r * per, per, hidden), _rows(up, (2 * r + 1) * per, r * per, per, hidden)]
    return _tensor(dst, dtype, [2 * inter, hidden], blocks, [{"offsets": [2 * rank * per, 0], "lengths": [2 * per, hidden]}])


def stacked_experts(shapes_, parts, dst, dtype, ep, rank):
    """Experts stacked on dim 0; each expert's sources stacked on dim 1; EP rank r holds E/ep experts."""
    experts = len(parts)
    _check("experts", experts, ep, rank)
    blocks, rows, cols = [], None, None
    for e, srcs in enumerate(parts):
        at = 0
        for src in srcs:
            r, c = shapes_[src]
            cols = c
            blocks.append({"offsets": [e, at, 0], "lengths": [1, r, c], "source": src, "base": [0, 0], "coeff": [[0, 1, 0], [0, 0, 1]]})
            at += r
        rows = at
    per = experts // ep
    return _tensor(dst, dtype, [experts, rows, cols], blocks, [{"offsets": [rank * per, 0, 0], "lengths": [per, rows, cols]}])


def rope_permute(shapes_, src, dst, dtype, head_dim, direction):
    """HF[h*D + t*D/2 + j] = Meta[h*D + 2j + t]; the rank holds the tensor whole."""
    rows, cols = shapes_[src]
    heads, half, blocks = rows // head_dim, head_dim // 2, []
    for h in range(heads):
        if direction == HF_TO_META:
            blocks += [{"offsets": [h * head_dim + 2 * j, 0], "lengths": [2, cols], "source": src,
                        "base": [h * head_dim + j, 0], "coeff": [[half, 0], [0, 1]]} for j in range(half)]
        else:
            blocks += [{"offsets": [h * head_dim + t * half, 0], "lengths": [half, cols], "source": src,
                        "base": [h * head_dim + t, 0], "coeff": [[2, 0], [0, 1]]} for t in range(2)]
    return _tensor(dst, dtype, [rows, cols], blocks, [{"offsets": [0, 0], "lengths": [rows, cols]}])


def preset(shapes_, head_dim, dtype, tp, rank, ep=0, vocab_pad=64):
    """A whole Llama- or Qwen-MoE-style model laid out as vLLM holds it, for one rank."""
    out = [vocab_parallel(shapes_, "model.embed_tokens.weight", "model.embed_tokens.weight", dtype, vocab_pad, tp, rank)]
    layers = sorted({int(m.group(1)) for n in shapes_ for m in [re.match(r"model\.layers\.(\d+)\.", n)] if m})
    for layer in layers:
        pre = f"model.layers.{layer}."
        at, mlp = pre + "self_attn.", pre + "mlp."
        out += [replicated(shapes_, pre + "input_layernorm.weight", pre + "input_layernorm.weight", dtype),
                fused_qkv(shapes_, at, at + "qkv_proj.weight", dtype, head_dim, tp, rank),
                row_parallel(shapes_, at + "o_proj.weight", at + "o_proj.weight", dtype, tp, rank),
                replicated(shapes_, pre + "post_attention_layernorm.weight", pre + "post_attention_layernorm.weight", dtype)]
        out += [replicated(shapes_, at + n, at + n, dtype) for n in ("q_norm.weight", "k_norm.weight") if at + n in shapes_]
        if mlp + "experts.0.gate_proj.weight" in shapes_:
            e = 0
            w13, w2 = [], []
            while f"{mlp}experts.{e}.gate_proj.weight" in shapes_:
                ex = f"{mlp}experts.{e}."
                w13.append([ex + "gate_proj.weight", ex + "up_proj.weight"])
                w2.append([ex + "down_proj.weight"])
                e += 1
            size, idx = (ep, rank % ep) if ep else (1, 0)
            out += [replicated(shapes_, mlp + "gate.weight", mlp + "gate.weight", dtype),
                    stacked_experts(shapes_, w13, mlp + "experts.w13_weight", dtype, size, idx),
                    stacked_experts(shapes_, w2, mlp + "experts.w2_weight", dtype, size, idx)]
        else:
            out += [gate_up(shapes_, mlp + "gate_proj.weight", mlp + "up_proj.weight", mlp + "gate_up_proj.weight", dtype, tp, rank),
                    row_parallel(shapes_, mlp + "down_proj.weight", mlp + "down_proj.weight", dtype, tp, rank)]
    out.append(replicated(shapes_, "model.norm.weight", "model.norm.weight", dtype))
    if "lm_head.weight" in shapes_:
        out.append(vocab_parallel(shapes_, "lm_head.weight", "lm_head.weight", dtype, vocab_pad, tp, rank))
    return out
