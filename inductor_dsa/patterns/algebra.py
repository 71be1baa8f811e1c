"""Index algebra used to read FX subgraphs as Einstein-style expressions.

Every tensor dimension met while reading a subgraph is described by a tuple of *atoms*
(index variables, outer to inner). A view that merges two dims concatenates their tuples;
a view that splits a dim partitions its tuple, refining an atom into an (outer, inner)
pair where the split falls inside it; broadcasting two operands identifies (unifies) the
atoms that share a position. Size-1 dims carry the empty tuple.

Values are small immutable trees (``Leaf``, ``Const``, ``Relu``, ``Cast``, ``Mul``,
``Sum``, ``Contract``, ``Add``, ``Where``, ``AllReduce``, ``Index``, ``Elem``; for attention also ``Gather``,
``Exp``, ``Recip``, ``Max``, ``Maximum``, ``Cat``, ``Slice``) whose free atoms are derived at the
end, once all unifications are known. Reading a node as a ``Leaf`` is always exact, so
giving up on an op never changes meaning: it only stops a match.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Optional

import sympy
import torch


class Reject(Exception):
    """The candidate is not provably the pattern; the message says why."""


def as_expr(size) -> sympy.Expr:
    if isinstance(size, bool):
        raise Reject(f"unexpected boolean size {size!r}")
    if isinstance(size, int):
        return sympy.Integer(size)
    if isinstance(size, torch.SymInt):
        return size.node.expr
    if isinstance(size, sympy.Expr):
        return size
    raise Reject(f"unsupported size {size!r}")


class Shapes:
    """Size arithmetic that consults the graph's ShapeEnv for facts such as s1 == s0 // 4."""

    def __init__(self, shape_env=None):
        self.shape_env = shape_env

    def eq(self, a, b) -> bool:
        a, b = as_expr(a), as_expr(b)
        if a == b or sympy.expand(a - b) == 0:
            return True
        if self.shape_env is not None and hasattr(self.shape_env, "_maybe_evaluate_static"):
            try:
                return bool(self.shape_env._maybe_evaluate_static(sympy.Eq(a, b)) == sympy.true)
            except Exception:  # noqa: BLE001 - an undecidable fact is simply not known
                return False
        return False

    def is_one(self, a) -> bool:
        return self.eq(a, 1)

    def hint(self, a) -> Optional[int]:
        """The value a size has in the example inputs (None if unknown)."""
        a = as_expr(a)
        if a.is_Integer:
            return int(a)
        if self.shape_env is None:
            return None
        # torch >= 2.13 names it guarding_hint_or_throw (size_hint warns there); 2.11 has size_hint
        fn = getattr(self.shape_env, "guarding_hint_or_throw", None) or self.shape_env.size_hint
        try:
            return int(fn(a))
        except Exception:  # noqa: BLE001 - unbacked or otherwise unknown
            return None

    def simplify(self, a) -> sympy.Expr:
        """``a`` with the ShapeEnv's replacements applied (e.g. a specialised s1 -> 4)."""
        a = as_expr(a)
        if self.shape_env is None or a.is_Integer:
            return a
        try:
            return self.shape_env.replace(a)
        except Exception:  # noqa: BLE001
            return a

    def specialize(self, a) -> int:
        """Guard ``a == hint`` (a recompile if it changes) and return the hint."""
        a = as_expr(a)
        h = self.hint(a)
        if h is None:
            raise Reject(f"size {a} has no known value to specialise on")
        if not a.is_Integer:
            try:
                self.shape_env.evaluate_expr(sympy.Eq(a, h))
            except Exception as e:  # noqa: BLE001
                raise Reject(f"cannot specialise {a} to {h}: {e}") from None
        return h

    def quotient(self, a, b) -> Optional[sympy.Expr]:
        """a / b when it is provably an integer other than 1, else None."""
        a, b = as_expr(a), as_expr(b)
        q = sympy.cancel(a / b)
        if q.is_integer and not self.is_one(q) and q != 0:
            return q
        return None


