"""Build the replacement for a proven ``IndexerForm`` and splice it into the graph.

The replacement is a plain Python function over the matched graph's own tensors (the q,
k and weight nodes, any integer tensor the mask reads) and its SymInt inputs. It is traced
with Inductor's ``fwd_only`` on the nodes' fake values, so symbolic sizes stay symbolic,
and its nodes are copied in front of the anchor. The old subgraph is left to dead-code
elimination; nothing is erased that another user still needs.
"""
from __future__ import annotations

import math
import operator
from dataclasses import dataclass
from typing import Optional

import sympy
import torch
import torch.fx as fx

from .. import fallback, ops  # noqa: F401  (ops registers torch.ops.inductor_dsa.*)
from ..patterns.algebra import Atoms, Reject
from ..patterns.indexer import IndexerForm, Term


@dataclass
class TopkSpec:
    k: object                 # int or SymInt node
    want_values: bool
    want_indices: bool


# ---- sympy -> torch ---------------------------------------------------------------------------
def _is_tensor(x):
    return isinstance(x, torch.Tensor)


def _extreme(a, b, largest: bool):
    """max (largest) or min of two values, each a tensor or a (Sym)Int."""
    if _is_tensor(a) or _is_tensor(b):
        if not _is_tensor(a):
            a, b = b, a
        if _is_tensor(b):
            return torch.maximum(a, b) if largest else torch.minimum(a, b)
        return torch.clamp(a, min=b) if largest else torch.clamp(a, max=b)
    return torch.sym_max(a, b) if largest else torch.sym_min(a, b)


class Emit:
    """Evaluates integer sympy expressions with Python/torch ops while being traced."""

    def __init__(self, sizes: dict, atoms: dict, funcs: dict, norm=None):
        self.sizes, self.atoms, self.funcs, self.norm = sizes, atoms, funcs, norm

    def __call__(self, e):
        if self.norm is not None:  # the ShapeEnv's replacements, once, at the top
            e, norm = self.norm(e), self.norm
            self.norm = None
            try:
                return self(e)
            finally:
                self.norm = norm
        if e.is_Integer:
            return int(e)
        if isinstance(e, sympy.Symbol):
            if e.name.startswith("_i"):
                return self.atoms[int(e.name[2:])]
            if e not in self.sizes:
                raise Reject(f"size {e} is not available to the replacement")
            return self.sizes[e]
        if isinstance(e, sympy.core.function.AppliedUndef):
            return self.funcs[e.func]
        if isinstance(e, sympy.Add):
            terms = [self(a) for a in e.args]
            out = terms[0]
            for t in terms[1:]:
                out = out + t
            return out
        if isinstance(e, sympy.Mul):
            c, rest = e.as_coeff_Mul()
            if not c.is_Integer:
                raise Reject(f"non-integer coefficient in {e}")
            fs = [self(a) for a in sympy.Mul.make_args(rest)]
            out = fs[0]
            for f in fs[1:]:
                out = out * f
            return out if c == 1 else out * int(c)
        if isinstance(e, sympy.Pow) and e.exp.is_Integer and e.exp > 0:
            b = self(e.base)
            out = b
            for _ in range(int(e.exp) - 1):
                out = out * b
            return out
        if isinstance(e, (sympy.floor, sympy.ceiling)):
            num, den = sympy.fraction(sympy.together(e.args[0]))
            if not (den.is_integer and den.is_positive):
                raise Reject(f"cannot divide by {den} in {e}")
            n, d = self(num), self(den)
            return n // d if isinstance(e, sympy.floor) else -((-n) // d)
        name = type(e).__name__
        if name == "FloorDiv":
            return self(e.args[0]) // self(e.args[1])
        if isinstance(e, (sympy.Max, sympy.Min)):
            vals = [self(a) for a in e.args]
            out = vals[0]
            for v in vals[1:]:
                out = _extreme(out, v, isinstance(e, sympy.Max))
            return out
        raise Reject(f"cannot evaluate {e} ({name})")


def _prod(xs):
    out = 1
    for x in xs:
        out = out * x
    return out


