"""Handlers that move data (views, permutes, expands, slices, copies), dtype casts and
the wait of a collective: the ``LAYOUT`` handler set.
"""
from __future__ import annotations


import sympy
import torch
import torch.fx as fx

from .reader import TV, HandlerSet, Interpreter, arg_of, norm_dim, packet, val_of
from .shapes import as_expr
from .values import substitute, AllReduce, Cast, Const, Elem, Index, Slice

aten = torch.ops.aten
prims = torch.ops.prims

LAYOUT = HandlerSet("layout")


@LAYOUT.handles(aten.view, aten._unsafe_view, aten.reshape, shape=True)
def _view(I: Interpreter, node, depth):
    if isinstance(node.args[1], torch.dtype):
        return None  # a reinterpretation of bytes: read_bytes
    x = I.ev(node.args[0], depth)
    return TV(x.value, I.A.regroup(x.dims, I.out_shape(node)), x.dtype)


@LAYOUT.handles(aten.permute, shape=True)
def _permute(I, node, depth):
    x = I.ev(node.args[0], depth)
    n = len(x.dims)
    return TV(x.value, tuple(x.dims[norm_dim(p, n)] for p in node.args[1]), x.dtype)


@LAYOUT.handles(aten.transpose, shape=True)
def _transpose(I, node, depth):
    x = I.ev(node.args[0], depth)
    n = len(x.dims)
    a, b = norm_dim(node.args[1], n), norm_dim(node.args[2], n)
    dims = list(x.dims)
    dims[a], dims[b] = dims[b], dims[a]
    return TV(x.value, tuple(dims), x.dtype)


@LAYOUT.handles(aten.t, shape=True)
def _t(I, node, depth):
    x = I.ev(node.args[0], depth)
    return TV(x.value, tuple(reversed(x.dims)), x.dtype)


@LAYOUT.handles(aten.unsqueeze, shape=True)
def _unsqueeze(I, node, depth):
    x = I.ev(node.args[0], depth)
    d = norm_dim(node.args[1], len(x.dims) + 1)
    dims = list(x.dims)
    dims.insert(d, ())
    return TV(x.value, tuple(dims), x.dtype)


@LAYOUT.handles(aten.squeeze, shape=True)
def _squeeze(I, node, depth):
    x = I.ev(node.args[0], depth)
    in_shape = list(node.args[0].meta["val"].shape)
    n = len(in_shape)
    if len(node.args) > 1:
        ds = node.args[1]
        ds = [ds] if isinstance(ds, int) else list(ds)
        ds = {norm_dim(d, n) for d in ds}
    else:
        ds = set(range(n))
    keep = [i for i in range(n) if not (i in ds and I.A.shapes.is_one(as_expr(in_shape[i])))]
    return TV(x.value, tuple(x.dims[i] for i in keep), x.dtype)


@LAYOUT.handles(aten.select, shape=True)
def _select(I, node, depth):
    """``x.select(d, 0)`` of a size-1 dim is a squeeze (transformers' ``attention_mask[:, 0]`` of its
    ``[B, 1, S, T]`` mask); selecting from a longer dim is not read."""
    in_shape = list(node.args[0].meta["val"].shape)
    d = norm_dim(node.args[1], len(in_shape))
    if not I.A.shapes.is_one(as_expr(in_shape[d])):
        return None
    x = I.ev(node.args[0], depth)
    return TV(x.value, x.dims[:d] + x.dims[d + 1:], x.dtype)


@LAYOUT.handles(aten.expand, shape=True)
def _expand(I, node, depth):
    x = I.ev(node.args[0], depth)
    out = I.out_shape(node)
    n, k = len(out), len(x.dims)
    dims = []
    for j, z in enumerate(out):
        i = j - (n - k)
        if i >= 0 and x.dims[i]:
            dims.append(x.dims[i])
        else:
            dims.append(I.A.dim(z))  # a broadcast index: the value does not depend on it
    return TV(x.value, tuple(dims), x.dtype)


@LAYOUT.handles(aten.repeat, shape=True)
def _repeat(I, node, depth):
    x = I.ev(node.args[0], depth)
    reps = list(node.args[1])
    out = I.out_shape(node)
    n, k = len(reps), len(x.dims)
    dims = []
    for j, r in enumerate(reps):
        i = j - (n - k)
        if i >= 0 and x.dims[i]:
            if not I.A.shapes.is_one(as_expr(val_of(r) if isinstance(r, fx.Node) else r)):
                return None  # tiling real data: index arithmetic modulo a size, not read
            dims.append(x.dims[i])
        else:
            dims.append(I.A.dim(out[j]))
    return TV(x.value, tuple(dims), x.dtype)