class Atoms:
    """Union-find over index variables, with refinement of a variable into (outer, inner)."""

    def __init__(self, shapes: Shapes):
        self.shapes = shapes
        self._size: list[sympy.Expr] = []
        self._parent: list[int] = []
        self._parts: dict[int, tuple[int, ...]] = {}

    def snapshot(self):
        return len(self._size), list(self._parent), dict(self._parts)

    def restore(self, snap) -> None:
        """Undo every union, split and new atom since ``snapshot()``."""
        n, parent, parts = snap
        del self._size[n:]
        self._parent, self._parts = parent, parts

    def new(self, size) -> int:
        self._size.append(as_expr(size))
        self._parent.append(len(self._parent))
        return len(self._parent) - 1

    def dim(self, size) -> tuple[int, ...]:
        """A fresh single-atom dim, or () for size 1."""
        return () if self.shapes.is_one(as_expr(size)) else (self.new(size),)

    def find(self, a: int) -> int:
        root = a
        while self._parent[root] != root:
            root = self._parent[root]
        while self._parent[a] != root:
            self._parent[a], a = root, self._parent[a]
        return root

    def size(self, a: int) -> sympy.Expr:
        return self._size[self.find(a)]

    def flat(self, a: int) -> tuple[int, ...]:
        r = self.find(a)
        if r in self._parts:
            return tuple(x for p in self._parts[r] for x in self.flat(p))
        return (r,)

    def flat_dim(self, d: tuple[int, ...]) -> tuple[int, ...]:
        return tuple(x for a in d for x in self.flat(a))

    def flat_dims(self, dims) -> tuple[tuple[int, ...], ...]:
        return tuple(self.flat_dim(d) for d in dims)

    def dim_size(self, d) -> sympy.Expr:
        return sympy.Mul(*[self.size(a) for a in self.flat_dim(d)])

    def split(self, a: int, outer) -> tuple[int, int]:
        r = self.find(a)
        assert r not in self._parts
        inner = self.shapes.quotient(self._size[r], outer)
        if inner is None:
            raise Reject(f"cannot split an index of size {self._size[r]} by {outer}")
        parts = (self.new(outer), self.new(inner))
        self._parts[r] = parts
        return parts

    def union(self, a: int, b: int) -> None:
        ra, rb = self.find(a), self.find(b)
        if ra == rb:
            return
        if ra in self._parts or rb in self._parts:
            self.unify(self.flat(ra), self.flat(rb))
            return
        if not self.shapes.eq(self._size[ra], self._size[rb]):
            raise Reject(f"index sizes {self._size[ra]} and {self._size[rb]} differ")
        self._parent[rb] = ra

    def unify(self, xs, ys) -> None:
        """Identify two sequences of atoms with the same total size, refining where needed."""
        xs, ys = list(self.flat_dim(xs)), list(self.flat_dim(ys))
        while xs and ys:
            x, y = xs.pop(0), ys.pop(0)
            if self.find(x) in self._parts:
                xs[:0] = self.flat(x)
                ys.insert(0, y)
                continue
            if self.find(y) in self._parts:
                ys[:0] = self.flat(y)
                xs.insert(0, x)
                continue
            sx, sy = self.size(x), self.size(y)
            if self.shapes.eq(sx, sy):
                self.union(x, y)
            elif self.shapes.quotient(sx, sy) is not None:
                x1, x2 = self.split(x, sy)
                self.union(x1, y)
                xs.insert(0, x2)
            elif self.shapes.quotient(sy, sx) is not None:
                y1, y2 = self.split(y, sx)
                self.union(x, y1)
                ys.insert(0, y2)
            else:
                raise Reject(f"cannot align index sizes {sx} and {sy}")
        if xs or ys:
            raise Reject("broadcast dims do not cover the same indices")

    def regroup(self, dims, sizes) -> tuple[tuple[int, ...], ...]:
        """The dims of a row-major reshape of ``dims`` to ``sizes``."""
        seq = [a for d in dims for a in self.flat_dim(d)]
        if len({self.find(a) for a in seq}) != len(seq):
            raise Reject("reshape of a tensor that repeats an index")
        out, i = [], 0
        for z in sizes:
            z = as_expr(z)
            group, need = [], z
            while not self.shapes.is_one(need):
                if i >= len(seq):
                    raise Reject("reshape sizes do not factor the input")
                a = seq[i]
                s = self.size(a)
                if self.shapes.eq(s, need):
                    group.append(a)
                    i, need = i + 1, sympy.Integer(1)
                elif (q := self.shapes.quotient(need, s)) is not None:
                    group.append(a)
                    i, need = i + 1, q
                elif self.shapes.quotient(s, need) is not None:
                    a1, a2 = self.split(a, need)
                    group.append(a1)
                    seq[i] = a2
                    need = sympy.Integer(1)
                else:
                    raise Reject(f"reshape splits an index of size {s} by {need}")
            out.append(tuple(group))
        if i != len(seq):
            raise Reject("reshape sizes do not factor the input")
        return tuple(out)

    # ---- atoms as sympy integer symbols -------------------------------------------------
    @staticmethod
    def symbol(a: int) -> sympy.Symbol:
        return sympy.Symbol(f"_i{a}", integer=True, nonnegative=True)

    def linear(self, a: int) -> sympy.Expr:
        """The value of index ``a`` in terms of its finest parts (row-major)."""
        parts = self.flat(a)
        expr, stride = sympy.Integer(0), sympy.Integer(1)
        for p in reversed(parts):
            expr += stride * self.symbol(p)
            stride *= self.size(p)
        return expr

    def resolve(self, expr: sympy.Basic) -> sympy.Basic:
        """Rewrite every atom symbol in ``expr`` to its representative's finest parts."""
        subs = {}
        for s in expr.free_symbols:
            if s.name.startswith("_i"):
                subs[s] = self.linear(int(s.name[2:]))
        return expr.xreplace(subs) if subs else expr

    def atoms_in(self, expr: sympy.Basic) -> set[int]:
        return {int(s.name[2:]) for s in self.resolve(expr).free_symbols if s.name.startswith("_i")}


