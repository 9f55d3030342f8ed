"""Tests of the Python client, against a live shardsrv serving the example checkpoint and against a
scripted local server for the retry policy.

Run with `python3 -m unittest discover -s clients/python/tests` after `make build`
(SHARDSRV_BIN points at the binary; default bin/shardsrv).
"""

import array
import base64
import ctypes
import hashlib
import http.client
import http.server
import io
import json
import mmap
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
import types
import unittest
import urllib.error
import urllib.parse
import urllib.request
from unittest import mock

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

import shardsrv  # noqa: E402

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))
CKPT = "qwen2-moe-tiny"
L0, L1 = "model.layers.0.", "model.layers.1."


BINARY = os.environ.get("SHARDSRV_BIN", os.path.join(ROOT, "bin", "shardsrv"))


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(store, log_level="warn"):
    """A shardsrv serving the checkpoint folders in store, once it answers: (process, URL)."""
    port = free_port()
    proc = subprocess.Popen([BINARY, "serve", "--store", store, "--addr", f"127.0.0.1:{port}",
                             "--log-level", log_level])
    url = f"http://127.0.0.1:{port}"
    for _ in range(200):
        try:
            urllib.request.urlopen(url + "/healthz", timeout=1).read()
            break
        except OSError:
            time.sleep(0.05)
    return proc, url


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


def vllm(tp, rank, ep=False, **kw):
    """A vLLM layout on the "0.10" line, the release these tests' expected names and slices follow."""
    return dict({"engine": "vllm", "engine_version": "0.10", "tensor_parallel_size": tp, "tp_rank": rank,
                 "enable_expert_parallel": ep}, **kw)


def sha256_field(body):
    """The RFC 9530 Repr-Digest value of body."""
    return "sha-256=:" + base64.b64encode(hashlib.sha256(body).digest()).decode() + ":"


