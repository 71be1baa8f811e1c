"""The indexer, lowered: plans for a matched ``topk`` or logits anchor, and the replacements.

``plan_topk`` / ``plan_logits`` read the anchor's input (``patterns.indexer.read_logits``), decide
between a dense key (``Replacement``: ``indexer_topk`` / ``indexer_logits``), a paged byte-cache
key (``PagedReplacement``: ``paged_indexer_topk`` / ``paged_indexer_logits``) and the
tensor-parallel form (``plan_topk_tp``: local ``indexer_logits``, the collective kept,
``logits_topk``), and return a traced ``splice.Plan``.

A replacement is a plain Python function over the matched graph's own tensors (the q, k and
weight nodes, any integer tensor the mask reads) and its SymInt inputs. It is traced with
Inductor's ``fwd_only`` on the nodes' fake values, so symbolic sizes stay symbolic, and its nodes
are copied in front of the anchor. The old subgraph is left to dead-code elimination; nothing is
erased that another user still needs.
"""
from __future__ import annotations

import dataclasses
import math
import operator
from dataclasses import dataclass
from typing import Optional

import sympy
import torch
import torch.fx as fx

from .. import fallback
from ..patterns.forms import Term
from ..patterns.indexer import READS, IndexerForm, read_logits, render
from ..patterns.paged import PagedKey, read_paged, render_paged
from ..symbolic import Atoms, Interpreter, Reject, as_expr
from ..symbolic.emit import Emit, arrange, on_rows_bool, prod, sizer, sym_nodes
from ..symbolic import splice
from . import report

PATTERN_TOPK = "indexer_topk"
PATTERN_LOGITS = "indexer_logits"
PATTERN_PAGED_TOPK = "paged_indexer_topk"
PATTERN_PAGED_LOGITS = "paged_indexer_logits"
PATTERN_TP_TOPK = "indexer_topk_all_reduce"


@dataclass
class TopkSpec:
    k: object                 # int or SymInt node
    want_values: bool
    want_indices: bool


