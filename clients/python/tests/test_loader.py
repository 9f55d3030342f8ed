"""Equivalence of the two ways a rank gets its weights, against a live shardsrv: (a) the model's
load_weights on the real, whole checkpoint tensors, as vLLM loads a checkpoint directory, and (b)
capture -> shardsrv -> load_model_weights. Every parameter and buffer must be the same, byte for
byte, at every rank of TP 1, 2, 4 and 8, with expert parallelism off and on. The models' loaders
(vllm_layers.py) are written from vLLM's; the checkpoints are written here. A cross-check compares
the capture with the server's own "engine": "vllm" layout for the architectures both cover."""

import json
import logging
import os
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.dirname(__file__))

import shardsrv  # noqa: E402
from test_client import serve  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    import vllm_layers as vl
    from shardsrv import capture as cap
    from shardsrv import loader


def tensor_bytes(t):
    return bytes(shardsrv._bytes_of(t.detach().contiguous().view(-1))) if t.numel() else b""


def write_checkpoint(folder, tensors, config=None):
    """A model.safetensors (and config.json) of tensors: {name: torch tensor}."""
    os.makedirs(folder, exist_ok=True)
    header, blobs, at = {}, [], 0
    for name, t in tensors.items():
        data = tensor_bytes(t)
        header[name] = {"dtype": cap.dtype_name(t.dtype), "shape": list(t.shape), "data_offsets": [at, at + len(data)]}
        blobs.append(data)
        at += len(data)
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    with open(os.path.join(folder, "model.safetensors"), "wb") as f:
        f.write(len(raw).to_bytes(8, "little") + raw + b"".join(blobs))
    if config is not None:
        with open(os.path.join(folder, "config.json"), "w") as f:
            json.dump(config, f)


def random_tensors(shapes, seed):
    g = torch.Generator().manual_seed(seed)
    out = {}
    for name, (shape, dtype) in shapes.items():
        if dtype == vl.FP8:  # bit patterns, never NaN (0x7f, 0xff), so every path keeps them as they are
            bits = torch.randint(0, 127, shape, generator=g, dtype=torch.uint8)
            bits |= torch.randint(0, 2, shape, generator=g, dtype=torch.uint8) << 7
            out[name] = bits.view(dtype) if dtype != torch.uint8 else bits
        elif name.endswith("A_log"):
            out[name] = torch.rand(shape, generator=g).to(dtype)
        else:
            out[name] = torch.randn(shape, generator=g).to(dtype)
    return out


def hf_config(arch, tie):
    c = vl.Config
    cfg = {"architectures": [arch], "hidden_size": c.hidden, "num_attention_heads": c.heads,
           "num_key_value_heads": c.kv_heads, "head_dim": c.head_dim, "intermediate_size": c.inter,
           "num_hidden_layers": c.layers, "vocab_size": c.vocab, "torch_dtype": "bfloat16",
           "tie_word_embeddings": tie, "rms_norm_eps": 1e-5}
    if arch == "MixtralForCausalLM":
        cfg.update(num_local_experts=c.experts, num_experts_per_tok=2)
    if arch == "Qwen3MoeForCausalLM":
        cfg.update(num_experts=c.experts, num_experts_per_tok=2, decoder_sparse_step=1, mlp_only_layers=[],
                   moe_intermediate_size=c.inter)
    return cfg


def state(model):
    return {name: tensor_bytes(t) for name, t in list(model.named_parameters()) + list(model.named_buffers())}


