"""Integer tensors read elementwise: gathers from byte caches, byte arithmetic, lookup tables,
``view(dtype)`` reinterpretations: the ``BYTES`` handler set. Its handlers claim only byte caches,
lookup tables and programs over bytes; chain it first (``HandlerSet.chain``) in front of the sets
that read the same ops as floats or index arithmetic.
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.fx as fx
from torch._subclasses.fake_tensor import unset_fake_temporarily

from .reader import TV, HandlerSet, Interpreter, arg_of, norm_dim, packet
from .shapes import as_expr
from .values import substitute, Const, Elem, Index

aten = torch.ops.aten
prims = torch.ops.prims

BYTES = HandlerSet("bytes")


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


@BYTES.handles(aten.view, shape=True)
def _view_dtype(I: Interpreter, node, depth):
    """x.view(dtype): same item size -> an elementwise reinterpretation; uint8 -> a 4-byte dtype
    -> a word input (the address of its first byte; the last dim shrinks by 4)."""
    if not isinstance(node.args[1], torch.dtype):
        return None  # a view to new sizes: read_layout
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


_TABLE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def table_input(node) -> Optional[fx.Node]:
    """``node`` if it is a 16-entry bf16 / fp16 / fp32 vector read from a graph input (a module
    buffer: values unknown when compiling) through copies / float casts, else None."""
    val = node.meta.get("val") if isinstance(node, fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dtype not in _TABLE_DTYPES or tuple(val.shape) != (16,):
        return None
    x = node
    while x.op == "call_function" and packet(x) in (aten.lift_fresh_copy, aten.clone, aten.alias, aten.detach,
                                                      prims.convert_element_type):
        x = x.args[0]
    return node if x.op == "placeholder" else None


def _index_bytes(I: Interpreter, node, depth):
    """A gather along dim 0 (``cache[block_table]``, index_select) of an integer tensor, or a
    lookup in a small table (``lut[codes]``): a constant, or a graph input indexed by a byte
    program (a ("table", node) leaf)."""
    src = node.args[0]
    if packet(node) is aten.index_select:
        if norm_dim(node.args[1], node.args[0].meta["val"].dim()) != 0:
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
    if lut is not None or (packet(node) is aten.index and isinstance(ix.value, Elem) and table_input(src) is not None):
        if lut is not None and (lut.dim() != 1 or lut.numel() > 256):
            return None
        e = as_elem(I, ix, idx_node)
        if e is None:
            return None
        prog = ("op", aten.index.Tensor, (("const", lut) if lut is not None else ("table", src), [e.prog]), {})
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
    dim = norm_dim(arg_of(node, 1, "dim", 0), n)
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



for _p in _ELEMENTWISE:
    BYTES.handles(_p)(_elementwise)
BYTES.handles(aten.index, aten.index_select)(_index_bytes)
BYTES.handles(aten.cat, aten.stack)(_cat_pick)