# ---- the replacement --------------------------------------------------------------------------
class Replacement(splice.Call):
    """The op call for ``form``: its logits, or its top-k (``topk``). With ``scores`` (a tensor
    over the form's rows and keys holding the unmasked logits, e.g. partial scores summed across
    ranks) the top-k selects from that tensor with ``logits_topk`` instead of recomputing it."""

    _mask = None  # the op's mask= of the call being traced (a mask given as data)

    def __init__(self, form: IndexerForm, atoms: Atoms, topk: Optional[TopkSpec], graph: fx.Graph,
                 scores: Optional[Term] = None):
        f = form
        operands = [scores] if scores is not None else [f.q, f.k] + list(f.weights)
        leaves = [Term(n, atoms.flat_dims(d), None) for _, n, d in f.mask_leaves]
        data = [Term(d.node, d.dims, d.dtype) for d in f.data]
        super().__init__(form, atoms, operands + leaves + data, sym_nodes(graph, topk))
        self.topk, self.scores = topk, scores
        self.n_batch = None
        if (topk is None or f.data) and f.batch:  # logits, or a data mask, with a per-batch k: a call per batch
            nb = sympy.Mul(*[atoms.size(a) for a in f.batch])
            self.n_batch = atoms.shapes.hint(nb)
            if self.n_batch is None or self.n_batch > 64:
                what = "a mask given as data" if f.data else "logits"
                raise Reject(f"per-batch k over {nb} batches: {what} need a small static batch")
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

    def __call__(self, *args):
        f, A = self.f, self.A
        tens, env, size = self._bind(args)
        n_ops = len(self.tensors) - len(f.mask_leaves) - len(f.data)
        leaves, data = tens[n_ops:n_ops + len(f.mask_leaves)], tens[n_ops + len(f.mask_leaves):]
        dev = tens[0].device
        rows, batch, keys = list(f.rows), list(f.batch), list(f.keys)
        T = prod(size(a) for a in rows)
        K = prod(size(a) for a in keys)

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
            if not isinstance(v, torch.Tensor):
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
        self._mask = self._data_mask(data, rows, keys, size)
        if self.scores is not None:
            x = arrange(tens[0], self.scores.dims, [rows, keys], size).to(torch.float32)
            vals, ids = torch.ops.inductor_dsa.logits_topk(x, ks.to(torch.int32), ke.to(torch.int32), self._k)
            return self._finish_topk(vals, ids.to(torch.int64), ks, ke)
        q, k, wts = tens[0], tens[1], tens[2:n_ops]
        H = prod(size(a) for a in f.heads)
        D = prod(size(a) for a in f.contract)
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

    def _data_mask(self, data, rows, keys, size):
        """The op's ``mask=`` ([T, K], a view of the user's tensor where one is possible), or None:
        a boolean shown where True (negated first where the user's shows False; several are
        and-ed), or an additive bias in fp32/bf16/fp16."""
        out = None
        for d, t in zip(self.f.data, data):
            if d.shown is False:
                t = ~t
            elif d.shown is None and t.dtype not in (torch.float32, torch.bfloat16, torch.float16):
                t = t.to(torch.float32)
            t = arrange(t, self.A.flat_dims(d.dims), [rows, keys], size)
            out = t if out is None else out & t
        return out

    def _per_batch(self, op, q3, k3, w2, ks, ke, H, D, *extra):
        """``op`` called once per batch (a per-batch k with logits or a data mask), outputs stacked."""
        NB, m = self.n_batch, self._mask
        q4, w4 = q3.reshape(NB, -1, H, D), w2.reshape(NB, -1, H)
        ks4, ke4 = ks.reshape(NB, -1), ke.reshape(NB, -1)
        m4 = None if m is None else m.reshape(NB, -1, m.shape[-1])
        outs = [op(q4[b], None, k3[b], None, w4[b], ks4[b].to(torch.int32), ke4[b].to(torch.int32), *extra,
                   mask=None if m4 is None else m4[b]) for b in range(NB)]
        if isinstance(outs[0], torch.Tensor):
            return torch.cat(outs, 0)
        return tuple(torch.cat(o, 0) for o in zip(*outs))

    # -- logits -------------------------------------------------------------------------------
    def _logits(self, q3, k3, w2, ks, ke, T, K, H, D, batch):
        op = torch.ops.inductor_dsa.indexer_logits
        if batch:
            out = self._per_batch(op, q3, k3, w2, ks, ke, H, D)
        else:
            out = op(q3, None, k3.reshape(K, D), None, w2, ks.to(torch.int32), ke.to(torch.int32), mask=self._mask)
        return self._finish_logits(out, ks, ke, K)

    # -- top-k --------------------------------------------------------------------------------
    def _topk(self, q3, k3, w2, ks, ke, T, K, D, batch, boff):
        op = torch.ops.inductor_dsa.indexer_topk
        kk = self._k
        if batch and self.f.data:
            vals, ids = self._per_batch(op, q3, k3, w2, ks, ke, w2.shape[1], D, kk)
            return self._finish_topk(vals, ids.to(torch.int64), ks, ke)
        if batch:
            kflat = k3.reshape(-1, D)
            vals, ids = op(q3, None, kflat, None, w2, (ks + boff).to(torch.int32), (ke + boff).to(torch.int32), kk)
        else:
            vals, ids = op(q3, None, k3.reshape(K, D), None, w2, ks.to(torch.int32), ke.to(torch.int32), kk,
                           mask=self._mask)
        ids = ids.to(torch.int64)
        if batch:
            ids = ids - boff.unsqueeze(1)
        return self._finish_topk(vals, ids, ks, ke)

    def _finish_topk(self, vals, ids, ks, ke):
        """[T, k] op outputs -> the user's layout, empty slots as eager top-k fills them."""
        f, spec, kk = self.f, self.topk, self._k
        if f.data:
            # Slots past the visible count (index -1 from the op): eager top-k returns hidden
            # columns there. Return the first hidden ones, in increasing order: slot s of a row
            # with n visible columns gets the column where the running count of hidden columns
            # reaches s - n + 1 (one [T, K] pass, only with a mask given as data).
            hidden = ~fallback.visible(ks, ke, self._mask.shape[1], self._mask)
            seen = hidden.cumsum(1, dtype=torch.int32)
            slot = torch.arange(kk, device=ids.device, dtype=torch.int64).unsqueeze(0)
            n_vis = (ids >= 0).sum(1, keepdim=True)
            pad = slot >= n_vis
            nth = (slot - n_vis + 1).clamp(min=1).to(torch.int32).expand(ids.shape[0], -1).contiguous()
            ids = torch.where(pad, torch.searchsorted(seen, nth), ids)
            vals = torch.where(pad, torch.full((), f.fill, dtype=vals.dtype, device=vals.device), vals)
        elif f.ranges is not None:
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
            vis = fallback.visible(ks, ke, K, self._mask)
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
                out_shape.append(prod(key_sizes))
            else:
                target += list(d)
                out_shape.append(prod(row_sizes[rows.index(a)] for a in d))
        y = y.permute([order.index(a) for a in target])
        return y.reshape(out_shape)


