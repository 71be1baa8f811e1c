"""Handlers for constants, index arithmetic (iota/arange, + - * //, min/max, comparisons, logic),
float elementwise ops, where/masked_fill, sums and matrix products: the ``ARITH`` handler set.
"""
from __future__ import annotations

import math

import sympy
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .reader import TV, HandlerSet, arg_of, norm_dim, packet, val_of
from .shapes import as_expr
from .values import Add, Cast, Const, Contract, Index, Maximum, Mul, Recip, Relu, Sum, Where

aten = torch.ops.aten
prims = torch.ops.prims

ARITH = HandlerSet("arith")


# ---- constants and indices -------------------------------------------------------------------
@ARITH.handles(aten.scalar_tensor, aten.full, aten.full_like, aten.new_full)
def _full(I, node, depth):
    p = packet(node)
    if p is aten.scalar_tensor:
        v = node.args[0]
    elif p is aten.full:
        v = node.args[1]
    else:
        v = node.args[1] if p is aten.full_like else node.args[2]
    if not isinstance(v, (int, float)):
        return None
    dt = node.meta["val"].dtype
    dims = tuple(I.A.dim(z) for z in I.out_shape(node))
    if dt.is_floating_point:
        return TV(Const(float(v)), dims, dt)
    if dt == torch.bool:
        return TV(Index(sympy.true if v else sympy.false, is_bool=True), dims, dt)
    if isinstance(v, float) and not v.is_integer():
        return None
    return TV(Index(sympy.Integer(int(v))), dims, dt)


@ARITH.handles(aten.zeros, aten.ones, aten.zeros_like, aten.ones_like, aten.new_zeros, aten.new_ones)
def _zeros(I, node, depth):
    v = 1 if "ones" in str(packet(node)) else 0
    dt = node.meta["val"].dtype
    dims = tuple(I.A.dim(z) for z in I.out_shape(node))
    if dt.is_floating_point:
        return TV(Const(float(v)), dims, dt)
    if dt == torch.bool:
        return None
    return TV(Index(sympy.Integer(v)), dims, dt)


@ARITH.handles(prims.iota)
def _iota(I, node, depth):
    start, step = node.kwargs.get("start", 0), node.kwargs.get("step", 1)
    return _range(I, node, start, step)


@ARITH.handles(aten.arange)
def _arange(I, node, depth):
    args = list(node.args)
    if node.target == aten.arange.default:
        start, step = 0, 1
    elif node.target == aten.arange.start:
        start, step = args[0], 1
    elif node.target == aten.arange.start_step:
        start, step = args[0], args[2] if len(args) > 2 else 1
    else:
        return None
    return _range(I, node, start, step)


def _range(I, node, start, step):
    dt = node.meta["val"].dtype
    if dt.is_floating_point or dt == torch.bool:
        return None
    vals = []
    for v in (start, step):
        if isinstance(v, fx.Node):
            v = val_of(v)
        if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
            return None
        vals.append(as_expr(v))
    (n,) = I.out_shape(node)
    d = I.A.dim(n)
    i = I.A.symbol(d[0]) if d else sympy.Integer(0)
    return TV(Index(vals[0] + vals[1] * i), (d,), dt)


# ---- elementwise -----------------------------------------------------------------------------
def binary(I, node, depth):
    """The two operands of a binary op, read, and their broadcast dims."""
    a = I.ev(node.args[0], depth)
    b = I.ev(node.args[1], depth)
    return a, b, I.bcast(node, [a, b])


def float_unary(make):
    """Handler of a float elementwise op: x -> ``make(x.value)`` (a value-tree node), x's dims, the
    node's dtype; no reading (None) for an index operand."""
    def read(I, node, depth):
        x = I.ev(node.args[0], depth)
        if not I.is_float(x):
            return None
        return TV(make(x.value), x.dims, node.meta["val"].dtype)
    return read


ARITH.handles(aten.relu)(float_unary(Relu))


def _index_minmax(I, node, x, lo, hi):
    e = I.index_of(x)
    if e is None:
        return None
    for bound, fn in ((lo, sympy.Max), (hi, sympy.Min)):
        if bound is None:
            continue
        bv = val_of(bound) if isinstance(bound, fx.Node) else bound
        if isinstance(bv, bool) or not isinstance(bv, (int, torch.SymInt)):
            return None
        e = fn(e, as_expr(bv))
    return TV(I.new_index(e, [x]), x.dims, node.meta["val"].dtype)


@ARITH.handles(aten.clamp_min)
def _clamp_min(I, node, depth):
    x = I.ev(node.args[0], depth)
    m = node.args[1]
    if I.is_float(x):
        if isinstance(m, (int, float)) and not isinstance(m, bool) and m == 0:
            return TV(Relu(x.value), x.dims, node.meta["val"].dtype)
        return None
    return _index_minmax(I, node, x, m, None)


