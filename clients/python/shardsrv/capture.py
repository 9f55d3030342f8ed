"""Capture: a rank's remap table, read off the model's own weight loaders.

``capture(model, tensors)`` runs ``model.load_weights`` — the loop every vLLM (and SGLang) model
implements, which hands each checkpoint tensor to its parameter's ``weight_loader`` — on recording
tensors: tensors with the checkpoint tensor's shape and dtype but no data (they live on the meta
device), which carry where each of their elements comes from. A recording is a list of pieces,
each a box of the recording and an affine map into one checkpoint tensor — exactly a block of the
server's table (docs/contract.md). The shape operations weight loaders use transform the pieces;
a ``copy_`` of a recording into parameter or buffer memory becomes blocks of that destination.

Supported: ``narrow``, indexing by ints, slices (positive steps), ``None`` and ``...``,
``select``/``unbind``, ``view``/``reshape``/``flatten``/``squeeze``/``unsqueeze`` (where the pieces
re-index affinely; others are cut into pieces that do, up to a bound), ``t``/``T``/``transpose``/
``permute``, ``chunk``/``split``, ``expand``/``expand_as``/``broadcast_to``, ``cat``/``stack`` of
recordings, ``contiguous``/``clone``/``detach``, ``.to(dtype)`` and the dtype methods (a ``cast``
post op), ``.to(device)``/``cpu``/``cuda``, and ``copy_`` (or item assignment) into any view of a
parameter or buffer that is a box of it. Every other operation on a recording — arithmetic,
``.item()``, comparisons, numpy, a copy into a temporary — raises inside the loader; the checkpoint
tensors it involves are then **fallbacks**: fetched whole at load time and handed to the model's
own loader with their real values. Nothing is guessed. Writes a loader makes with real values
(``fill_(0)`` of vocabulary padding) happen during the capture, as they would in a load.

The capture depends only on the model's code and configuration and the tensor headers, so every
run of it gives the same table.
"""

import logging
import math

import torch

from . import _TORCH_DTYPES

__all__ = ["Capture", "capture"]

log = logging.getLogger("shardsrv")

# A reshape whose pieces do not re-index affinely is cut into pieces that do; past this many the
# tensor falls back instead (a transposed weight flattened would otherwise make one piece a row).
MAX_PIECES = 4096

_DTYPE_NAMES = {}  # torch dtype -> the contract's name
for _name, _attr in _TORCH_DTYPES.items():
    if hasattr(torch, _attr):
        _DTYPE_NAMES.setdefault(getattr(torch, _attr), _name)


def dtype_name(dtype):
    """The contract's name of a torch dtype (BF16, F32, ...)."""
    try:
        return _DTYPE_NAMES[dtype]
    except KeyError:
        raise TypeError(f"shardsrv: {dtype} has no dtype in the shard contract") from None


def torch_dtype(name):
    """The torch dtype of a contract dtype name; TypeError when this torch has none."""
    t = getattr(torch, _TORCH_DTYPES.get(name, ""), None)
    if t is None:
        raise TypeError(f"shardsrv: torch {torch.__version__} has no dtype for {name}")
    return t


class Unsupported(Exception):
    """An operation the capture cannot follow; sources names the checkpoint tensors involved."""

    def __init__(self, what, sources):
        self.sources = sorted(sources)
        super().__init__(f"{what} on a recording of {', '.join(self.sources) or 'nothing'}")


class _Piece:
    """A box of a recording (offs, lens) whose element x is post(source[base + coeff · (x − offs)]);
    coeff is one row per source dimension, one column per recording dimension."""

    __slots__ = ("offs", "lens", "source", "base", "coeff", "post")

    def __init__(self, offs, lens, source, base, coeff, post):
        self.offs, self.lens, self.source, self.base, self.coeff, self.post = offs, lens, source, base, coeff, post

    def column(self, d):
        return [row[d] for row in self.coeff]

    def with_columns(self, cols, offs, lens, base=None):
        """A piece with the given columns (one list per new dimension), offsets and lengths."""
        coeff = [[col[i] for col in cols] for i in range(len(self.base))]
        return _Piece(offs, lens, self.source, self.base if base is None else base, coeff, self.post)