def _sym_stride(A: Atoms, atoms, i):
    return sympy.Mul(*[A.size(a) for a in atoms[i + 1:]])


class PagedReplacement(Replacement):
    """The replacement for a proven paged decode indexer (``patterns.paged``): one call of
    ``paged_indexer_topk`` / ``paged_indexer_logits`` on the user's own cache, block table and
    context lengths; the gather and the dequantisation happen inside the kernel.

        q [rows..., heads, head_dim] bf16 -> [B, N, H, D]   (N: every row atom that is not the batch)
        weights (times the proven constants) -> fp32 [B, N, H]
        kv_cache -> uint8 [num_pages, 64 * row_bytes] (a row-major view of each page)
        decode table (a graph input, if the key reads one) -> passed as the ops' ``table``
        block_table -> int32 (a negative page id wrapped as eager indexing does)
        context_lens -> clamped to [0, max_pages * 64], int32 (no mask: max_pages * 64)

    Outputs go back to the user's layout as for ``Replacement`` (empty top-k slots hold distinct
    masked columns, like eager ``torch.topk``)."""

    def __init__(self, form: IndexerForm, atoms: Atoms, key: PagedKey, topk: Optional[TopkSpec],
                 graph: fx.Graph):
        self.f, self.A, self.topk, self.key = form, atoms, topk, key
        plain = [Term(n, (), None) for n in (key.cache, key.table, key.context_lens, key.lut) if n is not None]
        self.tensors = [key.q] + plain + list(form.weights)
        self.sym_nodes = sym_nodes(graph, topk)
        self.n_batch = None

    def __call__(self, *args):
        f, key = self.f, self.key
        tens, _, size = self._bind(args)
        q, cache, table = tens[:3]
        ctx = tens[3] if key.context_lens is not None else None
        at = 4 if ctx is not None else 3
        lut = tens[at] if key.lut is not None else None
        wts = tens[at + (lut is not None):]
        batch = list(f.batch)
        rest = [a for a in f.rows if a not in batch]
        heads = list(f.heads)
        B, N = prod(size(a) for a in batch), prod(size(a) for a in rest)
        K = prod(size(a) for a in f.keys)
        q4 = arrange(q, key.q.dims, [batch, rest, heads, list(f.contract)], size).contiguous()
        w3 = None
        for t, term in zip(wts, f.weights):
            a = arrange(t, term.dims, [batch, rest, heads], size).to(torch.float32)
            w3 = a if w3 is None else w3 * a
        if w3 is None:
            w3 = torch.ones(q4.shape[:3], dtype=torch.float32, device=q.device)
        if f.scale != 1.0:
            w3 = w3 * f.scale
        cache2 = cache.reshape(cache.shape[0], -1)
        # eager's cache[table] wraps a negative page id; ids must be < 2^31 (any page of a real cache)
        table2 = torch.where(table < 0, table + cache.shape[0], table).to(torch.int32)
        if ctx is None:
            ctx32 = torch.full((B,), K, dtype=torch.int32, device=q.device)
        else:  # clamped before the cast: exact for any int64 length
            ctx32 = ctx.reshape(B).clamp(0, K).to(torch.int32)
        ke = ctx32.to(torch.int64).view(B, 1).expand(B, N).reshape(B * N)
        ks = torch.zeros_like(ke)
        if self.topk is None:
            out = torch.ops.inductor_dsa.paged_indexer_logits(q4, None, cache2, w3, table2, ctx32,
                                                              key.fmt, key.flavor, lut)
            return self._finish_logits(out.reshape(B * N, K), ks, ke, K)
        vals, ids = torch.ops.inductor_dsa.paged_indexer_topk(q4, None, cache2, w3, table2, ctx32,
                                                              self._k, key.fmt, key.flavor, lut)
        kk = vals.shape[-1]
        return self._finish_topk(vals.reshape(B * N, kk), ids.reshape(B * N, kk).to(torch.int64), ks, ke)