if torch is not None:
    class DeepseekWithoutQLora(vl.DeepseekConfig):
        q_lora = None

    DEEPSEEK = {"deepseek-x": vl.DeepseekConfig, "deepseek-x-noq": DeepseekWithoutQLora}

    class DeepseekBlockFP8(vl.DeepseekConfig):
        """Block FP8 with 8 × 8 blocks, sized as vLLM's validate_block_quant_shapes requires at TP 8
        (every TP-split dimension of a rank a whole number of blocks) but with the last part of
        fused_qkv_a_proj (kv_lora + rope = 36 rows) and kv_b_proj's input (28) not, as a merged
        layer's last part and an unsplit dimension may be: their scales round up."""
        block = [8, 8]
        inter, moe_inter, kv_lora, rope, nope, v_head = 128, 64, 28, 8, 16, 16

    class DeepseekBlockFP8WithoutQLora(DeepseekBlockFP8):
        q_lora = None

    DEEPSEEK_FP8 = {"deepseek-fp8-x": DeepseekBlockFP8, "deepseek-fp8-x-noq": DeepseekBlockFP8WithoutQLora}


def server_name(name):
    """The name vLLM v0.10.2's saved state dict gives a DeepSeek parameter, from the one
    named_parameters gives: MultiHeadLatentAttention holds the attention's modules a second time
    as self_attn.mla_attn.X, SharedFusedMoE the shared experts as experts._shared_experts.X and
    FusedMoE the router's bias as experts.e_score_correction_bias, and of two names for one tensor
    the saved state dict keeps the smaller."""
    for module in ("q_a_layernorm", "q_b_proj", "o_proj", "q_proj", "kv_a_proj_with_mqa"):
        seen = f"self_attn.{module}."
        if seen in name and f"self_attn.mla_attn.{module}." < seen:
            return name.replace(seen, f"self_attn.mla_attn.{module}.")
    if ".mlp.shared_experts." in name:
        return name.replace(".mlp.shared_experts.", ".mlp.experts._shared_experts.")
    return name.replace(".mlp.gate.e_score_correction_bias", ".mlp.experts.e_score_correction_bias")


@unittest.skipIf(torch is None, "the capture and the loader need torch")
class LiveCheckpoints(unittest.TestCase):
    """A live shardsrv serving the tiny models' checkpoints, written here."""

    CHECKPOINTS = {"everything": ("everything", False, None), "everything-tied": ("everything", True, None),
                   "llama-x": ("llama", False, "LlamaForCausalLM"), "llama-x-tied": ("llama", True, "LlamaForCausalLM"),
                   "qwen2-x": ("qwen2", False, "Qwen2ForCausalLM"), "qwen3-x": ("qwen3", True, "Qwen3ForCausalLM"),
                   "mixtral-x": ("mixtral", False, "MixtralForCausalLM"),
                   "qwen3-moe-x": ("qwen3_moe", False, "Qwen3MoeForCausalLM")}

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.tensors = {}
        for seed, (name, (arch, tie, hf)) in enumerate(cls.CHECKPOINTS.items()):
            cls.tensors[name] = random_tensors(vl.checkpoint_shapes(arch, tie), seed)
            write_checkpoint(os.path.join(cls.tmp.name, name), cls.tensors[name], hf and hf_config(hf, tie))
        for seed, (name, c) in enumerate({**DEEPSEEK, **DEEPSEEK_FP8}.items(), start=100):
            cls.tensors[name] = random_tensors(vl.deepseek_checkpoint(c), seed)
            write_checkpoint(os.path.join(cls.tmp.name, name), cls.tensors[name], c.hf())
        cls.tensors["qwen2-moe-x"] = random_tensors(vl.qwen2_moe_checkpoint(), 200)
        write_checkpoint(os.path.join(cls.tmp.name, "qwen2-moe-x"), cls.tensors["qwen2-moe-x"], vl.Qwen2MoeConfig.hf())
        cls.proc, cls.url = serve(cls.tmp.name, log_level="error")
        cls.client = shardsrv.Client(cls.url, attempts=2, backoff=0.05)

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=30)
        cls.tmp.cleanup()

    def load_both(self, checkpoint, tp, r, ep):
        arch, tie, _ = self.CHECKPOINTS[checkpoint]
        real = vl.TinyModel(vl.Rank(tp, r, ep), arch, tie)
        with torch.no_grad():
            real.load_weights(iter(self.tensors[checkpoint].items()))
        streamed = vl.TinyModel(vl.Rank(tp, r, ep), arch, tie)
        report = loader.load_model_weights(streamed, self.client, checkpoint)
        return real, streamed, report


