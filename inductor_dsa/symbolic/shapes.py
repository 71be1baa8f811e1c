"""Size arithmetic for the symbolic engine: sympy sizes, decided with the graph's ShapeEnv.

``Reject`` is the one exception of the engine and of every recogniser built on it: the candidate
is not provably what was asked, and the message says why.
"""
from __future__ import annotations

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