# ---- values -------------------------------------------------------------------------------
@dataclass(eq=False)
class Value:
    # The node whose output this value is, and that node's dims: used to materialise it.
    origin: object = field(default=None, repr=False, kw_only=True)
    origin_dims: tuple = field(default=(), repr=False, kw_only=True)


@dataclass(eq=False)
class Leaf(Value):
    node: object
    dims: tuple


@dataclass(eq=False)
class Const(Value):
    value: float


@dataclass(eq=False)
class Relu(Value):
    x: Value


@dataclass(eq=False)
class Cast(Value):
    x: Value
    dtype: torch.dtype


@dataclass(eq=False)
class Mul(Value):
    factors: tuple


@dataclass(eq=False)
class Sum(Value):
    x: Value
    atoms: tuple  # summed atoms


@dataclass(eq=False)
class Contract(Value):
    """sum over ``atoms`` of a * b (a matrix product)."""
    a: Value
    b: Value
    atoms: tuple


@dataclass(eq=False)
class Add(Value):
    a: Value
    b: Value


@dataclass(eq=False)
class Where(Value):
    cond: "Index"
    a: Value
    b: Value


@dataclass(eq=False)
class AllReduce(Value):
    """``x`` reduced across the ranks of a process group (``_c10d_functional.all_reduce`` then
    ``wait_tensor``); ``op`` is the reduce op's name ("sum", "max", ...), ``node`` the all_reduce."""
    x: Value
    op: str
    node: object = field(repr=False)


@dataclass(eq=False)
class Index(Value):
    """An integer or boolean tensor known as a sympy expression of atom symbols.

    ``expr`` is None for an opaque boolean (a mask we cannot read).
    """
    expr: Optional[sympy.Basic]
    is_bool: bool = False
    leaves: tuple = ()  # (function symbol, node, dims or None) of opaque integer tensors used


@dataclass(eq=False)
class Elem(Value):
    """A tensor computed elementwise from integer tensors known as index expressions (e.g. the
    bytes of a quantised cache): ``out[i] = prog(inputs[0][i], inputs[1][i], ...)``.

    ``inputs`` are (Index, dtype, nbytes): the tensor read at each position, the dtype the
    program sees it in, and 4 for a 4-byte word reinterpreted by ``view(dtype)`` (the Index is
    then the address of its first byte). ``prog`` is a tree of ("in", i) | ("const", value) |
    ("op", target, args, kwargs) | ("pick", i, progs): the real aten ops, so ``run_prog``
    evaluates it on concrete values exactly as the graph would.
    """
    prog: tuple
    inputs: tuple


def run_prog(prog, values):
    """Evaluate an ``Elem`` program on 1-D tensors ``values`` (one per input)."""
    kind = prog[0]
    if kind == "in":
        return values[prog[1]]
    if kind == "const":
        return prog[1]
    if kind == "pick":
        sel, outs = values[prog[1]], [run_prog(p, values) for p in prog[2]]
        out = outs[-1]
        for i in reversed(range(len(outs) - 1)):
            out = torch.where(sel == i, outs[i], out)
        return out
    _, target, args, kwargs = prog

    def arg(a):
        if isinstance(a, tuple) and a and a[0] in ("in", "const", "pick", "op"):
            return run_prog(a, values)
        if isinstance(a, list):
            return [arg(x) for x in a]
        return a
    return target(*[arg(a) for a in args], **kwargs)


