"""Eager spellings of DSA sparse attention (docs/semantics.md, "Sparse attention") for the graph-pass tests.

Every snippet gathers KV rows by top-k indices (-1 = empty slot), scores them against q,
masks the empty slots with -inf, normalises with or without an attention sink, and
contracts the weights with the same gathered rows. ``ATTENTION_CASES`` must be swapped to
``inductor_dsa.sparse_attention``; ``ATTENTION_NEAR_MISSES`` differ in one way that changes
the result and must be left alone. Written for these tests.
"""
from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from pass_corpus import Case

B, M, H, D, N, TOPK = 2, 3, 8, 32, 13, 7


def make_attention(b=B, m=M, h=H, d=D, n=N, topk=TOPK, batched=True, heads_first=False, holes=0.3):
    """(q, kv, idx, sink): -1 holes, repeated indices, one query (b=0, m=1) that sees nothing
    (no holes at all with ``holes=0``)."""
    def make(dtype, seed):
        g = torch.Generator().manual_seed(seed)
        q = torch.randn(b, m, h, d, generator=g).to(dtype)
        kv = torch.randn(b, n, d, generator=g).to(dtype)
        idx = torch.randint(0, n, (b, m, topk), generator=g)
        if holes:
            idx[torch.rand(b, m, topk, generator=g) < holes] = -1
            idx[0, min(1, m - 1)] = -1
        sink = torch.rand(h, generator=g) * 2
        if heads_first:
            q = q.transpose(1, 2).contiguous()
        if not batched:
            q, kv, idx = q[0], kv[0], idx[0]
        return q, kv, idx, sink
    return make


def oracle_inputs(case, args):
    """(q [B, M, H, D], kv, idx, sink or None) of a case's inputs, in the op's layout."""
    if isinstance(args[0], nn.Module):
        (q, kv, idx), sink = args[1], args[0].attn_sink.detach()
    else:
        q, kv, idx, sink = args
    if case.extra.get("heads_first"):
        q = q.transpose(1, 2)
    if not case.extra.get("batched", True):
        q, kv, idx = q[None], kv[None], idx[None]
    return q, kv, idx, sink if case.extra.get("sink", True) else None


def to_case_layout(case, out):
    """[B, M, H, D] -> the case's output layout."""
    if not case.extra.get("batched", True):
        out = out[0]
    return out.transpose(1, 2) if case.extra.get("heads_first") else out


# ---- positives ------------------------------------------------------------------------------
class SparseAttention(nn.Module):
    """V4-style: a learned per-head sink, softmax over cat([scores, sink]) then drop the sink
    column, fp32 scores from a bf16 einsum, probabilities cast back before P @ V."""

    def __init__(self, heads=H, head_dim=D):
        super().__init__()
        self.attn_sink = nn.Parameter(torch.rand(heads) * 2)
        self.softmax_scale = head_dim ** -0.5

    def forward(self, q, kv, idx):
        b, m, h, _ = q.shape
        rows = kv[torch.arange(b)[:, None, None], idx.clamp(min=0)]          # [B, M, K, D]
        s = torch.einsum("bmhd,bmkd->bmhk", q, rows).float() * self.softmax_scale
        s = s.masked_fill((idx == -1).unsqueeze(2), float("-inf"))
        sink = self.attn_sink.view(1, 1, h, 1).expand(b, m, h, 1)
        p = torch.cat([s, sink], dim=-1).softmax(dim=-1)[..., :-1]
        return torch.einsum("bmhk,bmkd->bmhd", p.to(q.dtype), rows)


def module_cat_sink(dtype, seed):
    q, kv, idx, sink = make_attention()(dtype, seed)
    m = SparseAttention()
    with torch.no_grad():
        m.attn_sink.copy_(sink)
    return m, (q, kv, idx)


def module_call(m, args):
    return m(*args)


def gather_explicit_sink(q, kv, idx, sink, scale=0.125):
    """torch.gather with where(idx < 0, 0, idx), matmul + transpose, where(idx == -1, -inf),
    explicit max (with the sink) / exp / sum + exp(sink - max), fp32 upcasts."""
    b, m, h, d = q.shape
    flat = torch.where(idx < 0, 0, idx).reshape(b, -1, 1).expand(-1, -1, d)
    rows = torch.gather(kv, 1, flat).reshape(b, m, -1, d).float()
    s = torch.matmul(q.float(), rows.transpose(-1, -2)) * scale
    s = torch.where((idx == -1)[:, :, None, :], float("-inf"), s)
    sk = sink.view(1, 1, h, 1)
    mx = torch.maximum(s.amax(dim=-1, keepdim=True), sk)
    e = torch.exp(s - mx)
    p = e / (e.sum(dim=-1, keepdim=True) + torch.exp(sk - mx))
    return torch.matmul(p, rows).to(q.dtype)


