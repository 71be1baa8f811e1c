"""Read post-decomposition aten nodes into the index algebra of ``algebra.py``.

One handler per aten/prims op. A handler returns a ``TV`` (value, dims, dtype) or None;
None (or a ``Reject`` raised inside) makes the node an opaque ``Leaf``, which is always
exact. Adding a spelling usually means adding or widening a handler here: see
docs/patterns.md.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Callable, Optional

import sympy
import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .algebra import (Add, AllReduce, Atoms, Cast, Cat, Const, Contract, Elem, Exp, Gather, Index, Leaf,
                      Max, Maximum, Mul, Recip, Reject, Relu, Shapes, Slice, Sum, Value, Where, as_expr)

aten = torch.ops.aten
prims = torch.ops.prims


@dataclass
class TV:
    """A tensor as read: its value, the atoms of each dim, its dtype."""
    value: Value
    dims: tuple
    dtype: Optional[torch.dtype]


HANDLERS: dict[object, Callable] = {}
SHAPE_OPS: set = set()  # handlers that only move data: they do not count towards the depth


def handles(*packets, shape: bool = False):
    def deco(fn):
        for p in packets:
            HANDLERS[p] = fn
            if shape:
                SHAPE_OPS.add(p)
        return fn
    return deco


def packet(node: fx.Node):
    t = node.target
    return getattr(t, "overloadpacket", t)


def shape_env_of(graph: fx.Graph):
    for n in graph.nodes:
        v = n.meta.get("val")
        syms = list(v.shape) if isinstance(v, torch.Tensor) else [v]
        for s in syms:
            if isinstance(s, torch.SymInt):
                return s.node.shape_env
    return None


def _val(node):
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def _arg(node: fx.Node, i: int, name: str, default=None):
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)


class Interpreter:
    """Reads nodes on demand (memoised). ``max_depth`` bounds how many non-shape ops are
    followed upstream from where reading started; deeper nodes are leaves."""

    def __init__(self, graph: fx.Graph, shapes: Optional[Shapes] = None, max_depth: int = 16):
        self.graph = graph
        self.A = Atoms(shapes or Shapes(shape_env_of(graph)))
        self.memo: dict[fx.Node, TV] = {}
        self.max_depth = max_depth
        self.notes: list[str] = []  # why nodes became leaves (for debugging)
        self._nfun = 0

    # ---- entry points ----------------------------------------------------------------------
    def ev(self, arg, depth: int = 0) -> TV:
        if not isinstance(arg, fx.Node):
            return self.scalar(arg)
        if arg in self.memo:
            return self.memo[arg]
        val = _val(arg)
        if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
            return TV(Index(as_expr(val)), (), torch.int64)
        if not isinstance(val, torch.Tensor):
            raise Reject(f"{arg.name} is not a tensor")
        tv = None
        p = packet(arg) if arg.op == "call_function" else None
        handler = HANDLERS.get(p)
        if handler is not None:
            step = 0 if p in SHAPE_OPS else 1
            if depth + step <= self.max_depth:
                # A handler that gives up must leave no trace: unions it made between its
                # operands' indices are not facts about any value that survives.
                snap, n_memo = self.A.snapshot(), len(self.memo)
                try:
                    tv = handler(self, arg, depth + step)
                except Reject as e:
                    self.notes.append(f"{arg.name}: {e}")
                    tv = None
                if tv is None:
                    self.A.restore(snap)
                    for key in list(self.memo)[n_memo:]:
                        del self.memo[key]
        if tv is None:
            tv = self.leaf(arg)
        if len(tv.dims) != val.dim():
            raise AssertionError(f"inductor_dsa: rank mismatch reading {arg.format_node()}")
        if tv.value.origin is None:
            tv.value.origin, tv.value.origin_dims = arg, tv.dims
        self.memo[arg] = tv
        return tv

    def scalar(self, x) -> TV:
        if isinstance(x, bool):
            return TV(Index(sympy.true if x else sympy.false, is_bool=True), (), torch.bool)
        if isinstance(x, int):
            return TV(Const(x), (), None)
        if isinstance(x, float):
            return TV(Const(x), (), None)
        raise Reject(f"unsupported scalar argument {x!r}")

    def leaf(self, node: fx.Node) -> TV:
        val = node.meta["val"]
        dims = tuple(self.A.dim(s) for s in val.shape)
        if val.dtype.is_floating_point or val.dtype.is_complex:
            return TV(Leaf(node, dims), dims, val.dtype)
        if val.dtype == torch.bool:
            return TV(Index(None, is_bool=True), dims, val.dtype)
        self._nfun += 1
        fn = sympy.Function(f"_L{self._nfun}", integer=True)
        args = [self.A.symbol(d[0]) if d else sympy.Integer(0) for d in dims]
        return TV(Index(fn(*args), leaves=((fn, node, dims),)), dims, val.dtype)

    # ---- helpers ---------------------------------------------------------------------------
    def out_shape(self, node):
        return list(node.meta["val"].shape)

    def bcast(self, node: fx.Node, tvs) -> tuple:
        return self.bcast_shape(self.out_shape(node), tvs)

    def bcast_shape(self, shape, tvs) -> tuple:
        """The dims of ``tvs`` broadcast together to ``shape`` (atoms unified by position)."""
        n = len(shape)
        out = [() for _ in range(n)]
        for tv in tvs:
            k = len(tv.dims)
            for i, d in enumerate(tv.dims):
                d = self.A.flat_dim(d)
                if not d:
                    continue
                j = n - k + i
                if not out[j]:
                    out[j] = d
                else:
                    self.A.unify(out[j], d)
                    out[j] = self.A.flat_dim(out[j])
        for j, z in enumerate(shape):
            if not out[j] and not self.A.shapes.is_one(as_expr(z)):
                out[j] = (self.A.new(z),)
        return tuple(out)

    def index_of(self, tv: TV) -> Optional[sympy.Basic]:
        """The integer sympy expression of an operand, or None if it is not an integer."""
        v = tv.value
        if isinstance(v, Index) and not v.is_bool and v.expr is not None:
            return v.expr
        if isinstance(v, Const) and isinstance(v.value, int) and not isinstance(v.value, bool):
            return sympy.Integer(v.value)
        return None

    def bool_of(self, tv: TV) -> Optional[Index]:
        v = tv.value
        return v if isinstance(v, Index) and v.is_bool else None

    @staticmethod
    def is_float(tv: TV) -> bool:
        v = tv.value
        if isinstance(v, Index):
            return False
        if isinstance(v, Const):
            return True
        return tv.dtype is not None and tv.dtype.is_floating_point

    def new_index(self, expr, tvs, is_bool=False) -> Index:
        leaves = tuple(l for tv in tvs if isinstance(tv.value, Index) for l in tv.value.leaves)
        return Index(expr, is_bool=is_bool, leaves=leaves)


def _norm_dim(d: int, n: int) -> int:
    return d + n if d < 0 else d


# ---- data movement ---------------------------------------------------------------------------
@handles(aten.view, aten._unsafe_view, aten.reshape, shape=True)
def _view(I: Interpreter, node, depth):
    if isinstance(node.args[1], torch.dtype):
        return _view_dtype(I, node, depth)
    x = I.ev(node.args[0], depth)
    return TV(x.value, I.A.regroup(x.dims, I.out_shape(node)), x.dtype)


@handles(aten.permute, shape=True)
def _permute(I, node, depth):
    x = I.ev(node.args[0], depth)
    n = len(x.dims)
    return TV(x.value, tuple(x.dims[_norm_dim(p, n)] for p in node.args[1]), x.dtype)


@handles(aten.transpose, shape=True)
def _transpose(I, node, depth):
    x = I.ev(node.args[0], depth)
    n = len(x.dims)
    a, b = _norm_dim(node.args[1], n), _norm_dim(node.args[2], n)
    dims = list(x.dims)
    dims[a], dims[b] = dims[b], dims[a]
    return TV(x.value, tuple(dims), x.dtype)


@handles(aten.t, shape=True)
def _t(I, node, depth):
    x = I.ev(node.args[0], depth)
    return TV(x.value, tuple(reversed(x.dims)), x.dtype)


@handles(aten.unsqueeze, shape=True)
def _unsqueeze(I, node, depth):
    x = I.ev(node.args[0], depth)
    d = _norm_dim(node.args[1], len(x.dims) + 1)
    dims = list(x.dims)
    dims.insert(d, ())
    return TV(x.value, tuple(dims), x.dtype)


@handles(aten.squeeze, shape=True)
def _squeeze(I, node, depth):
    x = I.ev(node.args[0], depth)
    in_shape = list(node.args[0].meta["val"].shape)
    n = len(in_shape)
    if len(node.args) > 1:
        ds = node.args[1]
        ds = [ds] if isinstance(ds, int) else list(ds)
        ds = {_norm_dim(d, n) for d in ds}
    else:
        ds = set(range(n))
    keep = [i for i in range(n) if not (i in ds and I.A.shapes.is_one(as_expr(in_shape[i])))]
    return TV(x.value, tuple(x.dims[i] for i in keep), x.dtype)


@handles(aten.expand, shape=True)
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


@handles(aten.repeat, shape=True)
def _repeat(I, node, depth):
    x = I.ev(node.args[0], depth)
    reps = list(node.args[1])
    out = I.out_shape(node)
    n, k = len(reps), len(x.dims)
    dims = []
    for j, r in enumerate(reps):
        i = j - (n - k)
        if i >= 0 and x.dims[i]:
            if not I.A.shapes.is_one(as_expr(_val(r) if isinstance(r, fx.Node) else r)):
                return None  # tiling real data: index arithmetic modulo a size, not read
            dims.append(x.dims[i])
        else:
            dims.append(I.A.dim(out[j]))
    return TV(x.value, tuple(dims), x.dtype)


@handles(aten.slice, shape=True)
def _slice(I, node, depth):
    """A slice that keeps the whole dim (``x[:, None]`` under dynamic shapes) is a no-op; a
    partial slice of bytes substitutes its offset into their index, one of floats is a ``Slice``."""
    x = I.ev(node.args[0], depth)
    n = len(x.dims)
    dim = _norm_dim(_arg(node, 1, "dim", 0), n)
    start, step = _arg(node, 2, "start", None), _arg(node, 4, "step", 1)
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
    start = 0 if start is None else _val(start) if isinstance(start, fx.Node) else start
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


@handles(aten.clone, aten.alias, aten.contiguous, aten.lift_fresh_copy, aten.detach, shape=True)
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
            return TV(x.value, x.dims, dtype)
        if not x.value.is_bool and src == torch.uint8 and dtype in (torch.int16,) + ints:
            return TV(x.value, x.dims, dtype)  # bytes widened: the same values
        return None
    if src is not None and src.is_floating_point and dtype.is_floating_point:
        return TV(Cast(x.value, dtype), x.dims, dtype)
    return None


@handles(prims.convert_element_type, shape=True)
def _convert(I, node, depth):
    return _cast(I, node, depth, node.args[1])


@handles(aten._to_copy, shape=True)
def _to_copy(I, node, depth):
    src, dst = node.args[0].meta["val"], node.meta["val"]
    if src.device != dst.device:
        return None
    return _cast(I, node, depth, dst.dtype)


@handles(aten.copy, shape=True)
def _copy(I, node, depth):
    """copy(dst, src): src's values in dst's shape and dtype, read only for the write-back of an
    in-place collective (``dist.all_reduce(x)``: src is its ``wait_tensor``). Any other copy stays
    a leaf: a cache written in place (``kv_cache[:b] = kv``) is the tensor the patterns take as k."""
    dst, src = node.args[0], node.args[1]
    if not (isinstance(src, fx.Node) and src.op == "call_function" and packet(src) is WAIT):
        return None
    if _val(dst).device != _val(src).device:
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
    handles(WAIT)(_wait)


# ---- constants and indices -------------------------------------------------------------------
@handles(aten.scalar_tensor, aten.full, aten.full_like, aten.new_full)
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


@handles(aten.zeros, aten.ones, aten.zeros_like, aten.ones_like, aten.new_zeros, aten.new_ones)
def _zeros(I, node, depth):
    v = 1 if "ones" in str(packet(node)) else 0
    dt = node.meta["val"].dtype
    dims = tuple(I.A.dim(z) for z in I.out_shape(node))
    if dt.is_floating_point:
        return TV(Const(float(v)), dims, dt)
    if dt == torch.bool:
        return None
    return TV(Index(sympy.Integer(v)), dims, dt)


@handles(prims.iota)
def _iota(I, node, depth):
    start, step = node.kwargs.get("start", 0), node.kwargs.get("step", 1)
    return _range(I, node, start, step)


@handles(aten.arange)
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
            v = _val(v)
        if isinstance(v, bool) or not isinstance(v, (int, torch.SymInt)):
            return None
        vals.append(as_expr(v))
    (n,) = I.out_shape(node)
    d = I.A.dim(n)
    i = I.A.symbol(d[0]) if d else sympy.Integer(0)
    return TV(Index(vals[0] + vals[1] * i), (d,), dt)


# ---- elementwise -----------------------------------------------------------------------------
def _binary(I, node, depth):
    a = I.ev(node.args[0], depth)
    b = I.ev(node.args[1], depth)
    return a, b, I.bcast(node, [a, b])


@handles(aten.relu)
def _relu(I, node, depth):
    x = I.ev(node.args[0], depth)
    if not I.is_float(x):
        return None
    return TV(Relu(x.value), x.dims, node.meta["val"].dtype)


def _index_minmax(I, node, x, lo, hi):
    e = I.index_of(x)
    if e is None:
        return None
    for bound, fn in ((lo, sympy.Max), (hi, sympy.Min)):
        if bound is None:
            continue
        bv = _val(bound) if isinstance(bound, fx.Node) else bound
        if isinstance(bv, bool) or not isinstance(bv, (int, torch.SymInt)):
            return None
        e = fn(e, as_expr(bv))
    return TV(I.new_index(e, [x]), x.dims, node.meta["val"].dtype)


@handles(aten.clamp_min)
def _clamp_min(I, node, depth):
    x = I.ev(node.args[0], depth)
    m = node.args[1]
    if I.is_float(x):
        if isinstance(m, (int, float)) and not isinstance(m, bool) and m == 0:
            return TV(Relu(x.value), x.dims, node.meta["val"].dtype)
        return None
    return _index_minmax(I, node, x, m, None)


@handles(aten.clamp)
def _clamp(I, node, depth):
    x = I.ev(node.args[0], depth)
    lo, hi = _arg(node, 1, "min"), _arg(node, 2, "max")
    if isinstance(lo, fx.Node) and isinstance(_val(lo), torch.Tensor):
        return None  # clamp.Tensor
    if I.is_float(x):
        if hi is None and isinstance(lo, (int, float)) and not isinstance(lo, bool) and lo == 0:
            return TV(Relu(x.value), x.dims, node.meta["val"].dtype)
        return None
    return _index_minmax(I, node, x, lo, hi)


@handles(aten.maximum, aten.minimum)
def _maxmin(I, node, depth):
    a, b, dims = _binary(I, node, depth)
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is None or eb is None:
        if packet(node) is aten.maximum and I.is_float(a) and I.is_float(b):
            return TV(Maximum(a.value, b.value), dims, node.meta["val"].dtype)
        return None
    fn = sympy.Max if packet(node) is aten.maximum else sympy.Min
    return TV(I.new_index(fn(ea, eb), [a, b]), dims, node.meta["val"].dtype)


@handles(aten.mul)
def _mul(I, node, depth):
    a, b, dims = _binary(I, node, depth)
    dt = node.meta["val"].dtype
    ea, eb = I.index_of(a), I.index_of(b)
    if ea is not None and eb is not None and not dt.is_floating_point:
        return TV(I.new_index(ea * eb, [a, b]), dims, dt)
    if I.is_float(a) and I.is_float(b) and dt.is_floating_point:
        return TV(Mul((a.value, b.value)), dims, dt)
    return None


@handles(aten.neg)
def _neg(I, node, depth):
    x = I.ev(node.args[0], depth)
    dt = node.meta["val"].dtype
    e = I.index_of(x)
    if e is not None:
        return TV(I.new_index(-e, [x]), x.dims, dt)
    if I.is_float(x):
        return TV(Mul((x.value, Const(-1.0))), x.dims, dt)
    return None


@handles(aten.div)
def _div(I, node, depth):
    a, b, dims = _binary(I, node, depth)
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


@handles(aten.floor_divide)
def _floor_divide(I, node, depth):
    a, b, dims = _binary(I, node, depth)
    return _floordiv(I, a, b, dims, node.meta["val"].dtype)


def _add_like(I, node, depth, sign):
    a, b, dims = _binary(I, node, depth)
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


@handles(aten.add)
def _add(I, node, depth):
    return _add_like(I, node, depth, 1)


@handles(aten.sub)
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


@handles(*_CMP)
def _compare(I, node, depth):
    a, b, dims = _binary(I, node, depth)
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


@handles(*_LOGIC)
def _logic(I, node, depth):
    a, b, dims = _binary(I, node, depth)
    ba, bb = I.bool_of(a), I.bool_of(b)
    if ba is None or bb is None:
        return None
    if ba.expr is None or bb.expr is None:
        expr = None
    else:
        expr = _LOGIC[packet(node)](ba.expr, bb.expr)
    return TV(I.new_index(expr, [a, b], is_bool=True), dims, torch.bool)


@handles(aten.logical_not, aten.bitwise_not)
def _not(I, node, depth):
    x = I.ev(node.args[0], depth)
    bx = I.bool_of(x)
    if bx is None:
        return None
    expr = None if bx.expr is None else sympy.Not(bx.expr)
    return TV(I.new_index(expr, [x], is_bool=True), x.dims, torch.bool)


@handles(aten.where)
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


@handles(aten.masked_fill)
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


# ---- reductions and products -----------------------------------------------------------------
def _reduce_dims(node, n):
    ds = _arg(node, 1, "dim")
    if ds is None or (isinstance(ds, (list, tuple)) and len(ds) == 0):
        return list(range(n))
    if isinstance(ds, int):
        ds = [ds]
    return sorted({_norm_dim(d, n) for d in ds})


@handles(aten.sum, aten.mean)
def _sum(I, node, depth):
    x = I.ev(node.args[0], depth)
    if not I.is_float(x) or isinstance(x.value, Const):
        return None
    n = len(x.dims)
    if node.target in (aten.sum.default, aten.mean.default):
        ds, keep = list(range(n)), False
    else:
        ds, keep = _reduce_dims(node, n), bool(_arg(node, 2, "keepdim", False))
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


@handles(aten.bmm)
def _bmm(I, node, depth):
    a = I.ev(node.args[0], depth)
    b = I.ev(node.args[1], depth)
    if not (I.is_float(a) and I.is_float(b)):
        return None
    (na, m, ca), (nb, cb, p) = a.dims, b.dims
    n = _join(I, na, nb)
    c = _join(I, ca, cb)
    return TV(Contract(a.value, b.value, I.A.flat_dim(c)), (n, m, p), node.meta["val"].dtype)


@handles(aten.mm)
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



# ---- attention: exp, max, concatenation, gathers (see patterns/attention.py) ------------------
@handles(aten.exp)
def _exp(I, node, depth):
    x = I.ev(node.args[0], depth)
    if not I.is_float(x):
        return None
    return TV(Exp(x.value), x.dims, node.meta["val"].dtype)


@handles(aten.reciprocal)
def _reciprocal(I, node, depth):
    x = I.ev(node.args[0], depth)
    if not I.is_float(x):
        return None
    return TV(Recip(x.value), x.dims, node.meta["val"].dtype)


def _reduce_max(I, node, x, ds, keep):
    if not I.is_float(x) or isinstance(x.value, Const):
        return None
    n = len(x.dims)
    atoms = tuple(a for d in ds for a in I.A.flat_dim(x.dims[d]))
    dims = tuple((() if i in ds else x.dims[i]) for i in range(n) if keep or i not in ds)
    return TV(Max(x.value, atoms), dims, x.dtype)


@handles(aten.amax)
def _amax(I, node, depth):
    x = I.ev(node.args[0], depth)
    return _reduce_max(I, node, x, _reduce_dims(node, len(x.dims)), bool(_arg(node, 2, "keepdim", False)))


@handles(operator.getitem)
def _getitem(I, node, depth):
    """``max(x, dim).values``: item 0 of aten.max.dim."""
    src = node.args[0]
    if node.args[1] != 0 or not isinstance(src, fx.Node) or src.op != "call_function" \
            or src.target != aten.max.dim:
        return None
    x = I.ev(src.args[0], depth)
    d = _norm_dim(_arg(src, 1, "dim"), len(x.dims))
    return _reduce_max(I, node, x, [d], bool(_arg(src, 2, "keepdim", False)))


def _cat_floats(I, node, depth):
    """Floats concatenated along one dim: a ``Cat`` over a fresh atom."""
    parts = [I.ev(a, depth) for a in node.args[0]]
    shape = I.out_shape(node)
    n = len(shape)
    dim = _norm_dim(_arg(node, 1, "dim", 0), n)
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


@handles(aten.remainder)
def _remainder(I, node, depth):
    a, b, dims = _binary(I, node, depth)
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


@handles(aten.gather)
def _gather(I, node, depth):
    """out[..., i, ...] = src[..., index[..., i, ...], ...] along ``dim``."""
    src = I.ev(node.args[0], depth)
    n = len(src.dims)
    axis = _norm_dim(node.args[1], n)
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
    axis = _norm_dim(node.args[1], len(src.dims))
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


# ---- integer tensors read elementwise: gathers, byte arithmetic, lookup tables ------------------
def substitute(A: Atoms, v, dim, index_expr):
    """``v`` (an Index or Elem) with the dim whose atoms are ``dim`` read at ``index_expr``:
    each atom becomes floor(index / stride) mod size (row-major), exact for 0 <= index < size."""
    flat = A.flat_dim(dim)
    subs, stride = {}, sympy.Integer(1)
    for i, a in reversed(list(enumerate(flat))):
        part = sympy.floor(index_expr / stride) if stride != 1 else index_expr
        subs[A.symbol(a)] = part if i == 0 else sympy.Mod(part, A.size(a))
        stride *= A.size(a)

    def one(ix: Index):
        # the leaves are now read at index expressions: their own dims no longer say where
        leaves = tuple((fn, node, None) for fn, node, _ in ix.leaves)
        return Index(A.resolve(ix.expr).xreplace(subs), is_bool=ix.is_bool, leaves=leaves)
    if isinstance(v, Index):
        return one(v)
    return Elem(v.prog, tuple((one(x), dt, nb) for x, dt, nb in v.inputs))


def as_elem(I: Interpreter, tv: TV, node=None) -> Optional[Elem]:
    """An operand as an Elem program: Elem itself, an Index with a known expression (an input),
    or a constant (as a 0-d tensor of the node's dtype, like the graph holds it)."""
    v = tv.value
    if isinstance(v, Elem):
        return v
    if isinstance(v, Index) and v.expr is not None:
        return Elem(("in", 0), ((v, tv.dtype, 1),))
    if isinstance(v, Const):
        c = v.value
        if isinstance(node, fx.Node) and tv.dtype:
            with unset_fake_temporarily():
                c = torch.tensor(v.value, dtype=tv.dtype)
        return Elem(("const", c), ())
    return None


def _shift(prog, k):
    kind = prog[0]
    if kind == "in":
        return ("in", prog[1] + k)
    if kind == "pick":
        return ("pick", prog[1] + k, tuple(_shift(p, k) for p in prog[2]))
    if kind == "op":
        def arg(a):
            if isinstance(a, tuple) and a and a[0] in ("in", "const", "pick", "op"):
                return _shift(a, k)
            if isinstance(a, list):
                return [arg(x) for x in a]
            return a
        return ("op", prog[1], tuple(arg(a) for a in prog[2]), prog[3])
    return prog


class _Merge:
    """Collects the inputs of several Elem operands into one input list."""

    def __init__(self):
        self.inputs = []

    def add(self, e: Elem):
        k = len(self.inputs)
        self.inputs += list(e.inputs)
        return _shift(e.prog, k)


# ops that are elementwise over their tensor operands (broadcasting)
_ELEMENTWISE = {aten.mul, aten.add, aten.sub, aten.rsub, aten.div, aten.neg, aten.exp2, aten.exp, aten.pow, aten.ldexp,
                aten.where, aten.abs, aten.bitwise_and, aten.bitwise_or, aten.bitwise_xor,
                aten.__and__, aten.__or__, aten.__xor__, aten.__rshift__, aten.__lshift__,
                aten.bitwise_right_shift, aten.bitwise_left_shift, aten.bitwise_not,
                prims.convert_element_type, aten._to_copy,
                aten.ge, aten.gt, aten.le, aten.lt, aten.eq, aten.ne}
# ops that turn plain integer tensors into an Elem (elsewhere integers stay sympy expressions)
_BYTE_OPS = {aten.bitwise_and, aten.bitwise_or, aten.bitwise_xor, aten.__and__, aten.__or__,
             aten.__xor__, aten.__rshift__, aten.__lshift__, aten.bitwise_right_shift,
             aten.bitwise_left_shift, aten.exp2, aten.pow, aten.ldexp, prims.convert_element_type, aten._to_copy}


# integer arithmetic that wraps around in these dtypes is evaluated, not read as exact sympy
_NARROW_INTS = (torch.uint8, torch.int8, torch.int16)


def _elementwise(I: Interpreter, node, depth):
    """Read an elementwise op as an Elem when an operand is one (or, for byte arithmetic and
    int -> float casts, an integer tensor); None leaves the op to its ordinary handler."""
    p = packet(node)
    nodes = [a for a in node.args if isinstance(a, fx.Node)]
    if not nodes:
        return None
    tvs = [I.ev(a, depth) for a in nodes]
    out_dt = node.meta["val"].dtype
    if not any(isinstance(tv.value, Elem) for tv in tvs):
        ints = [tv for tv in tvs if isinstance(tv.value, Index) and not tv.value.is_bool]
        narrow = out_dt in _NARROW_INTS and p in (aten.add, aten.sub, aten.rsub, aten.mul, aten.neg)
        if not ints or (p not in _BYTE_OPS and not narrow):
            return None
        if p in (prims.convert_element_type, aten._to_copy) and not out_dt.is_floating_point:
            return None  # int -> int casts stay index expressions
    elems = [as_elem(I, tv, a) for a, tv in zip(nodes, tvs)]
    if any(e is None for e in elems):
        return None
    if p is aten._to_copy:
        if node.args[0].meta["val"].device != node.meta["val"].device:
            return None
        target, kwargs = prims.convert_element_type.default, {}
        args_t = (node.args[0], out_dt)
    else:
        target, kwargs, args_t = node.target, dict(node.kwargs), node.args
        if any(isinstance(v, fx.Node) for v in kwargs.values()):
            return None
    m, progs = _Merge(), {a: None for a in nodes}
    for a, e in zip(nodes, elems):
        progs[a] = m.add(e)
    args = tuple(progs[a] if isinstance(a, fx.Node) else a for a in args_t)
    dims = I.bcast(node, tvs)
    return TV(Elem(("op", target, args, kwargs), tuple(m.inputs)), dims, out_dt)


def _view_dtype(I: Interpreter, node, depth):
    """x.view(dtype): same item size -> an elementwise reinterpretation; uint8 -> a 4-byte dtype
    -> a word input (the address of its first byte; the last dim shrinks by 4)."""
    x = I.ev(node.args[0], depth)
    src, dst = node.args[0].meta["val"].dtype, node.args[1]
    if src.itemsize == dst.itemsize:
        e = as_elem(I, x, node.args[0])
        if e is None or not isinstance(x.value, (Index, Elem)):
            return None
        return TV(Elem(("op", aten.view.dtype, (e.prog, dst), {}), e.inputs), x.dims, dst)
    if not (isinstance(x.value, Index) and x.value.expr is not None and src == torch.uint8
            and dst.itemsize == 4 and x.dims):
        return None
    last = x.dims[-1]
    flat = I.A.flat_dim(last)
    if not flat or not I.A.shapes.eq(I.A.size(flat[-1]), 4):
        if not flat or I.A.shapes.quotient(I.A.size(flat[-1]), 4) is None:
            return None
        I.A.split(flat[-1], I.A.size(flat[-1]) / 4)
        flat = I.A.flat_dim(last)
    byte = flat[-1]
    word = I.A.resolve(x.value.expr).xreplace({I.A.symbol(byte): 0})
    if I.A.symbol(byte) in word.free_symbols:
        return None
    ix = Index(word, leaves=x.value.leaves)
    dims = x.dims[:-1] + (tuple(flat[:-1]),)
    return TV(Elem(("in", 0), ((ix, dst, 4),)), dims, dst)


def constant_tensor(node) -> Optional[torch.Tensor]:
    """The real value of a constant tensor in the graph (a get_attr, through copies/casts)."""
    ops = []
    while isinstance(node, fx.Node) and node.op == "call_function":
        p = packet(node)
        if p in (aten.lift_fresh_copy, aten.clone, aten.alias, aten.detach):
            node = node.args[0]
        elif p is prims.convert_element_type:
            ops.append(node.args[1])
            node = node.args[0]
        else:
            return None
    if not isinstance(node, fx.Node) or node.op != "get_attr":
        return None
    t = node.graph.owning_module
    for part in str(node.target).split("."):
        t = getattr(t, part, None)
    if not isinstance(t, torch.Tensor) or isinstance(t, torch._subclasses.FakeTensor):
        return None
    with unset_fake_temporarily():
        for dt in reversed(ops):
            t = t.to(dt)
        return t.detach().cpu()


def _index_bytes(I: Interpreter, node, depth):
    """A gather along dim 0 (``cache[block_table]``, index_select) of an integer tensor, or a
    lookup in a small constant table (``lut[codes]``)."""
    src = node.args[0]
    if packet(node) is aten.index_select:
        if _norm_dim(node.args[1], node.args[0].meta["val"].dim()) != 0:
            return None
        idx_node = node.args[2]
    else:
        idx = node.args[1]
        if len(idx) != 1 or not isinstance(idx[0], fx.Node):
            return None
        idx_node = idx[0]
    ix = I.ev(idx_node, depth)
    if ix.dtype == torch.bool or ix.dtype is None or ix.dtype.is_floating_point:
        return None
    lut = constant_tensor(src)
    if lut is not None:
        if lut.dim() != 1 or lut.numel() > 256:
            return None
        e = as_elem(I, ix, idx_node)
        if e is None:
            return None
        prog = ("op", aten.index.Tensor, (("const", lut), [e.prog]), {})
        return TV(Elem(prog, e.inputs), ix.dims, node.meta["val"].dtype)
    x = I.ev(src, depth)
    if not (isinstance(x.value, Elem) or (isinstance(x.value, Index) and x.dtype == torch.uint8)):
        return None  # only byte caches are read through a gather
    if I.index_of(ix) is None or not x.dims or (isinstance(x.value, Index) and x.value.expr is None):
        return None
    value = substitute(I.A, x.value, x.dims[0], ix.value.expr)
    value = _with_leaves(value, ix.value.leaves)
    return TV(value, ix.dims + x.dims[1:], x.dtype)


def _with_leaves(v, leaves):
    if isinstance(v, Index):
        return Index(v.expr, is_bool=v.is_bool, leaves=v.leaves + leaves)
    return Elem(v.prog, tuple((Index(x.expr, x.is_bool, x.leaves + leaves), dt, nb) for x, dt, nb in v.inputs))


def _cat_pick(I: Interpreter, node, depth):
    """stack / cat of size-1 slices along a new dim: the new index picks the operand."""
    parts = node.args[0]
    n = len(node.meta["val"].shape)
    dim = _norm_dim(_arg(node, 1, "dim", 0), n)
    tvs = [I.ev(a, depth) for a in parts]
    if packet(node) is aten.stack:
        tvs = [TV(tv.value, tv.dims[:dim] + ((),) + tv.dims[dim:], tv.dtype) for tv in tvs]
    elif not all(I.A.shapes.is_one(as_expr(a.meta["val"].shape[dim])) for a in parts):
        return None
    elems = [as_elem(I, tv, a) for a, tv in zip(parts, tvs)]
    if any(e is None for e in elems) or not any(isinstance(tv.value, (Elem, Index)) for tv in tvs):
        return None
    dims = list(I.bcast(node, tvs))
    if not dims[dim]:
        return None
    m = _Merge()
    progs = tuple(m.add(e) for e in elems)
    sel = Index(I.A.symbol(dims[dim][0]))
    m.inputs.append((sel, torch.int64, 1))
    return TV(Elem(("pick", len(m.inputs) - 1, progs), tuple(m.inputs)), tuple(dims), node.meta["val"].dtype)


# ---- ops both sections read: bytes first (they claim only byte caches, lookup tables and ------
# programs over bytes), then what the op read before (attention's floats, index arithmetic)
def _first(*fns):
    """A handler trying ``fns`` in order: the first reading that is not None. (All but the last
    give up before they unify atoms, so each starts from the same state; ``ev`` undoes the last.)"""
    fns = [f for f in fns if f is not None]

    def handler(I, node, depth):
        for fn in fns:
            tv = fn(I, node, depth)
            if tv is not None:
                return tv
        return None
    return handler


for _p in _ELEMENTWISE:
    HANDLERS[_p] = _first(_elementwise, HANDLERS.get(_p))
handles(aten.index)(_first(_index_bytes, _index_floats))
handles(aten.index_select)(_first(_index_bytes, _index_select_floats))
handles(aten.cat)(_first(_cat_pick, _cat_floats))
handles(aten.stack)(_cat_pick)
