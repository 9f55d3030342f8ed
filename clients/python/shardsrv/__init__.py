"""Client for shardsrv: fetch remapped tensor shards over HTTP.

Standard library only. numpy and torch are used when installed, by ``to_numpy`` and ``to_torch``.

    from shardsrv import Client, layout
    c = Client("http://shardsrv:8080")
    shapes = layout.shapes(c.tensors("llama-tiny"))
    req = {"checkpoint": "llama-tiny",
           "tensors": [layout.fused_qkv(shapes, "model.layers.0.self_attn.", "qkv", "BF16", 16, tp=2, rank=1)]}
    raw = c.fetch(req)
"""

import json
import struct
import time
import urllib.error
import urllib.parse
import urllib.request

from . import layout  # noqa: F401  (re-exported)

__all__ = ["Client", "ProblemError", "ShortBodyError", "parse_safetensors", "to_numpy", "to_torch", "layout"]

DTYPE_SIZES = {"BOOL": 1, "U8": 1, "I8": 1, "U16": 2, "I16": 2, "U32": 4, "I32": 4, "U64": 8, "I64": 8,
               "F16": 2, "BF16": 2, "F32": 4, "F64": 8, "F8_E4M3": 1, "F8_E5M2": 1}


class ProblemError(Exception):
    """An RFC 9457 problem the server answered with."""

    def __init__(self, status, title, detail=None, errors=None, type_=None):
        self.status, self.title, self.detail, self.errors, self.type = status, title, detail, errors or [], type_
        lines = [f"shardsrv: {status} {title}" + (f": {detail}" if detail else "")]
        lines += [f"  {e.get('pointer')}: {e.get('detail')}" for e in self.errors]
        super().__init__("\n".join(lines))

    @property
    def retryable(self):
        return self.status in (409, 502, 503, 504)


class ShortBodyError(Exception):
    """The body ended before its Content-Length: the stream was aborted."""

    def __init__(self, got, want):
        self.got, self.want = got, want
        super().__init__(f"shardsrv: the body ended after {got} of {want} bytes")


class Client:
    """A shardsrv client; retries overload, storage trouble and aborted streams."""

    def __init__(self, base_url, token=None, attempts=5, backoff=0.5, timeout=600):
        self.base_url = base_url.rstrip("/")
        self.token, self.attempts, self.backoff, self.timeout = token, attempts, backoff, timeout

    def _open(self, method, path, body=None):
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if self.token:
            req.add_header("Authorization", "Bearer " + self.token)
        try:
            return urllib.request.urlopen(req, timeout=self.timeout)
        except urllib.error.HTTPError as e:
            try:
                p = json.loads(e.read() or b"{}")
            except ValueError:
                p = {}
            err = ProblemError(p.get("status", e.code), p.get("title", e.reason), p.get("detail"), p.get("errors"), p.get("type"))
            err.retry_after = e.headers.get("Retry-After")
            raise err from None

    def _retry(self, attempt):
        wait = self.backoff
        for n in range(1, max(1, self.attempts) + 1):
            try:
                return attempt()
            except (ProblemError, ShortBodyError, urllib.error.URLError, ConnectionError) as e:
                if n == self.attempts or (isinstance(e, ProblemError) and not e.retryable):
                    raise
                retry_after = getattr(e, "retry_after", None)
                time.sleep(float(retry_after) if retry_after and retry_after.isdigit() else wait)
                wait *= 2

    def _json(self, method, path, body=None):
        def attempt():
            with self._open(method, path, body) as res:
                return json.loads(res.read())
        return self._retry(attempt)

    def checkpoints(self):
        return self._json("GET", "/v1/checkpoints")["checkpoints"]

    def tensors(self, checkpoint):
        return self._json("GET", "/v1/tensors?checkpoint=" + urllib.parse.quote(checkpoint))

    def plan(self, request):
        return self._json("POST", "/v1/plan", request)

    def fetch_into(self, request, out, progress=None):
        """Streams a shard into a writable, rewindable binary file object; returns the byte count."""
        def attempt():
            out.seek(0)
            out.truncate()
            with self._open("POST", "/v1/shards", request) as res:
                total = int(res.headers.get("Content-Length", -1))
                done = 0
                while True:
                    chunk = res.read(4 << 20)
                    if not chunk:
                        break
                    out.write(chunk)
                    done += len(chunk)
                    if progress:
                        progress(done, total)
                if total >= 0 and done != total:
                    raise ShortBodyError(done, total)
                return done
        return self._retry(attempt)

    def fetch(self, request, progress=None):
        """Returns a whole shard as bytes."""
        import io
        buf = io.BytesIO()
        self.fetch_into(request, buf, progress)
        return buf.getvalue()

    def fetch_to_file(self, request, path, progress=None):
        with open(path, "w+b") as f:
            return self.fetch_into(request, f, progress)


def parse_safetensors(data):
    """Parses a safetensors body: returns ({name: (dtype, shape, memoryview)}, metadata)."""
    (n,) = struct.unpack_from("<Q", data, 0)
    header = json.loads(bytes(data[8:8 + n]))
    meta = header.pop("__metadata__", {})
    view, start = memoryview(data), 8 + n
    tensors = {name: (t["dtype"], t["shape"], view[start + t["data_offsets"][0]:start + t["data_offsets"][1]])
               for name, t in header.items()}
    return tensors, meta


def to_numpy(buf, dtype, shape):
    """A numpy array over raw bytes (BF16 and FP8 come back as uint16 / uint8 bit patterns)."""
    import numpy as np
    np_dtype = {"BOOL": np.bool_, "U8": np.uint8, "I8": np.int8, "U16": np.uint16, "I16": np.int16, "U32": np.uint32,
                "I32": np.int32, "U64": np.uint64, "I64": np.int64, "F16": np.float16, "BF16": np.uint16,
                "F32": np.float32, "F64": np.float64, "F8_E4M3": np.uint8, "F8_E5M2": np.uint8}[dtype]
    return np.frombuffer(buf, dtype=np.dtype(np_dtype).newbyteorder("<")).reshape(shape)


def to_torch(buf, dtype, shape):
    """A torch tensor over raw bytes, in the tensor's own dtype."""
    import torch
    t_dtype = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "I32": torch.int32,
               "I64": torch.int64, "F16": torch.float16, "BF16": torch.bfloat16, "F32": torch.float32,
               "F64": torch.float64, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2}[dtype]
    return torch.frombuffer(bytearray(buf), dtype=t_dtype).reshape(shape)
