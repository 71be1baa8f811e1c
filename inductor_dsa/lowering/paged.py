"""The replacement for a proven paged decode indexer (patterns/paged.py): one call of
``inductor_dsa.paged_indexer_topk`` / ``paged_indexer_logits`` on the user's own cache,
block table and context lengths; the gather and the dequantisation happen inside the kernel.

    q [rows..., heads, head_dim] bf16 -> [B, N, H, D]   (N: every row atom that is not the batch)
    weights (times the proven constants) -> fp32 [B, N, H]
    kv_cache -> uint8 [num_pages, 64 * row_bytes] (a row-major view of each page)
    block_table, context_lens -> int32 (no mask: context_lens = max_pages * 64)

Outputs go back to the user's layout exactly as in ``replace.Replacement`` (empty top-k slots
hold distinct masked columns, like eager ``torch.topk``).
"""
from __future__ import annotations

from typing import Optional

import torch
import torch.fx as fx

from ..patterns.algebra import Atoms
from ..patterns.indexer import IndexerForm, Term
from ..patterns.paged import PagedKey
from .replace import Replacement, TopkSpec, _prod, arrange, sym_nodes


class PagedReplacement(Replacement):
    def __init__(self, form: IndexerForm, atoms: Atoms, key: PagedKey, topk: Optional[TopkSpec],
                 graph: fx.Graph):
        self.f, self.A, self.topk, self.key = form, atoms, topk, key
        plain = [Term(n, (), None) for n in (key.cache, key.table, key.context_lens) if n is not None]
        self.tensors = [key.q] + plain + list(form.weights)
        self.sym_nodes = sym_nodes(graph, topk)
        self.n_batch = None

    def __call__(self, *args):
        f, key = self.f, self.key
        tens, _, size = self._bind(args)
        q, cache, table = tens[:3]
        ctx = tens[3] if key.context_lens is not None else None
        wts = tens[4 if ctx is not None else 3:]
        batch = list(f.batch)
        rest = [a for a in f.rows if a not in batch]
        heads = list(f.heads)
        B, N = _prod(size(a) for a in batch), _prod(size(a) for a in rest)
        K = _prod(size(a) for a in f.keys)
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
        table2 = table.to(torch.int32)
        if ctx is None:
            ctx32 = torch.full((B,), K, dtype=torch.int32, device=q.device)
        else:
            ctx32 = ctx.reshape(B).to(torch.int32)
        ke = ctx32.to(torch.int64).clamp(0, K).view(B, 1).expand(B, N).reshape(B * N)
        ks = torch.zeros_like(ke)
        if self.topk is None:
            out = torch.ops.inductor_dsa.paged_indexer_logits(q4, None, cache2, w3, table2, ctx32,
                                                              key.fmt, key.flavor)
            return self._finish_logits(out.reshape(B * N, K), ks, ke, K)
        vals, ids = torch.ops.inductor_dsa.paged_indexer_topk(q4, None, cache2, w3, table2, ctx32,
                                                              self._k, key.fmt, key.flavor)
        kk = vals.shape[-1]
        return self._finish_topk(vals.reshape(B * N, kk), ids.reshape(B * N, kk).to(torch.int64), ks, ke)
