"""A TP=8 startup of two Llama-3-8B layers and the embedding (the shapes of the Go bench's Llama
checkpoint, BF16, 1.9 GB) three ways, every rank one after another in this process:

  stream     load_model_weights: capture, then the rank's bytes streamed into its parameters
  directory  `shardsrv fetch --layout vllm --tp 8 --rank all --out DIR`, then each rank loads its
             model-rank-R-part-0.safetensors by name, as vLLM's ShardedStateLoader does
  whole      each rank reads the whole checkpoint file and runs load_weights on the real tensors,
             as vLLM's default loader does

    /usr/bin/python3 clients/python/bench/startup.py --bin bin/shardsrv

It writes the checkpoint (random values) and serves it with a local shardsrv. The storage bytes a
path reads are the server's plan's read_bytes (stream), the bodies fetched (directory), the
files read (whole).
"""

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.join(HERE, ".."), os.path.join(HERE, "..", "tests")]

import torch  # noqa: E402

import shardsrv  # noqa: E402
import vllm_layers as vl  # noqa: E402
from shardsrv import loader  # noqa: E402
import shardsrv.capture  # noqa: E402
from test_loader import hf_config, random_tensors, write_checkpoint  # noqa: E402

TP = 8


class Llama3(vl.Config):
    vocab, hidden, heads, kv_heads, head_dim, inter, layers = 128256, 4096, 32, 8, 128, 14336, 2


def serve(binary, store):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "serve", "--store", store, "--addr", f"127.0.0.1:{port}", "--log-level", "error"])
    url = f"http://127.0.0.1:{port}"
    for _ in range(400):
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).read()
            return proc, url
        except OSError:
            time.sleep(0.05)
    raise RuntimeError("shardsrv did not start")


def model(rank):
    # Tied: the Go bench's checkpoint has no lm_head.
    return vl.TinyModel(vl.Rank(TP, rank), "llama", tie=True, cfg=Llama3)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", default=os.path.join(HERE, "..", "..", "..", "bin", "shardsrv"))
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        store = os.path.join(tmp, "store")
        shapes = vl.checkpoint_shapes("llama", tie=True, cfg=Llama3)
        tensors = random_tensors(shapes, 0)
        cfg = hf_config("LlamaForCausalLM", True)
        cfg.update(vocab_size=Llama3.vocab, hidden_size=Llama3.hidden, num_attention_heads=Llama3.heads,
                   num_key_value_heads=Llama3.kv_heads, head_dim=Llama3.head_dim,
                   intermediate_size=Llama3.inter, num_hidden_layers=Llama3.layers)
        write_checkpoint(os.path.join(store, "llama"), tensors, cfg)
        del tensors
        path = os.path.join(store, "llama", "model.safetensors")
        size = os.path.getsize(path)
        proc, url = serve(args.bin, store)
        try:
            client = shardsrv.Client(url)

            # What the storage reads for the ranks' tables: the server's plans, made before the clock starts.
            listing = client.tensors("llama")["tensors"]
            read = sum(client.plan({"checkpoint": "llama", "tensors": shardsrv.capture.capture(model(r), listing)
                                    .table()})["summary"]["read_bytes"] for r in range(TP))
            t0 = time.monotonic()
            fetched = needed = 0
            for r in range(TP):
                rep = loader.load_model_weights(model(r), client, "llama")
                fetched += rep.bytes_fetched
                needed += rep.bytes_needed
            stream = time.monotonic() - t0
            print(f"checkpoint {size / 1e9:.2f} GB; the {TP} ranks need {needed / 1e9:.2f} GB of it together")
            print(f"stream     {stream:6.1f} s  storage read {read / 1e9:.2f} GB ({read / needed:.3f}x needed), "
                  f"fetched {fetched / 1e9:.2f} GB")

            out = os.path.join(tmp, "dir")
            t0 = time.monotonic()
            subprocess.run([args.bin, "fetch", "--server", url, "--checkpoint", "llama", "--layout", "vllm",
                            "--tp", str(TP), "--rank", "all", "--out", out], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            dir_bytes = 0
            for r in range(TP):
                m = model(r)
                with open(os.path.join(out, f"model-rank-{r}-part-0.safetensors"), "rb") as f:
                    data = bytearray(f.read())
                dir_bytes += len(data)
                parsed, _ = shardsrv.parse_safetensors(data)
                params = dict(m.named_parameters())
                params["lm_head.weight"] = params.pop("model.embed_tokens.weight")  # the tied key it is saved under
                with torch.no_grad():
                    for name, (dtype, shape, buf) in parsed.items():
                        params[name].copy_(shardsrv.to_torch(buf, dtype, shape))
            directory = time.monotonic() - t0
            print(f"directory  {directory:6.1f} s  fetched {dir_bytes / 1e9:.2f} GB, written and read again")

            t0 = time.monotonic()
            for r in range(TP):
                m = model(r)
                with open(path, "rb") as f:
                    data = bytearray(f.read())
                parsed, _ = shardsrv.parse_safetensors(data)
                with torch.no_grad():
                    m.load_weights((n, shardsrv.to_torch(b, d, s)) for n, (d, s, b) in parsed.items())
            whole = time.monotonic() - t0
            print(f"whole      {whole:6.1f} s  read {TP * size / 1e9:.2f} GB ({TP * size / needed:.1f}x needed)")
            print(f"stream / directory = {stream / directory:.2f}; stream / whole = {stream / whole:.2f}")
        finally:
            proc.terminate()
            proc.wait(timeout=30)


if __name__ == "__main__":
    main()