def arrange(x, dims, groups, size):
    """Rearrange tensor ``x`` (dims: atoms per dim) to [prod(group) for group in groups].

    Atoms of ``x`` not in any group are dropped by taking index 0 (the caller proved the
    value does not depend on them); atoms in a group but not in ``x`` are broadcast.
    """
    src = [a for d in dims for a in d]
    tgt = [a for g in groups for a in g]
    x = x.reshape([size(a) for a in src])
    for i in reversed(range(len(src))):
        if src[i] not in tgt:
            x = x.select(i, 0)
    src = [a for a in src if a in tgt]
    missing = [a for a in tgt if a not in src]
    if missing:
        x = x.reshape([size(a) for a in src] + [1] * len(missing))
    order = src + missing
    x = x.permute([order.index(a) for a in tgt])
    if missing:
        x = x.expand([size(a) for a in tgt])
    return x.reshape([_prod(size(a) for a in g) for g in groups])


def sizer(A: Atoms, tensors, syms):
    """(symbol -> SymInt env, size(atom)) for a replacement traced on ``tensors`` and ``syms``."""
    env = {}
    for s in [z for t in tensors for z in t.shape] + list(syms):
        if isinstance(s, torch.SymInt) and isinstance(s.node.expr, sympy.Symbol):
            env.setdefault(s.node.expr, s)
    cache = {}

    def size(a):
        if a not in cache:
            cache[a] = Emit(env, {}, {}, A.shapes.simplify)(A.size(a))
        return cache[a]
    return env, size


def sym_nodes(graph: fx.Graph, topk: Optional[TopkSpec] = None) -> list:
    """The SymInt inputs a replacement may need (graph placeholders, and a SymInt top-k k)."""
    out = [n for n in graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.SymInt)]
    if topk is not None and isinstance(topk.k, fx.Node) and topk.k not in out:
        out.append(topk.k)
    return out