class Equivalence(LiveCheckpoints):
    def ranks(self):
        for tp in (1, 2, 4, 8):
            for ep in (False, True):
                for r in range(tp):
                    yield tp, r, ep

    def test_every_rank_loads_as_the_models_own_loaders_do(self):
        for checkpoint in ("everything", "everything-tied"):
            for tp, r, ep in self.ranks():
                with self.subTest(checkpoint=checkpoint, tp=tp, rank=r, ep=ep):
                    real, streamed, report = self.load_both(checkpoint, tp, r, ep)
                    want, got = state(real), state(streamed)
                    self.assertEqual(sorted(want), sorted(got))
                    differ = [n for n in want if want[n] != got[n]]
                    self.assertEqual(differ, [], "parameters whose bytes differ")
                    # Mamba's A = -exp(A_log) is the only loader that computes on values.
                    self.assertEqual(report.fallbacks, ["ssm.A_log"])
                    self.assertEqual(report.requests, 1)
                    fallback_bytes = 4 * vl.Config.heads
                    self.assertEqual(report.bytes_fetched, report.bytes_needed + fallback_bytes)

    def test_capture_is_deterministic_and_logged(self):
        model = vl.TinyModel(vl.Rank(4, 1, True))
        listing = self.client.tensors("everything")["tensors"]
        with self.assertLogs("shardsrv", logging.INFO) as logs:
            first = cap.capture(model, listing).table()
        second = cap.capture(vl.TinyModel(vl.Rank(4, 1, True)), listing).table()
        self.assertEqual(json.dumps(first), json.dumps(second))
        self.assertRegex(logs.output[-1], r"captured \d+ tensors into \d+ blocks, 1 fallbacks \(ssm.A_log\)")

    def test_bounded_requests_and_staging_give_the_same_bytes(self):
        real, _, _ = self.load_both("everything", 2, 1, False)
        streamed = vl.TinyModel(vl.Rank(2, 1, False))
        report = loader.load_model_weights(streamed, self.client, "everything", max_request_bytes=20000,
                                           staging_bytes=256)
        self.assertGreater(report.requests, 3)
        self.assertEqual(state(real), state(streamed))

    def test_a_parameter_nothing_writes_fails_the_load_by_name(self):
        listing = [t for t in self.client.tensors("everything")["tensors"] if t["name"] != "model.norm.weight"]
        with self.assertRaisesRegex(loader.LoadError, r"1 parameters: model\.norm\.weight"):
            loader.load_model_weights(vl.TinyModel(vl.Rank(2, 0)), self.client, "everything", tensors=listing)

    def test_deepseek_agrees_with_the_servers_vllm_layout(self):
        """DeepSeek-V3 (with and without q_lora_rank) captured at every rank against the server's
        layout, the names mapped as vLLM v0.10.2's state dict has them (server_name)."""
        for checkpoint, c in DEEPSEEK.items():
            for tp, r, ep in self.ranks():
                with self.subTest(checkpoint=checkpoint, tp=tp, rank=r, ep=ep):
                    model = vl.DeepseekV3(vl.Rank(tp, r, ep), c)
                    report = loader.load_model_weights(model, self.client, checkpoint)
                    self.assertEqual(report.fallbacks, [])
                    got = {server_name(n): b for n, b in state(model).items() if b}
                    layout = {"engine": "vllm", "engine_version": "0.10", "tensor_parallel_size": tp,
                              "tp_rank": r, "enable_expert_parallel": ep}
                    parsed, _ = shardsrv.parse_safetensors(self.client.fetch(checkpoint, layout=layout,
                                                                             format="safetensors"))
                    want = {n: bytes(buf) for n, (_, _, buf) in parsed.items()}
                    self.assertEqual(sorted(want), sorted(got))
                    self.assertEqual([n for n in want if want[n] != got[n]], [])

    def assert_loads_exactly_and_as_the_server_lays_out(self, checkpoint, build, tp, r, ep, names=lambda n: n):
        """(a) the model's load_weights on the whole tensors against (b) capture -> shardsrv ->
        load_model_weights, byte for byte, and (b) against the server's vllm layout (v0.10), the
        names mapped by names."""
        real = build(vl.Rank(tp, r, ep))
        with torch.no_grad():
            real.load_weights(iter(self.tensors[checkpoint].items()))
        model = build(vl.Rank(tp, r, ep))
        report = loader.load_model_weights(model, self.client, checkpoint)
        self.assertEqual(report.fallbacks, [])
        want, got = state(real), state(model)
        self.assertEqual(sorted(want), sorted(got))
        self.assertEqual([n for n in want if want[n] != got[n]], [], "parameters whose bytes differ")
        got = {names(n): b for n, b in got.items() if b}  # the saved state dict drops empty tensors
        layout = {"engine": "vllm", "engine_version": "0.10", "tensor_parallel_size": tp, "tp_rank": r,
                  "enable_expert_parallel": ep}
        parsed, _ = shardsrv.parse_safetensors(self.client.fetch(checkpoint, layout=layout, format="safetensors"))
        want = {n: bytes(buf) for n, (_, _, buf) in parsed.items()}
        self.assertEqual(sorted(want), sorted(got))
        self.assertEqual([n for n in want if want[n] != got[n]], [])

    def test_block_fp8_deepseek_loads_exactly_and_agrees_with_the_servers_vllm_layout(self):
        """Block-FP8 DeepSeek-V3 (weights as FP8 bit patterns, weight_scale_inv split in blocks)
        at every rank, EP off and on."""
        for checkpoint, c in DEEPSEEK_FP8.items():
            for tp, r, ep in self.ranks():
                with self.subTest(checkpoint=checkpoint, tp=tp, rank=r, ep=ep):
                    self.assert_loads_exactly_and_as_the_server_lays_out(
                        checkpoint, lambda rank: vl.DeepseekV3(rank, c), tp, r, ep, server_name)

    def test_qwen2_moe_loads_exactly_and_agrees_with_the_servers_vllm_layout(self):
        """Qwen2-MoE (dense and sparse layers, experts, the TP-split shared_expert, the whole
        shared_expert_gate) at every rank, EP off and on."""
        for tp, r, ep in self.ranks():
            with self.subTest(tp=tp, rank=r, ep=ep):
                self.assert_loads_exactly_and_as_the_server_lays_out("qwen2-moe-x", vl.Qwen2Moe, tp, r, ep)

    def test_a_body_damaged_on_every_attempt_fails_the_load(self):
        from test_client import Proxy
        proxy = Proxy(self.url, flip=True)
        self.addCleanup(proxy.close)
        client = shardsrv.Client(proxy.url, attempts=2, backoff=0.01)
        with self.assertLogs("shardsrv", logging.WARNING), self.assertRaises(shardsrv.DigestError):
            loader.load_model_weights(vl.TinyModel(vl.Rank(2, 0)), client, "everything")
        self.assertEqual(proxy.shards(), 2, "retried once, then failed")

    def test_the_capture_agrees_with_the_servers_vllm_layout(self):
        """The server's "engine": "vllm" layout (vLLM v0.10.2's rules) against the capture of models
        whose loaders follow vLLM's, for the architectures both cover. With tied embeddings the
        server names the one parameter lm_head.weight (the state dict's smaller key); the model's
        named_parameters calls it model.embed_tokens.weight."""
        for checkpoint in ("llama-x", "llama-x-tied", "qwen2-x", "qwen3-x", "mixtral-x", "qwen3-moe-x"):
            for tp, r, ep in self.ranks():
                if ep and checkpoint not in ("mixtral-x", "qwen3-moe-x"):  # expert parallelism needs experts
                    continue
                with self.subTest(checkpoint=checkpoint, tp=tp, rank=r, ep=ep):
                    arch, tie, _ = self.CHECKPOINTS[checkpoint]
                    model = vl.TinyModel(vl.Rank(tp, r, ep), arch, tie)
                    loader.load_model_weights(model, self.client, checkpoint)
                    got = state(model)
                    if tie:
                        got["lm_head.weight"] = got.pop("model.embed_tokens.weight")
                    got = {n: b for n, b in got.items() if b}  # the saved state dict drops empty tensors
                    layout = {"engine": "vllm", "engine_version": "0.10", "tensor_parallel_size": tp, "tp_rank": r,
                              "enable_expert_parallel": ep}
                    body = self.client.fetch(checkpoint, layout=layout, format="safetensors")
                    parsed, _ = shardsrv.parse_safetensors(body)
                    want = {n: bytes(buf) for n, (_, _, buf) in parsed.items()}
                    self.assertEqual(sorted(want), sorted(got))
                    self.assertEqual([n for n in want if want[n] != got[n]], [])


