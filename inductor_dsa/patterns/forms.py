"""Shared forms of the DSA recognisers: what the indexer, the paged key and sparse attention
have in common, read off values of the symbolic engine.

* ``DSA_READS``: the handler sets every DSA recogniser reads graphs with (one explicit chain);
* operands: ``Term`` (a graph tensor and the atoms of its dims), ``term_of``;
* products and constants: ``peel`` (casts), ``factors``, ``split_consts``, ``sum_parts``;
* masks: ``peel_masks`` (``where(c, fill, x)``, ``x + where(c, fill, 0)``, ``x + bias``, ...), ``negate``,
  ``Opaque`` (a condition given as data),
  ``is_minus_inf_like`` (a fill that ranks like -inf);
* limits: ``check_heads`` (head_dim and head count against ``limits.py``);
* text: ``RegionNames``, ``dtype_name`` (the normalised rendering of a rewritten region).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import sympy
import torch
import torch.fx as fx

from .. import limits
from ..symbolic import (ARITH, BYTES, GATHER, LAYOUT, Add, Cast, Contract, HandlerSet, Index, Leaf, Mul,
                        Reject, Sum, Value, Where, const_value)

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)

# Every DSA pattern reads with all four families. Byte handlers come first: they claim only byte
# caches, lookup tables and programs over bytes (and narrow integer arithmetic, which wraps, so
# it must not be read as exact sympy even in an attention index); the gather family is kept for
# the indexer too, so a gathered float key reads as it always did (a Gather, not a Leaf).
DSA_READS = HandlerSet.chain("dsa", BYTES, LAYOUT, ARITH, GATHER)


@dataclass
class Term:
    """A tensor to hand to the op: a graph node and the atoms of its dims."""
    node: fx.Node
    dims: tuple
    dtype: torch.dtype


def peel(v: Value) -> Value:
    while isinstance(v, Cast):
        v = v.x
    return v


_NARROW = (torch.bfloat16, torch.float16, torch.float32)


def exact_source(v: Value, wider=(torch.float32,)) -> Value:
    """v under the casts that cannot change a value: a float cast to its own dtype, or a bf16 / fp16 /
    fp32 tensor widened to one of ``wider`` (``q.float()`` of bf16 is the bf16 q, read exactly)."""
    while isinstance(v, Cast) and v.x.origin is not None:
        src = v.x.origin.meta["val"].dtype
        if src != v.dtype and not (v.dtype in wider and src in _NARROW and src.itemsize <= v.dtype.itemsize):
            break
        v = v.x
    return v


def factors(v: Value) -> list:
    """Flatten a product (through float casts); constants stay as Const factors."""
    p = peel(v)
    if isinstance(p, Mul):
        return [f for x in p.factors for f in factors(x)]
    return [v]


@dataclass
class Opaque:
    """A mask condition the algebra cannot read (a boolean tensor given as data, or built from
    one): visible where the tensor ``cond`` (an opaque ``Index``, ``cond.origin`` its node) equals
    ``shown``. Like an opaque ``Index`` it has no expression for the range proofs."""
    cond: Index
    shown: bool
    expr = None


def visible_where(c: Index):
    """The condition ``c`` as a visible condition: itself, or an ``Opaque`` shown where True."""
    return Opaque(c, True) if c.expr is None else c


def mask_term(m: Value):
    """(visible, fill) for where(c, fill, 0) / where(c, 0, fill), else None."""
    m = peel(m)
    if not isinstance(m, Where):
        return None
    a, b = const_value(m.a), const_value(m.b)
    if a is None or b is None:
        return None
    if b == 0 and a != 0:
        return negate(m.cond), a
    if a == 0 and b != 0:
        return visible_where(m.cond), b
    return None


def negate(c):
    """not ``c`` (an ``Opaque`` flips the value that shows; a readable one remembers ``c``)."""
    if isinstance(c, Opaque):
        return Opaque(c.cond, not c.shown)
    if c.expr is None:
        return Opaque(c, False)
    return Index(sympy.Not(c.expr), is_bool=True, leaves=c.leaves, logic=("not", c))


def peel_masks(v: Value, biases: Optional[list] = None):
    """(unmasked value, [visible conditions], [fills], additive count). With ``biases`` (a list), an
    opaque float tensor added to the scores (an additive mask given as data) is appended to it (the
    value as added) instead of stopping the match."""
    conds, fills, additive = [], [], 0
    while True:
        v = peel(v)
        if isinstance(v, Where):
            a, b = const_value(v.a), const_value(v.b)
            if a is not None and b is None:
                conds.append(negate(v.cond))
                fills.append(a)
                v = v.b
            elif b is not None and a is None:
                conds.append(visible_where(v.cond))
                fills.append(b)
                v = v.a
            else:
                raise Reject("where(...) is not a mask: it does not select between the scores and a constant")
            continue
        if isinstance(v, Add):
            for m, other in ((v.b, v.a), (v.a, v.b)):
                mt = mask_term(m)
                if mt is not None:
                    conds.append(mt[0])
                    fills.append(mt[1])
                    additive += 1
                    v = other
                    break
            else:
                data = [(m, o) for m, o in ((v.b, v.a), (v.a, v.b)) if isinstance(peel(m), Leaf)]
                if biases is None:
                    raise Reject("an addition to the scores that is not a where(mask, fill, 0) mask")
                if not data:
                    raise Reject("an addition to the scores that is neither a where(mask, fill, 0) mask nor a "
                                 "tensor given as data (an additive bias is a graph input or an op not read)")
                biases.append(data[0][0])
                v = data[0][1]
            continue
        return v, conds, fills, additive


def sum_parts(v: Value):
    """(heads atoms, factor list) of Sum(Mul(...)) or Contract(a, b)."""
    v = peel(v)
    if isinstance(v, Sum):
        return v.atoms, factors(v.x)
    if isinstance(v, Contract):
        return v.atoms, factors(v.a) + factors(v.b)
    return None


def split_consts(fs, what):
    consts, rest = [], []
    for f in fs:
        c = const_value(f)
        if c is not None:
            consts.append(c)
        else:
            rest.append(f)
    return math.prod(consts) if consts else 1.0, rest


def term_of(v: Value, A) -> Term:
    """The graph tensor a value was read from, as an operand (its dims' atoms flattened)."""
    node = v.origin
    if node is None:
        raise Reject("an operand is computed inside the product (not a tensor of the graph)")
    return Term(node, A.flat_dims(v.origin_dims), node.meta["val"].dtype)


def is_minus_inf_like(x: float, dtype: torch.dtype) -> bool:
    """Whether a mask fill ranks like -inf for scores of ``dtype``: -inf, or at or below that dtype's
    most negative finite value (no finite score lies below it). A finite fill above it (e.g.
    finfo(float16).min on fp32 scores, or -1e4) can be crossed by visible scores, which top-k
    would then rank below masked columns: not the op's semantics."""
    return x == -math.inf or (dtype.is_floating_point and x <= torch.finfo(dtype).min)


def check_heads(A, head_dim_atoms, head_atoms) -> list:
    """Reject unless head_dim (the product of ``head_dim_atoms``' sizes) and the head count have
    known values within ``limits``; returns the symbolic ones, to specialise once proven."""
    D = sympy.Mul(*[A.size(a) for a in head_dim_atoms])
    Hn = sympy.Mul(*[A.size(a) for a in head_atoms])
    d_val, h_val = A.shapes.hint(D), A.shapes.hint(Hn)
    if d_val is None or h_val is None:
        raise Reject(f"head_dim {D} and heads {Hn} have no known value")
    if not limits.head_dim_ok(d_val):
        raise Reject(f"q: head_dim must be a power of two in [{limits.HEAD_DIM_MIN}, {limits.HEAD_DIM_MAX}], "
                     f"got {d_val}")
    if not 1 <= h_val <= limits.MAX_HEADS:
        raise Reject(f"{h_val} heads is outside [1, {limits.MAX_HEADS}]")
    return [e for e in (D, Hn) if not e.is_Integer]


class RegionNames:
    """Role names for atoms (``prefix``+i, in order) and S0, S1, ... for size symbols: the
    normalised text of a rewritten region, free of node names and generated code."""

    def __init__(self, A, roles):
        self.A, self.names, self.size_syms, self.tensors = A, {}, {}, {}
        for prefix, atoms in roles:
            for i, a in enumerate(atoms):
                self.names[A.find(a)] = f"{prefix}{i}"

    def expr(self, e) -> str:
        A = self.A
        e = A.resolve(sympy.sympify(e))
        subs = {}
        for s in sorted(e.free_symbols, key=lambda s: s.name):
            a = A.atom_of(s)
            if a is not None:
                subs[s] = sympy.Symbol(self.names.get(A.find(a), "_"))
            else:
                subs[s] = self.size_syms.setdefault(s, sympy.Symbol(f"S{len(self.size_syms)}"))
        out = e.xreplace(subs)
        for f in sorted({f.func for f in out.atoms(sympy.core.function.AppliedUndef)}, key=str):
            out = out.replace(f, self.tensors.setdefault(f, sympy.Function(f"tensor{len(self.tensors)}")))
        return str(out)

    def dims(self, ds) -> str:
        A = self.A
        return "[" + ", ".join("*".join(self.names.get(A.find(a), "_") for a in d) or "1" for d in ds) + "]"

    def atoms(self, xs) -> str:
        return "(" + ", ".join(f"{self.names[self.A.find(a)]}={self.expr(self.A.size(a))}" for a in xs) + ")"


def dtype_name(t) -> str:
    return str(t).replace("torch.", "")
