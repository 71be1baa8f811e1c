"""Prove that a mask is a per-row half-open range of visible columns.

The mask arrives as a sympy boolean ``visible(row atoms, col)`` read from the graph
(arange/iota, comparisons, floor division, &, |, ~). ``per_row_range`` rewrites it, by
equivalences that hold for every integer ``col``, into

    visible  <=>  k_start(row) <= col < k_end(row)

or raises ``Reject``. The rewriting rules, each an equivalence over the integers:

* negations are pushed to the comparisons (``~(a >= b)`` is ``a < b``);
* a conjunction intersects ranges: k_start = Max(lower bounds), k_end = Min(upper bounds);
  a disjunction is only accepted when none of its terms mentions ``col``;
* a comparison is ``a * V + r  op  0`` where ``r`` does not mention ``col``, ``a`` is a
  non-zero integer and ``V`` is ``col`` or ``floor(col / c)`` with a positive integer ``c``;
  for integer V and real x:  V >= x <=> V >= ceil(x);  V > x <=> V >= floor(x) + 1;
  V <= x <=> V < floor(x) + 1;  V < x <=> V < ceil(x);  V == x <=> x <= V < x + 1 when x is
  an integer; ``!=`` is not a range and is rejected;
* floor(col / c) >= L <=> col >= c * L  and  floor(col / c) < U <=> col < c * U  (L, U integers);
* a comparison that does not mention ``col`` keeps or empties the whole row.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import sympy

from .shapes import Reject


@dataclass
class RowRange:
    k_start: sympy.Expr       # may be < 0 or > K: the caller clamps to [0, K]
    k_end: sympy.Expr
    row_cond: Optional[sympy.Basic] = None  # rows where this is false see nothing


def _push_not(e, neg=False):
    """Negation normal form where every leaf is a relational (or a boolean constant)."""
    if e in (sympy.true, sympy.false):
        return sympy.false if (e == sympy.true) == neg else sympy.true
    if isinstance(e, sympy.Not):
        return _push_not(e.args[0], not neg)
    if isinstance(e, sympy.And):
        parts = [_push_not(a, neg) for a in e.args]
        return sympy.Or(*parts) if neg else sympy.And(*parts)
    if isinstance(e, sympy.Or):
        parts = [_push_not(a, neg) for a in e.args]
        return sympy.And(*parts) if neg else sympy.Or(*parts)
    if isinstance(e, sympy.Xor):
        raise Reject("xor in a mask is not a range")
    if isinstance(e, sympy.core.relational.Relational):
        return e.negated if neg else e
    raise Reject(f"mask term {e} is not a comparison")


def _conjuncts(e):
    if isinstance(e, sympy.And):
        return list(e.args)
    return [e]


def _integer_var(g, col):
    """(c, ok): g is col (c = 1) or floor(col / c) with a positive integer c."""
    if g == col:
        return 1
    if isinstance(g, sympy.floor):
        arg = sympy.expand(g.args[0])
        coeff, rest = arg.as_coeff_Mul()
        if rest == col and coeff.is_Rational and coeff > 0 and coeff.p == 1:
            return int(coeff.q)
    return None


def _bound(rel, col):
    """('lo', L) | ('hi', U) | ('eq', x): a comparison as a bound on col."""
    op = type(rel)
    e = sympy.expand(rel.lhs - rel.rhs)
    indep, dep = e.as_independent(col, as_Add=True)
    if dep == 0:
        raise AssertionError("caller filters col-free comparisons")
    a, g = dep.as_coeff_Mul()
    if not (a.is_Integer and a != 0):
        raise Reject(f"mask comparison {rel} is not linear in the column index")
    c = _integer_var(g, col)
    if c is None:
        raise Reject(f"mask comparison {rel} uses the column index as {g}")
    x = -indep / a
    if a < 0:  # dividing by a negative number flips the comparison
        op = {sympy.Ge: sympy.Le, sympy.Gt: sympy.Lt, sympy.Le: sympy.Ge, sympy.Lt: sympy.Gt}.get(op, op)
    if op is sympy.Ge:
        kind, v = "lo", sympy.ceiling(x)
    elif op is sympy.Gt:
        kind, v = "lo", sympy.floor(x) + 1
    elif op is sympy.Le:
        kind, v = "hi", sympy.floor(x) + 1
    elif op is sympy.Lt:
        kind, v = "hi", sympy.ceiling(x)
    elif op is sympy.Eq:
        if not x.is_integer:
            raise Reject(f"mask comparison {rel}: cannot show the right side is an integer")
        return [("lo", c * x), ("hi", c * (x + 1))]
    else:
        raise Reject(f"mask comparison {rel} ({op.__name__}) is not a range")
    return [(kind, c * v)]


def per_row_range(visible: sympy.Basic, col: sympy.Symbol) -> RowRange:
    nnf = _push_not(visible)
    lows, highs, row_terms = [], [], []
    for term in _conjuncts(nnf):
        if term == sympy.true:
            continue
        if col not in term.free_symbols:
            row_terms.append(term)  # a row-only condition (or False)
            continue
        if isinstance(term, sympy.Or):
            raise Reject("mask is a union of column ranges, not one range per row")
        for kind, v in _bound(term, col):
            (lows if kind == "lo" else highs).append(v)
    k_start = sympy.Max(*lows) if lows else sympy.Integer(0)
    k_end = sympy.Min(*highs) if highs else None
    row_cond = sympy.And(*row_terms) if row_terms else None
    if row_cond == sympy.true:
        row_cond = None
    return RowRange(k_start, k_end, row_cond)


def check_range(visible, col, rng: RowRange, subs_rows: dict, cols: int) -> bool:
    """Brute-force cross-check on concrete values (used by tests)."""
    for j in range(cols):
        env = dict(subs_rows)
        env[col] = j
        want = bool(visible.subs(env))
        lo = int(rng.k_start.subs(subs_rows))
        hi = cols if rng.k_end is None else int(rng.k_end.subs(subs_rows))
        ok = True if rng.row_cond is None else bool(rng.row_cond.subs(subs_rows))
        if want != (ok and lo <= j < hi):
            return False
    return True
