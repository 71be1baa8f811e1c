"""The replacement for a proven ``AttentionForm``: one ``inductor_dsa.sparse_attention`` call.

Traced like the indexer's replacement (``replace.py``): operands are rearranged by their
atoms to the op layout (q [B, M, H, D], kv [B, N, D], indices [B, M, topk], sink [H] fp32),
the op runs in q's dtype (fp32 when the matched output or the operands are wider), and its
[B, M, H, D] result is laid out, and cast, as the matched output. Where eager gives NaN for
a query with no valid slot (``empty == "nan"``), so does the replacement: out = NaN where
the op's lse is -inf.
"""
from __future__ import annotations

import torch
import torch.fx as fx

from .. import ops  # noqa: F401  (registers torch.ops.inductor_dsa.*)
from ..patterns.algebra import Atoms, Reject
from ..patterns.attention import AttentionForm
from .replace import _prod, arrange, graph_syms, sizer


def op_dtype(form: AttentionForm) -> torch.dtype:
    """q's dtype, unless q, kv and the output do not all share it: then fp32 (never narrower than eager)."""
    dts = {form.q.dtype, form.kv.dtype, form.out_dtype}
    return form.q.dtype if len(dts) == 1 else torch.float32


class AttentionReplacement:
    def __init__(self, form: AttentionForm, atoms: Atoms, graph: fx.Graph):
        self.f, self.A = form, atoms
        self.tensors = [form.q, form.kv, form.indices] + ([form.sink] if form.sink is not None else [])
        for t in self.tensors:
            if len(set(a for d in t.dims for a in d)) != sum(len(d) for d in t.dims):
                raise Reject(f"{t.node.name} repeats an index (a diagonal), not supported")
        self.sym_nodes = graph_syms(graph)

    def specialize(self):
        for e in self.f.static:
            self.A.shapes.specialize(e)

    def args(self):
        return [t.node for t in self.tensors] + self.sym_nodes

    def __call__(self, *args):
        f = self.f
        nt = len(self.tensors)
        tens, syms = args[:nt], args[nt:]
        _, size = sizer(self.A, tens, syms)
        batch, rows, heads, hd, keys = (list(x) for x in (f.batch, f.rows, f.heads, f.head_dim, f.keys))
        dt = op_dtype(f)
        q = arrange(tens[0], f.q.dims, [batch, rows, heads, hd], size).to(dt)
        kv = arrange(tens[1], f.kv.dims, [batch, list(f.kv_rows), hd], size).to(dt)
        idx = arrange(tens[2], f.indices.dims, [batch, rows, keys], size)
        sink = arrange(tens[3], f.sink.dims, [heads], size).float() if f.sink is not None else None
        out, lse = torch.ops.inductor_dsa.sparse_attention(q, kv, idx, sink, f.scale)
        if f.empty == "nan":
            out = torch.where(torch.isneginf(lse).unsqueeze(-1), torch.full((), float("nan"), dtype=out.dtype,
                                                                             device=out.device), out)
        out = out.to(f.out_dtype)
        # [B, M, H, D] -> the matched output's layout
        order = batch + rows + heads + hd
        out = out.reshape([size(a) for a in order])
        target = [a for d in f.out_dims for a in d]
        out = out.permute([order.index(a) for a in target])
        return out.reshape([_prod(size(a) for a in d) for d in f.out_dims])
