"""Handlers for gathers (advanced indexing, gather, index_select), exp, reciprocal, max
reductions, concatenation and remainder: the ``GATHER`` handler set (softmax over gathered rows).
"""
from __future__ import annotations

import operator

import sympy
import torch
import torch.fx as fx

from .read_arith import binary, float_unary, reduce_dims
from .reader import TV, HandlerSet, arg_of, norm_dim
from .shapes import as_expr
from .values import Cat, Const, Exp, Gather, Max, Recip

aten = torch.ops.aten
prims = torch.ops.prims

GATHER = HandlerSet("gather")


GATHER.handles(aten.exp)(float_unary(Exp))
GATHER.handles(aten.reciprocal)(float_unary(Recip))


def _reduce_max(I, node, x, ds, keep):
    if not I.is_float(x) or isinstance(x.value, Const):
        return None
    n = len(x.dims)
    atoms = tuple(a for d in ds for a in I.A.flat_dim(x.dims[d]))
    dims = tuple((() if i in ds else x.dims[i]) for i in range(n) if keep or i not in ds)
    return TV(Max(x.value, atoms), dims, x.dtype)


@GATHER.handles(aten.amax)
def _amax(I, node, depth):
    x = I.ev(node.args[0], depth)
    return _reduce_max(I, node, x, reduce_dims(node, len(x.dims)), bool(arg_of(node, 2, "keepdim", False)))


@GATHER.handles(operator.getitem)
def _getitem(I, node, depth):
    """``max(x, dim).values``: item 0 of aten.max.dim."""
    src = node.args[0]
    if node.args[1] != 0 or not isinstance(src, fx.Node) or src.op != "call_function" \
            or src.target != aten.max.dim:
        return None
    x = I.ev(src.args[0], depth)
    d = norm_dim(arg_of(src, 1, "dim"), len(x.dims))
    return _reduce_max(I, node, x, [d], bool(arg_of(src, 2, "keepdim", False)))


def _cat_floats(I, node, depth):
    """Floats concatenated along one dim: a ``Cat`` over a fresh atom."""
    parts = [I.ev(a, depth) for a in node.args[0]]
    shape = I.out_shape(node)
    n = len(shape)
    dim = norm_dim(arg_of(node, 1, "dim", 0), n)
    if len(parts) < 2 or any(len(p.dims) != n or not I.is_float(p) for p in parts):
        return None
    sizes = tuple(as_expr(a.meta["val"].shape[dim]) for a in node.args[0])
    # every other dim is shared by all parts: unify them position by position
    rest = [s if i != dim else 1 for i, s in enumerate(shape)]
    others = I.bcast_shape(rest, [TV(p.value, tuple(() if i == dim else d for i, d in enumerate(p.dims)), p.dtype)
                                  for p in parts])
    cat = I.A.dim(shape[dim])
    if not cat:
        return None
    dims = tuple(cat if i == dim else others[i] for i in range(n))
    value = Cat(tuple(p.value for p in parts), tuple(p.dims[dim] for p in parts), sizes, cat[0])
    return TV(value, dims, node.meta["val"].dtype)


@GATHER.handles(aten.remainder)
def _remainder(I, node, depth):
    a, b, dims = binary(I, node, depth)
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is None or eb is None or not (eb.is_integer and eb.is_positive):
        return None
    return TV(I.new_index(sympy.Mod(ea, eb), [a, b]), dims, node.meta["val"].dtype)


def _gather_value(I, node, src: TV, axis: int, index: TV, dims) -> TV:
    if not I.is_float(src) or isinstance(src.value, Const):
        return None
    if I.index_of(index) is None:
        return None
    value = Gather(src.value, tuple(I.A.flat_dim(d) for d in src.dims), axis, index.value)
    return TV(value, dims, node.meta["val"].dtype)


@GATHER.handles(aten.gather)
def _gather(I, node, depth):
    """out[..., i, ...] = src[..., index[..., i, ...], ...] along ``dim``."""
    src = I.ev(node.args[0], depth)
    n = len(src.dims)
    axis = norm_dim(node.args[1], n)
    index = I.ev(node.args[2], depth)
    src_shape = list(node.args[0].meta["val"].shape)
    idx_shape = list(node.args[2].meta["val"].shape)
    for i in range(n):
        if i != axis:
            if not I.A.shapes.eq(as_expr(src_shape[i]), as_expr(idx_shape[i])):
                return None  # a partial gather of another dim, not read
            if src.dims[i] and index.dims[i]:
                I.A.unify(src.dims[i], index.dims[i])
    dims = tuple(index.dims[i] if i == axis else (src.dims[i] or index.dims[i]) for i in range(n))
    return _gather_value(I, node, src, axis, index, dims)


def _index_select_floats(I, node, depth):
    src = I.ev(node.args[0], depth)
    axis = norm_dim(node.args[1], len(src.dims))
    index = I.ev(node.args[2], depth)
    dims = tuple(index.dims[0] if i == axis else d for i, d in enumerate(src.dims))
    return _gather_value(I, node, src, axis, index, dims)


def _index_floats(I, node, depth):
    """Advanced indexing ``src[i0, i1, ...]`` with integer tensors on leading adjacent dims:
    index tensors that are exactly an arange over a dim of the same size (``arange(B)[:, None,
    None]``) select that dim as it is; exactly one other index tensor is the gather."""
    src = I.ev(node.args[0], depth)
    ids = list(node.args[1])
    used = [i for i, t in enumerate(ids) if t is not None]
    if not used or used != list(range(used[0], used[-1] + 1)) or used[0] != 0:
        return None
    tvs = [I.ev(ids[i], depth) for i in used]
    if any(I.index_of(t) is None for t in tvs):
        return None  # boolean masks, floats
    out_shape = I.out_shape(node)
    nb = len(out_shape) - (len(src.dims) - len(used))
    bdims = I.bcast_shape(out_shape[:nb], tvs)
    exprs = [I.A.resolve(I.index_of(t)) for t in tvs]
    axis = None
    for i, e in zip(used, exprs):
        d = I.A.flat_dim(src.dims[i])
        if isinstance(e, sympy.Symbol) and e.name.startswith("_i") and len(d) == 1 \
                and I.A.shapes.eq(I.A.size(int(e.name[2:])), I.A.size(d[0])):
            I.A.union(int(e.name[2:]), d[0])  # arange over the whole dim: the dim itself
        elif e == 0 and not d:
            pass  # index 0 of a size-1 dim: the dim itself
        elif axis is None:
            axis = i
        else:
            return None  # two gathered dims
    if axis is None:
        return None
    dims = tuple(bdims) + tuple(src.dims[len(used):])
    return _gather_value(I, node, src, axis, tvs[used.index(axis)], dims)



GATHER.handles(aten.index)(_index_floats)
GATHER.handles(aten.index_select)(_index_select_floats)
GATHER.handles(aten.cat)(_cat_floats)
