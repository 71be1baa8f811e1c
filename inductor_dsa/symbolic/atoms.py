"""Index atoms: union-find over the index variables of the tensor dims met while reading.

Every tensor dim is a tuple of atoms (outer to inner). A view that merges dims concatenates
their tuples; a view that splits a dim partitions its tuple, refining an atom into an
(outer, inner) pair where the split falls inside it; broadcasting unifies the atoms that share
a position. Size-1 dims carry the empty tuple.

Atoms appear in sympy expressions as integer symbols made by ``Atoms.symbol``;
``Atoms.atom_of`` maps such a symbol back to its atom (None for any other symbol).
"""
from __future__ import annotations

from typing import Optional

import sympy

from .shapes import Reject, Shapes, as_expr

# atom <-> symbol, both ways (a memo: the symbol of atom ``a`` is always the same sympy object)
_SYMBOL: dict[int, sympy.Symbol] = {}
_ATOM: dict[sympy.Symbol, int] = {}


def atom_symbol(a: int) -> sympy.Symbol:
    """The integer sympy symbol that stands for atom ``a`` in index expressions."""
    s = _SYMBOL.get(a)
    if s is None:
        s = sympy.Symbol(f"_i{a}", integer=True, nonnegative=True)
        _SYMBOL[a], _ATOM[s] = s, a
    return s


def atom_of(s) -> Optional[int]:
    """The atom a symbol stands for, or None (a size symbol, or any other symbol)."""
    return _ATOM.get(s)


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
    symbol = staticmethod(atom_symbol)
    atom_of = staticmethod(atom_of)

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
            a = atom_of(s)
            if a is not None:
                subs[s] = self.linear(a)
        return expr.xreplace(subs) if subs else expr

    def atoms_in(self, expr: sympy.Basic) -> set[int]:
        return {a for a in map(atom_of, self.resolve(expr).free_symbols) if a is not None}