def stand_in_vllm():
    """The part of vLLM the plugin touches, as vLLM's sources define it (model_loader/__init__.py's
    register_model_loader and get_model_loader, base_loader.py's BaseModelLoader with its abstract
    download_model and load_weights and its load_model: build the model, load_weights, then
    process_weights_after_loading). vLLM itself cannot be installed where these tests run."""
    import abc
    import types
    registry = {}

    class BaseModelLoader(abc.ABC):
        def __init__(self, load_config):
            self.load_config = load_config

        @abc.abstractmethod
        def download_model(self, model_config):
            raise NotImplementedError

        @abc.abstractmethod
        def load_weights(self, model, model_config):
            raise NotImplementedError

        def load_model(self, vllm_config, model_config):
            model = vllm_config.initialize_model()
            self.load_weights(model, model_config)
            for module in model.modules():
                if hasattr(module, "process_weights_after_loading"):
                    module.process_weights_after_loading()
            return model.eval()

    def register_model_loader(load_format):
        def wrapper(cls):
            if not issubclass(cls, BaseModelLoader):
                raise ValueError("The model loader must be a subclass of `BaseModelLoader`.")
            registry[load_format] = cls
            return cls
        return wrapper

    def get_model_loader(load_config):
        return registry[load_config.load_format](load_config)

    loader_mod = types.ModuleType("vllm.model_executor.model_loader")
    loader_mod.register_model_loader, loader_mod.get_model_loader = register_model_loader, get_model_loader
    base = types.ModuleType("vllm.model_executor.model_loader.base_loader")
    base.BaseModelLoader = BaseModelLoader
    return {"vllm": types.ModuleType("vllm"), "vllm.model_executor": types.ModuleType("vllm.model_executor"),
            "vllm.model_executor.model_loader": loader_mod, "vllm.model_executor.model_loader.base_loader": base}


