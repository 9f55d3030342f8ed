"""Load: a model's weights streamed from shardsrv straight into its parameters.

``load_model_weights(model, client, checkpoint)`` captures the model's table (shardsrv.capture),
sends it as raw ``/v1/shards`` requests (as few as the size bounds allow) and reads each body
into the parameters as it arrives: a box contiguous in a CPU parameter's memory straight into it,
every other box through one bounded staging buffer (pinned host memory when the parameters are
on a GPU). Each body is checked against its digest and retried whole on what a retry may cure
(the client's rules). The fallbacks — checkpoint tensors whose loaders the capture could not
follow — come in the same requests, whole, and go to the model's own loader with their real
values. A short body, a digest mismatch or a parameter nothing wrote fails the load with an error
naming what is missing.
"""

import math
import time

import torch

from . import _bytes_of, to_torch
from .capture import capture, torch_dtype

__all__ = ["LoadError", "Report", "load_model_weights"]

# Bounds of one request: the output it streams, and its blocks and tensors (the server's default
# limits are 1 Mi blocks, 64 Ki tensors and a 64 MiB JSON body; a block is some 300 bytes of JSON).
MAX_REQUEST_BYTES = 16 << 30
MAX_REQUEST_BLOCKS = 65536
MAX_REQUEST_TENSORS = 16384
STAGING_BYTES = 64 << 20


class LoadError(Exception):
    """The weights could not all be loaded; the message names what is missing."""


class Report:
    """What a load did: bytes_fetched (bodies' bytes), bytes_needed (the parameters' captured
    boxes), requests, blocks, fallbacks (names), seconds (capture_seconds of them capturing)."""

    def __init__(self, **kw):
        self.__dict__.update(kw)

    def __repr__(self):
        return ("Report(" + ", ".join(f"{k}={v!r}" for k, v in self.__dict__.items() if k != "fallbacks")
                + f", fallbacks={len(self.fallbacks)})")


def _contiguous_start(shape, offsets, lengths):
    """The row-major index where the box starts when its elements are one run of a contiguous
    tensor, else None."""
    spans = [d for d, n in enumerate(lengths) if n > 1]
    if spans and any(lengths[d] != shape[d] for d in range(spans[0] + 1, len(shape))):
        return None
    start, stride = 0, 1
    for d in range(len(shape) - 1, -1, -1):
        start += offsets[d] * stride
        stride *= shape[d]
    return start


