"""The replacement for a proven ``AttentionForm``: one ``inductor_dsa.sparse_attention`` call.

Traced like the indexer's replacement (``lowering/indexer.py``): operands are rearranged by their
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
from ..patterns.attention import READS, AttentionForm, read_attention, render
from ..symbolic import Atoms, Interpreter, packet
from ..symbolic.emit import arrange, prod, sizer, sym_nodes
from ..symbolic import splice
from . import report

aten = torch.ops.aten
PATTERN_ATTENTION = "sparse_attention"


def op_dtype(form: AttentionForm) -> torch.dtype:
    """q's dtype, unless q, kv and the output do not all share it: then fp32 (never narrower than eager)."""
    dts = {form.q.dtype, form.kv.dtype, form.out_dtype}
    return form.q.dtype if len(dts) == 1 else torch.float32


class AttentionReplacement(splice.Call):
    def __init__(self, form: AttentionForm, atoms: Atoms, graph: fx.Graph):
        super().__init__(form, atoms, [form.q, form.kv, form.indices] + ([form.sink] if form.sink is not None else []),
                         sym_nodes(graph))

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
        return out.reshape([prod(size(a) for a in d) for d in f.out_dims])


def output_chain_end(node):
    """The last node of the single-user chain of layout ops and casts after ``node`` (slices,
    expands and repeats stay with the user: they change which values exist)."""
    while len(node.users) == 1:
        (u,) = node.users
        if (u.op != "call_function" or not READS.is_shape(packet(u)) or u.args[0] is not node
                or packet(u) in (aten.slice, aten.expand, aten.repeat)):
            break
        node = u
    return node


def plan_attention(graph, node) -> splice.Plan:
    """A bmm/mm with a gather upstream, planned as sparse attention (``NotCandidate``: not one)."""
    interp = Interpreter(graph, READS, max_depth=24)
    anchor = output_chain_end(node)
    tv = interp.ev(anchor)
    form = read_attention(tv, interp)
    repl = AttentionReplacement(form, interp.A, graph)
    swap = report.Swap(PATTERN_ATTENTION, "torch.ops.inductor_dsa.sparse_attention", report.source_line(node),
                       render(form, interp.A, op_dtype(form)))
    return splice.plan(anchor, repl, swap)