def take_along_no_sink(q, kv, idx, sink):
    """No sink: take_along_dim gather, softmax(dtype=fp32); a query with no slot gives NaN in eager."""
    b, m, h, d = q.shape
    rows = torch.take_along_dim(kv, idx.clamp(min=0).reshape(b, -1, 1), dim=1).view(b, m, -1, d)
    s = torch.einsum("bmhd,bmkd->bmhk", q, rows) * d ** -0.5
    s = s.masked_fill((idx < 0)[:, :, None], float("-inf"))
    p = F.softmax(s, dim=-1, dtype=torch.float32)
    return torch.einsum("bmhk,bmkd->bmhd", p.to(rows.dtype), rows)


def index_select_sink_first(q, kv, idx, sink):
    """One sequence, no batch dim: index_select rows, additive -inf mask, the sink column first."""
    m, h, d = q.shape
    rows = kv.index_select(0, idx.clamp_min(0).flatten()).view(m, -1, d)
    s = torch.einsum("mhd,mkd->mhk", q.float(), rows.float()) / 8.0
    s = s + torch.where(idx < 0, float("-inf"), 0.0)[:, None, :]
    z = torch.cat([sink[None, :, None].expand(m, h, 1), s], dim=-1)
    p = torch.softmax(z, dim=-1)[:, :, 1:]
    return (p @ rows.float()).to(q.dtype)


def heads_first_max_values(q, kv, idx, sink):
    """q [B, H, M, D]: max(...).values, maximum with the sink, multiply by reciprocal of the sum."""
    b, h, m, d = q.shape
    rows = kv[torch.arange(b).view(b, 1, 1), idx.clamp(min=0)]          # [B, M, K, D]
    s = torch.einsum("bhmd,bmkd->bhmk", q, rows) * d ** -0.5
    s = s.masked_fill(~(idx >= 0)[:, None], float("-inf"))
    sk = sink[None, :, None, None]
    mx = torch.maximum(torch.max(s, dim=-1, keepdim=True).values, sk)
    e = (s - mx).exp()
    den = e.sum(-1, keepdim=True) + (sk - mx).exp()
    return torch.einsum("bhmk,bmkd->bhmd", e * den.reciprocal(), rows)


def shift_without_sink(q, kv, idx, sink):
    """The sink only in the denominator and NOT in the shift: a query with no slot gives NaN."""
    b, m, h, d = q.shape
    rows = kv[torch.arange(b)[:, None, None], idx.clamp(min=0)]
    s = torch.einsum("bmhd,bmkd->bmhk", q, rows) * d ** -0.5
    s = s.masked_fill((idx == -1).unsqueeze(2), float("-inf"))
    mx = s.amax(-1, keepdim=True)
    e = torch.exp(s - mx)
    sk = sink.view(h, 1).to(s.dtype)
    return torch.matmul(e / (e.sum(-1, keepdim=True) + torch.exp(sk - mx)), rows)


ATTENTION_CASES = [
    Case("module_cat_sink", module_call, module_cat_sink, {"sparse_attention": 1}, kind="attention",
         dtypes=(torch.bfloat16, torch.float32), notes="nn.Module, parameter sink, cat + softmax + slice",
         extra=dict(empty="zeros", scale=D ** -0.5)),
    Case("gather_explicit_sink", gather_explicit_sink, make_attention(), {"sparse_attention": 1},
         kind="attention", dtypes=(torch.bfloat16, torch.float32), extra=dict(empty="zeros", scale=0.125)),
    Case("take_along_no_sink", take_along_no_sink, make_attention(h=4, d=64, topk=16), {"sparse_attention": 1},
         kind="attention", dtypes=(torch.bfloat16,), extra=dict(empty="nan", sink=False, scale=64 ** -0.5, dynamic=True),
         notes="topk > N: indices repeat"),
    Case("index_select_sink_first", index_select_sink_first, make_attention(b=1, m=5, batched=False),
         {"sparse_attention": 1}, kind="attention", dtypes=(torch.bfloat16,),
         extra=dict(empty="zeros", scale=0.125, batched=False, dynamic=True)),
    Case("heads_first_max_values", heads_first_max_values, make_attention(h=16, heads_first=True),
         {"sparse_attention": 1}, kind="attention", dtypes=(torch.float32,),
         extra=dict(empty="zeros", scale=D ** -0.5, heads_first=True)),
    Case("shift_without_sink", shift_without_sink, make_attention(), {"sparse_attention": 1},
         kind="attention", dtypes=(torch.bfloat16,), extra=dict(empty="nan", scale=D ** -0.5)),
]


# ---- near-misses ----------------------------------------------------------------------------
def _rows(kv, idx):
    return kv[torch.arange(kv.shape[0])[:, None, None], idx.clamp(min=0)]