@dataclass(eq=False)
class Gather(Value):
    """src[..., index, ...]: ``index`` (an integer ``Index`` over the result's atoms) picks
    along src dim ``axis``; every other src dim is shared with the result (same atoms)."""
    src: Value
    src_dims: tuple
    axis: int
    index: Index


@dataclass(eq=False)
class Exp(Value):
    x: Value


@dataclass(eq=False)
class Recip(Value):
    """1 / x."""
    x: Value


@dataclass(eq=False)
class Max(Value):
    """max over ``atoms`` of x (a reduction)."""
    x: Value
    atoms: tuple


@dataclass(eq=False)
class Maximum(Value):
    """Elementwise max(a, b) of floats."""
    a: Value
    b: Value


@dataclass(eq=False)
class Cat(Value):
    """Concatenation along a fresh atom ``atom``: part i covers positions
    [sum(sizes[:i]), sum(sizes[:i+1])) and is indexed there by its own ``part_atoms[i]``."""
    parts: tuple
    part_atoms: tuple
    sizes: tuple
    atom: int


@dataclass(eq=False)
class Slice(Value):
    """x restricted to ``start <= atom_in < stop``, re-indexed by ``atom_out`` = atom_in - start."""
    x: Value
    atom_in: int
    atom_out: int
    start: object
    stop: object


def deps(v: Value, atoms: Atoms) -> frozenset:
    """Root atoms a value depends on."""
    if isinstance(v, Leaf):
        return frozenset(x for d in v.dims for x in atoms.flat_dim(d))
    if isinstance(v, Const):
        return frozenset()
    if isinstance(v, (Relu, Cast, Exp, Recip, AllReduce)):
        return deps(v.x, atoms)
    if isinstance(v, Max):
        return deps(v.x, atoms) - frozenset(atoms.flat_dim(v.atoms))
    if isinstance(v, Maximum):
        return deps(v.a, atoms) | deps(v.b, atoms)
    if isinstance(v, Gather):
        kept = deps(v.src, atoms) - frozenset(atoms.flat_dim(v.src_dims[v.axis]))
        return kept | deps(v.index, atoms)
    if isinstance(v, Cat):
        out = set(atoms.flat(v.atom))
        for p, pa in zip(v.parts, v.part_atoms):
            out |= deps(p, atoms) - frozenset(atoms.flat_dim(pa))
        return frozenset(out)
    if isinstance(v, Slice):
        return (deps(v.x, atoms) - frozenset(atoms.flat(v.atom_in))) | frozenset(atoms.flat(v.atom_out))
    if isinstance(v, Mul):
        return frozenset().union(*[deps(f, atoms) for f in v.factors])
    if isinstance(v, Sum):
        return deps(v.x, atoms) - frozenset(atoms.flat_dim(v.atoms))
    if isinstance(v, Contract):
        return (deps(v.a, atoms) | deps(v.b, atoms)) - frozenset(atoms.flat_dim(v.atoms))
    if isinstance(v, Add):
        return deps(v.a, atoms) | deps(v.b, atoms)
    if isinstance(v, Where):
        return deps(v.cond, atoms) | deps(v.a, atoms) | deps(v.b, atoms)
    if isinstance(v, Elem):
        return frozenset().union(*[deps(x, atoms) for x, _, _ in v.inputs])
    if isinstance(v, Index):
        out = set() if v.expr is None else atoms.atoms_in(v.expr)
        for _, node, dims in v.leaves:
            if dims is not None:  # None: read through an index expression (a gather)
                out |= {x for d in dims for x in atoms.flat_dim(d)}
        if v.expr is None:
            out |= {x for d in v.origin_dims for x in atoms.flat_dim(d)}
        return frozenset(atoms.find(a) for a in out)
    raise TypeError(type(v))


def const_value(v: Value) -> Optional[float]:
    while isinstance(v, Cast):
        v = v.x
    return v.value if isinstance(v, Const) else None


def is_minus_inf_like(x: float, dtype: torch.dtype) -> bool:
    """Whether a mask fill ranks like -inf for scores of ``dtype``: -inf, or at or below that dtype's
    most negative finite value (no finite score lies below it). A finite fill above it (e.g.
    finfo(float16).min on fp32 scores, or -1e4) can be crossed by visible scores, which top-k
    would then rank below masked columns: not the op's semantics."""
    return x == -math.inf or (dtype.is_floating_point and x <= torch.finfo(dtype).min)
