"""Property tests of the capture: random chains of the operations weight loaders use, run on real
tensors by torch and on recordings, must agree element for element. A recording's pieces are
evaluated here straight from the contract's definition of a block (element x of a block is
post(source[base + coeff · (x − offsets)])), one element at a time."""

import itertools
import os
import random
import sys
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), ".."))

try:
    import torch
except ImportError:
    torch = None

if torch is not None:
    from shardsrv import capture as cap


def evaluate(pieces, shape, dtype, sources):
    """The tensor pieces describe, element by element; every element must be covered once."""
    out = torch.zeros(shape, dtype=dtype)
    seen = torch.zeros(shape, dtype=torch.int32)
    for p in pieces:
        src = sources[p.source]
        for x in itertools.product(*(range(o, o + n) for o, n in zip(p.offs, p.lens))):
            rel = [xi - o for xi, o in zip(x, p.offs)]
            at = tuple(b + sum(c * r for c, r in zip(row, rel)) for b, row in zip(p.base, p.coeff))
            v = src[at]
            for op in p.post:
                assert op["op"] == "cast"
                v = v.to(cap.torch_dtype(op["dtype"]))
            out[x] = v.to(dtype)
            seen[x] += 1
    assert bool((seen == 1).all()), f"elements covered {seen.tolist()} times"
    return out


def factorizations(n, rng):
    """A random shape with n elements."""
    dims = []
    while n > 1 and len(dims) < 4:
        divs = [d for d in range(2, n + 1) if n % d == 0]
        d = rng.choice(divs)
        dims.append(d)
        n //= d
    if n > 1:
        dims.append(n)
    if rng.random() < 0.3:
        dims.insert(rng.randrange(len(dims) + 1), 1)
    return dims or [1]