def _scores(q, rows, idx, fill=float("-inf")):
    s = torch.einsum("bmhd,bmkd->bmhk", q, rows) * q.shape[-1] ** -0.5
    return s.masked_fill((idx == -1).unsqueeze(2), fill)


def _with_sink(s, sink):
    b, m, h, _ = s.shape
    return torch.cat([s, sink.view(1, 1, h, 1).expand(b, m, h, 1)], dim=-1)


def nm_sink_column_kept(q, kv, idx, sink):
    """Drops the first score column instead of the sink column."""
    rows = _rows(kv, idx)
    p = _with_sink(_scores(q, rows, idx), sink).softmax(-1)[..., 1:]
    return torch.einsum("bmhk,bmkd->bmhd", p, rows)


def nm_sink_in_numerator(q, kv, idx, sink):
    rows = _rows(kv, idx)
    s = _scores(q, rows, idx)
    sk = sink.view(1, 1, -1, 1)
    mx = torch.maximum(s.amax(-1, keepdim=True), sk)
    e = torch.exp(s - mx)
    den = e.sum(-1, keepdim=True) + torch.exp(sk - mx)
    return torch.matmul((e + torch.exp(sk - mx)) / den, rows)


def nm_no_mask(q, kv, idx, sink):
    rows = _rows(kv, idx)
    s = torch.einsum("bmhd,bmkd->bmhk", q, rows) * q.shape[-1] ** -0.5
    return torch.einsum("bmhk,bmkd->bmhd", _with_sink(s, sink).softmax(-1)[..., :-1], rows)


def nm_k_v_different(q, kv, idx, sink):
    rows = _rows(kv, idx)
    p = _with_sink(_scores(q, rows, idx), sink).softmax(-1)[..., :-1]
    return torch.einsum("bmhk,bmkd->bmhd", p, _rows(kv * 2, idx))


def nm_scale_after_softmax(q, kv, idx, sink):
    rows = _rows(kv, idx)
    s = torch.einsum("bmhd,bmkd->bmhk", q, rows).masked_fill((idx == -1).unsqueeze(2), float("-inf"))
    p = _with_sink(s, sink).softmax(-1)[..., :-1] * q.shape[-1] ** -0.5
    return torch.einsum("bmhk,bmkd->bmhd", p, rows)


def nm_softmax_over_heads(q, kv, idx, sink):
    rows = _rows(kv, idx)
    s = _scores(q, rows, idx)
    return torch.einsum("bmhk,bmkd->bmhd", s.softmax(2), rows)


def nm_mask_fill_zero(q, kv, idx, sink):
    rows = _rows(kv, idx)
    p = _with_sink(_scores(q, rows, idx, fill=0.0), sink).softmax(-1)[..., :-1]
    return torch.einsum("bmhk,bmkd->bmhd", p, rows)


def nm_mask_other_indices(q, kv, idx, sink):
    """The mask tests a different index tensor than the one that gathers."""
    rows = _rows(kv, idx.flip(-1))
    p = _with_sink(_scores(q, rows, idx), sink).softmax(-1)[..., :-1]
    return torch.einsum("bmhk,bmkd->bmhd", p, rows)


def nm_mask_finfo_min_no_sink(q, kv, idx, sink):
    """finfo.min instead of -inf, no sink: a query with no slot averages its (row 0) values."""
    rows = _rows(kv, idx)
    s = _scores(q, rows, idx, fill=torch.finfo(q.dtype).min)
    return torch.einsum("bmhk,bmkd->bmhd", s.softmax(-1), rows)


ATTENTION_NEAR_MISSES = [
    Case("attn_sink_column_kept", nm_sink_column_kept, make_attention(), {}, reject="keep exactly the scores"),
    Case("attn_sink_in_numerator", nm_sink_in_numerator, make_attention(), {}, reject="not exp(...) / denominator"),
    Case("attn_no_minus1_mask", nm_no_mask, make_attention(), {}, reject="no -1 mask"),
    Case("attn_k_v_different", nm_k_v_different, make_attention(), {}, reject="K and V are different"),
    Case("attn_scale_after_softmax", nm_scale_after_softmax, make_attention(), {},
         reject="not exp(...) / denominator"),
    Case("attn_softmax_over_heads", nm_softmax_over_heads, make_attention(holes=0), {}, reject="wrong dim"),
    Case("attn_mask_fill_zero", nm_mask_fill_zero, make_attention(), {}, reject="fill value 0.0"),
    Case("attn_mask_other_indices", nm_mask_other_indices, make_attention(), {}, reject="does not read row idx"),
    Case("attn_mask_finfo_min_no_sink", nm_mask_finfo_min_no_sink, make_attention(), {}, reject="is not -inf"),
]
