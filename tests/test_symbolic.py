"""Unit tests of the symbolic engine (``inductor_dsa.symbolic``), without any DSA pattern."""
import sympy
import torch
import torch.fx as fx
import pytest

from inductor_dsa.symbolic import (ARITH, LAYOUT, Atoms, HandlerSet, Interpreter, Leaf, Mul, Reject, Relu, Shapes,
                                   Sum, atom_of, atom_symbol, deps)
from inductor_dsa.symbolic.emit import Emit, arrange
from inductor_dsa.symbolic.ranges import check_range, per_row_range

aten = torch.ops.aten


def test_atoms_symbols_round_trip():
    A = Atoms(Shapes())
    a, b = A.new(4), A.new(6)
    assert atom_of(atom_symbol(a)) == a and atom_of(A.symbol(b)) == b
    assert atom_of(sympy.Symbol("s0", integer=True)) is None
    assert A.atoms_in(A.symbol(a) * 3 + A.symbol(b) + sympy.Symbol("s0")) == {a, b}


def test_shape_algebra_split_unify_regroup():
    A = Atoms(Shapes())
    (x,) = A.dim(24)
    outer, inner = A.regroup(((x,),), [4, 6])          # view 24 -> [4, 6] splits the atom
    assert A.size(outer[0]) == 4 and A.size(inner[0]) == 6
    assert A.linear(x) == 6 * A.symbol(outer[0]) + A.symbol(inner[0])
    (y,) = A.dim(4)
    A.unify((outer[0],), (y,))                          # broadcasting identifies them
    assert A.find(y) == A.find(outer[0])
    assert A.dim(1) == ()                               # size-1 dims carry no atom
    with pytest.raises(Reject):
        A.unify(A.dim(5), A.dim(7))


def test_handler_set_chain_takes_first_reading():
    first, second = HandlerSet("a"), HandlerSet("b")
    first.handles(aten.relu)(lambda I, n, d: None)
    second.handles(aten.relu, shape=True)(lambda I, n, d: "read")
    both = HandlerSet.chain("ab", first, second)
    assert both.get(aten.relu)(None, None, 0) == "read" and both.is_shape(aten.relu)
    with pytest.raises(ValueError):
        first.handles(aten.relu)(lambda I, n, d: None)


def _graph():
    """A tiny traced graph: relu(x @ y^T) summed over dim 1, with fake values on every node."""
    def f(x, y):
        return torch.ops.aten.sum(torch.ops.aten.relu(torch.ops.aten.mm(x, torch.ops.aten.t(y))), [1])
    gm = fx.symbolic_trace(f)
    from torch.fx.passes.shape_prop import ShapeProp
    ShapeProp(gm).propagate(torch.randn(3, 8), torch.randn(5, 8))
    for n in gm.graph.nodes:
        if "tensor_meta" in n.meta:
            tm = n.meta["tensor_meta"]
            n.meta["val"] = torch.empty(tm.shape, dtype=tm.dtype)
    return gm


def test_reader_with_a_handler_set():
    gm = _graph()
    out = [n for n in gm.graph.nodes if n.op == "output"][0].args[0]
    I = Interpreter(gm.graph, HandlerSet.chain("core", LAYOUT, ARITH))
    tv = I.ev(out)
    assert isinstance(tv.value, Sum) and isinstance(tv.value.x, Relu)
    (row,) = tv.dims[0]
    assert deps(tv.value, I.A) == {I.A.find(row)}      # the sum removed the key index
    # without ARITH the same node is an opaque leaf (always exact)
    leaf = Interpreter(gm.graph, LAYOUT).ev(out)
    assert isinstance(leaf.value, Leaf) and not isinstance(leaf.value, Mul)


def test_range_proof():
    row = sympy.Symbol("r", integer=True, nonnegative=True)
    col = sympy.Symbol("c", integer=True, nonnegative=True)
    visible = sympy.And(col <= row, sympy.Not(col < row - 3))    # a sliding window of 4
    rng = per_row_range(visible, col)
    assert check_range(visible, col, rng, {row: 0}, 8) and check_range(visible, col, rng, {row: 6}, 8)
    with pytest.raises(Reject):
        per_row_range(sympy.Ne(col, row), col)