@LAYOUT.handles(aten.slice, shape=True)
def _slice(I, node, depth):
    """A slice that keeps the whole dim (``x[:, None]`` under dynamic shapes) is a no-op; a
    partial slice of bytes substitutes its offset into their index, one of floats is a ``Slice``."""
    x = I.ev(node.args[0], depth)
    n = len(x.dims)
    dim = norm_dim(arg_of(node, 1, "dim", 0), n)
    start, step = arg_of(node, 2, "start", None), arg_of(node, 4, "step", 1)
    size_in = node.args[0].meta["val"].shape[dim]
    size_out = node.meta["val"].shape[dim]
    if start in (0, None) and step == 1 and I.A.shapes.eq(as_expr(size_in), as_expr(size_out)):
        return TV(x.value, x.dims, x.dtype)
    if isinstance(x.value, Elem) or (isinstance(x.value, Index) and x.dtype == torch.uint8):
        # bytes (or a program over them) read from an offset: the index is substituted
        if step != 1 or isinstance(start, fx.Node):
            return None
        start = 0 if start is None else start
        if start < 0:
            start = as_expr(size_in) + start
        dims = list(x.dims)
        dims[dim] = I.A.dim(size_out)
        new = I.A.symbol(dims[dim][0]) if dims[dim] else sympy.Integer(0)
        return TV(substitute(I.A, x.value, x.dims[dim], new + start), tuple(dims), x.dtype)
    # floats: a Slice onto a fresh atom (other integer tensors stay opaque leaves, as masks read them)
    atoms = I.A.flat_dim(x.dims[dim])
    if step != 1 or len(atoms) != 1 or not I.is_float(x) or isinstance(x.value, Const):
        return None
    start = 0 if start is None else val_of(start) if isinstance(start, fx.Node) else start
    if isinstance(start, bool) or not isinstance(start, (int, torch.SymInt)):
        return None
    lo = as_expr(start)
    if lo.is_Integer and lo < 0:
        lo = lo + as_expr(size_in)
    out = I.A.dim(size_out)
    if not out:
        return None  # a single position: a select, not read
    dims = list(x.dims)
    dims[dim] = out
    return TV(Slice(x.value, atoms[0], out[0], lo, lo + as_expr(size_out)), tuple(dims), x.dtype)


@LAYOUT.handles(aten.clone, aten.alias, aten.contiguous, aten.lift_fresh_copy, aten.detach, shape=True)
def _same(I, node, depth):
    x = I.ev(node.args[0], depth)
    return TV(x.value, x.dims, x.dtype)


def _cast(I, node, depth, dtype, x=None):
    x = I.ev(node.args[0], depth) if x is None else x
    src = x.dtype
    if dtype is None or dtype == src:
        return TV(x.value, x.dims, x.dtype)
    if isinstance(x.value, Index):
        ints = (torch.int64, torch.int32)
        if not x.value.is_bool and src in ints and dtype in ints:
            if dtype == torch.int32 and _int64_data(x.value):
                return None  # int64 data narrowed: wraps past 2^31, so the cast stays a tensor
            return TV(x.value, x.dims, dtype)
        if not x.value.is_bool and src == torch.uint8 and dtype in (torch.int16,) + ints:
            return TV(x.value, x.dims, dtype)  # bytes widened: the same values
        return None
    if src is not None and src.is_floating_point and dtype.is_floating_point:
        return TV(Cast(x.value, dtype), x.dims, dtype)
    return None


def _int64_data(v: Index) -> bool:
    """Is the value (not just a position it reads at) an int64 tensor's element?"""
    apps = v.expr.atoms(sympy.core.function.AppliedUndef)
    inner = set().union(*[a.atoms(sympy.core.function.AppliedUndef) for f in apps for a in f.args])
    nodes = {fn: node for fn, node, _ in v.leaves}
    return any(getattr(val_of(nodes.get(f.func)), "dtype", None) == torch.int64 for f in apps - inner)


@LAYOUT.handles(prims.convert_element_type, shape=True)
def _convert(I, node, depth):
    return _cast(I, node, depth, node.args[1])


@LAYOUT.handles(aten._to_copy, shape=True)
def _to_copy(I, node, depth):
    src, dst = node.args[0].meta["val"], node.meta["val"]
    if src.device != dst.device:
        return None
    return _cast(I, node, depth, dst.dtype)


@LAYOUT.handles(aten.copy, shape=True)
def _copy(I, node, depth):
    """copy(dst, src): src's values in dst's shape and dtype, read only for the write-back of an
    in-place collective (``dist.all_reduce(x)``: src is its ``wait_tensor``). Any other copy stays
    a leaf: a cache written in place (``kv_cache[:b] = kv``) is the tensor the patterns take as k."""
    dst, src = node.args[0], node.args[1]
    if not (isinstance(src, fx.Node) and src.op == "call_function" and packet(src) is WAIT):
        return None
    if val_of(dst).device != val_of(src).device:
        return None
    x = I.ev(src, depth)
    dims = I.bcast(node, [x])
    dt = node.meta["val"].dtype
    if x.dtype == dt:
        return TV(x.value, dims, dt)
    return _cast(I, node, depth, dt, TV(x.value, dims, x.dtype))


# ---- collectives -------------------------------------------------------------------------------
_c10d = getattr(torch.ops, "_c10d_functional", None)
ALL_REDUCE = getattr(_c10d, "all_reduce", None)
WAIT = getattr(_c10d, "wait_tensor", None)


def _wait(I, node, depth):
    """wait_tensor(all_reduce(x, op, group)): x reduced across ranks (op kept, checked by patterns)."""
    ar = node.args[0]
    if not (isinstance(ar, fx.Node) and ar.op == "call_function" and packet(ar) is ALL_REDUCE):
        return None
    x = I.ev(ar.args[0], depth)
    if not I.is_float(x) or isinstance(x.value, Const):
        return None
    return TV(AllReduce(x.value, str(ar.args[1]).lower(), ar), x.dims, node.meta["val"].dtype)


if WAIT is not None and ALL_REDUCE is not None:
    LAYOUT.handles(WAIT)(_wait)