# ---- the replacement --------------------------------------------------------------------------
class Replacement:
    """The op call for ``form``: its logits, or its top-k (``topk``). With ``scores`` (a tensor
    over the form's rows and keys holding the unmasked logits, e.g. partial scores summed across
    ranks) the top-k selects from that tensor with ``logits_topk`` instead of recomputing it."""

    def __init__(self, form: IndexerForm, atoms: Atoms, topk: Optional[TopkSpec], graph: fx.Graph,
                 scores: Optional[Term] = None):
        self.f, self.A, self.topk, self.scores = form, atoms, topk, scores
        f = form
        operands = [scores] if scores is not None else [f.q, f.k] + list(f.weights)
        self.tensors = operands + [Term(n, atoms.flat_dims(d), None) for _, n, d in f.mask_leaves]
        self.sym_nodes = sym_nodes(graph, topk)
        for t in self.tensors:
            if len(set(a for d in t.dims for a in d)) != sum(len(d) for d in t.dims):
                raise Reject(f"{t.node.name} repeats an index (a diagonal), not supported")
        self.n_batch = None
        if topk is None and f.batch:  # logits with a per-batch k: one op call per batch
            nb = sympy.Mul(*[atoms.size(a) for a in f.batch])
            self.n_batch = atoms.shapes.hint(nb)
            if self.n_batch is None or self.n_batch > 64:
                raise Reject(f"per-batch k over {nb} batches: logits need a small static batch")
            if not nb.is_Integer:
                f.static.append(nb)

    def _bind(self, args):
        """(tensor args, size symbol -> SymInt, size(atom)); sets self._size and self._k."""
        nt = len(self.tensors)
        tens, syms = args[:nt], args[nt:]
        env, size = sizer(self.A, tens, syms)
        self._size = size
        self._k = self.topk.k if self.topk is not None else None
        if isinstance(self._k, fx.Node):
            self._k = syms[self.sym_nodes.index(self._k)]
        return tens, env, size

    def specialize(self):
        """Install the guards the replacement relies on (call once every check has passed)."""
        for e in self.f.static:
            self.A.shapes.specialize(e)

    def args(self):
        return [t.node for t in self.tensors] + self.sym_nodes

    def __call__(self, *args):
        f, A = self.f, self.A
        tens, env, size = self._bind(args)
        n_ops = len(self.tensors) - len(f.mask_leaves)
        leaves = tens[n_ops:]
        dev = tens[0].device
        rows, batch, keys = list(f.rows), list(f.batch), list(f.keys)
        T = _prod(size(a) for a in rows)
        K = _prod(size(a) for a in keys)

        # per-row ranges on the row grid (internal order)
        grid = [size(a) for a in rows]
        idx = {}
        for i, a in enumerate(rows):
            shape = [1] * len(rows)
            shape[i] = -1
            idx[a] = torch.arange(size(a), device=dev, dtype=torch.int64).view(shape)
        funcs = {}
        for (fn, _node, dims), t in zip(f.mask_leaves, leaves):
            funcs[fn] = arrange(t, A.flat_dims(dims), [[a] for a in rows], size).to(torch.int64)
        emit = Emit(env, idx, funcs, A.shapes.simplify)

        def on_rows(e):
            v = emit(e)
            if not _is_tensor(v):
                v = torch.full((), v, dtype=torch.int64, device=dev)
            return v.to(torch.int64).expand(grid).reshape(T)

        if f.ranges is None:
            ks = torch.zeros((T,), dtype=torch.int64, device=dev)
            ke = torch.full((T,), K, dtype=torch.int64, device=dev)
        else:
            ks = on_rows(f.ranges.k_start).clamp(min=0)
            ks = torch.minimum(ks, torch.full((), K, dtype=torch.int64, device=dev))
            ke = on_rows(f.ranges.k_end) if f.ranges.k_end is not None else torch.full((T,), K, dtype=torch.int64, device=dev)
            ke = torch.minimum(ke, torch.full((), K, dtype=torch.int64, device=dev))
            ke = torch.maximum(ke, ks)
            if f.ranges.row_cond is not None:
                ke = torch.where(on_rows_bool(emit, f.ranges.row_cond, grid, T, dev), ke, ks)
        if self.scores is not None:
            x = arrange(tens[0], self.scores.dims, [rows, keys], size).to(torch.float32)
            vals, ids = torch.ops.inductor_dsa.logits_topk(x, ks.to(torch.int32), ke.to(torch.int32), self._k)
            return self._finish_topk(vals, ids.to(torch.int64), ks, ke)
        q, k, wts = tens[0], tens[1], tens[2:n_ops]
        H = _prod(size(a) for a in f.heads)
        D = _prod(size(a) for a in f.contract)
        q3 = arrange(q, f.q.dims, [rows, list(f.heads), list(f.contract)], size)
        k3 = arrange(k, f.k.dims, [batch, keys, list(f.contract)], size)
        w2 = None
        for t, term in zip(wts, f.weights):
            a = arrange(t, term.dims, [rows, list(f.heads)], size).to(torch.float32)
            w2 = a if w2 is None else w2 * a
        if w2 is None:
            w2 = torch.ones((T, H), dtype=torch.float32, device=dev)
        if f.scale != 1.0:
            w2 = w2 * f.scale
        if batch:
            boff = on_rows(sum(A.linear(a) * _sym_stride(A, batch, i) for i, a in enumerate(batch))) * K
        if self.topk is None:
            return self._logits(q3, k3, w2, ks, ke, T, K, H, D, batch)
        return self._topk(q3, k3, w2, ks, ke, T, K, D, batch, boff if batch else None)

    # -- logits -------------------------------------------------------------------------------
    def _logits(self, q3, k3, w2, ks, ke, T, K, H, D, batch):
        op = torch.ops.inductor_dsa.indexer_logits
        if batch:
            NB = self.n_batch
            q4, w4 = q3.reshape(NB, -1, H, D), w2.reshape(NB, -1, H)
            ks4, ke4 = ks.reshape(NB, -1), ke.reshape(NB, -1)
            parts = [op(q4[b], None, k3[b], None, w4[b], ks4[b].to(torch.int32), ke4[b].to(torch.int32))
                     for b in range(NB)]
            out = torch.cat(parts, 0)
        else:
            out = op(q3, None, k3.reshape(K, D), None, w2, ks.to(torch.int32), ke.to(torch.int32))
        return self._finish_logits(out, ks, ke, K)

    # -- top-k --------------------------------------------------------------------------------
    def _topk(self, q3, k3, w2, ks, ke, T, K, D, batch, boff):
        op = torch.ops.inductor_dsa.indexer_topk
        kk = self._k
        if batch:
            kflat = k3.reshape(-1, D)
            vals, ids = op(q3, None, kflat, None, w2, (ks + boff).to(torch.int32), (ke + boff).to(torch.int32), kk)
        else:
            vals, ids = op(q3, None, k3.reshape(K, D), None, w2, ks.to(torch.int32), ke.to(torch.int32), kk)
        ids = ids.to(torch.int64)
        if batch:
            ids = ids - boff.unsqueeze(1)
        return self._finish_topk(vals, ids, ks, ke)

    def _finish_topk(self, vals, ids, ks, ke):
        """[T, k] op outputs -> the user's layout, empty slots as eager top-k fills them."""
        f, spec, kk = self.f, self.topk, self._k
        if f.ranges is not None:
            # Rows with fewer visible columns than k: eager top-k returns masked columns
            # (value = the fill) there. Return distinct masked columns, in increasing order.
            n_vis = (ke - ks).unsqueeze(1)
            slot = torch.arange(kk, device=ids.device, dtype=torch.int64).unsqueeze(0)
            pad = slot >= n_vis
            p = slot - n_vis
            col = torch.where(p < ks.unsqueeze(1), p, p - ks.unsqueeze(1) + ke.unsqueeze(1))
            ids = torch.where(pad, col, ids)
            fill = torch.full((), f.fill, dtype=vals.dtype, device=vals.device)
            vals = torch.where(pad, fill, vals)
        vals = vals.to(f.out_dtype)
        return (self._unarrange(vals, None) if spec.want_values else None,
                self._unarrange(ids, None) if spec.want_indices else None)

    def _finish_logits(self, out, ks, ke, K):
        """[T, K] fp32 logits (-inf outside the ranges) -> the mask's fill, dtype and layout."""
        f = self.f
        if f.fill is not None and f.fill != -math.inf:
            vis = fallback.visible_mask(ks, ke, K)
            out = torch.where(vis, out, torch.full((), f.fill, dtype=out.dtype, device=out.device))
        return self._unarrange(out.to(f.out_dtype), f.keys)

    def _unarrange(self, y, keys):
        """[T, K or k] in internal row order -> the output layout (key dim at ``key_dim``)."""
        f, size = self.f, self._size
        rows = list(f.rows)
        row_sizes = [size(a) for a in rows]
        if keys is not None:
            key_tokens, key_sizes = list(keys), [size(a) for a in keys]
        else:
            key_tokens, key_sizes = ["k"], [y.shape[1]]
        y = y.reshape(row_sizes + key_sizes)
        order = rows + key_tokens
        target, out_shape = [], []
        for i, d in enumerate(f.out_dims):
            if i == f.key_dim:
                target += key_tokens
                out_shape.append(_prod(key_sizes))
            else:
                target += list(d)
                out_shape.append(_prod(row_sizes[rows.index(a)] for a in d))
        y = y.permute([order.index(a) for a in target])
        return y.reshape(out_shape)