def _shift(base, col, by):
    return [b + c * by for b, c in zip(base, col)] if by else base


def _sources(pieces):
    return {p.source for p in pieces}


_IDENTITIES = {}


def _identity(n):
    """The n × n identity coefficients, shared: pieces never change their coeff in place."""
    ident = _IDENTITIES.get(n)
    if ident is None:
        ident = _IDENTITIES[n] = [[int(i == j) for j in range(n)] for i in range(n)]
    return ident


class Recording(torch.Tensor):
    """A tensor with a shape and a dtype but no data (on the meta device) that records, in
    _pieces, where each of its elements comes from."""

    @staticmethod
    def __new__(cls, meta, pieces):
        r = torch.Tensor._make_subclass(cls, meta)
        r._pieces = pieces
        return r

    @classmethod
    def of(cls, name, dtype, shape):
        """The recording of a whole checkpoint tensor."""
        n = len(shape)
        meta = torch.empty(shape, dtype=dtype, device="meta")
        if math.prod(shape) == 0:
            return cls(meta, [])
        return cls(meta, [_Piece([0] * n, list(shape), name, [0] * n, _identity(n), ())])

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        handler = _HANDLERS.get(func)
        if handler is None:
            if func in _QUERIES:
                with torch._C.DisableTorchFunction():
                    return func(*args, **kwargs)
            name = getattr(func, "__name__", repr(func))
            raise Unsupported(name, _sources(p for a in _flat(args, kwargs) for p in a._pieces))
        return handler(func, *args, **kwargs)


def _flat(args, kwargs):
    """The recordings among a call's arguments (also inside lists and tuples)."""
    for a in list(args) + list(kwargs.values()):
        if isinstance(a, Recording):
            yield a
        elif isinstance(a, (list, tuple)):
            yield from (x for x in a if isinstance(x, Recording))


def _meta(func, args, kwargs):
    """func run on the recordings' meta tensors: the result's shape and dtype, checked by torch."""
    with torch._C.DisableTorchFunction():
        return func(*args, **kwargs)


def _new(like, pieces):
    return Recording(torch.empty(like.shape, dtype=like.dtype, device="meta"), pieces)


# Operations on pieces. Each returns new pieces; none changes its input.

