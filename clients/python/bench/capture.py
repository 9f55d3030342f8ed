"""Capture time and request size for a DeepSeek-V3-shaped model: 61 layers (3 dense, 58 MoE with
256 routed experts and a shared one), MLA attention, block-FP8 weights with their
weight_scale_inv, the vocabulary of 129,280 — one rank of TP 8 with expert parallelism (EP 8),
built on the meta device (no memory for weights), its loaders the tests' vLLM-style ones
(tests/vllm_layers.py) driven by a load_weights of the shape of vLLM's DeepseekV2Model's.

    /usr/bin/python3 clients/python/bench/capture.py [--rank R] [--layers N]

Prints the capture's time (and, beside it, the model's own load_weights loop on plain meta
tensors, which any load pays), blocks, fallbacks, the bytes the rank needs and the requests' count
and JSON size. No server is involved: the checkpoint's listing is built from the shapes.
"""

import argparse
import json
import math
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests")]

import torch  # noqa: E402
from torch import nn  # noqa: E402

import vllm_layers as vl  # noqa: E402
from shardsrv import capture as cap  # noqa: E402
from shardsrv import loader  # noqa: E402

HIDDEN, VOCAB, LAYERS, DENSE = 7168, 129280, 61, 3
INTER, MOE_INTER, EXPERTS = 18432, 2048, 256
HEADS, Q_LORA, KV_LORA, ROPE, NOPE, V_HEAD = 128, 1536, 512, 64, 128, 128
BLOCK = [128, 128]


def meta_param(shape, dtype, loader_, **attrs):
    p = nn.Parameter(torch.empty(shape, dtype=dtype, device="meta"), requires_grad=False)
    p.weight_loader = loader_
    for k, v in attrs.items():
        setattr(p, k, v)
    return p


vl._param = meta_param  # the tests' layers, with their parameters on the meta device


class MLP(nn.Module):
    def __init__(self, rank, inter):
        super().__init__()
        self.gate_up_proj = vl.MergedColumnParallel(rank, [inter, inter], HIDDEN, block=BLOCK)
        self.down_proj = vl.RowParallel(rank, HIDDEN, inter, block=BLOCK)


class DeepseekV3(nn.Module):
    def __init__(self, rank, layers):
        super().__init__()
        self.model = nn.Module()
        self.model.embed_tokens = vl.VocabParallelEmbedding(rank, VOCAB, HIDDEN)
        self.model.layers = nn.ModuleList()
        for i in range(layers):
            layer = nn.Module()
            layer.input_layernorm = vl.Replicated([HIDDEN])
            layer.post_attention_layernorm = vl.Replicated([HIDDEN])
            a = layer.self_attn = nn.Module()
            a.fused_qkv_a_proj = vl.MergedColumnParallel(rank, [Q_LORA, KV_LORA + ROPE], HIDDEN, block=BLOCK,
                                                         disable_tp=True)
            a.q_a_layernorm = vl.Replicated([Q_LORA])
            a.q_b_proj = vl.ColumnParallel(rank, HEADS * (NOPE + ROPE), Q_LORA, block=BLOCK)
            a.kv_a_layernorm = vl.Replicated([KV_LORA])
            a.kv_b_proj = vl.ColumnParallel(rank, HEADS * (NOPE + V_HEAD), KV_LORA, block=BLOCK)
            a.o_proj = vl.RowParallel(rank, HIDDEN, HEADS * V_HEAD, block=BLOCK)
            if i < DENSE:
                layer.mlp = MLP(rank, INTER)
            else:
                layer.mlp = nn.Module()
                layer.mlp.gate = vl.Replicated([EXPERTS, HIDDEN])
                layer.mlp.gate.e_score_correction_bias = meta_param([EXPERTS], torch.float32,
                                                                    vl.default_weight_loader)
                layer.mlp.experts = vl.FusedMoE(rank, EXPERTS, HIDDEN, MOE_INTER, block=BLOCK)
                layer.mlp.shared_experts = MLP(rank, MOE_INTER)
            self.model.layers.append(layer)
        self.model.norm = vl.Replicated([HIDDEN])
        self.lm_head = vl.VocabParallelEmbedding(rank, VOCAB, HIDDEN)

    def load_weights(self, weights):
        """DeepseekV2Model.load_weights' loop: stacked parameters, then experts, then the rest."""
        stacked = [("gate_up_proj", "gate_proj", 0), ("gate_up_proj", "up_proj", 1),
                   ("fused_qkv_a_proj", "q_a_proj", 0), ("fused_qkv_a_proj", "kv_a_proj_with_mqa", 1)]
        experts = vl.FusedMoE.make_expert_params_mapping("", "gate_proj", "down_proj", "up_proj", EXPERTS)
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
                    getattr(p, "weight_loader", vl.default_weight_loader)(p, w)
            loaded.add(name)
        return loaded


