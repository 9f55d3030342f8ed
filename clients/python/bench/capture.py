"""Capture time and request size for a DeepSeek-V3-shaped model: 61 layers (3 dense, 58 MoE with
256 routed experts and a shared one), MLA attention, block-FP8 weights with their
weight_scale_inv, the vocabulary of 129,280 — one rank of TP 8 with expert parallelism (EP 8),
built on the meta device (no memory for weights): the tests' model written from vLLM's
deepseek_v2.py (tests/vllm_layers.py), at DeepSeek-V3's size.

    /usr/bin/python3 clients/python/bench/capture.py [--rank R] [--layers N]

Prints the capture's time (and, beside it, the model's own load_weights loop on plain meta
tensors, which any load pays), blocks, fallbacks, the bytes the rank needs and the requests' count
and JSON size. No server is involved: the checkpoint's listing is built from the shapes.
"""

import argparse
import json
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


class DeepseekV3Config(vl.DeepseekConfig):
    """DeepSeek-V3's config.json at full size."""
    vocab, hidden, layers, first_k_dense = 129280, 7168, 61, 3
    inter, moe_inter, experts, n_shared = 18432, 2048, 256, 1
    heads, q_lora, kv_lora, rope, nope, v_head = 128, 1536, 512, 64, 128, 128
    block = [128, 128]


vl.DEVICE = "meta"  # the tests' layers, their parameters without memory


def listing(c):
    """The checkpoint's tensors as /v1/tensors lists them (DeepSeek-V3's Hugging Face names)."""
    return [{"name": name, "dtype": cap.dtype_name(dtype), "shape": shape}
            for name, (shape, dtype) in vl.deepseek_checkpoint(c).items()]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rank", type=int, default=3, help="the TP/EP rank of 8")
    ap.add_argument("--layers", type=int, default=DeepseekV3Config.layers)
    args = ap.parse_args()
    c = type("DeepseekV3Layers", (DeepseekV3Config,), {"layers": args.layers})
    tensors = listing(c)
    t0 = time.monotonic()
    model = vl.DeepseekV3(vl.Rank(8, args.rank, ep=True), c)
    built = time.monotonic()
    result = cap.capture(model, tensors)
    captured = time.monotonic()
    # The model's own loop on plain meta tensors (what vLLM's loop costs with no recording).
    plain = vl.DeepseekV3(vl.Rank(8, args.rank, ep=True), c)
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