# ---- plans ---------------------------------------------------------------------------------------
def read_form(graph, x: fx.Node, key_dim: Optional[int]):
    """(IndexerForm, its Interpreter) of ``x``. Read first with one set of atoms per node; if that
    met a diagonal (a tensor used at two positions, e.g. q, k and the weights all projected from
    the same hidden states, or ``i[:, None] >= i[None, :]`` of one arange), read again with a
    fresh copy per use (``Interpreter(copy_reused=True)``), whose reason then stands."""
    interp = Interpreter(graph, READS)
    try:
        return read_logits(interp.ev(x), interp, key_dim), interp
    except Reject as e:
        if not any("repeats an index" in n for n in interp.notes + [str(e)]):
            raise
    interp = Interpreter(graph, READS, copy_reused=True)
    return read_logits(interp.ev(x), interp, key_dim), interp


def _paged(interp, form: IndexerForm):
    """``read_paged``'s key, or None; a paged key with a mask given as data is rejected."""
    key = read_paged(interp, form)
    if key is not None and form.data:
        raise Reject("a mask given as data on a paged key: the paged ops take context_lens only")
    return key


# ---- anchors ----------------------------------------------------------------------------------------
def plan_topk(graph, node) -> Optional[splice.Plan]:
    """A matched ``aten.topk`` anchor, planned; None if neither output is used; else ``Reject``."""
    args = list(node.args) + [None] * (5 - len(node.args))
    x, k = args[0], args[1] if args[1] is not None else node.kwargs.get("k")
    dim = args[2] if args[2] is not None else node.kwargs.get("dim", -1)
    largest = args[3] if args[3] is not None else node.kwargs.get("largest", True)
    if not largest:
        raise Reject("topk(largest=False) selects the smallest scores")
    uses = set()
    for u in node.users:
        if u.op == "call_function" and u.target is operator.getitem and u.args[1] in (0, 1):
            uses.add(u.args[1])
        else:
            raise Reject(f"the top-k result is used whole by {u.name}")
    if not uses:
        return None
    form, interp = read_form(graph, x, dim % x.meta["val"].dim())
    spec = TopkSpec(k, 0 in uses, 1 in uses)
    kval = k.meta.get("val") if isinstance(k, fx.Node) else k
    used = " and ".join(w for i, w in ((0, "values"), (1, "indices")) if i in uses)
    if form.collective is not None:
        return plan_topk_tp(graph, node, form, interp, spec, (as_expr(kval), used))
    note = "the logits are also used elsewhere: they stay computed there" if len(x.users) > 1 else ""
    key = _paged(interp, form)
    pattern = PATTERN_TOPK if key is None else PATTERN_PAGED_TOPK
    repl = (Replacement(form, interp.A, spec, graph) if key is None
            else PagedReplacement(form, interp.A, key, spec, graph))
    region = render(form, interp.A, pattern, (as_expr(kval), used))
    swap = report.Swap(pattern, f"torch.ops.inductor_dsa.{pattern}", report.source_line(node),
                       region if key is None else render_paged(region, key), note)
    return splice.plan(node, repl, swap)