def listing(layers):
    """The checkpoint's tensors as /v1/tensors lists them (DeepSeek-V3's Hugging Face names)."""
    out = []

    def add(name, shape, dtype="BF16"):
        out.append({"name": name, "dtype": dtype, "shape": shape})

    def fp8(name, shape):
        add(name + ".weight", shape, cap.dtype_name(vl.FP8))
        add(name + ".weight_scale_inv", [math.ceil(shape[0] / BLOCK[0]), math.ceil(shape[1] / BLOCK[1])], "F32")

    add("model.embed_tokens.weight", [VOCAB, HIDDEN])
    for i in range(layers):
        p = f"model.layers.{i}."
        add(p + "input_layernorm.weight", [HIDDEN])
        add(p + "post_attention_layernorm.weight", [HIDDEN])
        fp8(p + "self_attn.q_a_proj", [Q_LORA, HIDDEN])
        add(p + "self_attn.q_a_layernorm.weight", [Q_LORA])
        fp8(p + "self_attn.q_b_proj", [HEADS * (NOPE + ROPE), Q_LORA])
        fp8(p + "self_attn.kv_a_proj_with_mqa", [KV_LORA + ROPE, HIDDEN])
        add(p + "self_attn.kv_a_layernorm.weight", [KV_LORA])
        fp8(p + "self_attn.kv_b_proj", [HEADS * (NOPE + V_HEAD), KV_LORA])
        fp8(p + "self_attn.o_proj", [HIDDEN, HEADS * V_HEAD])
        if i < DENSE:
            for w, shape in (("gate_proj", [INTER, HIDDEN]), ("up_proj", [INTER, HIDDEN]),
                             ("down_proj", [HIDDEN, INTER])):
                fp8(f"{p}mlp.{w}", shape)
            continue
        add(p + "mlp.gate.weight", [EXPERTS, HIDDEN])
        add(p + "mlp.gate.e_score_correction_bias", [EXPERTS], "F32")
        for e in range(EXPERTS):
            for w, shape in (("gate_proj", [MOE_INTER, HIDDEN]), ("up_proj", [MOE_INTER, HIDDEN]),
                             ("down_proj", [HIDDEN, MOE_INTER])):
                fp8(f"{p}mlp.experts.{e}.{w}", shape)
        for w, shape in (("gate_proj", [MOE_INTER, HIDDEN]), ("up_proj", [MOE_INTER, HIDDEN]),
                         ("down_proj", [HIDDEN, MOE_INTER])):
            fp8(f"{p}mlp.shared_experts.{w}", shape)
    add("model.norm.weight", [HIDDEN])
    add("lm_head.weight", [VOCAB, HIDDEN])
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, default=3, help="the TP/EP rank of 8")
    ap.add_argument("--layers", type=int, default=LAYERS)
    args = ap.parse_args()
    tensors = listing(args.layers)
    t0 = time.monotonic()
    model = DeepseekV3(vl.Rank(8, args.rank, ep=True), args.layers)
    built = time.monotonic()
    result = cap.capture(model, tensors)
    captured = time.monotonic()
    # The model's own loop on plain meta tensors (what vLLM's loop costs with no recording).
    plain = DeepseekV3(vl.Rank(8, args.rank, ep=True), args.layers)
    t1 = time.monotonic()
    plain.load_weights((t["name"], torch.empty(t["shape"], dtype=cap.torch_dtype(t["dtype"]), device="meta"))
                       for t in tensors)
    baseline = time.monotonic() - t1
    table = result.table()
    items = list(loader._items(result, [], loader.STAGING_BYTES))
    requests = [loader._body("deepseek-v3", g) for g in loader._requests(items, loader.MAX_REQUEST_BYTES)]
    sizes = [len(json.dumps(r)) for r in requests]
    needed = sum(it.nbytes for it in items)
    print(f"checkpoint tensors   {len(tensors):,}")
    print(f"model built (meta)   {built - t0:.2f} s")
    print(f"capture              {captured - built:.2f} s (the model's load_weights on plain meta tensors: "
          f"{baseline:.2f} s)")
    print(f"destinations         {len(table):,}")
    print(f"blocks               {result.block_count():,}")
    print(f"fallbacks            {len(result.fallbacks)} {result.fallbacks[:5]}")
    print(f"bytes the rank needs {needed:,} ({needed / 2**30:.1f} GiB)")
    print(f"requests             {len(requests)} (JSON {', '.join(f'{s / 2**20:.1f} MiB' for s in sizes)})")


if __name__ == "__main__":
    main()