@ARITH.handles(aten.clamp)
def _clamp(I, node, depth):
    x = I.ev(node.args[0], depth)
    lo, hi = arg_of(node, 1, "min"), arg_of(node, 2, "max")
    if isinstance(lo, fx.Node) and isinstance(val_of(lo), torch.Tensor):
        return None  # clamp.Tensor
    if I.is_float(x):
        if hi is None and isinstance(lo, (int, float)) and not isinstance(lo, bool) and lo == 0:
            return TV(Relu(x.value), x.dims, node.meta["val"].dtype)
        return None
    return _index_minmax(I, node, x, lo, hi)


@ARITH.handles(aten.maximum, aten.minimum)
def _maxmin(I, node, depth):
    a, b, dims = binary(I, node, depth)
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is None or eb is None:
        if packet(node) is aten.maximum and I.is_float(a) and I.is_float(b):
            return TV(Maximum(a.value, b.value), dims, node.meta["val"].dtype)
        return None
    fn = sympy.Max if packet(node) is aten.maximum else sympy.Min
    return TV(I.new_index(fn(ea, eb), [a, b]), dims, node.meta["val"].dtype)


@ARITH.handles(aten.mul)
def _mul(I, node, depth):
    a, b, dims = binary(I, node, depth)
    dt = node.meta["val"].dtype
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is not None and eb is not None and not dt.is_floating_point:
        return TV(I.new_index(ea * eb, [a, b]), dims, dt)
    if I.is_float(a) and I.is_float(b) and dt.is_floating_point:
        return TV(Mul((a.value, b.value)), dims, dt)
    return None


@ARITH.handles(aten.neg)
def _neg(I, node, depth):
    x = I.ev(node.args[0], depth)
    dt = node.meta["val"].dtype
    e = I.index_of(x)
    if e is not None:
        return TV(I.new_index(-e, [x]), x.dims, dt)
    if I.is_float(x):
        return TV(Mul((x.value, Const(-1.0))), x.dims, dt)
    return None


@ARITH.handles(aten.div)
def _div(I, node, depth):
    a, b, dims = binary(I, node, depth)
    dt = node.meta["val"].dtype
    mode = node.kwargs.get("rounding_mode")
    if mode is None:
        c = b.value.value if isinstance(b.value, Const) else None
        if I.is_float(a) and c not in (None, 0) and dt.is_floating_point:
            return TV(Mul((a.value, Const(1.0 / c))), dims, dt)
        if I.is_float(a) and I.is_float(b) and c is None and dt.is_floating_point:
            return TV(Mul((a.value, Recip(b.value))), dims, dt)
        return None
    if mode == "floor":
        return _floordiv(I, a, b, dims, dt)
    return None


def _floordiv(I, a, b, dims, dt):
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is None or eb is None or dt.is_floating_point:
        return None
    if not (eb.is_integer and (eb.is_positive or eb.is_negative)):
        return None  # a divisor of unknown sign (or zero): not read
    return TV(I.new_index(sympy.floor(ea / eb), [a, b]), dims, dt)


@ARITH.handles(aten.floor_divide)
def _floor_divide(I, node, depth):
    a, b, dims = binary(I, node, depth)
    return _floordiv(I, a, b, dims, node.meta["val"].dtype)


def _add_like(I, node, depth, sign):
    a, b, dims = binary(I, node, depth)
    alpha = node.kwargs.get("alpha", 1)
    dt = node.meta["val"].dtype
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is not None and eb is not None and not dt.is_floating_point:
        if not isinstance(alpha, int):
            return None
        return TV(I.new_index(ea + sign * alpha * eb, [a, b]), dims, dt)
    if I.is_float(a) and I.is_float(b) and dt.is_floating_point:
        bv = b.value
        if sign * alpha != 1:
            if isinstance(bv, Const):
                bv = Const(bv.value * sign * alpha)
            else:
                bv = Mul((bv, Const(float(sign * alpha))))
        return TV(Add(a.value, bv), dims, dt)
    return None


@ARITH.handles(aten.add)
def _add(I, node, depth):
    return _add_like(I, node, depth, 1)


@ARITH.handles(aten.sub)
def _sub(I, node, depth):
    return _add_like(I, node, depth, -1)


_CMP = {aten.ge: sympy.Ge, aten.gt: sympy.Gt, aten.le: sympy.Le, aten.lt: sympy.Lt,
        aten.eq: sympy.Eq, aten.ne: sympy.Ne}


