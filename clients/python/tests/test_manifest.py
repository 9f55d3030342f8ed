"""The manifest check from Python, against a live shardsrv serving the example checkpoint: manifests
read from a sharded_state directory the server's layout filled (standard library) and from the
state dict of a model built as vLLM builds it (torch), compared by ``shardsrv layout --check``."""

import os
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

from shardsrv import Client  # noqa: E402
from shardsrv import manifest as mf  # noqa: E402
from test_client import BINARY, CKPT, ExampleServer  # noqa: E402

try:
    import torch
    import vllm_layers as vl
except ImportError:
    torch = None
else:
    class ExampleConfig(vl.Qwen2MoeConfig):
        """The example checkpoint's config.json: a dense layer 0 and a sparse layer 1."""
        vocab, hidden, heads, kv_heads, layers = 256, 64, 4, 2, 2
        inter, moe_inter, shared_inter, experts = 128, 32, 64, 4
        decoder_sparse_step, mlp_only_layers = 2, []

# The layout vllm_layers' models follow, at TP 2 rank 1.
LAYOUT = {"engine": "vllm", "engine_version": "0.10", "tensor_parallel_size": 2, "tp_rank": 1}


class Check(ExampleServer):
    def check(self, entries, layout=LAYOUT):
        return mf.check(entries, CKPT, layout, server=self.url, binary=BINARY)

    def saved_rank(self):
        """The manifest of rank 1's file in a directory `shardsrv fetch --layout vllm` wrote."""
        out = os.path.join(self.tmp.name, "sharded")
        subprocess.run([BINARY, "fetch", "--server", self.url, "--checkpoint", CKPT, "--layout", "vllm",
                        "--engine-version", "0.10", "--tp", "2", "--rank", "all", "--out", out],
                       check=True, stderr=subprocess.DEVNULL)
        return mf.saved(out, 1)

    def test_a_saved_directory_matches_and_a_renamed_and_a_reshaped_tensor_are_reported_exactly(self):
        entries = self.saved_rank()
        self.assertEqual(len(entries), 21)
        self.assertEqual(self.check(entries), [])
        for e in entries:
            if e["name"] == "model.layers.0.self_attn.qkv_proj.weight":
                e["name"] = "model.layers.0.self_attn.qkv.weight"
            if e["name"] == "model.layers.1.mlp.experts.w13_weight":
                e["shape"] = [4, 64, 32]
        self.assertEqual(self.check(entries), [
            "missing: model.layers.0.self_attn.qkv.weight BF16 [64 64] (the engine holds it; the table does not)",
            "shape: model.layers.1.mlp.experts.w13_weight is [4 32 64] in the table, [4 64 32] in the engine",
            "extra: model.layers.0.self_attn.qkv_proj.weight BF16 [64 64] "
            "(the table serves it; the engine does not hold it)"])

    def test_a_manifest_file_is_checked_as_it_is(self):
        path = os.path.join(self.tmp.name, "manifest.json")
        with open(path, "w") as f:
            f.write("[]")
        got = self.check(path)
        self.assertTrue(got and all(line.startswith("extra: ") for line in got), got)

    def test_what_fails_before_comparing_raises_the_commands_message(self):
        with self.assertRaisesRegex(mf.CheckError, "no-such"):
            mf.check([], "no-such", LAYOUT, server=self.url, binary=BINARY)
        with self.assertRaisesRegex(ValueError, "pipeline_parallel_size"):
            self.check([], {**LAYOUT, "pipeline_parallel_size": 2})

    def test_vllms_moe_options_reach_the_server_as_they_are(self):
        pcp = {"engine": "vllm", "tensor_parallel_size": 2, "tp_rank": 1, "enable_expert_parallel": True,
               "prefill_context_parallel_size": 2, "pcp_rank": 1, "enable_eplb": False,
               "num_redundant_experts": 0, "expert_placement_strategy": "round_robin"}
        table = Client(self.url).layout(CKPT, pcp)
        entries = [{"name": t["name"], "shape": t["shape"], "dtype": t["dtype"]} for t in table]
        self.assertEqual(self.check(entries, pcp), [])
        # What the server refuses is its 422, naming the field the member set.
        for member, field in [({"enable_eplb": True}, "enable_eplb"),  # Qwen2-MoE is not balanced
                              ({"num_redundant_experts": 2}, "num_redundant_experts"),
                              ({"data_parallel_size": 2}, "prefill_context_parallel_size"),
                              ({"expert_placement_strategy": "zigzag"}, "expert_placement_strategy"),
                              ({"pcp_rank": 2}, "pcp_rank")]:
            with self.assertRaisesRegex(mf.CheckError, "(?s)422 .*/layout/" + field + ":", msg=member):
                self.check(entries, {**pcp, **member})

    @unittest.skipIf(torch is None, "a state dict needs torch")
    def test_a_models_state_dict_matches_and_a_retyped_tensor_is_reported(self):
        model = vl.Qwen2Moe(vl.Rank(2, 1), ExampleConfig)
        self.assertEqual(self.check(mf.manifest(model.state_dict())), [])
        model.model.norm.weight.data = model.model.norm.weight.data.float()
        self.assertEqual(self.check(mf.manifest(model.state_dict())),
                         ["dtype: model.norm.weight is BF16 in the table, F32 in the engine"])


if __name__ == "__main__":
    unittest.main()
