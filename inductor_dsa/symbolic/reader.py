"""Read post-decomposition aten nodes into values over atoms (``values.py``, ``atoms.py``).

A ``HandlerSet`` maps aten/prims ops to handlers; a handler returns a ``TV`` (value, dims, dtype)
or None. None (or a ``Reject`` raised inside) makes the node an opaque ``Leaf``, which is always
exact. There is no global table: each reader is given the handler set it reads with, and a
recogniser names the sets it needs (the families in ``read_layout``, ``read_arith``,
``read_gather``, ``read_bytes``, composed with ``HandlerSet.chain``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Optional

import sympy
import torch
import torch.fx as fx

from .atoms import Atoms
from .shapes import Reject, Shapes, as_expr
from .values import Const, Index, Leaf, Value


@dataclass
class TV:
    """A tensor as read: its value, the atoms of each dim, its dtype."""
    value: Value
    dims: tuple
    dtype: Optional[torch.dtype]


class HandlerSet:
    """Handlers by op packet, and which of them only move data (not counted towards the depth)."""

    def __init__(self, name: str):
        self.name = name
        self.handlers: dict[object, Callable] = {}
        self.shape_ops: set = set()

    def handles(self, *packets, shape: bool = False):
        """Decorator: ``fn`` reads ``packets`` in this set."""
        def deco(fn):
            for p in packets:
                if p in self.handlers:
                    raise ValueError(f"{self.name}: two handlers for {p}")
                self.handlers[p] = fn
                if shape:
                    self.shape_ops.add(p)
            return fn
        return deco

    def get(self, p) -> Optional[Callable]:
        return self.handlers.get(p)

    def __contains__(self, p) -> bool:
        return p in self.handlers

    def is_shape(self, p) -> bool:
        return p in self.shape_ops

    @staticmethod
    def chain(name: str, *sets: "HandlerSet") -> "HandlerSet":
        """The union of ``sets``; an op that several sets read tries their handlers in the order
        given and takes the first reading that is not None (see ``first``)."""
        out = HandlerSet(name)
        claims: dict[object, list] = {}
        for s in sets:
            for p, fn in s.handlers.items():
                claims.setdefault(p, []).append(fn)
            out.shape_ops |= s.shape_ops
        for p, fns in claims.items():
            out.handlers[p] = fns[0] if len(fns) == 1 else first(*fns)
        return out


def first(*fns):
    """A handler trying ``fns`` in order: the first reading that is not None. (All but the last
    give up before they unify atoms, so each starts from the same state; ``ev`` undoes the last.)"""
    def handler(I, node, depth):
        for fn in fns:
            tv = fn(I, node, depth)
            if tv is not None:
                return tv
        return None
    return handler


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


def val_of(node):
    """The example value (fake tensor or SymInt) of a node; None for other arguments."""
    return node.meta.get("val") if isinstance(node, fx.Node) else None


def arg_of(node: fx.Node, i: int, name: str, default=None):
    """Positional argument ``i`` of ``node``, or its keyword ``name``."""
    if len(node.args) > i:
        return node.args[i]
    return node.kwargs.get(name, default)



class Interpreter:
    """Reads nodes on demand (memoised). ``max_depth`` bounds how many non-shape ops are
    followed upstream from where reading started; deeper nodes are leaves.

    With ``copy_reused``, a node met again is read again as a fresh copy (new atoms, its own
    memo scope): each use of a tensor gets its own index variables, related to the others only
    where an op aligns them (broadcast, contraction). Without it every use shares the node's
    atoms, so a tensor used at two positions (``i[:, None] >= i[None, :]`` of one arange, q and k
    both projected from the same hidden states) reads as a diagonal: exact, but it never matches.
    Copies are read only within ``copy_depth`` non-shape ops of where reading started; a node met
    again deeper is a fresh opaque leaf (exact, new atoms): in a model the hidden states reach back
    through the whole previous layer, whose reused tensors would otherwise be copied per path.
    ``max_reads`` bounds the work of the copies."""

    def __init__(self, graph: fx.Graph, handlers: HandlerSet, shapes: Optional[Shapes] = None,
                 max_depth: int = 16, copy_reused: bool = False, max_reads: int = 20000,
                 copy_depth: int = 4):
        self.graph = graph
        self.handlers = handlers
        self.A = Atoms(shapes or Shapes(shape_env_of(graph)))
        self.memo: dict[fx.Node, TV] = {}
        self.max_depth = max_depth
        self.notes: list[str] = []  # why nodes became leaves (for debugging)
        self._nfun = 0
        self.copy_reused, self.max_reads, self._reads = copy_reused, max_reads, 0
        self.copy_depth = copy_depth

    # ---- entry points ----------------------------------------------------------------------
    def ev(self, arg, depth: int = 0) -> TV:
        if not isinstance(arg, fx.Node):
            return self.scalar(arg)
        if arg in self.memo:
            if not self.copy_reused:
                return self.memo[arg]
            if depth > self.copy_depth:
                return self.fresh_leaf(arg)
            outer, self.memo = self.memo, {}
            try:
                return self.ev(arg, depth)
            finally:
                self.memo = outer
        self._reads += 1
        if self._reads > self.max_reads:
            raise Reject(f"reading stopped after {self.max_reads} node reads (copies of reused tensors)")
        val = val_of(arg)
        if isinstance(val, (torch.SymInt, int)) and not isinstance(val, bool):
            return TV(Index(as_expr(val)), (), torch.int64)
        if not isinstance(val, torch.Tensor):
            raise Reject(f"{arg.name} is not a tensor")
        tv = None
        p = packet(arg) if arg.op == "call_function" else None
        handler = self.handlers.get(p)
        if handler is not None:
            step = 0 if self.handlers.is_shape(p) else 1
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

    def fresh_leaf(self, node: fx.Node) -> TV:
        """``node`` as an opaque leaf at new atoms (not memoised): a copy that is not read again."""
        tv = self.leaf(node)
        tv.value.origin, tv.value.origin_dims = node, tv.dims
        return tv

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




def norm_dim(d: int, n: int) -> int:
    return d + n if d < 0 else d

