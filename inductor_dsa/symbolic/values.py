"""Values: what a tensor computes, as small immutable trees over atoms (``Leaf``, ``Const``,
``Relu``, ``Cast``, ``Mul``, ``Sum``, ``Contract``, ``Add``, ``Where``, ``AllReduce``, ``Index``,
``Elem``, ``Gather``, ``Exp``, ``Recip``, ``Max``, ``Maximum``, ``Cat``, ``Slice``).

The atoms a value depends on are derived at the end (``deps``), once all unifications are
known. Reading a node as a ``Leaf`` is always exact, so giving up on an op never changes
meaning: it only stops a match.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import sympy
import torch

from .atoms import Atoms


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

    ``expr`` is None for an opaque boolean (a mask we cannot read). ``logic`` says how a boolean was
    built from others (each with its own ``origin`` tensor), where that is known: ("not", x) |
    ("and", a, b) | ("or", a, b); the patterns use it to pass opaque parts of a mask as data.
    """
    expr: Optional[sympy.Basic]
    is_bool: bool = False
    leaves: tuple = ()  # (function symbol, node, dims or None) of opaque integer tensors used
    logic: Optional[tuple] = None


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


def run_prog(prog, values, tables=None):
    """Evaluate an ``Elem`` program on 1-D tensors ``values`` (one per input); a ("table", node)
    leaf (a lookup table that is a graph input) takes the value ``tables[node]``."""
    kind = prog[0]
    if kind == "in":
        return values[prog[1]]
    if kind == "const":
        return prog[1]
    if kind == "table":
        return tables[prog[1]]
    if kind == "pick":
        sel, outs = values[prog[1]], [run_prog(p, values, tables) for p in prog[2]]
        out = outs[-1]
        for i in reversed(range(len(outs) - 1)):
            out = torch.where(sel == i, outs[i], out)
        return out
    _, target, args, kwargs = prog

    def arg(a):
        if isinstance(a, tuple) and a and a[0] in ("in", "const", "table", "pick", "op"):
            return run_prog(a, values, tables)
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