class Proxy:
    """A local HTTP proxy in front of a server that passes each exchange through whole — the
    request's headers, the response's headers and a chunked body's trailer fields — except that,
    while flip is set, one byte in the middle of every 200 /v1/shards body is flipped. It records
    the requests' headers and the server's responses (status, headers, trailers or None)."""

    HOP = {"connection", "keep-alive", "proxy-connection", "te", "trailer", "transfer-encoding", "upgrade", "host",
           "content-length", "date", "server"}

    def __init__(self, upstream, flip=True):
        self.flip, self.requests, self.responses = flip, [], []
        up = urllib.parse.urlsplit(upstream)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.requests.append((self.path, self.headers))
                conn = http.client.HTTPConnection(up.hostname, up.port, timeout=60)
                conn.response_class = shardsrv._TrailerResponse  # keeps the trailer, as the client does
                conn.request(self.command, self.path, body=body or None,
                             headers={k: v for k, v in self.headers.items() if k.lower() not in Proxy.HOP})
                res = conn.getresponse()
                data = bytearray(res.read())
                conn.close()
                outer.responses.append((res.status, res.headers, res.trailers))
                if outer.flip and res.status == 200 and self.path == "/v1/shards" and data:
                    data[len(data) // 2] ^= 0x10
                self.send_response(res.status)
                for k, v in res.headers.items():
                    if k.lower() not in Proxy.HOP or k.lower() == "trailer":
                        self.send_header(k, v)
                if res.chunked:
                    self.send_header("Transfer-Encoding", "chunked")
                else:
                    self.send_header("Content-Length", str(len(data)))
                self.send_header("Connection", "close")
                self.end_headers()
                if not res.chunked:
                    self.wfile.write(data)
                    return
                half = len(data) // 3
                for part in (data[:half], data[half:]):  # two chunks
                    if part:
                        self.wfile.write(b"%x\r\n" % len(part) + part + b"\r\n")
                self.wfile.write(b"0\r\n")
                for k, v in (res.trailers or {}).items():
                    self.wfile.write(f"{k}: {v}\r\n".encode("latin-1"))
                self.wfile.write(b"\r\n")

            do_GET = do_POST

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def shards(self):
        """How many /v1/shards requests came through."""
        return sum(path == "/v1/shards" for path, _ in self.requests)

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class ExampleServer(unittest.TestCase):
    """A live shardsrv serving the example checkpoint, written into a temporary directory (tmp)."""

    @classmethod
    def setUpClass(cls):
        cls.tmp = tempfile.TemporaryDirectory()
        cls.store = os.path.join(cls.tmp.name, "checkpoints")
        subprocess.run([BINARY, "example", "--out", cls.store], check=True, stdout=subprocess.DEVNULL)
        cls.proc, cls.url = serve(cls.store)

    @classmethod
    def tearDownClass(cls):
        cls.proc.terminate()
        cls.proc.wait(timeout=30)
        cls.tmp.cleanup()


class LiveServer(ExampleServer):
    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.client = shardsrv.Client(cls.url, attempts=2, backoff=0.05)
        cls.folder = os.path.join(cls.store, CKPT)
        cls.data = read_checkpoint(cls.folder)

    def rows(self, name, lo, hi):
        """Rows [lo, hi) of a checkpoint tensor (elements, for a 1-d one), BF16."""
        shape, data = self.data[name]
        row = (shape[1] if len(shape) > 1 else 1) * 2
        return data[lo * row:hi * row]

    def cols(self, name, lo, hi):
        """Columns [lo, hi) of every row of a 2-d checkpoint tensor, BF16."""
        (rows, n), data = self.data[name]
        return b"".join(data[(r * n + lo) * 2:(r * n + hi) * 2] for r in range(rows))

    def safetensors(self, layout):
        parsed, meta = shardsrv.parse_safetensors(self.client.fetch(CKPT, layout=layout, format="safetensors"))
        self.assertEqual(meta["shardsrv.checkpoint"], CKPT)
        return {name: (dtype, shape, bytes(buf)) for name, (dtype, shape, buf) in parsed.items()}

    def test_listings(self):
        self.assertEqual(self.client.checkpoints(), [CKPT])
        shapes = {t["name"]: t["shape"] for t in self.client.tensors(CKPT)["tensors"]}
        self.assertEqual(shapes[L0 + "self_attn.q_proj.weight"], [64, 64])

    def test_a_layout_serves_its_table(self):
        for layout in (vllm(2, 1), vllm(2, 0, ep=True), vllm(1, 0, dtype="F32")):
            table = self.client.layout(CKPT, layout)
            self.assertEqual(table[0]["name"], "model.embed_tokens.weight")
            self.assertEqual(self.client.fetch(CKPT, layout=layout), self.client.fetch(CKPT, tensors=table))
            by_layout, meta = shardsrv.parse_safetensors(self.client.fetch(CKPT, layout=layout, format="safetensors"))
            by_table, _ = shardsrv.parse_safetensors(
                self.client.fetch({"checkpoint": CKPT, "tensors": table, "format": "safetensors"}))
            self.assertEqual({n: (d, s, bytes(b)) for n, (d, s, b) in by_layout.items()},
                             {n: (d, s, bytes(b)) for n, (d, s, b) in by_table.items()})
            # a layout's body names the release line its table follows; the table's alone cannot
            self.assertEqual((meta["shardsrv.engine"], meta["shardsrv.engine_version"]), ("vllm", "0.10"))
            plan = self.client.plan(CKPT, layout=layout)
            self.assertEqual(plan["summary"]["output_bytes"], len(self.client.fetch(CKPT, tensors=table)))

    def test_tp_rank_bytes_follow_vllm(self):
        """TP=2 rank 1, checked by slicing the checkpoint's own tensors as vLLM does."""
        got = self.safetensors(vllm(2, 1))
        q, k, v = (L0 + f"self_attn.{p}_proj." for p in "qkv")
        # The vocabulary (256, a multiple of 64) splits into 128 rows per rank.
        self.assertEqual(got["model.embed_tokens.weight"],
                         ("BF16", [128, 64], self.rows("model.embed_tokens.weight", 128, 256)))
        self.assertEqual(got["lm_head.weight"][2], self.rows("lm_head.weight", 128, 256))
        # QKVParallelLinear: rank r's rows are [q_r; k_r; v_r] (2 of 4 query heads, 1 of 2 KV heads, 16 wide).
        self.assertEqual(got[L0 + "self_attn.qkv_proj.weight"],
                         ("BF16", [64, 64], self.rows(q + "weight", 32, 64) + self.rows(k + "weight", 16, 32)
                          + self.rows(v + "weight", 16, 32)))
        self.assertEqual(got[L0 + "self_attn.qkv_proj.bias"][2],
                         self.rows(q + "bias", 32, 64) + self.rows(k + "bias", 16, 32) + self.rows(v + "bias", 16, 32))
        self.assertEqual(got[L0 + "self_attn.o_proj.weight"],
                         ("BF16", [64, 32], self.cols(L0 + "self_attn.o_proj.weight", 32, 64)))
        # MergedColumnParallelLinear: [gate_r; up_r]; the down projection splits its columns.
        g, u, d = (L0 + f"mlp.{p}_proj.weight" for p in ("gate", "up", "down"))
        self.assertEqual(got[L0 + "mlp.gate_up_proj.weight"],
                         ("BF16", [128, 64], self.rows(g, 64, 128) + self.rows(u, 64, 128)))
        self.assertEqual(got[L0 + "mlp.down_proj.weight"][2], self.cols(d, 64, 128))
        # FusedMoE without expert parallelism: every expert split by TP, w13 [E, 2I/tp, H], w2 [E, H, I/tp].
        ex = [f"{L1}mlp.experts.{e}." for e in range(4)]
        self.assertEqual(got[L1 + "mlp.experts.w13_weight"],
                         ("BF16", [4, 32, 64], b"".join(self.rows(e + "gate_proj.weight", 16, 32)
                                                        + self.rows(e + "up_proj.weight", 16, 32) for e in ex)))
        self.assertEqual(got[L1 + "mlp.experts.w2_weight"],
                         ("BF16", [4, 64, 16], b"".join(self.cols(e + "down_proj.weight", 16, 32) for e in ex)))
        self.assertEqual(got[L1 + "mlp.gate.weight"][2], self.data[L1 + "mlp.gate.weight"][1])
        self.assertEqual(got["model.norm.weight"][2], self.data["model.norm.weight"][1])

    def test_expert_parallel_rank_holds_whole_experts(self):
        got = self.safetensors(vllm(2, 1, ep=True))
        ex = [f"{L1}mlp.experts.{e}." for e in (2, 3)]
        self.assertEqual(got[L1 + "mlp.experts.w13_weight"],
                         ("BF16", [2, 64, 64], b"".join(self.data[e + "gate_proj.weight"][1]
                                                        + self.data[e + "up_proj.weight"][1] for e in ex)))
        self.assertEqual(got[L1 + "mlp.experts.w2_weight"][2],
                         b"".join(self.data[e + "down_proj.weight"][1] for e in ex))

    def test_files(self):
        files = self.client.files(CKPT)
        self.assertEqual([f["name"] for f in files],
                         ["config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json"])
        for f in files:
            with open(os.path.join(self.folder, f["name"]), "rb") as disk:
                want = disk.read()
            self.assertEqual(self.client.file(CKPT, f["name"]), want)
            self.assertEqual(f["size"], len(want))
        self.assertEqual(json.loads(self.client.file(CKPT, "config.json"))["architectures"], ["Qwen2MoeForCausalLM"])
        with self.assertRaises(shardsrv.ProblemError) as ctx:
            self.client.file(CKPT, "tokenizer.model")  # a small file's name the checkpoint does not have
        self.assertEqual(ctx.exception.status, 404)

    def test_problems_are_typed_errors(self):
        norm = {"name": "n", "dtype": "BF16", "shape": [64], "boxes": [{"offsets": [0], "lengths": [64]}],
                "blocks": [{"offsets": [0], "lengths": [64], "source": "missing", "base": [0], "coeff": [[1]]}]}
        with self.assertRaises(shardsrv.ProblemError) as ctx:
            self.client.fetch(CKPT, tensors=[norm])
        self.assertEqual(ctx.exception.status, 422)
        self.assertEqual(ctx.exception.errors[0]["pointer"], "/tensors/0/blocks/0/source")
        with self.assertRaises(shardsrv.ProblemError) as ctx:
            self.client.layout(CKPT, vllm(3, 0))  # the padded vocabulary (256) does not split over 3
        self.assertEqual((ctx.exception.status, ctx.exception.errors[0]["pointer"]),
                         (422, "/layout/tensor_parallel_size"))
        with self.assertRaises(shardsrv.ProblemError) as ctx:
            self.client.tensors("no-such-checkpoint")
        self.assertEqual(ctx.exception.status, 404)
        with self.assertRaises(ValueError):
            self.client.fetch(CKPT)  # a checkpoint name needs layout= or tensors=

    def test_fetch_into_any_writable_buffer(self):
        want = self.client.fetch(CKPT, layout=vllm(2, 0))
        n = len(want)
        buffers = {"bytearray": bytearray(n), "memoryview": memoryview(bytearray(n)),
                   "array": array.array("H", bytes(n)),
                   "mmap": mmap.mmap(-1, n), "ctypes": (ctypes.c_char * n)(), "larger": bytearray(n + 100)}
        try:
            import numpy
            buffers["numpy"] = numpy.zeros((n // 2,), dtype=numpy.uint16)
        except ImportError:
            pass
        # A CPU torch storage or tensor (no buffer protocol): data_ptr, nbytes and a device.
        backing = (ctypes.c_char * n)()
        buffers["storage-like"] = types.SimpleNamespace(data_ptr=lambda: ctypes.addressof(backing), nbytes=lambda: n,
                                                        device="cpu")
        buffers["tensor-like"] = types.SimpleNamespace(data_ptr=lambda: ctypes.addressof(backing), numel=lambda: n // 2,
                                                       element_size=lambda: 2, device="cpu",
                                                       is_contiguous=lambda: True)
        try:
            import torch
            # untyped_storage arrived in torch 2.0; 1.13's storage() is a TypedStorage.
            tensor = torch.empty(n, dtype=torch.uint8)
            storage = tensor.untyped_storage() if hasattr(tensor, "untyped_storage") else tensor.storage()
            buffers["torch-storage"] = storage
            buffers["torch-tensor"] = torch.empty(n // 2, dtype=torch.bfloat16)
            buffers["torch-2d-tensor"] = torch.empty(2, n // 4, dtype=torch.bfloat16)
        except ImportError:
            pass
        for kind, buf in buffers.items():
            with self.subTest(kind), \
                    mock.patch.object(http.client.HTTPResponse, "read", side_effect=AssertionError("read copies")):
                # Streaming uses readinto only: the bytes go from the socket into the buffer.
                self.assertEqual(self.client.fetch_into(CKPT, buf, layout=vllm(2, 0)), n)
                self.assertEqual(bytes(shardsrv._bytes_of(buf)[:n]), want)
        with self.assertRaises(TypeError):
            self.client.fetch_into(CKPT, bytes(n), layout=vllm(2, 0))  # read-only
        with self.assertRaises(ValueError):
            self.client.fetch_into(CKPT, bytearray(n - 1), layout=vllm(2, 0))  # too small
        with self.assertRaises(TypeError):
            gpu = types.SimpleNamespace(data_ptr=lambda: 0, nbytes=lambda: n, device="cuda:0")
            self.client.fetch_into(CKPT, gpu, layout=vllm(2, 0))

    def test_fetch_into_a_non_contiguous_tensor_says_so(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is optional")
        n = len(self.client.fetch(CKPT, layout=vllm(2, 0)))
        transposed = torch.empty(2, n // 4, dtype=torch.bfloat16).t()
        with self.assertRaisesRegex(TypeError, "needs a contiguous tensor"):
            self.client.fetch_into(CKPT, transposed, layout=vllm(2, 0))

    def test_fetch_holds_the_body_once(self):
        head = {"name": "h", "dtype": "F32", "shape": [256, 64], "boxes": [{"offsets": [0, 0], "lengths": [256, 64]}],
                "blocks": [{"offsets": [0, 0], "lengths": [256, 64], "source": "lm_head.weight", "base": [0, 0],
                            "coeff": [[1, 0], [0, 1]]}]}
        tensors = [dict(head, name=f"h{i}") for i in range(64)]  # 4 MiB
        tracemalloc.start()
        try:
            body = self.client.fetch(CKPT, tensors=tensors)
            _, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        self.assertEqual(len(body), 64 * 256 * 64 * 4)
        self.assertLess(peak, 1.25 * len(body), "the body was held more than once")

    def test_fetch_to_file_reports_progress(self):
        seen = []
        with tempfile.NamedTemporaryFile() as f:
            n = self.client.fetch_to_file(CKPT, f.name, progress=lambda done, total: seen.append((done, total)),
                                          layout=vllm(1, 0))
            self.assertEqual(os.path.getsize(f.name), n)
        self.assertEqual(seen[-1], (n, n))

    def proxy(self, flip):
        p = Proxy(self.url, flip)
        self.addCleanup(p.close)
        return p

    def fetch_paths(self, c, request):
        """Fetches request by every path the client has; yields (path name, bytes fetched, digest)."""
        body, digest = c.fetch_verified(request)
        yield "fetch_verified", bytes(body), digest
        yield "fetch", bytes(c.fetch(request)), None
        for kind, make in (("bytearray", lambda: bytearray(len(body))), ("larger", lambda: bytearray(len(body) + 9)),
                           ("mmap", lambda: mmap.mmap(-1, len(body)))):
            buf = make()
            n = c.fetch_into(request, buf)
            yield "fetch_into " + kind, bytes(memoryview(buf)[:n]), None
            buf = make()
            n, digest = c.fetch_verified(request, buf)
            yield "fetch_verified " + kind, bytes(memoryview(buf)[:n]), digest
        for verified in (False, True):
            f = io.BytesIO(b"head:")
            f.seek(5)
            n, digest = c.fetch_verified(request, f) if verified else (c.fetch_into(request, f), None)
            self.assertEqual(f.getvalue()[:5], b"head:")
            yield ("fetch_verified" if verified else "fetch_into") + " file object", f.getvalue()[5:5 + n], digest
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "shard")
            n = c.fetch_to_file(request, path)
            with open(path, "rb") as f:
                yield "fetch_to_file", f.read(), None
            self.assertEqual(os.path.getsize(path), n)
            n, digest = c.fetch_verified(request, pathlib.Path(path))
            with open(path, "rb") as f:
                yield "fetch_verified path", f.read(), digest

    def test_a_first_read_trails_the_digest_and_later_ones_send_it_as_a_header(self):
        """What the rest assumes: a body the server streams the first time comes chunked, its length in
        Shard-Length, its digest after it; once the server knows its digest, the digest comes first,
        as a header, and the body with a Content-Length."""
        n = self.data["model.embed_tokens.weight"][0][1]
        # A row of the embedding no other test asks for: the server has not streamed this body yet.
        request = {"checkpoint": CKPT, "tensors": [{
            "name": "row", "dtype": "BF16", "shape": [1, n], "boxes": [{"offsets": [0, 0], "lengths": [1, n]}],
            "blocks": [{"source": "model.embed_tokens.weight", "offsets": [0, 0], "lengths": [1, n],
                        "base": [7, 0], "coeff": [[1, 0], [0, 1]]}]}]}
        responses = []
        for _ in range(2):
            conn = http.client.HTTPConnection("127.0.0.1", urllib.parse.urlsplit(self.url).port, timeout=60)
            conn.response_class = shardsrv._TrailerResponse
            conn.request("POST", "/v1/shards", json.dumps(request))
            res = conn.getresponse()
            responses.append((res, res.read()))
            conn.close()
        (first, body), (again, body_again) = responses
        self.assertEqual(body, self.rows("model.embed_tokens.weight", 7, 8))
        self.assertEqual(first.status, 200)
        self.assertTrue(first.chunked)
        self.assertIsNone(first.headers.get("Content-Length"))
        self.assertEqual(first.headers.get("Trailer"), "Repr-Digest")
        self.assertEqual(int(first.headers["Shard-Length"]), len(body))
        self.assertEqual(first.trailers.get_all("Repr-Digest"), [sha256_field(body)])
        self.assertEqual((again.status, body_again), (200, body))
        self.assertFalse(again.chunked)
        self.assertIsNone(again.trailers)
        self.assertIsNone(again.headers.get("Trailer"))
        self.assertEqual(again.headers.get("Content-Length"), str(len(body)))
        self.assertEqual(again.headers.get_all("Repr-Digest"), [sha256_field(body)])
        self.assertEqual(self.client.fetch_verified(request), (body, sha256_field(body)))

    def test_every_fetch_path_checks_the_digest(self):
        request = {"checkpoint": CKPT, "layout": vllm(2, 1), "format": "safetensors"}
        want = bytes(self.client.fetch(request))
        paths = 0
        with mock.patch("shardsrv._verify", wraps=shardsrv._verify) as verify:
            for path, got, digest in self.fetch_paths(self.client, request):
                paths += 1
                with self.subTest(path):
                    self.assertEqual(got, want)
                    if path.startswith("fetch_verified"):
                        self.assertEqual(digest, sha256_field(want))
        self.assertEqual(verify.call_count, paths)  # once a fetch, whatever the path
        # The server streamed this body whole once: every later response carries its digest as a header.
        self.assertTrue(all(call.args[0].headers.get("Repr-Digest") == sha256_field(want)
                            for call in verify.call_args_list))
        # Through a proxy that changes nothing, the digest comes through: the same.
        p = self.proxy(flip=False)
        self.assertEqual(shardsrv.Client(p.url).fetch_verified(request), (want, sha256_field(want)))

    def test_a_flipped_byte_fails_every_fetch_path(self):
        request = {"checkpoint": CKPT, "layout": vllm(2, 0)}
        want = sha256_field(bytes(self.client.fetch(request)))
        p = self.proxy(flip=True)
        c = shardsrv.Client(p.url, attempts=2, backoff=0.01)
        paths = {"fetch": lambda: c.fetch(request), "fetch_verified": lambda: c.fetch_verified(request),
                 "fetch_into": lambda: c.fetch_into(request, bytearray(1 << 20)),
                 "fetch_into file object": lambda: c.fetch_into(request, io.BytesIO())}
        with tempfile.TemporaryDirectory() as d:
            paths["fetch_to_file"] = lambda: c.fetch_to_file(request, os.path.join(d, "shard"))
            for path, fetch in paths.items():
                with self.subTest(path):
                    before = p.shards()
                    with self.assertLogs("shardsrv", "WARNING") as logs, self.assertRaises(shardsrv.DigestError) as ctx:
                        fetch()
                    self.assertEqual(p.shards() - before, 2, "retried, then raised")
                    self.assertIn("damaged in transit", logs.output[0])
                    self.assertEqual(ctx.exception.want, want)
                    self.assertNotEqual(ctx.exception.got, want)
                    self.assertTrue(ctx.exception.got.startswith("sha-256=:"))

    def test_declining_the_digest(self):
        request = {"checkpoint": CKPT, "layout": vllm(2, 0)}
        want = bytes(self.client.fetch(request))
        p = self.proxy(flip=False)
        body, digest = shardsrv.Client(p.url, digest=False).fetch_verified(request)
        self.assertEqual((body, digest), (want, None))
        (_, headers), = p.requests
        self.assertEqual(headers.get_all("Want-Repr-Digest"), ["sha-256=0"])
        (status, res_headers, trailers), = p.responses
        self.assertEqual(status, 200)
        self.assertIsNone(res_headers.get("Trailer"))
        self.assertIsNone(trailers, "a body with a trailer")
        self.assertEqual(res_headers.get("Content-Length"), str(len(want)))
        # A client that does not decline says nothing of it.
        shardsrv.Client(p.url).fetch(request)
        self.assertIsNone(p.requests[1][1].get("Want-Repr-Digest"))
        self.assertEqual(p.responses[1][1].get("Repr-Digest"), sha256_field(want))  # a header: the body was streamed
        # Declined, a flipped byte goes unnoticed: nothing checks the body but its length.
        p.flip = True
        body, digest = shardsrv.Client(p.url, digest=False).fetch_verified(request)
        self.assertEqual((len(body), digest), (len(want), None))
        self.assertNotEqual(body, want)

    def test_numpy_helper_when_installed(self):
        try:
            import numpy  # noqa: F401
        except ImportError:
            self.skipTest("numpy is optional")
        arr = shardsrv.to_numpy(self.data["model.norm.weight"][1], "BF16", [64])
        self.assertTrue((arr == 0x3F80).all())  # norms are ones


class Scripted:
    """A local HTTP server answering each request with the next (status, headers, body) of its script,
    then 200 with a checkpoint list. A Content-Length above the body's length cuts the body short.
    An entry (status, headers, body, trailers) sends the body chunked (in two chunks), then the
    trailer fields (a dict), over HTTP/1.1."""

    def __init__(self, *script):
        self.script, self.paths, self.headers = list(script), [], []
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                outer.paths.append(self.path)
                outer.headers.append(self.headers)
                status, headers, body, *trailers = outer.script.pop(0) if outer.script else \
                    (200, {}, b'{"checkpoints": ["x"]}')
                if trailers:
                    self.chunked(status, headers, body, trailers[0])
                    return
                self.send_response(status)
                headers = dict({"Content-Length": str(len(body))}, **headers)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(body)
                self.close_connection = int(headers["Content-Length"]) != len(body)

            def chunked(self, status, headers, body, trailers):
                self.protocol_version = "HTTP/1.1"
                self.send_response(status)
                for k, v in dict({"Transfer-Encoding": "chunked", "Trailer": ", ".join(trailers)}, **headers).items():
                    self.send_header(k, v)
                self.send_header("Connection", "close")
                self.end_headers()
                for part in (body[:len(body) // 2], body[len(body) // 2:]):
                    if part:
                        self.wfile.write(b"%x\r\n" % len(part) + part + b"\r\n")
                self.wfile.write(b"0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in trailers.items()) + b"\r\n")
                self.close_connection = True

            do_POST = do_GET

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def problem(status, retry_after=None):
    headers = {"Content-Type": "application/problem+json"}
    if retry_after is not None:
        headers["Retry-After"] = retry_after
    return status, headers, json.dumps({"type": "about:blank", "title": "scripted", "status": status}).encode()


class RetryPolicy(unittest.TestCase):
    def serve(self, *script):
        s = Scripted(*script)
        self.addCleanup(s.close)
        return s

    def test_transient_failures_are_retried_and_logged(self):
        s = self.serve(problem(503, "0"), problem(429), problem(502), problem(504), problem(408))
        c = shardsrv.Client(s.url, attempts=6, backoff=0.01)
        with self.assertLogs("shardsrv", "WARNING") as logs:
            self.assertEqual(c.checkpoints(), ["x"])
        self.assertEqual(len(s.paths), 6)
        self.assertEqual(len(logs.output), 5)
        self.assertIn("retrying GET /v1/checkpoints", logs.output[0])
        self.assertIn("attempt 2 of 6", logs.output[0])
        self.assertIn("503 scripted", logs.output[0])

    def test_what_cannot_succeed_is_not_retried(self):
        for status in (400, 401, 404, 413, 422):
            s = self.serve(problem(status))
            c = shardsrv.Client(s.url, attempts=5, backoff=60)  # a retry would hang the test
            with self.assertNoLogs("shardsrv", "WARNING"), self.assertRaises(shardsrv.ProblemError) as ctx:
                c.checkpoints()
            self.assertEqual((ctx.exception.status, len(s.paths)), (status, 1))
        for url in ("localhost:8080", "shardsrv:8080", "ftp://shardsrv", "http://"):
            with self.assertRaises(ValueError):
                shardsrv.Client(url)

    def test_a_server_failure_that_says_it_is_permanent_is_not_retried(self):
        body = {"type": "urn:shardsrv:problem:integrity-mismatch", "title": "scripted", "status": 502,
                "retryable": False}
        s = self.serve((502, {"Content-Type": "application/problem+json"}, json.dumps(body).encode()))
        c = shardsrv.Client(s.url, attempts=5, backoff=60)  # a retry would hang the test
        with self.assertNoLogs("shardsrv", "WARNING"), self.assertRaises(shardsrv.ProblemError) as ctx:
            c.checkpoints()
        self.assertEqual((ctx.exception.status, len(s.paths)), (502, 1))

    def test_backoff_is_jittered_on_top_of_retry_after(self):
        s = self.serve(problem(503, "2"), problem(503), problem(503))
        c = shardsrv.Client(s.url, attempts=4, backoff=0.1)
        with mock.patch("shardsrv.time.sleep") as sleep, \
                mock.patch("shardsrv.random.uniform", side_effect=lambda a, b: b / 2) as uniform, \
                self.assertLogs("shardsrv", "WARNING"):
            c.checkpoints()
        self.assertEqual([call.args for call in uniform.call_args_list], [(0, 0.1), (0, 0.2), (0, 0.4)])
        self.assertEqual([round(call.args[0], 6) for call in sleep.call_args_list], [2.05, 0.1, 0.2])

    def test_zero_attempts_send_one_request(self):
        s = self.serve()
        self.assertEqual(shardsrv.Client(s.url, attempts=0).checkpoints(), ["x"])
        s = self.serve(problem(503))
        with self.assertRaises(shardsrv.ProblemError):
            shardsrv.Client(s.url, attempts=0).checkpoints()
        self.assertEqual(len(s.paths), 1)

    def test_refused_connections_are_retried(self):
        c = shardsrv.Client(f"http://127.0.0.1:{free_port()}", attempts=2, backoff=0.01)
        with self.assertLogs("shardsrv", "WARNING") as logs, self.assertRaises(urllib.error.URLError):
            c.checkpoints()
        self.assertEqual(len(logs.output), 1)

    def test_tensors_follow_pages(self):
        page = lambda names, token=None: (200, {}, json.dumps(dict(
            {"checkpoint": "c", "tensors": [{"name": n, "dtype": "BF16", "shape": [1], "file": "f"} for n in names]},
            **({"next_page_token": token} if token else {}))).encode())
        s = self.serve(page(["a", "b"], "b"), page(["c"]))
        got = shardsrv.Client(s.url).tensors("org/c")
        self.assertEqual([t["name"] for t in got["tensors"]], ["a", "b", "c"])
        self.assertNotIn("next_page_token", got)
        self.assertEqual(s.paths, ["/v1/tensors?checkpoint=org%2Fc", "/v1/tensors?checkpoint=org%2Fc&page_token=b"])

    def test_a_cut_body_is_fetched_again(self):
        s = self.serve((200, {"Content-Length": "10"}, b"01234"), (200, {}, b"0123456789"))
        c = shardsrv.Client(s.url, attempts=2, backoff=0.01)
        with self.assertLogs("shardsrv", "WARNING"):
            self.assertEqual(c.fetch({"checkpoint": "x", "tensors": []}), b"0123456789")
        buf = bytearray(10)
        s.script = [(200, {"Content-Length": "10"}, b"01234"), (200, {}, b"0123456789")]
        with self.assertLogs("shardsrv", "WARNING"):
            self.assertEqual(c.fetch_into({"checkpoint": "x", "tensors": []}, buf), 10)
        self.assertEqual(buf, b"0123456789")
        # A file object is rewound to where it was; one that cannot be is not retried into.
        f = io.BytesIO(b"head:")
        f.seek(5)
        s.script = [(200, {"Content-Length": "10"}, b"01234"), (200, {}, b"0123456789")]
        with self.assertLogs("shardsrv", "WARNING"):
            c.fetch_into({"checkpoint": "x", "tensors": []}, f)
        self.assertEqual(f.getvalue(), b"head:0123456789")

        class Pipe(io.RawIOBase):
            def writable(self):
                return True

            def write(self, b):
                return len(b)
        s.script = [(200, {"Content-Length": "10"}, b"01234")]
        with self.assertRaises(RuntimeError):
            c.fetch_into({"checkpoint": "x", "tensors": []}, Pipe())


class Digests(unittest.TestCase):
    """The Repr-Digest trailer, against a scripted server."""

    BODY = b"0123456789"
    REQ = {"checkpoint": "x", "tensors": []}

    def serve(self, *script):
        s = Scripted(*script)
        self.addCleanup(s.close)
        return s

    def shard(self, body=BODY, digest=None, length=None):
        """A chunked shard response, trailing digest (default: body's own)."""
        return (200, {"Shard-Length": str(len(self.BODY) if length is None else length)}, body,
                {"Repr-Digest": sha256_field(self.BODY) if digest is None else digest})

    def test_a_body_that_fails_its_digest_is_fetched_again(self):
        wrong = sha256_field(b"something else")
        s = self.serve(self.shard(digest=wrong), self.shard())
        c = shardsrv.Client(s.url, attempts=2, backoff=0.01)
        with self.assertLogs("shardsrv", "WARNING") as logs:
            self.assertEqual(c.fetch_verified(self.REQ), (self.BODY, sha256_field(self.BODY)))
        self.assertIn(f"the server sent {wrong}", logs.output[0])
        for out in (bytearray(10), bytearray(20), io.BytesIO()):
            s.script = [self.shard(digest=wrong), self.shard()]
            with self.subTest(type(out).__name__), self.assertLogs("shardsrv", "WARNING"):
                self.assertEqual(c.fetch_verified(self.REQ, out), (10, sha256_field(self.BODY)))
            got = out.getvalue() if isinstance(out, io.BytesIO) else bytes(out[:10])
            self.assertEqual(got, self.BODY)
        # Out of attempts: a DigestError, with both digests.
        s.script = [self.shard(digest=wrong)] * 2
        with self.assertLogs("shardsrv", "WARNING"), self.assertRaises(shardsrv.DigestError) as ctx:
            c.fetch(self.REQ)
        self.assertEqual((ctx.exception.got, ctx.exception.want), (sha256_field(self.BODY), wrong))
        # A digest that is not base64 cannot match either.
        s.script = [self.shard(digest="sha-256=:not*base64:")]
        with self.assertRaises(shardsrv.DigestError):
            shardsrv.Client(s.url, attempts=1).fetch(self.REQ)

    def test_a_digest_header_is_checked_as_a_trailer_is(self):
        header = (200, {"Shard-Length": "10", "Content-Length": "10", "Repr-Digest": sha256_field(self.BODY)}, self.BODY)
        wrong = (200, {"Shard-Length": "10", "Content-Length": "10", "Repr-Digest": sha256_field(b"x")}, self.BODY)
        s = self.serve(header)
        c = shardsrv.Client(s.url, attempts=2, backoff=0.01)
        self.assertEqual(c.fetch_verified(self.REQ), (self.BODY, sha256_field(self.BODY)))
        for fetch in (lambda: c.fetch(self.REQ), lambda: c.fetch_into(self.REQ, bytearray(10)),
                      lambda: c.fetch_into(self.REQ, io.BytesIO())):
            s.script = [wrong, wrong]
            with self.assertLogs("shardsrv", "WARNING"), self.assertRaises(shardsrv.DigestError) as ctx:
                fetch()
            self.assertEqual(ctx.exception.want, sha256_field(b"x"))
        # A chunked body with the digest in its header and none trailing is checked against the header.
        s.script = [(200, {"Shard-Length": "10", "Repr-Digest": sha256_field(b"x")}, self.BODY, {})]
        with self.assertRaises(shardsrv.DigestError):
            shardsrv.Client(s.url, attempts=1).fetch(self.REQ)
        # Both: they must agree.
        s.script = [(200, {"Shard-Length": "10", "Repr-Digest": sha256_field(b"x")}, self.BODY,
                     {"Repr-Digest": sha256_field(self.BODY)})]
        with self.assertRaises(shardsrv.DigestError) as ctx:
            shardsrv.Client(s.url, attempts=1).fetch(self.REQ)
        self.assertEqual(ctx.exception.want, sha256_field(b"x") + "; " + sha256_field(self.BODY))

    def test_the_shared_digest_vectors(self):
        """api/testdata/repr_digest.json: the cases the Go client checks too."""
        with open(os.path.join(ROOT, "api", "testdata", "repr_digest.json")) as f:
            vectors = json.load(f)
        got = hashlib.sha256(vectors["body"].encode()).digest()
        for case in vectors["cases"]:
            with self.subTest(case["name"]):
                if case["want"] == "mismatch":
                    with self.assertRaises(shardsrv.DigestError) as ctx:
                        shardsrv._check_digest(case["header"], case["trailer"], got)
                    self.assertEqual(ctx.exception.got, vectors["matched"])
                else:
                    want = {"match": vectors["matched"], "none": None}[case["want"]]
                    self.assertEqual(shardsrv._check_digest(case["header"], case["trailer"], got), want)
        self.assertGreaterEqual(len(vectors["cases"]), 10)

    def test_an_output_that_cannot_start_over_is_not_retried_into(self):
        class Pipe(io.RawIOBase):
            def writable(self):
                return True

            def write(self, b):
                return len(b)
        s = self.serve(self.shard(digest=sha256_field(b"")))
        with self.assertRaises(RuntimeError) as ctx:
            shardsrv.Client(s.url, attempts=3, backoff=0.01).fetch_into(self.REQ, Pipe())
        self.assertIsInstance(ctx.exception.__cause__, shardsrv.DigestError)
        self.assertEqual(len(s.paths), 1)

    def test_the_digest_field_may_name_other_algorithms(self):
        body_b64 = sha256_field(self.BODY)[len("sha-256="):]
        other = "sha-512=:" + base64.b64encode(hashlib.sha512(self.BODY).digest()).decode() + ":"
        for field in (f"{other}, sha-256={body_b64}", f"sha-256={body_b64};note=1,{other}"):
            s = self.serve(self.shard(digest=field))
            with self.subTest(field):
                got = shardsrv.Client(s.url, attempts=1).fetch_verified(self.REQ)
                self.assertEqual(got, (self.BODY, sha256_field(self.BODY)))
        # Without a sha-256 member there is nothing this client can check.
        s = self.serve(self.shard(digest=other))
        self.assertEqual(shardsrv.Client(s.url, attempts=1).fetch_verified(self.REQ), (self.BODY, None))

    def test_shard_length_is_the_length_of_a_chunked_body(self):
        seen = []
        s = self.serve(self.shard())
        c = shardsrv.Client(s.url, attempts=1)
        with tempfile.TemporaryDirectory() as d:
            c.fetch_to_file(self.REQ, os.path.join(d, "f"), progress=lambda done, total: seen.append((done, total)))
        self.assertEqual(seen[-1], (10, 10))
        for length in (12, 8):  # short, and past its length
            for fetch in (lambda: c.fetch(self.REQ), lambda: c.fetch_into(self.REQ, bytearray(20)),
                          lambda: c.fetch_into(self.REQ, io.BytesIO())):
                s.script = [self.shard(length=length)]
                with self.subTest(length=length), self.assertRaises(shardsrv.ShortBodyError) as ctx:
                    fetch()
                self.assertEqual(ctx.exception.want, length)
                if length > 10:
                    self.assertEqual(ctx.exception.got, 10)
                else:
                    self.assertGreater(ctx.exception.got, length)
                    self.assertIn("ran past its length of 8 bytes", str(ctx.exception))
        s.script = [(200, {"Shard-Length": "10", "Content-Length": "10"}, self.BODY)]
        self.assertEqual(c.fetch_verified(self.REQ), (self.BODY, None))  # no trailer: nothing to check

    def test_declining_sends_want_repr_digest(self):
        s = self.serve((200, {"Shard-Length": "10"}, self.BODY), self.shard())
        self.assertEqual(shardsrv.Client(s.url, digest=False).fetch_verified(self.REQ), (self.BODY, None))
        self.assertEqual(s.headers[0].get_all("Want-Repr-Digest"), ["sha-256=0"])
        self.assertEqual(shardsrv.Client(s.url).fetch_verified(self.REQ), (self.BODY, sha256_field(self.BODY)))
        self.assertIsNone(s.headers[1].get("Want-Repr-Digest"))

    def test_declining_still_checks_a_digest_sent_anyway(self):
        """A server that ignores Want-Repr-Digest: what it sends is checked, trailer or header."""
        wrong = sha256_field(b"wrong")
        header = (200, {"Shard-Length": "10", "Content-Length": "10", "Repr-Digest": wrong}, self.BODY)
        for response in (self.shard(digest=wrong), header):
            c = shardsrv.Client(self.serve(response, response, response, response).url, digest=False, attempts=1)
            for fetch in (lambda: c.fetch(self.REQ), lambda: c.fetch_into(self.REQ, bytearray(10)),
                          lambda: c.fetch_into(self.REQ, io.BytesIO()),
                          lambda: c.fetch_into_parts(self.REQ, 10, lambda: [(memoryview(bytearray(10)), None)])):
                with self.subTest(response=response[1], fetch=fetch), self.assertRaises(shardsrv.DigestError):
                    fetch()

    def test_without_the_trailer_hook_the_length_is_still_checked(self):
        """A Python whose http.client no longer calls _read_and_discard_trailer: no digest, a warning."""
        s = self.serve(self.shard(digest=sha256_field(b"wrong")), self.shard(digest=sha256_field(b"wrong")))
        with mock.patch.object(shardsrv._TrailerResponse, "_read_and_discard_trailer",
                               http.client.HTTPResponse._read_and_discard_trailer), \
                mock.patch.object(shardsrv, "_warned_no_trailers", False), \
                self.assertLogs("shardsrv", "WARNING") as logs:
            c = shardsrv.Client(s.url, attempts=1)
            self.assertEqual(c.fetch_verified(self.REQ), (self.BODY, None))
            self.assertEqual(c.fetch_verified(self.REQ), (self.BODY, None))
        self.assertEqual(len(logs.output), 1, "warned once")
        self.assertIn("did not hand over the Repr-Digest trailer", logs.output[0])


class TorchHelper(unittest.TestCase):
    def fake_torch(self):
        """A torch older than 2.1: no FP8 dtypes (and no wide unsigned integers)."""
        torch = types.ModuleType("torch")
        torch.__version__ = "2.0.1"
        for name in ("bool", "uint8", "int8", "int16", "int32", "int64", "float16", "bfloat16", "float32", "float64"):
            setattr(torch, name, "torch." + name)
        torch.calls = []

        def frombuffer(buf, dtype):
            torch.calls.append((buf, dtype))
            return types.SimpleNamespace(reshape=lambda shape: (dtype, shape, bytes(buf)))
        torch.frombuffer = frombuffer
        torch.empty = lambda shape, dtype: (dtype, shape, b"")
        return torch

    def test_to_torch_on_torch_without_float8(self):
        torch = self.fake_torch()
        with mock.patch.dict(sys.modules, {"torch": torch}):
            body = bytearray(b"\x80\x3f" * 4)
            self.assertEqual(shardsrv.to_torch(body, "BF16", [2, 2]), ("torch.bfloat16", [2, 2], bytes(body)))
            self.assertIs(torch.calls[-1][0].obj, body, "a writable buffer is shared, not copied")
            self.assertEqual(shardsrv.to_torch(b"\x01\x02", "I16", [1])[0], "torch.int16")
            self.assertIsInstance(torch.calls[-1][0], bytearray, "read-only bytes are copied")
            self.assertEqual(shardsrv.to_torch(b"", "F32", [0, 4]), ("torch.float32", [0, 4], b""))
            with self.assertRaisesRegex(TypeError, "float8_e4m3fn"):
                shardsrv.to_torch(b"\x00", "F8_E4M3", [1])

    def test_real_torch_when_installed(self):
        try:
            import torch
        except ImportError:
            self.skipTest("torch is optional")
        t = shardsrv.to_torch(bytearray(b"\x80\x3f" * 4), "BF16", [2, 2])
        self.assertTrue(bool((t == 1).all()))


if __name__ == "__main__":
    unittest.main()