def _exact_small(x) -> bool:
    """Integers of magnitude <= 256 (and +-inf) are the same in every float dtype, so
    comparing them symbolically agrees with comparing them in the tensor's dtype."""
    return isinstance(x, (int, float)) and (math.isinf(x) or (float(x).is_integer() and abs(x) <= 256))


def _selection(tv: TV):
    """(cond, x, y) for a float where(cond, x, y) of two constants (a float 0/1 mask, e.g.
    tril(ones)), or (True, c, c) for a constant; None otherwise."""
    v = tv.value
    while isinstance(v, Cast):
        v = v.x
    if isinstance(v, Const) and _exact_small(v.value):
        return sympy.true, v.value, v.value
    if (isinstance(v, Where) and v.cond.expr is not None and not v.cond.leaves
            and isinstance(v.a, Const) and isinstance(v.b, Const)
            and _exact_small(v.a.value) and _exact_small(v.b.value)):
        return v.cond.expr, v.a.value, v.b.value
    return None


def _branchwise(rel, sel, other, flip):
    """rel(where(c, x, y), o) == (c & rel(x, o)) | (~c & rel(y, o)) for constants x, y, o."""
    c, x, y = sel
    fx_, fy = (rel(other, x), rel(other, y)) if flip else (rel(x, other), rel(y, other))
    return sympy.Or(sympy.And(c, fx_), sympy.And(sympy.Not(c), fy))


@ARITH.handles(*_CMP)
def _compare(I, node, depth):
    a, b, dims = binary(I, node, depth)
    rel = _CMP[packet(node)]
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is not None and eb is not None:
        return TV(I.new_index(rel(ea, eb), [a, b], is_bool=True), dims, torch.bool)
    sa, sb = _selection(a), _selection(b)
    if sa is not None and sb is not None and (sa[0] == sympy.true or sb[0] == sympy.true):
        sel, other, flip = (sa, sb[1], False) if sb[0] == sympy.true else (sb, sa[1], True)
        expr = _branchwise(lambda x, y: sympy.sympify(rel(sympy.Float(x) if isinstance(x, float) else x,
                                                          sympy.Float(y) if isinstance(y, float) else y)),
                           sel, other, flip)
        return TV(Index(expr, is_bool=True), dims, torch.bool)
    return None


_LOGIC = {aten.logical_and: sympy.And, aten.bitwise_and: sympy.And, aten.__and__: sympy.And,
          aten.logical_or: sympy.Or, aten.bitwise_or: sympy.Or, aten.__or__: sympy.Or,
          aten.logical_xor: sympy.Xor, aten.bitwise_xor: sympy.Xor}


@ARITH.handles(*_LOGIC)
def _logic(I, node, depth):
    a, b, dims = binary(I, node, depth)
    ba, bb = I.bool_of(a), I.bool_of(b)
    if ba is None or bb is None:
        return None
    op = _LOGIC[packet(node)]
    if ba.expr is not None and bb.expr is not None:
        return TV(I.new_index(op(ba.expr, bb.expr), [a, b], is_bool=True), dims, torch.bool)
    out = I.new_index(None, [a, b], is_bool=True)
    if op is not sympy.Xor:  # opaque: remember the conjunction / disjunction (masks given as data)
        out.logic = ("and" if op is sympy.And else "or", ba, bb)
    return TV(out, dims, torch.bool)


@ARITH.handles(aten.logical_not, aten.bitwise_not)
def _not(I, node, depth):
    x = I.ev(node.args[0], depth)
    bx = I.bool_of(x)
    if bx is None:
        return None
    out = I.new_index(None if bx.expr is None else sympy.Not(bx.expr), [x], is_bool=True)
    if bx.expr is None:
        out.logic = ("not", bx)
    return TV(out, x.dims, torch.bool)


@ARITH.handles(aten.where)
def _where(I, node, depth):
    c = I.ev(node.args[0], depth)
    a = I.ev(node.args[1], depth)
    b = I.ev(node.args[2], depth)
    cond = I.bool_of(c)
    dt = node.meta["val"].dtype
    if cond is None:
        return None
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is not None and eb is not None and cond.expr is not None and not dt.is_floating_point:
        expr = sympy.Piecewise((ea, cond.expr), (eb, True))
        return TV(I.new_index(expr, [c, a, b]), I.bcast(node, [c, a, b]), dt)
    if not dt.is_floating_point or not (I.is_float(a) and I.is_float(b)):
        return None
    dims = I.bcast(node, [c, a, b])
    return TV(Where(cond, a.value, b.value), dims, dt)


