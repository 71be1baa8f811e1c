"""The prefill DSA indexer pattern.

Reads a node (a top-k input, or a logits tensor) and proves it computes

    X[rows, j] = fill                                              if not visible(rows, j)
               = sum_h  w[rows, h] * relu( sum_d q[rows, h, d] * k[b(rows), j, d] )   otherwise

where ``visible`` is a per-row range of j, ``fill`` is -inf or the scores' dtype's finfo.min, and
``w`` is a product of tensors/constants over (rows, h). A mask given as data (a boolean tensor the
algebra cannot read, or an opaque float tensor added after the head sum: X + bias[rows, j]) over rows
and keys only is kept as a graph tensor (``DataMask``) for the op's ``mask=``, next to any provable range. Tensor-parallel form: the head sum covers this
rank's heads and is summed across ranks (``all_reduce``, op sum) before the mask. Everything is checked on the index algebra
of the symbolic engine (``inductor_dsa.symbolic``): which index each tensor depends on, which indices are summed, in which
order relu and the weights are applied. Any doubt raises ``Reject`` with the reason.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import sympy
import torch

from ..symbolic import TV, AllReduce, Contract, Interpreter, Reject, Relu, Value, deps
from ..symbolic.ranges import RowRange, per_row_range
from .forms import (DSA_READS, FLOAT_DTYPES, Opaque, RegionNames, Term, check_heads, dtype_name, exact_source,
                    factors, is_minus_inf_like, negate, peel, peel_masks, split_consts, sum_parts, term_of)

READS = DSA_READS  # the handler sets the indexer is read with (a paged key reads bytes)


@dataclass
class IndexerForm:
    q: Term
    k: Term
    weights: list          # Terms, multiplied together
    scale: float           # times this constant
    rows: tuple            # atoms, internal order: batch atoms first, then the rest in output order
    batch: tuple           # rows atoms that k depends on (a per-batch k)
    heads: tuple
    contract: tuple
    keys: tuple            # atoms of the output's key dim, in order
    out_dims: tuple        # flattened atoms of each output dim
    key_dim: int
    out_dtype: torch.dtype
    fill: Optional[float] = None          # None: no mask
    ranges: Optional[RowRange] = None
    mask_leaves: tuple = ()               # (sympy function, node, dims) used by the ranges
    additive: bool = False
    static: list = field(default_factory=list)  # sizes to specialise (guard) before the swap
    key_symbol: Optional[sympy.Symbol] = None     # the column symbol of the ranges
    q_value: Optional[Value] = None       # the values read as q and k (patterns/paged.py reads k)
    k_value: Optional[Value] = None
    collective: Optional[AllReduce] = None        # partial scores summed across ranks before the mask
    data: tuple = ()                      # DataMask: masks given as data, passed to the op's mask=


@dataclass
class DataMask:
    """A mask the op reads as data: a graph tensor over rows and keys (atoms per dim), either a
    boolean (visible where it equals ``shown``) or, with ``shown`` None, an additive float bias."""
    node: object
    dims: tuple
    dtype: torch.dtype
    shown: Optional[bool]


def _collective(v: Value):
    """(partial scores, the all-reduce) when ``v`` is a sum across ranks (tensor-parallel heads:
    each rank sums its own heads, then ``all_reduce``), else (v, None). Only a sum may be crossed:
    sum_r sum_{h in rank r} = sum_h; max / avg / product of partial sums are other functions."""
    p = peel(v)
    if not isinstance(p, AllReduce):
        return v, None
    if p.op != "sum":
        raise Reject(f"all_reduce with op {p.op!r}: only a sum of partial scores is the indexer")
    return p.x, p


def read_logits(tv: TV, I: Interpreter, key_dim: Optional[int] = None) -> IndexerForm:
    A = I.A
    out_dtype = tv.dtype
    biases = []
    v, conds, fills, additive = peel_masks(tv.value, biases)
    v, collective = _collective(v)

    # -- weighted head sum, possibly times per-row factors ---------------------------------
    post = []
    parts = sum_parts(v)
    if parts is None:
        fs = factors(v)
        sums = [f for f in fs if sum_parts(f) is not None]
        if len(sums) != 1:
            if isinstance(peel(v), Relu):
                raise Reject("relu(q.k) is not summed over heads")
            raise Reject("no weighted sum over heads of relu(q.k)")
        post = [f for f in fs if f is not sums[0]]
        parts = sum_parts(sums[0])
    heads, inner = parts
    relus = [f for f in inner if isinstance(peel(f), Relu)]
    if len(relus) != 1:
        raise Reject("the head sum is not over relu(q.k) * weights (no relu factor"
                     + (", or several)" if relus else ")"))
    weights = [f for f in inner if f is not relus[0]] + post

    # -- relu(c * q.k), c > 0 -----------------------------------------------------------------
    pre = factors(peel(relus[0]).x)
    dots = [f for f in pre if sum_parts(f) is not None]
    if len(dots) != 1:
        raise Reject("relu is not applied to a q.k product")
    c_pre, other = split_consts([f for f in pre if f is not dots[0]], "relu")
    if other:
        raise Reject("the relu input is scaled by a tensor of unknown sign (weights applied before relu?)")
    if not c_pre > 0:
        raise Reject(f"the relu input is scaled by {c_pre} <= 0")
    dot = peel(dots[0])
    if isinstance(dot, Contract):
        contract, (ta, tb) = dot.atoms, (dot.a, dot.b)
        c_dot = 1.0
    else:
        contract = dot.atoms
        c_dot, ts = split_consts(factors(dot.x), "dot")
        if len(ts) != 2:
            raise Reject("the q.k product does not have exactly two tensor operands")
        ta, tb = ts
    if not c_dot > 0:
        raise Reject(f"q.k is scaled by {c_dot} <= 0 before relu")
    scale, wterms = split_consts(weights, "weights")
    scale *= c_pre * c_dot

    # -- roles of the indices -------------------------------------------------------------------
    out_dims = A.flat_dims(tv.dims)
    C = frozenset(A.flat_dim(contract))
    H = frozenset(A.flat_dim(heads))
    errors = []
    for qv, kv in ((ta, tb), (tb, ta)):
        try:
            form = _assign(I, qv, kv, wterms, C, H, out_dims, key_dim)
        except Reject as e:
            errors.append(str(e))
            continue
        form.scale, form.out_dtype, form.collective = scale, out_dtype, collective
        _attach_mask(I, form, conds, fills, additive, biases)
        return form
    # prefer the reason from the orientation where q carries more of the summed indices
    raise Reject(errors[1] if len(H & deps(tb, A)) > len(H & deps(ta, A)) else errors[0])


def _assign(I, qv, kv, wterms, C, H, out_dims, key_dim) -> IndexerForm:
    A = I.A
    dq, dk = deps(qv, A), deps(kv, A)
    if key_dim is None:
        cand = [i for i, d in enumerate(out_dims) if d and set(d) <= dk and not set(d) & dq]
        if len(cand) != 1:
            raise Reject("cannot tell which output dim indexes the keys")
        key_dim = cand[0]
    if H & dk:
        raise Reject("the weighted sum runs over an index of k (a sum over keys, or a per-head k)")
    J = out_dims[key_dim]
    if not J:
        raise Reject("the key dim has size 1")
    Jset = frozenset(J)
    every = frozenset(a for d in out_dims for a in d)
    if len(every) != sum(len(d) for d in out_dims):
        raise Reject("the output repeats an index (a diagonal)")
    R = every - Jset
    if not C:
        raise Reject("q.k contracts no index")
    if not (C <= dq and C <= dk):
        raise Reject("q and k do not both span the contracted (head_dim) index")
    if not Jset <= dk:
        raise Reject("the top-k/key dim is not an index of k")
    if Jset & dq:
        raise Reject("q depends on the key index")
    if not H <= dq:
        raise Reject("the head sum runs over an index q does not depend on")
    if not dq <= R | H | C:
        raise Reject("q depends on an index that is not a row, head or head_dim index")
    if not dk <= Jset | C | R:
        raise Reject("k depends on an index that is neither key, head_dim nor batch")
    for w in wterms:
        dw = deps(w, A)
        if dw & Jset:
            raise Reject("weights depend on the key index (per-key weights)")
        if not dw <= R | H:
            raise Reject("weights depend on an index that is not a row or head index")
    batch = tuple(a for d in out_dims for a in d if a in dk and a in R)
    rows_out = tuple(a for i, d in enumerate(out_dims) if i != key_dim for a in d)
    rows = batch + tuple(a for a in rows_out if a not in batch)
    qt, kt = _operands(qv, kv, A)
    if qt.dtype not in FLOAT_DTYPES or kt.dtype != qt.dtype:
        raise Reject(f"q/k dtypes {qt.dtype}/{kt.dtype} are not one of bf16/fp16/fp32 (shared)")
    # head_dim and heads are compile-time constants of the kernels: symbolic ones (dynamic=True)
    # are specialised to their example values once the whole match is proven.
    static = check_heads(A, C, H)
    wts = []
    for w in wterms:
        t = term_of(w, A)
        if not t.dtype.is_floating_point:
            raise Reject("weights are not floating point")
        wts.append(t)
    order = sorted
    return IndexerForm(q=qt, k=kt, weights=wts, scale=1.0, rows=rows, batch=batch,
                       heads=tuple(order(H)), contract=tuple(order(C)), keys=J,
                       out_dims=out_dims, key_dim=key_dim, out_dtype=None, static=static,
                       q_value=qv, k_value=kv)


def _operands(qv, kv, A):
    """q and k as the op takes them: under exact upcasts when both peel to one dtype (transformers'
    ``matmul(q.float(), k.float())`` of bf16 q, k is a bf16 q.k with fp32 accumulation: the same
    products, each exact in fp32, on the matrix units instead of an fp32 dot)."""
    qs, ks = exact_source(qv), exact_source(kv)
    if qs.origin is not None and ks.origin is not None and \
            qs.origin.meta["val"].dtype == ks.origin.meta["val"].dtype:
        qv, kv = qs, ks
    return term_of(qv, A), term_of(kv, A)


def _data_masks(I, conds, biases, keys):
    """(provable conditions, [DataMask]): opaque conditions, and readable ones that read a tensor
    indexed by the key (``pad[b, j] == 1``: data, not a range), become their boolean tensors,
    split through ~, & (and | of hidden conditions, De Morgan) so that provable parts keep their range."""
    A, ranged, data = I.A, [], []
    keys = {A.find(a) for a in keys}

    def reads_keys(c):
        return any(dims is not None and {A.find(x) for d in dims for x in A.flat_dim(d)} & keys
                   for _, _, dims in c.leaves)

    def visible(c, shown):
        if c.expr is not None and not reads_keys(c):
            ranged.append(c if shown else negate(c))
            return
        logic = c.logic or ("",)
        if logic[0] == "not":
            visible(logic[1], not shown)
        elif logic[0] == ("and" if shown else "or"):
            visible(logic[1], shown)
            visible(logic[2], shown)
        elif c.origin is None:
            raise Reject("a mask given as data is not a tensor of the graph")
        else:
            data.append(DataMask(c.origin, A.flat_dims(c.origin_dims), torch.bool, shown))
    for c in conds:
        visible(*((c.cond, c.shown) if isinstance(c, Opaque) else (c, True)))
    for b in biases:
        t = term_of(b, I.A)
        data.append(DataMask(t.node, t.dims, t.dtype, None))
    return ranged, data


def _attach_mask(I, form: IndexerForm, conds, fills, additive, biases):
    if not conds and not biases:
        return
    A = I.A
    conds, data = _data_masks(I, conds, biases, form.keys)
    bad = [f for f in fills if not is_minus_inf_like(f, form.out_dtype)]
    if bad:
        raise Reject(f"mask fill value {bad[0]} is not -inf or finfo({dtype_name(form.out_dtype)}).min")
    if len(set(fills)) > 1:
        raise Reject("masks with different fill values")
    if additive > 1 and fills[0] != -math.inf:
        raise Reject("several additive finite masks (their sum is not the fill value)")
    if biases:
        if len(biases) > 1:
            raise Reject("several tensors added to the scores as data (the op takes one additive bias)")
        if fills and fills[0] != -math.inf:
            raise Reject(f"a mask filled with {fills[0]:g} and an additive bias given as data: with a bias "
                         "added, only a -inf fill stays the same hidden value")
        if any(d.shown is not None for d in data):
            raise Reject("a boolean mask and an additive bias both given as data (the op takes one)")
    rk = {A.find(a) for a in form.rows + form.keys}
    for d in data:
        if not {A.find(x) for dim in d.dims for x in dim} <= rk:
            raise Reject("a mask given as data depends on an index that is neither a row nor the key index "
                         "(a per-head bias, or dims that do not line up with the scores)")
    form.data = tuple(data)
    form.additive = additive > 0 or bool(biases)
    form.fill = fills[0] if fills else -math.inf
    if not conds:
        return
    visible = A.resolve(sympy.And(*[c.expr for c in conds]))
    leaves = tuple(l for c in conds for l in c.leaves)
    if any(dims is None for _, _, dims in leaves):
        raise Reject("the mask reads a gathered or sliced byte tensor")
    dmask = A.atoms_in(visible)
    for _, node, dims in leaves:
        dmask |= {x for d in dims for x in A.flat_dim(d)}
    dmask = {A.find(a) for a in dmask}
    if not dmask <= set(form.rows) | set(form.keys):
        raise Reject("the mask depends on an index that is neither a row nor the key index")
    if len(form.keys) == 1:
        col = A.symbol(form.keys[0])
    else:
        # The key dim is several indices (e.g. page, offset after a gather); the mask may use
        # them only through the linear index col = sum_i j_i * stride_i. Substituting
        # j_1 = floor(col / s_1) and j_i = floor(col / s_i) - n_i * floor(col / s_(i-1)) is exact
        # for 0 <= col < K, and the linear combination telescopes back to col; any other use
        # leaves floors of col behind, which the range proof rejects.
        col = sympy.Symbol("_col", integer=True, nonnegative=True)
        sizes = [A.size(a) for a in form.keys]
        strides = [sympy.Mul(*sizes[i + 1:]) for i in range(len(sizes))]
        subs = {}
        for i, a in enumerate(form.keys):
            v = sympy.floor(col / strides[i])
            if i > 0:
                v -= sizes[i] * sympy.floor(col / strides[i - 1])
            subs[A.symbol(a)] = v
        visible = visible.xreplace(subs)
    form.ranges = per_row_range(visible, col)
    form.key_symbol = col
    form.mask_leaves = leaves


def render(form: IndexerForm, A, op: str, topk=None) -> str:
    """The rewritten region as normalised text: index roles, operand layouts, ranges.

    Independent of node names and of Inductor's code generation, so it reads the same on
    every supported torch; size symbols are renamed S0, S1, ... in order of appearance.
    """
    N = RegionNames(A, (("b", form.batch), ("r", [a for a in form.rows if a not in form.batch]),
                        ("h", form.heads), ("d", form.contract), ("j", form.keys)))
    expr, dims, atoms, dt = N.expr, N.dims, N.atoms, dtype_name
    names = N.names
    lines = [f"{op}  rows {atoms(form.rows)} heads {atoms(form.heads)} "
             f"head_dim {atoms(form.contract)} keys {atoms(form.keys)}",
             f"  q       {dims(form.q.dims)} {dt(form.q.dtype)} -> [rows, heads, head_dim]",
             f"  k       {dims(form.k.dims)} {dt(form.k.dtype)} -> "
             + ("[keys, head_dim]" if not form.batch else "[batch, keys, head_dim], one call per batch"
                if form.data else "[batch*keys, head_dim], ranges offset by batch*keys"),
             "  weights " + (" * ".join(dims(w.dims) for w in form.weights) or "1")
             + (f" * {form.scale:.6g}" if form.scale != 1.0 else "") + " -> [rows, heads]"]
    if form.collective is not None:
        ar = form.collective.node
        lines.append(f"  all_reduce {form.collective.op} of the partial scores (group {ar.args[2]!r}, kept)")
    if form.ranges is None:
        lines.append("  ranges  all keys")
    else:
        start = expr(form.ranges.k_start)
        end = "keys" if form.ranges.k_end is None else expr(form.ranges.k_end)
        lines.append(f"  ranges  {start} <= key < {end}"
                     + (f" if {expr(form.ranges.row_cond)}" if form.ranges.row_cond is not None else ""))
    for d in form.data:
        kind = (f"bool, visible where {d.shown}" if d.shown is not None
                else f"additive {dt(d.dtype)} bias, -inf hides")
        lines.append(f"  mask    data {dims(d.dims)} ({kind}) -> mask=[rows, keys]")
    if form.ranges is not None or form.data:
        lines.append(f"  fill    {form.fill:g} ({'added' if form.additive else 'selected'})")
    out = [("k" if i == form.key_dim and topk is not None else
            "*".join(names.get(A.find(a), "_") for a in d) or "1") for i, d in enumerate(form.out_dims)]
    lines.append(f"  out     [{', '.join(out)}] {dt(form.out_dtype)}")
    if topk is not None:
        k, outputs = topk
        lines.append(f"  top-k   k={expr(k)} -> {outputs}; empty slots get masked columns")
    return "\n".join(lines)