def _strided(pieces, dim, start, step, count):
    """Elements start, start+step, ... (count of them) of dimension dim."""
    out = []
    for p in pieces:
        o, n = p.offs[dim], p.lens[dim]
        lo = max(0, -(-(o - start) // step))
        hi = min(count - 1, (o + n - 1 - start) // step)
        if lo > hi:
            continue
        col = p.column(dim)
        cols = [p.column(d) for d in range(len(p.offs))]
        cols[dim] = [c * step for c in col]
        offs, lens = list(p.offs), list(p.lens)
        offs[dim], lens[dim] = lo, hi - lo + 1
        out.append(p.with_columns(cols, offs, lens, _shift(p.base, col, start + step * lo - o)))
    return out


def _drop_dim(pieces, dim):
    """Removes dimension dim, of length 1."""
    out = []
    for p in pieces:
        keep = [d for d in range(len(p.offs)) if d != dim]
        out.append(p.with_columns([p.column(d) for d in keep], [p.offs[d] for d in keep], [p.lens[d] for d in keep]))
    return out


def _insert_dim(pieces, dim):
    """Inserts a dimension of length 1 at dim."""
    out = []
    for p in pieces:
        cols = [p.column(d) for d in range(len(p.offs))]
        cols.insert(dim, [0] * len(p.base))
        out.append(p.with_columns(cols, p.offs[:dim] + [0] + p.offs[dim:], p.lens[:dim] + [1] + p.lens[dim:]))
    return out


def _permute(pieces, perm):
    return [p.with_columns([p.column(d) for d in perm], [p.offs[d] for d in perm], [p.lens[d] for d in perm])
            for p in pieces]


def _shift_dim(pieces, dim, by):
    out = []
    for p in pieces:
        offs = list(p.offs)
        offs[dim] += by
        out.append(_Piece(offs, p.lens, p.source, p.base, p.coeff, p.post))
    return out


def _expand(pieces, old_shape, new_shape):
    lead = len(new_shape) - len(old_shape)
    for _ in range(lead):
        pieces = _insert_dim(pieces, 0)
    out = []
    for p in pieces:
        cols = [p.column(d) for d in range(len(p.offs))]
        lens = list(p.lens)
        for d in range(len(new_shape)):
            if d < lead or (old_shape[d - lead] == 1 and new_shape[d] != 1):
                cols[d], lens[d] = [0] * len(p.base), new_shape[d]
        out.append(p.with_columns(cols, list(p.offs), lens))
    return out


def _strides(shape):
    out, acc = [0] * len(shape), 1
    for d in range(len(shape) - 1, -1, -1):
        out[d] = acc
        acc *= shape[d]
    return out


def _range_boxes(start, length, shape):
    """The boxes (offsets, lengths) of shape that tile the row-major index range [start, start+length)."""
    if length == 0:
        return []
    if len(shape) == 1:
        return [([start], [length])]
    inner = math.prod(shape[1:])
    row, within = divmod(start, inner)
    if within == 0 and length % inner == 0:
        return [([row] + [0] * (len(shape) - 1), [length // inner] + list(shape[1:]))]
    if within == 0 and length > inner:
        full = length // inner
        return _range_boxes(start, full * inner, shape) + _range_boxes(start + full * inner, length - full * inner,
                                                                        shape)
    take = min(length, inner - within)
    head = [([row] + o, [1] + n) for o, n in _range_boxes(within, take, shape[1:])]
    return head + _range_boxes(start + take, length - take, shape)


def _regroup(p, dims, old_sizes, new_sizes):
    """One group of a reshape (old dimensions dims, of old_sizes, become new dimensions of
    new_sizes, with the same product) for piece p: a list of (offsets, lengths, columns, base) over
    the new dimensions, or None when p's part is not one affine run (cut p, then)."""
    if len(dims) == 1 and len(new_sizes) == 1:
        d = dims[0]
        return [([p.offs[d]], [p.lens[d]], [p.column(d)], None)]
    first = next((k for k, d in enumerate(dims) if p.lens[d] > 1), None)
    old_strides, new_strides = _strides(old_sizes), _strides(new_sizes)
    flat = sum(p.offs[d] * s for d, s in zip(dims, old_strides))
    rows = len(p.base)
    if first is None:
        unit, length = [0] * rows, 1
    else:
        for k in range(first + 1, len(dims)):
            if p.offs[dims[k]] != 0 or p.lens[dims[k]] != old_sizes[k]:
                return None
        unit = p.column(dims[-1])
        for k in range(first, len(dims) - 1):
            if p.column(dims[k]) != [u * old_strides[k] for u in unit]:
                return None
        length = p.lens[dims[first]] * old_strides[first]
    out = []
    for offs, lens in _range_boxes(flat, length, new_sizes):
        at = sum(o * s for o, s in zip(offs, new_strides))
        cols = [[u * s for u in unit] for s in new_strides]
        out.append((offs, lens, cols, [u * (at - flat) for u in unit]))
    return out


def _reshape(pieces, old_shape, new_shape):
    old_shape, new_shape = list(old_shape), list(new_shape)
    if math.prod(new_shape) == 0:
        return []
    # Dimensions of length 1 carry nothing: drop them, group the rest by equal products, put them back.
    for d in range(len(old_shape) - 1, -1, -1):
        if old_shape[d] == 1:
            pieces = _drop_dim(pieces, d)
    old = [n for n in old_shape if n != 1]
    new = [n for n in new_shape if n != 1]
    groups, i, j = [], 0, 0
    while i < len(old):
        ga, gb, pa, pb = [i], [j], old[i], new[j]
        i, j = i + 1, j + 1
        while pa != pb:
            if pa < pb:
                ga.append(i)
                pa *= old[i]
                i += 1
            else:
                gb.append(j)
                pb *= new[j]
                j += 1
        groups.append((ga, gb))
    out, todo = [], list(pieces)
    while todo:
        p = todo.pop()
        parts = []
        for ga, gb in groups:
            part = _regroup(p, ga, [old[k] for k in ga], [new[k] for k in gb])
            if part is None:
                # Cut p along the group's first dimension it spans, and try its slices.
                d = next(d for d in ga if p.lens[d] > 1)
                todo.extend(_slice_at(p, d, p.offs[d] + k) for k in range(p.lens[d] - 1, -1, -1))
                if len(todo) + len(out) > MAX_PIECES:
                    raise Unsupported(f"a reshape to {tuple(new_shape)} (more than {MAX_PIECES} pieces)", {p.source})
                parts = None
                break
            parts.append(part)
        if parts is None:
            continue
        combos = [([], [], [], p.base)]
        for part in parts:
            combos = [(o + po, n + pn, c + pc, base if pb is None else [b + x for b, x in zip(base, pb)])
                      for o, n, c, base in combos for po, pn, pc, pb in part]
        for offs, lens, cols, base in combos:
            out.append(p.with_columns(cols, offs, lens, base))
    out.reverse()
    # Back in the new shape, with its dimensions of length 1.
    for d, n in enumerate(new_shape):
        if n == 1:
            out = _insert_dim(out, d)
    return out


def _slice_at(p, d, x):
    """Piece p restricted to index x of dimension d (kept, of length 1)."""
    offs, lens = list(p.offs), list(p.lens)
    offs[d], lens[d] = x, 1
    return _Piece(offs, lens, p.source, _shift(p.base, p.column(d), x - p.offs[d]), p.coeff, p.post)


# Handlers: func(*args, **kwargs) on recordings -> recording(s).

def _dim(d, ndim):
    return d + ndim if d < 0 else d


def _h_identity(func, self, *args, **kwargs):
    return _new(self, self._pieces)


def _h_reshape(func, *args, **kwargs):
    self = args[0]
    out = _meta(func, args, kwargs)
    if out.dtype != self.dtype:  # view(dtype) reinterprets bits: not a copy of values
        raise Unsupported(f"{func.__name__} to {out.dtype}", _sources(self._pieces))
    return _new(out, _reshape(self._pieces, self.shape, out.shape))


def _h_narrow(func, self, dim, start, length):
    dim = _dim(dim, self.dim())
    start = _dim(int(start), self.shape[dim])
    return _new(_meta(func, (self, dim, start, length), {}), _strided(self._pieces, dim, start, 1, int(length)))


def _h_select(func, self, dim, index):
    dim = _dim(dim, self.dim())
    index = _dim(int(index), self.shape[dim])
    if not 0 <= index < self.shape[dim]:
        raise IndexError(f"index {index} is out of range of dimension {dim} of size {self.shape[dim]}")
    return _new(_meta(func, (self, dim, index), {}), _drop_dim(_strided(self._pieces, dim, index, 1, 1), dim))


def _h_unbind(func, self, dim=0):
    dim = _dim(dim, self.dim())
    return tuple(_h_select(torch.Tensor.select, self, dim, i) for i in range(self.shape[dim]))


def _h_getitem(func, self, index):
    out = _meta(func, (self, index), {})
    items = index if isinstance(index, tuple) else (index,)
    for it in items:
        if not (it is None or it is Ellipsis or isinstance(it, (int, slice))) or isinstance(it, bool):
            raise Unsupported(f"indexing by {type(it).__name__}", _sources(self._pieces))
    consumed = sum(1 for it in items if it is not None and it is not Ellipsis)
    pieces, dim, shape = self._pieces, 0, list(self.shape)
    for it in items:
        if it is Ellipsis:
            dim += self.dim() - consumed
        elif it is None:
            pieces = _insert_dim(pieces, dim)
            shape.insert(dim, 1)
            dim += 1
        elif isinstance(it, int):
            i = _dim(it, shape[dim])
            pieces = _drop_dim(_strided(pieces, dim, i, 1, 1), dim)
            del shape[dim]
        else:
            start, stop, step = it.indices(shape[dim])
            if step <= 0:
                raise Unsupported("a slice with a negative step", _sources(self._pieces))
            count = max(0, -(-(stop - start) // step))
            pieces = _strided(pieces, dim, start, step, count)
            shape[dim] = count
            dim += 1
    return _new(out, pieces)


def _h_transpose(func, self, d0, d1):
    perm = list(range(self.dim()))
    d0, d1 = _dim(d0, self.dim()), _dim(d1, self.dim())
    perm[d0], perm[d1] = perm[d1], perm[d0]
    return _new(_meta(func, (self, d0, d1), {}), _permute(self._pieces, perm))


def _h_t(func, self):
    perm = list(range(self.dim()))[::-1]
    return _new(_meta(func, (self,), {}), _permute(self._pieces, perm))


def _h_permute(func, self, *dims, **kwargs):
    dims = kwargs.get("dims", dims)
    if len(dims) == 1 and isinstance(dims[0], (list, tuple)):
        dims = dims[0]
    perm = [_dim(d, self.dim()) for d in dims]
    return _new(_meta(func, (self, perm), {}), _permute(self._pieces, perm))


def _h_split(func, self, *args, **kwargs):
    """chunk and split: torch decides the parts' sizes; each is a narrow."""
    outs = _meta(func, (self,) + args, kwargs)
    dim = kwargs.get("dim", args[1] if len(args) > 1 else 0)
    dim = _dim(dim, self.dim())
    parts, at = [], 0
    for o in outs:
        parts.append(_new(o, _strided(self._pieces, dim, at, 1, o.shape[dim])))
        at += o.shape[dim]
    return tuple(parts)


def _h_expand(func, self, *args, **kwargs):
    out = _meta(func, (self,) + args, kwargs)
    return _new(out, _expand(self._pieces, list(self.shape), list(out.shape)))


def _h_cat(func, tensors, dim=0, **kwargs):
    tensors = list(tensors)
    sources = _sources(p for t in tensors if isinstance(t, Recording) for p in t._pieces)
    if not all(isinstance(t, Recording) for t in tensors):
        raise Unsupported(f"{func.__name__} of a recording with real values", sources)
    out = _meta(func, (tensors, dim), kwargs)
    dim = _dim(dim, out.dim())
    pieces, at = [], 0
    for t in tensors:
        if t.dim() == 1 and t.shape[0] == 0 and out.dim() != 1:
            continue  # torch.cat skips empty 1-d tensors
        pieces += _shift_dim(t._pieces, dim, at)
        at += t.shape[dim]
    return _new(out, pieces)


def _h_stack(func, tensors, dim=0, **kwargs):
    tensors = list(tensors)
    if not all(isinstance(t, Recording) for t in tensors):
        raise Unsupported(f"{func.__name__} of a recording with real values",
                          _sources(p for t in tensors if isinstance(t, Recording) for p in t._pieces))
    out = _meta(func, (tensors, dim), kwargs)
    dim = _dim(dim, out.dim())
    pieces = []
    for i, t in enumerate(tensors):
        pieces += _shift_dim(_insert_dim(t._pieces, dim), dim, i)
    return _new(out, pieces)


_DTYPE_METHODS = {"float": torch.float32, "half": torch.float16, "bfloat16": torch.bfloat16, "double": torch.float64}


def _h_cast(func, self, *args, **kwargs):
    """to(), type(), float() and the like: a change of dtype is a cast post op; of device, nothing."""
    name = func.__name__
    if name == "type" and not args and not kwargs:
        with torch._C.DisableTorchFunction():
            return func(self)  # the type's name, a string
    dtype = _DTYPE_METHODS.get(name, kwargs.get("dtype"))
    for a in args:
        if isinstance(a, torch.dtype):
            dtype = a
        elif isinstance(a, torch.Tensor):
            dtype = a.dtype
        elif name == "type":
            raise Unsupported(f"type({a!r})", _sources(self._pieces))
    if dtype is None or dtype == self.dtype:
        return _new(self, self._pieces)
    post = ({"op": "cast", "dtype": dtype_name(dtype)},)
    out = torch.empty(self.shape, dtype=dtype, device="meta")
    return _new(out, [_Piece(p.offs, p.lens, p.source, p.base, p.coeff, p.post + post) for p in self._pieces])


def _h_copy(func, dest, src, non_blocking=False):
    if isinstance(dest, Recording) or not isinstance(src, Recording):
        raise Unsupported("copy_ into a recording", _sources(dest._pieces if isinstance(dest, Recording) else []))
    _active.record(dest, src)
    return dest


def _h_setitem(func, dest, index, src):
    if isinstance(dest, Recording) or not isinstance(src, Recording):
        raise Unsupported("item assignment into a recording", _sources(dest._pieces))
    with torch._C.DisableTorchFunction():
        view = dest[index]
    _active.record(view, src)


_T = torch.Tensor
_HANDLERS = {
    _T.narrow: _h_narrow, torch.narrow: _h_narrow,
    _T.select: _h_select, torch.select: _h_select,
    _T.unbind: _h_unbind, torch.unbind: _h_unbind,
    _T.__getitem__: _h_getitem,
    _T.view: _h_reshape, _T.reshape: _h_reshape, torch.reshape: _h_reshape, _T.view_as: _h_reshape,
    _T.reshape_as: _h_reshape, _T.flatten: _h_reshape, torch.flatten: _h_reshape, _T.squeeze: _h_reshape,
    torch.squeeze: _h_reshape, _T.unsqueeze: _h_reshape, torch.unsqueeze: _h_reshape, _T.unflatten: _h_reshape,
    _T.transpose: _h_transpose, torch.transpose: _h_transpose, _T.swapaxes: _h_transpose,
    _T.t: _h_t, torch.t: _h_t, _T.T.__get__: _h_t,
    _T.permute: _h_permute, torch.permute: _h_permute,
    _T.chunk: _h_split, torch.chunk: _h_split, _T.split: _h_split, torch.split: _h_split,
    _T.expand: _h_expand, _T.expand_as: _h_expand, _T.broadcast_to: _h_expand, torch.broadcast_to: _h_expand,
    torch.cat: _h_cat, torch.concat: _h_cat, torch.stack: _h_stack,
    _T.contiguous: _h_identity, _T.clone: _h_identity, torch.clone: _h_identity, _T.detach: _h_identity,
    _T.data.__get__: _h_identity, _T.cpu: _h_cast, _T.cuda: _h_cast,
    _T.to: _h_cast, _T.type: _h_cast, _T.type_as: _h_cast, _T.float: _h_cast, _T.half: _h_cast,
    _T.bfloat16: _h_cast, _T.double: _h_cast,
    _T.copy_: _h_copy, _T.__setitem__: _h_setitem,
}
# What asks a recording about its shape, and never about values: answered by its meta tensor.
_QUERIES = {
    _T.size, _T.dim, _T.numel, _T.nelement, _T.element_size, _T.is_contiguous, _T.stride, _T.__len__,
    _T.is_floating_point, _T.is_complex, _T.__repr__, _T.__format__, _T.__hash__, _T.storage_offset,
    _T.shape.__get__, _T.ndim.__get__, _T.dtype.__get__, _T.device.__get__, _T.is_cuda.__get__,
    _T.layout.__get__, _T.requires_grad.__get__, _T.is_meta.__get__, _T.names.__get__,
}
if hasattr(torch, "concatenate"):
    _HANDLERS[torch.concatenate] = _h_cat


def _storage_key(t):
    storage = t.untyped_storage() if hasattr(t, "untyped_storage") else t.storage()
    return storage._cdata


class _Destination:
    """A parameter or buffer a capture may write: its name, its tensor and its place in its storage."""

    __slots__ = ("name", "tensor", "start", "strides")

    def __init__(self, name, tensor):
        self.name, self.tensor = name, tensor
        self.start, self.strides = tensor.storage_offset(), list(tensor.stride())


class Capture:
    """A captured table: for each destination (a parameter or buffer, by the name the model gives
    it), its blocks in the server's explicit table format; and the fallbacks, checkpoint tensors
    whose loaders did something the capture does not follow."""

    def __init__(self, model, tensors):
        self.sources = {t["name"]: t for t in tensors}
        self.fallbacks = []   # names, in checkpoint order
        self.blocks = {}      # destination name -> [block]
        self.destinations = {}  # destination name -> _Destination
        self._by_storage = {}
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if t.is_contiguous():  # a box of anything else has no simple place in its storage
                self._by_storage.setdefault(_storage_key(t), []).append(_Destination(name, t.data))
        self._current = {}   # source -> blocks recorded for it while its loader runs: [(dest name, block)]

    def table(self):
        """The explicit tensors table (docs/contract.md): one entry a destination, in the model's
        order, each block its own box."""
        out = []
        for name, blocks in self.blocks.items():
            d = self.destinations[name]
            out.append({"name": name, "dtype": dtype_name(d.tensor.dtype), "shape": list(d.tensor.shape),
                        "boxes": [{"offsets": b["offsets"], "lengths": b["lengths"]} for b in blocks],
                        "blocks": blocks})
        return out

    def block_count(self):
        return sum(len(b) for b in self.blocks.values())

    def _find(self, view):
        """The destination view is a box of: (destination, offsets, dims) where view dimension k is
        destination dimension dims[k] (None for a dimension of length 1); None when there is none."""
        for d in self._by_storage.get(_storage_key(view), ()):
            shape = list(d.tensor.shape)
            rel = view.storage_offset() - d.start
            if rel < 0 or rel >= max(1, d.tensor.numel()):
                continue
            offsets = []
            for s, n in zip(d.strides, shape):
                offsets.append((rel // s) % n if n > 1 else 0)
            if sum(o * s for o, s in zip(offsets, d.strides)) != rel:
                continue
            dims, used = [], set()
            for s, n in zip(view.stride(), view.shape):
                if n == 1:
                    dims.append(None)
                    continue
                j = next((j for j in range(len(shape) - 1, -1, -1) if d.strides[j] == s and shape[j] > 1), None)
                if j is None or j in used or offsets[j] + n > shape[j]:
                    break
                used.add(j)
                dims.append(j)
            else:
                return d, offsets, dims
        return None

    def record(self, view, src):
        found = self._find(view)
        if found is None:
            raise Unsupported("copy_ into memory that is not a box of a parameter or buffer", _sources(src._pieces))
        d, offsets, dims = found
        pieces = src._pieces
        if list(src.shape) != list(view.shape):
            pieces = _expand(pieces, list(src.shape), list(view.shape))
        ndim = d.tensor.dim()
        blocks = []
        for p in pieces:
            offs, lens = list(offsets), [1] * ndim
            cols = [[0] * len(p.base) for _ in range(ndim)]
            for k, j in enumerate(dims):
                if j is not None:  # a view dimension of length 1 adds nothing to offsets
                    offs[j] += p.offs[k]
                    lens[j] = p.lens[k]
                    cols[j] = p.column(k)
            block = {"offsets": offs, "lengths": lens, "source": p.source, "base": list(p.base),
                     "coeff": [[col[i] for col in cols] for i in range(len(p.base))]}
            if p.post:
                block["post"] = list(p.post)
            blocks.append(block)
        for b in blocks:
            self._current.setdefault(b["source"], []).append((d.name, b))
        self.destinations.setdefault(d.name, d)


def _overlaps(a, b):
    return all(ao < bo + bn and bo < ao + an for ao, an, bo, bn in zip(a["offsets"], a["lengths"], b["offsets"],
                                                                          b["lengths"]))


def _any_overlap(blocks):
    """Whether two of the blocks overlap: a sweep along the first dimension."""
    if not blocks or not blocks[0]["offsets"]:
        return len(blocks) > 1
    spans = sorted(blocks, key=lambda b: b["offsets"][0])
    for i, a in enumerate(spans):
        end = a["offsets"][0] + a["lengths"][0]
        for b in spans[i + 1:]:
            if b["offsets"][0] >= end:
                break
            if _overlaps(a, b):
                return True
    return False


_active = None  # the Capture a load_weights call is recording into


def capture(model, tensors, load_weights=None):
    """Captures model's table: runs load_weights (default model.load_weights) on recordings of the
    checkpoint tensors (tensors: [{"name", "dtype", "shape"}], as /v1/tensors lists them) and
    returns a Capture."""
    global _active
    load_weights = load_weights or model.load_weights
    cap = Capture(model, tensors)
    names = [t["name"] for t in tensors]
    fallbacks = set()
    at = 0
    while at < len(names):
        yielded = []

        def recordings(start):
            for name in names[start:]:
                t = cap.sources[name]
                yielded.append(name)
                yield name, Recording.of(name, torch_dtype(t["dtype"]), list(t["shape"]))

        _active = cap
        try:
            with torch.no_grad():
                load_weights(recordings(at))
            at = len(names)
        except Unsupported as e:
            if not yielded:
                raise
            involved = set(e.sources) or {yielded[-1]}
            log.debug("shardsrv capture: %s: falling back", e)
            fallbacks |= involved
            at += len(yielded)
        finally:
            _active = None
        for name in yielded:
            if name in fallbacks:
                cap._current.pop(name, None)
    # Blocks in checkpoint order, per destination in the model's order; a later write wins, so a
    # source whose blocks overlap earlier ones falls back (its loader then writes last, for real).
    order = {name: i for i, name in enumerate(names)}
    per_dest, overlapping = {}, {}
    sources = sorted(cap._current, key=order.get)
    for source in sources:
        for dest, b in cap._current[source]:
            per_dest.setdefault(dest, []).append(b)
    for dest, blocks in per_dest.items():
        if _any_overlap(blocks):
            overlapping[dest] = []
    if overlapping:  # rare: redo those destinations in order, the later source falling back
        for source in sources:
            mine = [(d, b) for d, b in cap._current[source] if d in overlapping]
            if any(_overlaps(b, o) for d, b in mine for o in overlapping[d]) or \
                    any(_any_overlap([b for d2, b in mine if d2 == d]) for d in {d for d, _ in mine}):
                fallbacks.add(source)
            else:
                for d, b in mine:
                    overlapping[d].append(b)
        per_dest = {}
        for source in sources:
            if source not in fallbacks:
                for dest, b in cap._current[source]:
                    per_dest.setdefault(dest, []).append(b)
    model_order = [n for n, _ in model.named_parameters()] + [n for n, _ in model.named_buffers()]
    for name in model_order:
        if name in per_dest:
            cap.blocks[name] = per_dest[name]
    cap.fallbacks = [n for n in names if n in fallbacks]
    cap._current = {}
    shown = ", ".join(cap.fallbacks[:8]) + (", ..." if len(cap.fallbacks) > 8 else "")
    captured = {b["source"] for blocks in cap.blocks.values() for b in blocks}
    log.info("captured %d tensors into %d blocks, %d fallbacks%s", len(captured),
             cap.block_count(), len(cap.fallbacks), f" ({shown})" if cap.fallbacks else "")
    return cap
