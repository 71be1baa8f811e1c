"""Unit tests of the index algebra the pass reads graphs with."""
import pytest
import sympy
import torch
from torch.fx.experimental.proxy_tensor import make_fx

import pass_helpers  # noqa: F401  (puts this checkout first on sys.path)
from inductor_dsa.symbolic import Atoms, Leaf, Reject, Shapes, deps
from inductor_dsa.patterns.forms import DSA_READS
from inductor_dsa.symbolic import Interpreter


def test_regroup_merges_and_splits_with_refinement():
    A = Atoms(Shapes())
    t, hd = A.new(6), A.new(12)                      # [T=6, H*D=12]
    dims = A.regroup(((t,), (hd,)), [6, 3, 4])       # view as [T, H=3, D=4]
    assert dims[0] == (t,) and len(dims[1]) == len(dims[2]) == 1
    assert A.flat(hd) == dims[1] + dims[2]           # hd is now (h, d), row-major
    merged = A.regroup(dims, [18, 4])                # [T*H, D]
    assert A.flat_dim(merged[0]) == (t,) + dims[1]
    assert A.linear(hd) == 4 * A.symbol(dims[1][0]) + A.symbol(dims[2][0])
    with pytest.raises(Reject):
        A.regroup(dims, [5, 15])                     # 72 = 5 * 15 is not a factorisation of (6, 3, 4)


def test_unify_aligns_by_size():
    A = Atoms(Shapes())
    a, b = A.new(2), A.new(6)                        # (2, 6)
    c = A.new(12)                                    # (12)
    A.unify((a, b), (c,))
    assert A.flat(c) == (A.find(a), A.find(b))      # c was split as (2, 6) and identified
    with pytest.raises(Reject):
        A.unify((A.new(4),), (A.new(5),))


def test_failed_handler_leaves_no_unification():
    """(a[:, None] > 0) * b: a bool times a float is not read; the failed broadcast must not
    identify a's index with b's (nothing that survives says they are the same)."""
    gm = make_fx(lambda a, b: (a.unsqueeze(1) > 0) * b)(torch.arange(4), torch.randn(4, 4))
    mul = next(n for n in gm.graph.nodes if n.target == torch.ops.aten.mul.Tensor)
    I = Interpreter(gm.graph, DSA_READS)
    tv = I.ev(mul)
    assert isinstance(tv.value, Leaf) and tv.value.node is mul
    assert len(deps(tv.value, I.A)) == 2
    assert all(I.A.find(x) == x for x in range(len(I.A._parent)))  # no union survived


def test_symbolic_quotient():
    s = sympy.Symbol("s0", integer=True, positive=True)
    sh = Shapes()
    assert sh.quotient(4 * s, s) == 4
    assert sh.quotient(s, 4) is None                 # not provably an integer
    assert sh.quotient(4 * s, 4 * s) is None         # 1 is not a proper factor