def test_emitter_evaluates_atoms_sizes_and_floors():
    A = Atoms(Shapes())
    (i,) = A.dim(6)
    s = sympy.Symbol("s0", integer=True, positive=True)
    idx = torch.arange(6)
    e = Emit({s: 10}, {i: idx}, {})
    out = e(sympy.floor((A.symbol(i) + s) / 4) + sympy.Max(A.symbol(i), 2))
    assert torch.equal(out, (idx + 10) // 4 + idx.clamp(min=2))
    x = torch.arange(24).reshape(2, 3, 4)
    a, b, c = A.new(2), A.new(3), A.new(4)
    y = arrange(x, ((a,), (b,), (c,)), [[c], [a, b]], A.size)
    assert torch.equal(y, x.permute(2, 0, 1).reshape(4, 6))


def test_splice_call_rejects_a_diagonal_operand():
    """``splice.Call``: a graph tensor read with one index in two places (x[i, i], or [i*j, i] after
    a merge) is a diagonal, which the traced replacement would read as a full tensor: rejected with
    that reason. Distinct indices, merged dims and scalars pass and become the call's arguments."""
    from types import SimpleNamespace
    from inductor_dsa.symbolic.splice import Call

    A = Atoms(Shapes())
    (i,), (j,) = A.dim(4), A.dim(6)
    g = fx.Graph()
    x = g.placeholder("x")
    n = g.placeholder("n")
    form = SimpleNamespace(static=[])
    for dims in (((i,), (i,)), ((i, j), (i,)), ((j,), (i,), (j,))):
        with pytest.raises(Reject, match=r"^x repeats an index \(a diagonal\), not supported$"):
            Call(form, A, [SimpleNamespace(node=x, dims=dims)], [])
    for dims in (((i,), (j,)), ((i, j),), ((j,), (), (i,)), ()):
        call = Call(form, A, [SimpleNamespace(node=x, dims=dims)], [n])
        assert call.args() == [x, n]


def _traced(f, *inputs):
    """``f`` traced to an FX graph with fake values on every node, and its output node."""
    gm = fx.symbolic_trace(f)
    from torch.fx.passes.shape_prop import ShapeProp
    ShapeProp(gm).propagate(*inputs)
    for n in gm.graph.nodes:
        if "tensor_meta" in n.meta:
            tm = n.meta["tensor_meta"]
            n.meta["val"] = torch.empty(tm.shape, dtype=tm.dtype)
    return gm.graph, [n for n in gm.graph.nodes if n.op == "output"][0].args[0]


def test_select_of_a_size_one_dim_is_a_squeeze():
    """x[:, 0] of a size-1 dim (transformers' ``attention_mask[:, 0]``) reads through; a select
    from a longer dim picks one slice of data and stays an opaque leaf."""
    core = HandlerSet.chain("core", LAYOUT, ARITH)
    graph, out = _traced(lambda x: aten.relu(aten.select(x, 1, 0)), torch.randn(2, 1, 3, 5))
    tv = Interpreter(graph, core).ev(out)
    assert isinstance(tv.value, Relu) and tv.value.x.node.name == "x" and len(tv.dims) == 3
    graph, out = _traced(lambda x: aten.relu(aten.select(x, 1, 1)), torch.randn(2, 2, 3, 5))
    tv = Interpreter(graph, core).ev(out)
    assert isinstance(tv.value, Relu) and tv.value.x.node.name == "select"


def _reuse_deep_and_shallow(x):
    h = aten.mul(x, 2.0)          # used twice: right under the output, and 6 products deeper
    y = h
    for _ in range(6):
        y = aten.mul(y, 1.5)
    return aten.add(h, y)


def test_copies_of_reused_tensors_stop_at_copy_depth():
    """With ``copy_reused``, a tensor met again within ``copy_depth`` ops of where reading started
    is read again as a fresh copy; deeper it is a fresh opaque leaf (exact, new atoms): the copies
    stay bounded in deep graphs (a layer's hidden states reach back through the previous layer)."""
    core = HandlerSet.chain("core", LAYOUT, ARITH)
    graph, out = _traced(_reuse_deep_and_shallow, torch.randn(3, 4))
    for copy_depth, read in ((16, True), (4, False)):
        I = Interpreter(graph, core, copy_reused=True, copy_depth=copy_depth)
        tv = I.ev(out)
        shallow, inner = tv.value.a, tv.value.b
        assert isinstance(shallow, Mul) and isinstance(shallow.factors[0], Leaf)  # h = x * 2, read
        for _ in range(6):
            inner = inner.factors[0]  # through the six products
        assert isinstance(inner, Mul) == read
        if not read:
            assert isinstance(inner, Leaf) and inner.node is shallow.origin
            assert inner.dims != shallow.factors[0].dims  # new atoms (the add then unifies them)
