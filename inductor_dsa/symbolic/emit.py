"""sympy -> torch: evaluate index expressions and sizes while a replacement is being traced.

``Emit`` turns an integer sympy expression over atoms, size symbols and opaque integer tensors into
Python/torch ops (so symbolic sizes stay symbolic under ``make_fx``); ``on_rows_bool`` does the same
for a boolean condition; ``arrange`` rearranges a tensor by the atoms of its dims; ``sizer`` binds
the size of every atom for one traced call.
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

from .atoms import Atoms, atom_of
from .shapes import Reject


def _is_tensor(x):
    return isinstance(x, torch.Tensor)


def _extreme(a, b, largest: bool):
    """max (largest) or min of two values, each a tensor or a (Sym)Int."""
    if _is_tensor(a) or _is_tensor(b):
        if not _is_tensor(a):
            a, b = b, a
        if _is_tensor(b):
            return torch.maximum(a, b) if largest else torch.minimum(a, b)
        return torch.clamp(a, min=b) if largest else torch.clamp(a, max=b)
    return torch.sym_max(a, b) if largest else torch.sym_min(a, b)


class Emit:
    """Evaluates integer sympy expressions with Python/torch ops while being traced: ``sizes``
    maps size symbols to SymInts, ``atoms`` atoms to index tensors, ``funcs`` opaque integer
    tensors (sympy functions) to tensors; ``norm`` (the ShapeEnv's replacements) applies once."""

    def __init__(self, sizes: dict, atoms: dict, funcs: dict, norm=None):
        self.sizes, self.atoms, self.funcs, self.norm = sizes, atoms, funcs, norm

    def __call__(self, e):
        if self.norm is not None:  # the ShapeEnv's replacements, once, at the top
            e, norm = self.norm(e), self.norm
            self.norm = None
            try:
                return self(e)
            finally:
                self.norm = norm
        if e.is_Integer:
            return int(e)
        if isinstance(e, sympy.Symbol):
            a = atom_of(e)
            if a is not None:
                return self.atoms[a]
            if e not in self.sizes:
                raise Reject(f"size {e} is not available to the replacement")
            return self.sizes[e]
        if isinstance(e, sympy.core.function.AppliedUndef):
            return self.funcs[e.func]
        if isinstance(e, sympy.Add):
            terms = [self(a) for a in e.args]
            out = terms[0]
            for t in terms[1:]:
                out = out + t
            return out
        if isinstance(e, sympy.Mul):
            c, rest = e.as_coeff_Mul()
            if not c.is_Integer:
                raise Reject(f"non-integer coefficient in {e}")
            fs = [self(a) for a in sympy.Mul.make_args(rest)]
            out = fs[0]
            for f in fs[1:]:
                out = out * f
            return out if c == 1 else out * int(c)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
            b = self(e.base)
            out = b
            for _ in range(int(e.exp) - 1):
                out = out * b
            return out
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if not (den.is_integer and den.is_positive):
                raise Reject(f"cannot divide by {den} in {e}")
            n, d = self(num), self(den)
            return n // d if isinstance(e, sympy.floor) else -((-n) // d)
        name = type(e).__name__
        if name == "FloorDiv":
            return self(e.args[0]) // self(e.args[1])
        if isinstance(e, (sympy.Max, sympy.Min)):
            vals = [self(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = _extreme(out, v, isinstance(e, sympy.Max))
            return out
        raise Reject(f"cannot evaluate {e} ({name})")


def prod(xs):
    """The product of sizes (ints or SymInts) without math.prod's int check."""
    out = 1
    for x in xs:
        out = out * x
    return out


def arrange(x, dims, groups, size):
    """Rearrange tensor ``x`` (dims: atoms per dim) to [prod(group) for group in groups].

    Atoms of ``x`` not in any group are dropped by taking index 0 (the caller proved the
    value does not depend on them); atoms in a group but not in ``x`` are broadcast.
    """
    src = [a for d in dims for a in d]
    tgt = [a for g in groups for a in g]
    x = x.reshape([size(a) for a in src])
    for i in reversed(range(len(src))):
        if src[i] not in tgt:
            x = x.select(i, 0)
    src = [a for a in src if a in tgt]
    missing = [a for a in tgt if a not in src]
    if missing:
        x = x.reshape([size(a) for a in src] + [1] * len(missing))
    order = src + missing
    x = x.permute([order.index(a) for a in tgt])
    if missing:
        x = x.expand([size(a) for a in tgt])
    return x.reshape([prod(size(a) for a in g) for g in groups])


def sizer(A: Atoms, tensors, syms):
    """(symbol -> SymInt env, size(atom)) for a replacement traced on ``tensors`` and ``syms``."""
    env = {}
    for s in [z for t in tensors for z in t.shape] + list(syms):
        if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
            env.setdefault(s.node.expr, s)
    cache = {}

    def size(a):
        if a not in cache:
            cache[a] = Emit(env, {}, {}, A.shapes.simplify)(A.size(a))
        return cache[a]
    return env, size


def on_rows_bool(e, cond, grid, T, dev):
    """A row-only sympy condition as a bool tensor [T] (rows on ``grid``)."""
    if isinstance(cond, sympy.And):
        out = None
        for c in cond.args:
            v = on_rows_bool(e, c, grid, T, dev)
            out = v if out is None else out & v
        return out
    if isinstance(cond, sympy.Or):
        out = None
        for c in cond.args:
            v = on_rows_bool(e, c, grid, T, dev)
            out = v if out is None else out | v
        return out
    if isinstance(cond, sympy.Not):
        return ~on_rows_bool(e, cond.args[0], grid, T, dev)
    if cond in (sympy.true, sympy.false):
        return torch.full((T,), bool(cond), dtype=torch.bool, device=dev)
    ops_ = {sympy.Ge: operator.ge, sympy.Gt: operator.gt, sympy.Le: operator.le,
            sympy.Lt: operator.lt, sympy.Eq: operator.eq, sympy.Ne: operator.ne}
    fn = ops_.get(type(cond))
    if fn is None:
        raise Reject(f"cannot evaluate row condition {cond}")
    a, b = e(cond.lhs), e(cond.rhs)
    if not _is_tensor(a):
        a = torch.full((), a, dtype=torch.int64, device=dev)
    return fn(a, b).expand(grid).reshape(T)


def sym_nodes(graph: fx.Graph, topk=None) -> list:
    """The SymInt inputs a replacement may need: the graph's SymInt placeholders, and ``topk.k``
    when it is a node (a top-k spec with a SymInt k)."""
    out = [n for n in graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)]
    k = getattr(topk, "k", None)
    if isinstance(k, fx.Node) and k not in out:
        out.append(k)
    return out
