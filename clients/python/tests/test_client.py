"""Tests of the Python client against a live shardsrv serving the example checkpoint.

Run with `python3 -m unittest discover -s clients/python/tests` after `make build`
(SHARDSRV_BIN points at the binary; default bin/shardsrv).
"""

import json
import os
import socket
import struct
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import shardsrv  # noqa: E402
from shardsrv import layout  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CKPT = "llama-tiny"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def read_checkpoint(folder):
    """The example checkpoint's tensors, read straight from its files: {name: (shape, bytes)}."""
    out = {}
    for name in os.listdir(folder):
        if not name.endswith(".safetensors"):
            continue
        with open(os.path.join(folder, name), "rb") as f:
            data = f.read()
        tensors, _ = shardsrv.parse_safetensors(data)
        out.update({n: (shape, bytes(buf)) for n, (_, shape, buf) in tensors.items()})
    return out


class LiveServer(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        binary = os.environ.get("SHARDSRV_BIN", os.path.join(ROOT, "bin", "shardsrv"))
        ckdir = os.path.join(cls.tmp.name, "checkpoints")
        subprocess.run([binary, "example", "--out", ckdir], check=True, stdout=subprocess.DEVNULL)
        port = free_port()
        cls.proc = subprocess.Popen([binary, "serve", "--store", ckdir, "--addr", f"127.0.0.1:{port}", "--log-level", "warn"])
        cls.url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                urllib.request.urlopen(cls.url + "/healthz", timeout=1).read()
                break
            except OSError:
                time.sleep(0.05)
        cls.client = shardsrv.Client(cls.url, attempts=2, backoff=0.05)
        cls.data = read_checkpoint(os.path.join(ckdir, CKPT))
        cls.shapes = layout.shapes(cls.client.tensors(CKPT))

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=30)
        cls.tmp.cleanup()

    def rows(self, name, lo, hi):
        shape, data = self.data[name]
        row = shape[1] * 2
        return data[lo * row:hi * row]

    def fetch(self, *tensors, **kw):
        return self.client.fetch(dict({"checkpoint": CKPT, "tensors": list(tensors)}, **kw))

    def test_listings(self):
        self.assertEqual(self.client.checkpoints(), [CKPT])
        self.assertEqual(self.shapes["model.layers.0.self_attn.q_proj.weight"], [64, 64])

    def test_fused_qkv_rank_of_two(self):
        p = "model.layers.0.self_attn."
        got = self.fetch(layout.fused_qkv(self.shapes, p, "qkv", "BF16", 16, tp=2, rank=1))
        want = self.rows(p + "q_proj.weight", 32, 64) + self.rows(p + "k_proj.weight", 16, 32) + self.rows(p + "v_proj.weight", 16, 32)
        self.assertEqual(got, want)

    def test_interleaved_and_gate_up_agree_with_go_layouts(self):
        p = "model.layers.0.self_attn."
        got = self.fetch(layout.interleaved_qkv(self.shapes, p, "wqkv", "BF16", 16, tp=2, rank=0))
        self.assertEqual(got, self.rows(p + "q_proj.weight", 0, 32) + self.rows(p + "k_proj.weight", 0, 16) + self.rows(p + "v_proj.weight", 0, 16))
        g, u = "model.layers.0.mlp.gate_proj.weight", "model.layers.0.mlp.up_proj.weight"
        want = self.rows(g, 0, 64) + self.rows(u, 0, 64)
        self.assertEqual(self.fetch(layout.gate_up(self.shapes, g, u, "w13", "BF16", 2, 0)), want)
        self.assertEqual(self.fetch(layout.gate_up_per_rank(self.shapes, g, u, "fc1", "BF16", 2, 0)), want)

    def test_stacked_experts_and_vocab_padding(self):
        parts = [[f"model.layers.1.mlp.experts.{e}.down_proj.weight"] for e in range(4)]
        got = self.fetch(layout.stacked_experts(self.shapes, parts, "w2", "BF16", 4, 3))
        self.assertEqual(got, self.data["model.layers.1.mlp.experts.3.down_proj.weight"][1])
        emb = "model.embed_tokens.weight"
        self.assertEqual(self.fetch(layout.vocab_parallel(self.shapes, emb, "e", "BF16", 64, 3, 2)), bytes(128 * 64 * 2))

    def test_rope_round_trip(self):
        q = "model.layers.0.self_attn.q_proj.weight"
        meta = self.fetch(layout.rope_permute(self.shapes, q, "wq", "BF16", 16, layout.HF_TO_META))
        self.assertEqual(meta[2 * 64 * 2:3 * 64 * 2], self.rows(q, 1, 2))  # Meta row 2 = HF row 1 (h=0, j=1, t=0)
        self.assertEqual(meta[1 * 64 * 2:2 * 64 * 2], self.rows(q, 8, 9))  # Meta row 1 = HF row D/2 (h=0, j=0, t=1)

    def test_safetensors_format_and_preset(self):
        tensors = layout.preset(self.shapes, 16, "BF16", tp=2, rank=1, ep=2)
        body = self.fetch(*tensors, format="safetensors")
        parsed, meta = shardsrv.parse_safetensors(body)
        self.assertEqual(meta["shardsrv.checkpoint"], CKPT)
        self.assertIn("model.layers.1.mlp.experts.w13_weight", parsed)
        # w13 of EP rank 1: experts 2 and 3, each [gate; up], shaped [2, 64, 64].
        dtype, shape, buf = parsed["model.layers.1.mlp.experts.w13_weight"]
        self.assertEqual((dtype, shape), ("BF16", [2, 64, 64]))
        e2 = "model.layers.1.mlp.experts.2."
        self.assertEqual(bytes(buf[:64 * 64 * 2]), self.data[e2 + "gate_proj.weight"][1] + self.data[e2 + "up_proj.weight"][1])
        # vLLM's w13 of TP rank 1 as two boxes, named NAME#0 and NAME#1.
        self.assertIn("model.layers.0.mlp.gate_up_proj.weight#1", parsed)
        plan = self.client.plan({"checkpoint": CKPT, "tensors": tensors})
        self.assertEqual(plan["summary"]["output_bytes"], len(self.fetch(*tensors)))

    def test_problems_are_typed_errors(self):
        bad = layout.replicated(self.shapes, "model.norm.weight", "n", "BF16")
        bad["blocks"][0]["source"] = "missing"
        with self.assertRaises(shardsrv.ProblemError) as ctx:
            self.fetch(bad)
        self.assertEqual(ctx.exception.status, 422)
        self.assertEqual(ctx.exception.errors[0]["pointer"], "/tensors/0/blocks/0/source")
        with self.assertRaises(shardsrv.ProblemError) as ctx:
            self.client.tensors("no-such-checkpoint")
        self.assertEqual(ctx.exception.status, 404)

    def test_fetch_to_file_reports_progress(self):
        seen = []
        with tempfile.NamedTemporaryFile() as f:
            n = self.client.fetch_to_file({"checkpoint": CKPT, "tensors": [layout.replicated(self.shapes, "lm_head.weight", "h", "F32")]},
                                          f.name, progress=lambda done, total: seen.append((done, total)))
            self.assertEqual(n, 256 * 64 * 4)
            self.assertEqual(os.path.getsize(f.name), n)
        self.assertEqual(seen[-1], (n, n))

    def test_numpy_helper_when_installed(self):
        try:
            import numpy  # noqa: F401
        except ImportError:
            self.skipTest("numpy is optional")
        arr = shardsrv.to_numpy(self.data["model.norm.weight"][1], "BF16", [64])
        self.assertTrue((arr == 0x3F80).all())  # norms are ones


if __name__ == "__main__":
    unittest.main()
