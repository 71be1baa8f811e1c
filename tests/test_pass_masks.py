"""The sympy proof that a mask is a per-row range, checked against brute force."""
import pytest
import sympy
from hypothesis import given, settings
from hypothesis import strategies as st

import pass_helpers  # noqa: F401  (puts this checkout first on sys.path)
from inductor_dsa.symbolic import Reject
from inductor_dsa.symbolic.ranges import check_range, per_row_range

row = sympy.Symbol("_i0", integer=True, nonnegative=True)
col = sympy.Symbol("_i1", integer=True, nonnegative=True)
ROWS, COLS = 24, 16


def brute(visible):
    rng = per_row_range(visible, col)
    for r in range(ROWS):
        assert check_range(visible, col, rng, {row: r}, COLS), f"row {r}: {visible} vs {rng}"
    return rng


def test_official_ratio_rule():
    # masked: arange(S//4).repeat(S, 1) >= arange(1, S+1).unsqueeze(1) // 4
    masked = sympy.Ge(col, sympy.floor((row + 1) / 4))
    rng = brute(sympy.Not(masked))
    assert rng.k_start == 0 and rng.k_end == sympy.floor((row + 1) / 4)


@pytest.mark.parametrize("visible", [
    sympy.Le(col, row),                                              # causal
    sympy.And(sympy.Le(col, row), sympy.Ge(col, row - 6)),           # sliding window
    sympy.Not(sympy.Gt(col, row + 3)),                               # causal with a prefix
    sympy.Eq(col, row),                                              # only the diagonal
    sympy.Lt(sympy.floor(col / 4), sympy.floor(row / 4) + 1),        # block-causal on key blocks
    sympy.Ge(2 * col, row),                                          # col >= ceil(row / 2)
    sympy.Not(sympy.Or(sympy.Lt(col, 3), sympy.Ge(col, row))),       # de Morgan: 3 <= col < row
    sympy.And(sympy.Lt(col, 10), sympy.Lt(row, 20)),                 # a row-only condition
    sympy.Ge(-col, -row),                                            # negative coefficient
])
def test_ranges(visible):
    brute(visible)


@pytest.mark.parametrize("visible,why", [
    (sympy.Or(sympy.Lt(col, 2), sympy.Gt(col, row)), "union"),
    (sympy.Ne(col, row), "not a range"),
    (sympy.Eq(sympy.Mod(col, 2), 0), "column index"),
    (sympy.Le(col * col, row), "column index as"),
    (sympy.Le(sympy.Rational(1, 2) * col, row), "not linear"),
    (sympy.Eq(2 * col, row), "integer"),
])
def test_not_ranges_are_rejected(visible, why):
    with pytest.raises(Reject, match=why):
        per_row_range(visible, col)


OPS = [sympy.Lt, sympy.Le, sympy.Gt, sympy.Ge, sympy.Eq]
atom = st.tuples(st.sampled_from([-2, -1, 1, 2]), st.sampled_from([1, 2, 3]),
                 st.integers(-3, 3), st.sampled_from([1, 4]), st.integers(-5, 5),
                 st.sampled_from(OPS), st.booleans())


@settings(max_examples=60, deadline=None)
@given(st.lists(atom, min_size=1, max_size=3))
def test_random_conjunctions_are_exact(terms):
    """Conjunctions of a*floor(col/c) + b*floor(row/r) + e  op  0, maybe negated."""
    parts = []
    for a, c, b, r, e, op, neg in terms:
        rel = op(a * sympy.floor(col / c) + b * sympy.floor(row / r) + e, 0)
        parts.append(sympy.Not(rel) if neg else rel)
    visible = sympy.And(*parts)
    try:
        rng = per_row_range(visible, col)
    except Reject as err:
        # only an equality whose right side is not provably an integer, or a negated
        # equality (!=), may be refused
        assert any(op is sympy.Eq for *_, op, _n in terms), (visible, err)
        return
    for rr in range(ROWS):
        assert check_range(visible, col, rng, {row: rr}, COLS), (visible, rng, rr)