def on_rows_bool(e, cond, grid, T, dev):
    """A row-only sympy condition as a bool tensor [T] (rows on ``grid``)."""
    if isinstance(cond, sympy.And):
        out = None
        for c in cond.args:
            v = on_rows_bool(e, c, grid, T, dev)
            out = v if out is None else out & v
        return out
    if isinstance(cond, sympy.Or):
        out = None
        for c in cond.args:
            v = on_rows_bool(e, c, grid, T, dev)
            out = v if out is None else out | v
        return out
    if isinstance(cond, sympy.Not):
        return ~on_rows_bool(e, cond.args[0], grid, T, dev)
    if cond in (sympy.true, sympy.false):
        return torch.full((T,), bool(cond), dtype=torch.bool, device=dev)
    ops_ = {sympy.Ge: operator.ge, sympy.Gt: operator.gt, sympy.Le: operator.le,
            sympy.Lt: operator.lt, sympy.Eq: operator.eq, sympy.Ne: operator.ne}
    fn = ops_.get(type(cond))
    if fn is None:
        raise Reject(f"cannot evaluate row condition {cond}")
    a, b = e(cond.lhs), e(cond.rhs)
    if not _is_tensor(a):
        a = torch.full((), a, dtype=torch.int64, device=dev)
    return fn(a, b).expand(grid).reshape(T)


def _sym_stride(A: Atoms, atoms, i):
    return sympy.Mul(*[A.size(a) for a in atoms[i + 1:]])