@unittest.skipIf(torch is None, "the plugin needs torch")
class Plugin(unittest.TestCase):
    def test_the_entry_point_names_register(self):
        try:
            import tomllib
        except ImportError:
            self.skipTest("tomllib arrived in Python 3.11")
        with open(os.path.join(os.path.dirname(__file__), "..", "pyproject.toml"), "rb") as f:
            project = tomllib.load(f)["project"]
        self.assertEqual(project["entry-points"]["vllm.general_plugins"], {"shardsrv": "shardsrv.vllm_plugin:register"})
        from shardsrv import vllm_plugin
        self.assertTrue(callable(vllm_plugin.register))

    def test_extra_config(self):
        from shardsrv.vllm_plugin import parse_extra_config
        with tempfile.NamedTemporaryFile("w") as f:
            f.write("s3cret\n")
            f.flush()
            self.assertEqual(parse_extra_config({"url": "http://x:8080", "checkpoint": "c", "token_file": f.name}),
                             ("http://x:8080", "c", "s3cret"))
        self.assertEqual(parse_extra_config({"url": "http://x", "checkpoint": "c"}), ("http://x", "c", None))
        with self.assertRaisesRegex(ValueError, '"checkpoint"'):
            parse_extra_config({"url": "http://x"})
        with self.assertRaisesRegex(ValueError, r"unknown fields \['tp'\]"):
            parse_extra_config({"url": "http://x", "checkpoint": "c", "tp": 2})
        with self.assertRaisesRegex(ValueError, '"url"'):
            parse_extra_config(None)