@ARITH.handles(aten.masked_fill)
def _masked_fill(I, node, depth):
    x = I.ev(node.args[0], depth)
    m = I.ev(node.args[1], depth)
    fill = I.ev(node.args[2], depth)
    cond = I.bool_of(m)
    dt = node.meta["val"].dtype
    ex, ef = I.index_of(x), I.index_of(fill)
    if cond is not None and cond.expr is not None and ex is not None and ef is not None:
        expr = sympy.Piecewise((ef, cond.expr), (ex, True))
        return TV(I.new_index(expr, [m, x]), I.bcast(node, [x, m]), dt)
    if cond is None or not dt.is_floating_point or not isinstance(fill.value, Const):
        return None
    dims = I.bcast(node, [x, m])
    return TV(Where(cond, Const(float(fill.value.value)), x.value), dims, dt)



@ARITH.handles(aten.index_put)
def _index_put(I, node, depth):
    """``x[mask] = c`` (index_put, no accumulate) with one boolean mask of x's whole shape and a
    one-element constant c: where(mask, c, x). Any other index, or a tensor of values, is not read."""
    x_node, idx, values = node.args[0], node.args[1], node.args[2]
    accumulate = arg_of(node, 3, "accumulate", False)
    if accumulate or len(idx) != 1 or not isinstance(idx[0], fx.Node) or not isinstance(values, fx.Node):
        return None
    xv, mv = val_of(x_node), val_of(idx[0])
    if mv.dtype != torch.bool or list(mv.shape) != list(xv.shape) or not xv.dtype.is_floating_point:
        return None
    from .read_bytes import constant_tensor  # read_bytes is the one that reads graph constants
    c = constant_tensor(values)
    if c is None or c.numel() != 1:
        return None
    x, m = I.ev(x_node, depth), I.ev(idx[0], depth)
    cond = I.bool_of(m)
    if cond is None or not I.is_float(x):
        return None
    with unset_fake_temporarily():  # a real tensor, read while the graph's fake mode is on
        fill = float(c.reshape(()).to(xv.dtype).item())
    return TV(Where(cond, Const(fill), x.value), I.bcast(node, [x, m]), node.meta["val"].dtype)

# ---- reductions and products -----------------------------------------------------------------
def reduce_dims(node, n):
    """The dims a reduction (sum, mean, amax) reduces, normalised and sorted."""
    ds = arg_of(node, 1, "dim")
    if ds is None or (isinstance(ds, (list, tuple)) and len(ds) == 0):
        return list(range(n))
    if isinstance(ds, int):
        ds = [ds]
    return sorted({norm_dim(d, n) for d in ds})


@ARITH.handles(aten.sum, aten.mean)
def _sum(I, node, depth):
    x = I.ev(node.args[0], depth)
    if not I.is_float(x) or isinstance(x.value, Const):
        return None
    n = len(x.dims)
    if node.target in (aten.sum.default, aten.mean.default):
        ds, keep = list(range(n)), False
    else:
        ds, keep = reduce_dims(node, n), bool(arg_of(node, 2, "keepdim", False))
    atoms = tuple(a for d in ds for a in I.A.flat_dim(x.dims[d]))
    dims = tuple((() if i in ds else x.dims[i]) for i in range(n) if keep or i not in ds)
    dt = node.meta["val"].dtype
    value = Sum(x.value, atoms)
    if packet(node) is aten.mean:
        count = sympy.Mul(*[I.A.size(a) for a in atoms])
        if not count.is_Integer:
            return None
        value = Mul((value, Const(1.0 / int(count))))
    return TV(value, dims, dt)


@ARITH.handles(aten.bmm)
def _bmm(I, node, depth):
    a = I.ev(node.args[0], depth)
    b = I.ev(node.args[1], depth)
    if not (I.is_float(a) and I.is_float(b)):
        return None
    (na, m, ca), (nb, cb, p) = a.dims, b.dims
    n = _join(I, na, nb)
    c = _join(I, ca, cb)
    return TV(Contract(a.value, b.value, I.A.flat_dim(c)), (n, m, p), node.meta["val"].dtype)


@ARITH.handles(aten.mm)
def _mm(I, node, depth):
    a = I.ev(node.args[0], depth)
    b = I.ev(node.args[1], depth)
    if not (I.is_float(a) and I.is_float(b)):
        return None
    (m, ca), (cb, p) = a.dims, b.dims
    c = _join(I, ca, cb)
    return TV(Contract(a.value, b.value, I.A.flat_dim(c)), (m, p), node.meta["val"].dtype)


def _join(I, x, y):
    """The shared dim of two operands of a product (either may be broadcast)."""
    x, y = I.A.flat_dim(x), I.A.flat_dim(y)
    if x and y:
        I.A.unify(x, y)
        return I.A.flat_dim(x)
    return x or y