def random_step(real, rec, rng):
    """Applies one random supported operation to both; returns (description, real', rec')."""
    nd, shape = real.dim(), list(real.shape)
    choices = ["reshape", "to", "clone", "unsqueeze", "expand", "cat", "stack"]
    if nd:
        choices += ["narrow", "getitem", "select", "chunk", "split", "flatten", "squeeze", "unbind"]
    if nd >= 2:
        choices += ["transpose", "permute", "t"]
    op = rng.choice(choices)
    d = rng.randrange(nd) if nd else 0
    if op in ("narrow", "select", "chunk", "split", "unbind") and shape[d] == 0:
        op = "clone"
    if op == "narrow":
        s = rng.randrange(shape[d])
        n = rng.randrange(1, shape[d] - s + 1)
        return f"narrow({d}, {s}, {n})", real.narrow(d, s, n), rec.narrow(d, s, n) if s % 2 else torch.narrow(rec, d, s, n)
    if op == "select":
        i = rng.randrange(-shape[d], shape[d])
        return f"select({d}, {i})", real.select(d, i), rec.select(d, i)
    if op == "unbind":
        i = rng.randrange(shape[d])
        return f"unbind({d})[{i}]", real.unbind(d)[i], rec.unbind(d)[i]
    if op == "getitem":
        per_dim = []  # the index items of each dimension: perhaps a None, then what takes the dimension
        for k in range(nd):
            items = [None] if rng.random() < 0.2 else []
            kind = rng.choice(["slice", "int", "all"])
            if kind == "int" and shape[k]:
                items.append(rng.randrange(-shape[k], shape[k]))
            elif kind == "slice":
                a, b = sorted(rng.randrange(-shape[k] - 1, shape[k] + 2) for _ in range(2))
                items.append(slice(a, b, rng.choice([1, 1, 2, 3])))
            else:
                items.append(slice(None))
            per_dim.append(items)
        if rng.random() < 0.3:
            index = tuple([Ellipsis] + [it for items in per_dim[rng.randrange(nd + 1):] for it in items])
        else:
            index = tuple(it for items in per_dim[:rng.randrange(nd + 1)] for it in items)
        if len(index) == 1 and rng.random() < 0.5:
            index = index[0]
        return f"[{index}]", real[index], rec[index]
    if op == "transpose":
        a, b = rng.randrange(nd), rng.randrange(-nd, nd)
        how = rng.choice([lambda t: t.transpose(a, b), lambda t: t.swapaxes(a, b), lambda t: torch.transpose(t, a, b)])
        return f"transpose({a}, {b})", real.transpose(a, b), how(rec)
    if op == "t" and nd == 2:
        return "t()", real.t(), rec.t() if rng.random() < 0.5 else rec.T
    if op in ("permute", "t"):
        perm = list(range(nd))
        rng.shuffle(perm)
        return f"permute({perm})", real.permute(*perm), rec.permute(*perm)
    if op == "chunk":
        n = rng.randrange(1, 5)
        parts = real.chunk(n, d)
        i = rng.randrange(len(parts))
        return f"chunk({n}, {d})[{i}]", parts[i], rec.chunk(n, d)[i]
    if op == "split":
        size = rng.randrange(1, shape[d] + 1)
        parts = real.split(size, d)
        i = rng.randrange(len(parts))
        return f"split({size}, {d})[{i}]", parts[i], torch.split(rec, size, dim=d)[i]
    if op == "reshape":
        new = factorizations(real.numel(), rng) if real.numel() else [0, *shape[1:]]
        if rng.random() < 0.3 and len(new) > 1 and real.numel():
            new[rng.randrange(len(new))] = -1
        return f"reshape({new})", real.reshape(new), rec.reshape(new) if rng.random() < 0.5 else rec.view(*new)
    if op == "flatten":
        if rng.random() < 0.5:
            return "flatten()", real.flatten(), rec.flatten()
        sizes = factorizations(shape[d], rng) if shape[d] else [0]
        return f"unflatten({d}, {sizes})", real.unflatten(d, sizes), rec.unflatten(d, sizes)
    if op == "squeeze":
        return f"squeeze({d})", real.squeeze(d), rec.squeeze(d)
    if op == "unsqueeze":
        d = rng.randrange(nd + 1)
        return f"unsqueeze({d})", real.unsqueeze(d), rec.unsqueeze(d)
    if op == "expand":
        new = [rng.randrange(1, 4) if n == 1 else n for n in shape]
        lead = [rng.randrange(1, 3)] if rng.random() < 0.3 else []
        return f"expand({lead + new})", real.expand(lead + new), rec.expand(lead + new)
    if op == "cat" and nd:
        s = rng.randrange(shape[d] + 1)
        return (f"cat(narrow {s}, whole; {d})", torch.cat([real.narrow(d, 0, s), real], d),
                torch.cat([rec.narrow(d, 0, s), rec], dim=d))
    if op == "stack":
        d = rng.randrange(nd + 1)
        return f"stack({d})", torch.stack([real, real], d), torch.stack([rec, rec], d)
    if op == "to":
        dtype = rng.choice([torch.float64, torch.float16, torch.bfloat16, torch.float32])
        how = rng.choice([lambda t: t.to(dtype), lambda t: t.to("cpu", dtype), lambda t: t.to(dtype=dtype),
                          lambda t: t.type_as(torch.zeros((), dtype=dtype)), lambda t: t.type(dtype)])
        return f"to({dtype})", real.to(dtype), how(rec)
    return "clone()", real.clone().contiguous(), rec.clone().contiguous().data.detach()