def plan_topk_tp(graph, node, form: IndexerForm, interp, spec: TopkSpec, topk_info) -> splice.Plan:
    """Tensor-parallel indexer: mask(all_reduce_sum(local head-sum)) -> topk.

    The all_reduce input (this rank's partial scores) becomes ``indexer_logits`` over all keys,
    in its own layout and dtype; the collective and its wait stay exactly as they were; the top-k
    of the masked reduced scores becomes ``logits_topk`` over the mask's per-row ranges.
    """
    if read_paged(interp, form) is not None:
        raise Reject("a paged (byte cache) key summed across ranks: not supported")
    if form.data:
        raise Reject("a mask given as data after the all_reduce: logits_topk takes row ranges only")
    A = interp.A
    coll = form.collective
    local_node, local_dims = coll.x.origin, A.flat_dims(coll.x.origin_dims)
    reduced = Term(coll.origin, A.flat_dims(coll.origin_dims), coll.origin.meta["val"].dtype)
    every = {A.find(a) for a in form.rows + form.keys}
    key_dim = None
    for i, d in enumerate(local_dims):
        if tuple(A.find(a) for a in d) == tuple(A.find(a) for a in form.keys):
            key_dim = i
    for dims in (local_dims, reduced.dims):
        flat = [A.find(a) for d in dims for a in d]
        if len(flat) != len(set(flat)) or set(flat) != every:
            raise Reject("the all_reduce input is not indexed by exactly the rows and keys of the scores")
    if key_dim is None:
        raise Reject("the all_reduce input has no dim made of exactly the key index")
    local = dataclasses.replace(form, out_dims=local_dims, key_dim=key_dim,
                                out_dtype=local_node.meta["val"].dtype, fill=None, ranges=None,
                                mask_leaves=(), additive=False, collective=None, key_symbol=None)
    repl_l = Replacement(local, A, None, graph)
    repl_t = Replacement(form, A, spec, graph, scores=reduced)
    repl_l.specialize()
    repl_t.specialize()
    pre = splice.Plan(local_node, splice.trace(repl_l, repl_l.args()), repl_l.args(), None)
    swap = report.Swap(PATTERN_TP_TOPK, "torch.ops.inductor_dsa.indexer_logits + all_reduce (kept) + "
                       "torch.ops.inductor_dsa.logits_topk", report.source_line(node),
                       render(form, A, PATTERN_TP_TOPK, topk_info))
    return splice.Plan(node, splice.trace(repl_t, repl_t.args()), repl_t.args(), swap, pre)


def plan_logits(graph, node) -> splice.Plan:
    """A logits anchor (the last node downstream of relu(q.k) that proves to be the logits), planned."""
    if not node.meta["val"].dtype.is_floating_point:
        raise Reject("not a floating-point tensor")
    form, interp = read_form(graph, node, None)
    if form.collective is not None:
        raise Reject("logits summed across ranks: the local head-sum before the all_reduce is the match")
    key = _paged(interp, form)
    pattern = PATTERN_LOGITS if key is None else PATTERN_PAGED_LOGITS
    repl = (Replacement(form, interp.A, None, graph) if key is None
            else PagedReplacement(form, interp.A, key, None, graph))
    region = render(form, interp.A, pattern)
    swap = report.Swap(pattern, f"torch.ops.inductor_dsa.{pattern}", report.source_line(node),
                       region if key is None else render_paged(region, key))
    return splice.plan(node, repl, swap)
