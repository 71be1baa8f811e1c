"""The DSA sparse-attention pattern (one KV head, K = V, indices with -1 holes).

Reads the output of a contraction and proves it computes, for every query row r and head h,

    rows_j   = kv[b(r), g(idx[r, j]), :]                 g(i) = i for i >= 0 (clamp, where, wrap)
    s_j      = scale * q[r, h, :] . rows_j               -inf where idx[r, j] == -1 (the only mask)
    out[r, h] = sum_j exp(s_j - c) rows_j / (sum_j exp(s_j - c) [+ exp(sink[h] - c)])

with c the row max of the scores (max'ed with the sink, or over cat([s, sink]) in the
softmax-over-a-sink-column spelling). The same gathered rows are K and V. Indices are
assumed to lie in [-1, N) (the op's contract). Any doubt raises ``Reject`` with the reason.

A query with no valid slot: with the sink inside the shift c, eager gives 0 (as the op
does); without a sink, or with a shift that leaves the sink out, c = -inf and eager gives
NaN, which the replacement reproduces from the op's lse (``empty = "nan"``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import sympy
import torch

from ..symbolic import (TV, Add, Cat, Contract, Exp, Gather, Index, Interpreter, Leaf, Max, Maximum, Mul,
                        Recip, Reject, Slice, Sum, Value, const_value, deps)
from .forms import (DSA_READS, FLOAT_DTYPES, RegionNames, Term, check_heads, dtype_name, exact_source, factors,
                    peel, peel_masks, split_consts, sum_parts)

READS = DSA_READS  # the handler sets sparse attention is read with


class NotCandidate(Reject):
    """The contraction is not (weights) @ (gathered rows): not worth reporting."""


@dataclass
class AttentionForm:
    q: Term
    kv: Term
    indices: Term
    sink: Optional[Term]
    scale: float
    batch: tuple           # atoms of kv's batch dim (shared by q and the indices)
    rows: tuple            # the other query row atoms
    heads: tuple
    head_dim: tuple
    keys: tuple            # the top-k slot atoms
    kv_rows: tuple         # atoms of kv's gathered dim
    out_dims: tuple        # flattened atoms of each output dim
    out_dtype: torch.dtype
    empty: str             # "zeros" | "nan": what eager gives a query with no valid slot
    static: list = field(default_factory=list)


def _term(v: Value, I: Interpreter, what: str) -> Term:
    v = exact_source(v)
    if v.origin is None:
        raise Reject(f"{what} is computed inside the pattern (not a tensor of the graph)")
    return Term(v.origin, I.A.flat_dims(v.origin_dims), v.origin.meta["val"].dtype)


def _atoms(A, xs) -> frozenset:
    return frozenset(A.flat_dim(tuple(xs)))


def _shifted(e: Value):
    """(x, c) for x - c (an Add whose other term is c * -1)."""
    e = peel(e)
    if isinstance(e, Add):
        for x, m in ((e.a, e.b), (e.b, e.a)):
            fs = factors(m)
            minus = [f for f in fs if const_value(f) == -1.0]
            if len(fs) == 2 and len(minus) == 1:
                return x, [f for f in fs if f is not minus[0]][0]
    raise Reject("the exponent is not scores minus a shift")


def _normalised(p: Value, I: Interpreter):
    """(x, c, extras, sum atoms) for p = exp(x - c) / (sum exp(x - c) + sum(extras))."""
    fs = factors(p)
    exps = [f for f in fs if isinstance(peel(f), Exp)]
    recs = [f for f in fs if isinstance(peel(f), Recip)]
    if len(exps) != 1 or len(recs) != 1 or len(fs) != 2:
        raise Reject("the attention weights are not exp(...) / denominator")
    num = peel(exps[0])
    terms, todo = [], [peel(peel(recs[0]).x)]
    while todo:
        t = peel(todo.pop())
        if isinstance(t, Add):
            todo += [t.a, t.b]
        else:
            terms.append(t)
    sums = [t for t in terms if isinstance(t, Sum) and peel(t.x) is num]
    if len(sums) != 1:
        raise Reject("the denominator does not sum the numerator's exp (sink in the numerator?)")
    extras = [t for t in terms if t is not sums[0]]
    x, c = _shifted(num.x)
    return x, c, extras, sums[0].atoms


def _same(a: Value, b: Value) -> bool:
    a, b = peel(a), peel(b)
    return a is b or (a.origin is not None and a.origin is b.origin)


def _is_row_max(c: Value, x: Value, J, A) -> bool:
    c = peel(c)
    return isinstance(c, Max) and _same(c.x, x) and _atoms(A, c.atoms) == J


def _softmax(p: Value, I: Interpreter, J):
    """(scores, sink value or None, empty) for attention weights p over the key atoms J."""
    A = I.A
    pp = peel(p)
    if isinstance(pp, Slice):  # softmax(cat([scores, sink column]))[..., :K]
        if frozenset(A.flat(pp.atom_out)) != J:
            raise Reject("the sliced softmax is not contracted over its sliced dim")
        x, c, extras, sum_atoms = _normalised(pp.x, I)
        cat = peel(x)
        if not isinstance(cat, Cat) or frozenset(A.flat(cat.atom)) != frozenset(A.flat(pp.atom_in)):
            raise Reject("the sliced softmax is not over a concatenation along the sliced dim")
        if extras or _atoms(A, sum_atoms) != frozenset(A.flat(cat.atom)) or not _is_row_max(c, x, _atoms(A, sum_atoms), A):
            raise Reject("the softmax over the concatenation is not exp(x - max x) / sum exp(x - max x)")
        if len(cat.parts) != 2:
            raise Reject("the concatenation is not [scores, sink column]")
        offsets = [sympy.Integer(0), cat.sizes[0]]
        kept = [i for i in range(2) if A.shapes.eq(pp.start, offsets[i])
                and A.shapes.eq(pp.stop - pp.start, cat.sizes[i])]
        if len(kept) != 1:
            raise Reject("the slice after the softmax does not keep exactly the scores (sink column kept?)")
        i = kept[0]
        if not A.shapes.is_one(cat.sizes[1 - i]):
            raise Reject("the column dropped after the softmax is not a single sink column")
        sink = cat.parts[1 - i]
        A.unify((pp.atom_out,), cat.part_atoms[i])
        return cat.parts[i], sink, "zeros"
    x, c, extras, sum_atoms = _normalised(p, I)
    if _atoms(A, sum_atoms) != J:
        raise Reject("the softmax is not over the gathered slots (wrong dim)")
    sink = None
    if extras:
        if len(extras) != 1 or not isinstance(extras[0], Exp):
            raise Reject("the denominator adds something other than exp(sink - shift)")
        sink, c2 = _shifted(extras[0].x)
        if not _same(c2, c):
            raise Reject("the sink term uses a different shift than the scores")
    cc = peel(c)
    if _is_row_max(cc, x, J, A):
        return x, sink, "nan"
    if isinstance(cc, Maximum) and sink is not None:
        for m, other in ((cc.a, cc.b), (cc.b, cc.a)):
            if _is_row_max(m, x, J, A) and _same(other, sink):
                return x, sink, "zeros"
    raise Reject("the softmax shift is not the row max of the scores (optionally with the sink)")


def _mask_index(I: Interpreter, conds):
    """The index tensor expression X whose -1 entries the mask hides: visible <=> X >= 0 on X >= -1."""
    A = I.A
    if not conds:
        raise Reject("no -1 mask on the scores (empty slots would be attended)")
    if any(c.expr is None for c in conds):
        raise Reject("the mask is an opaque boolean tensor, not a test of the indices")
    vis = A.resolve(sympy.And(*[c.expr for c in conds]))
    rels = list(vis.atoms(sympy.core.relational.Relational))
    xs = set()
    for r in rels:
        if r.rhs.is_Integer:
            xs.add(r.lhs)
        elif r.lhs.is_Integer:
            xs.add(r.rhs)
        else:
            raise Reject(f"mask term {r} does not compare the indices with a constant")
    if len(xs) != 1:
        raise Reject("the mask does not test one index tensor")
    (X,) = xs
    x = sympy.Symbol("_x", integer=True)
    y = sympy.Symbol("_y", integer=True, nonnegative=True)
    v = vis.xreplace({X: x})
    if v.free_symbols - {x} or v.atoms(sympy.core.function.AppliedUndef):
        raise Reject("the mask depends on more than the indices")
    if v.xreplace({x: sympy.Integer(-1)}) != sympy.false or v.xreplace({x: y}) != sympy.true:
        raise Reject(f"the mask is not 'index == -1' (visible where {vis})")
    return X


def _index_node(I: Interpreter, X):
    """A graph node whose value is the integer expression X (the op's indices)."""
    for node, tv in I.memo.items():
        v = tv.value
        if isinstance(v, Index) and not v.is_bool and v.expr is not None and I.A.resolve(v.expr) == X:
            return Term(node, I.A.flat_dims(tv.dims), tv.dtype)
    raise Reject("the masked index tensor is not a tensor of the graph")


def read_attention(tv: TV, I: Interpreter) -> AttentionForm:
    A = I.A
    out = peel(tv.value)
    if not isinstance(out, Contract):
        raise NotCandidate("not a contraction")
    kappa = out.atoms
    operands = [out.a, out.b]
    gathers = [f for f in operands if isinstance(exact_source(f), Gather)]
    if len(gathers) != 1:
        raise NotCandidate("not weights @ gathered rows")
    V = exact_source(gathers[0])
    P = [f for f in operands if f is not gathers[0]][0]
    if not isinstance(peel(P), (Mul, Slice)):
        raise NotCandidate("the weights are not a softmax")
    J = _atoms(A, kappa)

    scores, sink, empty = _softmax(P, I, J)
    J = _atoms(A, kappa)  # the concatenation spelling unifies the sliced slot index
    s, conds, fills, _ = peel_masks(scores)
    if any(f != -math.inf for f in fills):
        bad = [f for f in fills if f != -math.inf][0]
        raise Reject(f"mask fill value {bad} is not -inf")
    scale, rest = split_consts(factors(s), "scores")
    dots = [f for f in rest if sum_parts(f) is not None]
    extra = [f for f in rest if f not in dots]
    if len(dots) == 1 and extra and all(not f.origin_dims and isinstance(peel(f), Leaf) for f in extra):
        raise Reject("the scale is a run-time tensor (a Python float made an input by dynamic=True?): "
                     "the op needs a constant")
    if len(rest) != 1 or not dots:
        raise Reject("the scores are not scale * q . rows")
    D, dfs = sum_parts(rest[0])
    c_dot, ops_ = split_consts(dfs, "dot")
    scale *= c_dot
    ks = [f for f in ops_ if isinstance(exact_source(f), Gather)]
    if len(ops_) != 2 or len(ks) != 1:
        raise Reject("the scores are not q . gathered rows")
    K = exact_source(ks[0])
    if K is not V and not (K.src.origin is not None and K.src.origin is V.src.origin and K.axis == V.axis
                           and A.resolve(K.index.expr) == A.resolve(V.index.expr)):
        raise Reject("K and V are different tensors (the op uses the same gathered rows for both)")
    if not math.isfinite(scale):
        raise Reject(f"scale {scale} is not finite")
    qv = [f for f in ops_ if f is not ks[0]][0]

    # -- the indices: mask and gather read the same tensor X -------------------------------
    X = _mask_index(I, conds)
    y = sympy.Symbol("_y", integer=True, nonnegative=True)
    n_rows = A.dim_size(V.src_dims[V.axis])
    g = A.resolve(V.index.expr).xreplace({X: y})
    g = g.replace(lambda z: isinstance(z, sympy.Mod) and z.args[0] == y and A.shapes.eq(z.args[1], n_rows),
                  lambda z: y)
    if g != y:
        raise Reject(f"the gather does not read row idx for idx >= 0 (it reads {g})")
    idx = _index_node(I, X)

    # -- roles ------------------------------------------------------------------------------
    Dset = _atoms(A, D)
    out_dims = A.flat_dims(tv.dims)
    O = frozenset(a for d in out_dims for a in d)
    if len(O) != sum(len(d) for d in out_dims):
        raise Reject("the output repeats an index (a diagonal)")
    dq, dX = deps(qv, A), deps(Index(X), A)
    kv_other = [a for i, d in enumerate(V.src_dims) if i != V.axis for a in A.flat_dim(d)]
    if not Dset <= set(kv_other) or not Dset <= dq or not Dset <= O:
        raise Reject("q, the gathered rows and the output do not share the head_dim index")
    batch = tuple(a for a in kv_other if a not in Dset)
    if J & dq or J & O:
        raise Reject("q or the output depends on the slot index")
    if not J <= dX:
        raise Reject("the indices do not run over the contracted slots")
    if not dX <= O | J or dX & Dset:
        raise Reject("the indices depend on an index that is neither a row nor a slot")
    if not frozenset(batch) <= O:
        raise Reject("kv has a batch index the output does not have")
    if not dq <= O:
        raise Reject("q depends on an index the output does not have")
    row_set = (dX & O) | frozenset(batch)
    flat_out = [a for d in out_dims for a in d]
    heads = tuple(a for a in flat_out if a not in row_set and a not in Dset)
    rows = tuple(a for a in flat_out if a in row_set and a not in batch)
    sink_term = None
    if sink is not None:
        if not deps(sink, A) <= frozenset(heads):
            raise Reject("the sink depends on more than the head index")
        sink_term = _term(sink, I, "the sink")
        if not sink_term.dtype.is_floating_point:
            raise Reject("the sink is not floating point")

    qt, kvt = _term(qv, I, "q"), _term(V.src, I, "kv")
    for t, what in ((qt, "q"), (kvt, "kv")):
        if t.dtype not in FLOAT_DTYPES:
            raise Reject(f"{what} dtype {t.dtype} is not bf16/fp16/fp32")
    if idx.dtype not in (torch.int32, torch.int64):
        raise Reject(f"indices dtype {idx.dtype} is not int32/int64")
    static = check_heads(A, Dset, heads)
    return AttentionForm(q=qt, kv=kvt, indices=idx, sink=sink_term, scale=float(scale), batch=batch,
                         rows=rows, heads=heads, head_dim=tuple(sorted(Dset)), keys=tuple(sorted(J)),
                         kv_rows=tuple(A.flat_dim(V.src_dims[V.axis])), out_dims=out_dims,
                         out_dtype=tv.dtype, empty=empty,
                         static=static)


def render(form: AttentionForm, A, op_dtype: torch.dtype) -> str:
    """The rewritten region as normalised text (see ``indexer.render``)."""
    N = RegionNames(A, (("b", form.batch), ("r", form.rows), ("h", form.heads), ("d", form.head_dim),
                        ("j", form.keys), ("n", form.kv_rows)))
    dt = dtype_name
    empty = ("zeros (the sink is in the shift, as in eager)" if form.empty == "zeros"
             else "NaN (eager divides 0 by 0; restored where the op's lse is -inf)")
    lines = [f"sparse_attention  batch {N.atoms(form.batch)} rows {N.atoms(form.rows)} heads {N.atoms(form.heads)} "
             f"head_dim {N.atoms(form.head_dim)} keys {N.atoms(form.keys)} kv_rows {N.atoms(form.kv_rows)}",
             f"  q       {N.dims(form.q.dims)} {dt(form.q.dtype)} -> [batch, rows, heads, head_dim]",
             f"  kv      {N.dims(form.kv.dims)} {dt(form.kv.dtype)} -> [batch, kv_rows, head_dim], K = V",
             f"  indices {N.dims(form.indices.dims)} {dt(form.indices.dtype)} -> [batch, rows, keys], -1 = empty",
             "  sink    " + ("none" if form.sink is None else
                             f"{N.dims(form.sink.dims)} {dt(form.sink.dtype)} -> [heads] float32"),
             f"  scale   {form.scale:.6g}",
             f"  empty   {empty}",
             f"  out     {N.dims(form.out_dims)} {dt(form.out_dtype)} (op in {dt(op_dtype)})"]
    return "\n".join(lines)