def _fit(shape, offsets, lengths, limit):
    """Boxes tiling (offsets, lengths), each contiguous in a tensor of shape or at most limit
    elements, cut along their outer dimensions."""
    if _contiguous_start(shape, offsets, lengths) is not None or math.prod(lengths) <= limit:
        return [(offsets, lengths)]
    d = next(d for d, n in enumerate(lengths) if n > 1)
    inner = math.prod(lengths[d + 1:])
    step = max(1, limit // inner)
    out = []
    for at in range(0, lengths[d], step):
        o, n = list(offsets), list(lengths)
        o[d], n[d] = offsets[d] + at, min(step, lengths[d] - at)
        out += _fit(shape, o, n, limit)
    return out


class _Item:
    """One box of the body: where in a destination (or a fallback buffer) its bytes go."""

    __slots__ = ("entry", "block", "offsets", "lengths", "nbytes", "tensor", "buffer", "source")

    def __init__(self, entry, block, offsets, lengths, nbytes, tensor=None, buffer=None):
        self.entry, self.block, self.offsets, self.lengths, self.nbytes = entry, block, offsets, lengths, nbytes
        self.tensor, self.buffer = tensor, buffer


def _items(cap, fallbacks, staging_bytes):
    for entry in cap.table():
        t = cap.destinations[entry["name"]].tensor
        es = t.element_size()
        for block in entry["blocks"]:
            for o, n in _fit(list(t.shape), block["offsets"], block["lengths"], staging_bytes // es):
                yield _Item(entry, block, o, n, math.prod(n) * es, tensor=t)
    for f in fallbacks:
        n = len(f["shape"])
        # A name of its own: a destination may have the name of a checkpoint tensor.
        entry = {"name": f["name"] + "#fallback", "dtype": f["dtype"], "shape": f["shape"]}
        block = {"offsets": [0] * n, "lengths": f["shape"], "source": f["name"], "base": [0] * n,
                 "coeff": [[int(i == j) for j in range(n)] for i in range(n)]}
        item = _Item(entry, block, [0] * n, f["shape"], f["nbytes"], buffer=bytearray(f["nbytes"]))
        item.source = f["name"]
        yield item


def _requests(items, max_bytes):
    """Groups items into requests under the bounds, each destination's boxes together in order."""
    group, nbytes, blocks, names = [], 0, set(), set()
    for it in items:
        new_block, new_name = id(it.block) not in blocks, it.entry["name"] not in names
        if group and (nbytes + it.nbytes > max_bytes or len(blocks) + new_block > MAX_REQUEST_BLOCKS or
                      len(names) + new_name > MAX_REQUEST_TENSORS):
            yield group
            group, nbytes, blocks, names = [], 0, set(), set()
        group.append(it)
        nbytes += it.nbytes
        blocks.add(id(it.block))
        names.add(it.entry["name"])
    if group:
        yield group


def _body(checkpoint, group):
    """The request: each destination with the boxes of it in the group and the blocks they come from."""
    tensors, seen = {}, set()
    for it in group:
        e = tensors.get(it.entry["name"])
        if e is None:
            e = tensors[it.entry["name"]] = {"name": it.entry["name"], "dtype": it.entry["dtype"],
                                             "shape": it.entry["shape"], "boxes": [], "blocks": []}
        e["boxes"].append({"offsets": it.offsets, "lengths": it.lengths})
        if id(it.block) not in seen:
            seen.add(id(it.block))
            e["blocks"].append(it.block)
    return {"checkpoint": checkpoint, "format": "raw", "tensors": list(tensors.values())}


def _box(t, offsets, lengths):
    return t[tuple(slice(o, o + n) for o, n in zip(offsets, lengths))]


class _Stream:
    """The parts of one request's body: views straight into CPU parameters where a box is one
    run of one, else the staging buffer, copied on into the box once filled."""

    def __init__(self, group, staging):
        self.group, self.staging = group, staging
        self.staging_view = _bytes_of(staging) if staging is not None else None

    def __call__(self):
        for it in self.group:
            if it.buffer is not None:
                yield memoryview(it.buffer), None
                continue
            t = it.tensor
            start = _contiguous_start(list(t.shape), it.offsets, it.lengths)
            n = math.prod(it.lengths)
            if start is not None and t.device.type == "cpu":
                yield _bytes_of(t.view(-1)[start:start + n]), None
            elif start is not None:  # one run on a GPU: through staging, a staging buffer at a time
                flat, per = t.view(-1), self.staging.numel() // t.element_size()
                for at in range(0, n, per):
                    m = min(per, n - at)
                    yield self.staging_view[:m * t.element_size()], self._copier(flat[start + at:start + at + m],
                                                                                 m, None)
            else:
                yield self.staging_view[:it.nbytes], self._copier(_box(t, it.offsets, it.lengths), n, it.lengths)

    def _copier(self, dest, n, shape):
        def filled():
            src = self.staging[:n * dest.element_size()].view(dest.dtype)
            dest.copy_(src.view(shape) if shape is not None else src)
        return filled


def load_model_weights(model, client, checkpoint, *, load_weights=None, tensors=None,
                       max_request_bytes=MAX_REQUEST_BYTES, staging_bytes=STAGING_BYTES):
    """Loads model's weights from checkpoint on shardsrv (client: a shardsrv.Client) and returns a
    Report. load_weights defaults to model.load_weights; tensors to the checkpoint's listing
    (client.tensors). Raises LoadError when a parameter was left unwritten."""
    began = time.monotonic()
    load_weights = load_weights or model.load_weights
    listing = tensors if tensors is not None else client.tensors(checkpoint)["tensors"]
    cap = capture(model, listing, load_weights)
    captured = time.monotonic()
    by_name = {t["name"]: t for t in listing}
    fallbacks = []
    for name in cap.fallbacks:
        t = by_name[name]
        nbytes = math.prod(t["shape"]) * torch.empty((), dtype=torch_dtype(t["dtype"])).element_size()
        fallbacks.append(dict(t, nbytes=nbytes))
    on_gpu = any(d.tensor.device.type == "cuda" for d in cap.destinations.values())
    staging = torch.empty(staging_bytes, dtype=torch.uint8, pin_memory=on_gpu and torch.cuda.is_available())
    items = list(_items(cap, fallbacks, staging_bytes))
    needed = sum(it.nbytes for it in items if it.buffer is None)
    fetched = requests = 0
    for group in _requests(items, max_request_bytes):
        nbytes = sum(it.nbytes for it in group)
        client.fetch_into_parts(_body(checkpoint, group), nbytes, _Stream(group, staging))
        fetched += nbytes
        requests += 1
    if on_gpu:
        torch.cuda.synchronize()
    loaded = set()
    for it in items:
        if it.buffer is not None:
            real = to_torch(it.buffer, it.entry["dtype"], it.entry["shape"])
            with torch.no_grad():
                got = load_weights([(it.source, real)])
            loaded |= set(got or ())
    written = set(cap.blocks) | loaded
    missing = [name for name, p in model.named_parameters() if name not in written and p.numel()]
    if missing:
        shown = ", ".join(missing[:20]) + (f" and {len(missing) - 20} more" if len(missing) > 20 else "")
        raise LoadError(f"shardsrv: nothing in {checkpoint} was loaded into {len(missing)} parameters: {shown}")
    return Report(bytes_fetched=fetched, bytes_needed=needed, requests=requests, blocks=cap.block_count(),
                  fallbacks=list(cap.fallbacks), capture_seconds=captured - began,
                  seconds=time.monotonic() - began)