@unittest.skipIf(torch is None, "the capture needs torch")
class RandomChains(unittest.TestCase):
    def test_random_op_chains_match_torch(self):
        rng = random.Random(22)
        for case in range(2000):
            shape = [rng.randrange(1, 6) for _ in range(rng.randrange(1, 4))]
            # Values that survive F16 and BF16 exactly tell elements apart (distinct up to 256).
            real = (torch.arange(math_prod(shape), dtype=torch.float32) % 256 - 128).reshape(shape)
            rec = cap.Recording.of("w", torch.float32, shape)
            chain = []
            for _ in range(rng.randrange(1, 7)):
                step, real, rec = random_step(real, rec, rng)
                chain.append(step)
                with self.subTest(case=case, chain=" . ".join(chain)):
                    self.assertIsInstance(rec, cap.Recording)
                    self.assertEqual(list(rec.shape), list(real.shape))
                    self.assertEqual(rec.dtype, real.dtype)
                    got = evaluate(rec._pieces, list(real.shape), real.dtype,
                                   {"w": (torch.arange(math_prod(shape), dtype=torch.float32) % 256 - 128)
                                    .reshape(shape)})
                    self.assertTrue(torch.equal(got, real), f"{got} != {real}")

    def test_a_reshape_of_a_transpose_is_cut_into_pieces(self):
        rec = cap.Recording.of("w", torch.float32, [3, 4]).t().reshape(12)
        real = torch.arange(12.0).reshape(3, 4).t().reshape(12)
        self.assertEqual(len(rec._pieces), 4)
        self.assertTrue(torch.equal(evaluate(rec._pieces, [12], torch.float32,
                                             {"w": torch.arange(12.0).reshape(3, 4)}), real))

    def test_anything_else_is_refused_with_its_sources(self):
        rec = cap.Recording.of("w", torch.float32, [2, 2])
        other = cap.Recording.of("v", torch.float32, [2, 2])
        for what, f in [("mul", lambda: rec * 2), ("exp", lambda: rec.exp()), ("item", lambda: rec[0, 0].item()),
                        ("add", lambda: rec + other), ("numpy", lambda: rec.numpy()), ("bool", lambda: bool(rec[0, 0])),
                        ("index by tensor", lambda: rec[torch.tensor([1, 0])]),
                        ("cat with real values", lambda: torch.cat([rec, torch.zeros(2, 2)])),
                        ("view as another dtype", lambda: rec.view(torch.int32)),
                        ("copy into a temporary", lambda: torch.empty(2, 2).copy_(rec))]:
            with self.subTest(what), self.assertRaises(cap.Unsupported) as ctx:
                cap._active = cap.Capture(torch.nn.Module(), [])
                try:
                    f()
                finally:
                    cap._active = None
            self.assertIn("w", ctx.exception.sources)


@unittest.skipIf(torch is None, "the capture needs torch")
class Captures(unittest.TestCase):
    def model(self, load):
        m = torch.nn.Module()
        m.w = torch.nn.Parameter(torch.zeros(4, 6), requires_grad=False)
        m.load_weights = lambda weights: [load(m, name, t) for name, t in weights]
        return m

    def test_a_write_over_an_earlier_one_makes_the_later_source_a_fallback(self):
        def load(m, name, t):
            if name == "a":
                m.w.data.copy_(t)
            else:  # b overwrites a's middle columns
                m.w.data[:, 2:4].copy_(t)
        listing = [{"name": "a", "dtype": "F32", "shape": [4, 6]}, {"name": "b", "dtype": "F32", "shape": [4, 2]}]
        c = cap.capture(self.model(load), listing)
        self.assertEqual(c.fallbacks, ["b"])
        self.assertEqual([b["source"] for b in c.table()[0]["blocks"]], ["a"])

    def test_views_that_are_not_boxes_fall_back(self):
        def load(m, name, t):
            if name == "flat":
                m.w.data.view(-1)[3:9].copy_(t)  # a run across rows
            elif name == "strided":
                m.w.data[:, ::2].copy_(t)
            else:
                m.w.data[1].copy_(t)  # a row: a box
        listing = [{"name": "flat", "dtype": "F32", "shape": [6]}, {"name": "strided", "dtype": "F32", "shape": [4, 3]},
                   {"name": "row", "dtype": "BF16", "shape": [6]}]
        c = cap.capture(self.model(load), listing)
        self.assertEqual(c.fallbacks, ["flat", "strided"])
        self.assertEqual(c.table()[0]["blocks"], [{"offsets": [1, 0], "lengths": [1, 6], "source": "row", "base": [0],
                                                   "coeff": [[0, 1]]}])


def math_prod(shape):
    n = 1
    for s in shape:
        n *= s
    return n


if __name__ == "__main__":
    unittest.main()