class PluginLoad(LiveCheckpoints):
    """The plugin's path end to end: vLLM's get_model_loader and load_model (the stand-in) with
    --load-format shardsrv, against the live server."""

    def test_the_plugin_loads_through_vllms_loader_api(self):
        from unittest import mock
        import types
        with mock.patch.dict(sys.modules, stand_in_vllm()):
            from shardsrv import vllm_plugin
            vllm_plugin.register()
            get_model_loader = sys.modules["vllm.model_executor.model_loader"].get_model_loader
            for tp, r, ep in [(1, 0, False), (2, 1, False), (8, 5, True)]:
                with self.subTest(tp=tp, rank=r, ep=ep):
                    load_config = types.SimpleNamespace(load_format="shardsrv", model_loader_extra_config={
                        "url": self.url, "checkpoint": "everything"})
                    vllm_config = types.SimpleNamespace(initialize_model=lambda: vl.TinyModel(vl.Rank(tp, r, ep)))
                    loader_ = get_model_loader(load_config)
                    loader_.download_model(None)
                    with self.assertLogs("shardsrv", logging.INFO) as logs:
                        model = loader_.load_model(vllm_config, None)
                    self.assertIn("fallbacks=1", logs.output[-1])
                    real = vl.TinyModel(vl.Rank(tp, r, ep))
                    with torch.no_grad():
                        real.load_weights(iter(self.tensors["everything"].items()))
                    self.assertEqual(state(model), state(real))


class StreamingParts(unittest.TestCase):
    """Client.fetch_into_parts, which the loader streams through, against a scripted server."""

    BODY = b"0123456789"

    def parts(self, log):
        views = [memoryview(bytearray(n)) for n in (3, 3, 4)]

        def parts():
            for i, v in enumerate(views):
                yield v, (lambda i=i, v=v: log.append((i, bytes(v))))
        return parts

    def test_parts_are_filled_in_order_and_again_on_a_retry(self):
        from test_client import Scripted, sha256_field
        good = (200, {"Shard-Length": "10"}, self.BODY, {"Repr-Digest": sha256_field(self.BODY)})
        bad = (200, {"Shard-Length": "10"}, self.BODY, {"Repr-Digest": sha256_field(b"else")})
        s = Scripted(bad, good)
        self.addCleanup(s.close)
        log = []
        c = shardsrv.Client(s.url, attempts=2, backoff=0.01)
        with self.assertLogs("shardsrv", logging.WARNING):
            self.assertEqual(c.fetch_into_parts({}, 10, self.parts(log)), sha256_field(self.BODY))
        want = [(0, b"012"), (1, b"345"), (2, b"6789")]
        self.assertEqual(log, want + want, "each attempt fills every part")

    def test_a_short_body_fails_after_the_retries_and_a_wrong_length_at_once(self):
        from test_client import Scripted
        s = Scripted(*[(200, {"Content-Length": "10"}, self.BODY[:6])] * 2)
        self.addCleanup(s.close)
        log = []
        with self.assertLogs("shardsrv", logging.WARNING), self.assertRaises(shardsrv.ShortBodyError) as ctx:
            shardsrv.Client(s.url, attempts=2, backoff=0.01).fetch_into_parts({}, 10, self.parts(log))
        self.assertEqual((ctx.exception.got, ctx.exception.want), (6, 10))
        self.assertEqual(log, [(0, b"012"), (1, b"345")] * 2, "the parts before the cut were filled")
        s.script = [(200, {}, self.BODY)] * 2
        with self.assertRaisesRegex(ValueError, "the shard is 10 bytes, not the 12"):
            shardsrv.Client(s.url, attempts=2, backoff=0.01).fetch_into_parts({}, 12, self.parts([]))
        self.assertEqual(len(s.script), 1, "not retried")


if __name__ == "__main__":
    unittest.main()
