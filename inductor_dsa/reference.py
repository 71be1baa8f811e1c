"""Float64 oracles in plain torch, for the tests: the single source of truth for what every op computes.

Indexer (DSA) score over per-row half-open ranges of visible columns::

    logits[t, j] = sum_h w[t, h] * relu(q[t, h, :] . k[j, :])   if k_start[t] <= j < k_end[t]
                 = -inf                                          otherwise

Top-k keeps the ``topk`` largest visible scores per row, sorted descending; slots past
the row's visible count hold index -1 and value -inf; NaN scores rank below every number
(value -inf); +0.0 == -0.0. Oracles run in float64 on the already-quantised inputs (MXFP4 /
FP8 pairs are decoded first, exactly). No production module imports this one (the ops'
fallback is ``fallback.py``); the dtype-free index plumbing is shared from there.
"""
from __future__ import annotations

import torch

from . import fallback
from .fallback import paged_gather, visible, visible_mask  # noqa: F401  (index plumbing, dtype-free)


def dequantize(x, dtype=torch.float64) -> torch.Tensor:
    """A plain tensor, an MXFP4 pair (uint8 codes, uint8 E8M0) or an FP8 pair (e4m3, fp32 row scale)."""
    return fallback.dequantize(x, None, dtype) if isinstance(x, torch.Tensor) else fallback.dequantize(*x, dtype)


def full_ranges(rows: int, cols: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """k_start = 0, k_end = cols for every row."""
    z = torch.zeros(rows, dtype=torch.int32, device=device)
    return z, torch.full_like(z, cols)


def causal_ranges(rows: int, cols: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Bottom-right aligned causal mask: row t sees j < cols - rows + t + 1."""
    t = torch.arange(rows, dtype=torch.int32, device=device)
    return torch.zeros_like(t), (cols - rows + t + 1).clamp(0, cols)


def ratio_ranges(rows: int, ratio: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """Official V4 prefill mask: compressed entry j is visible to query t iff j < (t + 1) // ratio."""
    t = torch.arange(rows, dtype=torch.int32, device=device)
    return torch.zeros_like(t), (t + 1) // ratio


def indexer_logits(q, k, weights, k_start=None, k_end=None, mask=None) -> torch.Tensor:
    """float64 [T, K] indexer logits (+ an additive mask's bias), -inf outside [k_start[t], k_end[t])
    and where the mask hides (bool False, bias -inf)."""
    q64, k64 = dequantize(q), dequantize(k)
    w64 = weights.to(torch.float64)
    scores = torch.einsum("thd,kd->thk", q64, k64).clamp_min(0)
    logits = (scores * w64.unsqueeze(-1)).sum(1)
    rows, cols = logits.shape
    if k_start is None:
        k_start, k_end = full_ranges(rows, cols, logits.device)
    if mask is not None and mask.dtype != torch.bool:
        logits = logits + mask.to(torch.float64)
    return logits.masked_fill(~visible(k_start, k_end, cols, mask), float("-inf"))


def topk_from_logits(logits: torch.Tensor, topk: int, visible: torch.Tensor):
    """(values fp32 [T, topk], indices int32 [T, topk]): descending, -inf / -1 past the visible count.

    README ranking: visible numbers by value (+0.0 == -0.0; ties to the lower column), then
    visible NaN scores (value -inf), then nothing (-1 / -inf).
    """
    pad = max(0, topk - logits.shape[1])
    nan = logits.isnan()
    rank = torch.where(visible, nan.long(), 2)                     # 0 number, 1 NaN, 2 not visible
    key = logits.masked_fill(~visible | nan, float("-inf"))
    if pad:
        key = torch.nn.functional.pad(key, (0, pad), value=float("-inf"))
        rank = torch.nn.functional.pad(rank, (0, pad), value=2)
    order = torch.sort(key, dim=-1, descending=True, stable=True).indices
    order = order.gather(1, torch.sort(rank.gather(1, order), dim=-1, stable=True).indices)[:, :topk]
    taken = rank.gather(1, order) < 2
    values = key.gather(1, order).masked_fill(~taken, float("-inf"))
    return values.float(), torch.where(taken, order, -1).to(torch.int32)


def logits_topk(logits, topk, k_start, k_end):
    """``topk_from_logits`` of given logits [T, K] over the rows' ranges k_start[t] <= j < k_end[t]."""
    return topk_from_logits(logits.to(torch.float64), topk, visible_mask(k_start, k_end, logits.shape[1]))


def indexer_topk(q, k, weights, topk, k_start=None, k_end=None, mask=None):
    """Top-k of ``indexer_logits`` (float64 scores, values returned as fp32). With a mask, only the
    columns it shows are candidates and a visible NaN score ranks as -inf (ties: lower column)."""
    logits = indexer_logits(q, k, weights, k_start, k_end, mask)
    rows, cols = logits.shape
    if k_start is None:
        k_start, k_end = full_ranges(rows, cols, logits.device)
    if mask is not None:
        logits = torch.where(logits.isnan(), float("-inf"), logits)
    return topk_from_logits(logits, topk, visible(k_start, k_end, cols, mask))


def topk_mismatch(indices, logits64, topk, rel_tol=1e-2, abs_tol=1e-3) -> str | None:
    """Compare a top-k selection with fp64 logits as a set with a score tolerance.

    ``indices`` int [T, topk] (-1 = empty slot), ``logits64`` the oracle with -inf where masked
    (NaN = a visible NaN score, which ranks below every number). A row passes when it selects
    exactly min(topk, visible) distinct visible columns, the NaN ones only after every number,
    and every column in the symmetric difference with the oracle's set scores within tolerance
    of the oracle's k-th largest score (tol = abs_tol + rel_tol * max|finite score| of the row).
    Returns None, or a message naming the first bad row.
    """
    indices = indices.long().cpu()
    logits64 = logits64.cpu()
    nan = logits64.isnan()
    visible = ~torch.isneginf(logits64)
    n_vis = visible.sum(1)
    ref_vals, ref_idx = topk_from_logits(logits64, topk, visible)
    for t in range(indices.shape[0]):
        want = int(min(topk, n_vis[t]))
        got = indices[t][indices[t] >= 0]
        if got.numel() != want or (indices[t][want:] != -1).any():
            return f"row {t}: {got.numel()} selected, expected {want} followed by -1"
        if got.unique().numel() != want:
            return f"row {t}: duplicate indices"
        if not visible[t, got].all():
            return f"row {t}: selected a masked column"
        n_num = int((visible[t] & ~nan[t]).sum())
        if not torch.equal(nan[t, got], torch.arange(want) >= n_num):
            return f"row {t}: NaN scores must come after the {n_num} numbers"
        got, ref = got[:min(want, n_num)], ref_idx[t, :min(want, n_num)]
        if not got.numel():
            continue
        kth = logits64[t, ref[-1]]
        fin = logits64[t][torch.isfinite(logits64[t])]
        tol = abs_tol + rel_tol * (fin.abs().max().item() if fin.numel() else 0.0)
        diff = set(got.tolist()) ^ set(ref.tolist())
        bad = [j for j in diff if not abs(logits64[t, j].item() - kth.item()) <= tol]
        if bad:
            return f"row {t}: columns {bad[:5]} differ from the oracle beyond tolerance {tol:.3g}"
    return None


def sparse_attention(q, kv, indices, sink=None, scale=None):
    """(out float64 [B, M, H, D], lse float64 [B, M, H]) of DSA sparse attention (one KV head).

    kv [B, N, D] is both K and V; indices [B, M, topk] pick its rows, -1 = empty slot; each slot
    counts on its own (a repeated index counts twice). With s_j = scale * q . kv[idx_j]
    (scale defaults to D**-0.5) over the non-empty slots and m any finite shift::

        out = sum_j exp(s_j - m) kv[idx_j] / (sum_j exp(s_j - m) + exp(sink[h] - m))
        lse = log sum_j exp(s_j)          (natural log, sink NOT included; -inf if no slot)

    A query with no non-empty slot gets out = 0 (with or without a sink); sink = +inf gives out = 0,
    a NaN sink or score out NaN; a NaN score makes lse NaN (the sink never enters it). Indices outside
    [-1, N) raise ValueError (this oracle reads them).
    """
    b, m, h, d = q.shape
    n = kv.shape[1]
    idx = indices.long()
    if idx.numel() and (idx.min() < -1 or idx.max() >= n):
        raise ValueError(f"indices must lie in [-1, {n}), got [{idx.min().item()}, {idx.max().item()}]")
    scale = d ** -0.5 if scale is None else scale
    valid = idx >= 0
    rows = torch.gather(kv.to(torch.float64), 1,
                        idx.clamp_min(0).reshape(b, -1, 1).expand(-1, -1, d)).reshape(b, m, -1, d)
    s = torch.einsum("bmhd,bmkd->bmhk", q.to(torch.float64), rows) * scale
    s = s.masked_fill(~valid.unsqueeze(2), float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    shift = lse if sink is None else torch.logaddexp(lse, sink.to(torch.float64).view(1, 1, h))
    shift = torch.where(torch.isneginf(shift), 0.0, shift)  # log of the denominator; +inf sink: out 0
    p = torch.exp(s - shift.unsqueeze(-1))
    return torch.einsum("bmhk,bmkd->bmhd", p, rows), lse


# --- paged (decode) indexer: docs/semantics.md, "Paged key cache" ----------------------------

def paged_keys(kv_cache, block_table, context_lens, fmt="mxfp4", head_dim=128, fp8_flavor="fn", table=None):
    """``fallback.paged_keys`` in float64: an out-of-range page id inside the context reads as an
    all-zero key row (score 0), rows past the context are zero. ``table``: 16 floats decoding the
    MXFP4 codes, key = fp32(table[code] * 2^(s - 127)) (the fp32 key is exact in float64)."""
    return fallback.paged_keys(kv_cache, block_table, context_lens, fmt, head_dim, fp8_flavor, torch.float64, table)


def paged_indexer_logits(q, kv_cache, weights, block_table, context_lens, fmt="mxfp4", fp8_flavor="fn", table=None):
    """float64 [B, N, max_len] decode indexer logits over a paged key cache, -inf at j >= context_lens[b].

        logits[b, n, j] = sum_h weights[b, n, h] * relu(q[b, n, h, :] . key_b[j, :])

    q: [B, N, H, D] tensor or an MXFP4 pair; key_b as in ``paged_keys``. Every query token of a
    request sees the same rows j < context_lens[b] (clamped to [0, max_len]).
    """
    q64 = dequantize(q)
    k = paged_keys(kv_cache, block_table, context_lens, fmt, q64.shape[-1], fp8_flavor, table)
    scores = torch.einsum("bnhd,bjd->bnhj", q64, k).clamp_min(0)
    logits = (scores * weights.to(torch.float64).unsqueeze(-1)).sum(2)
    max_len = k.shape[1]
    ctx = context_lens.long().clamp(0, max_len).view(-1, 1, 1)
    return logits.masked_fill(torch.arange(max_len, device=logits.device) >= ctx, float("-inf"))


def paged_indexer_topk(q, kv_cache, weights, block_table, context_lens, topk, fmt="mxfp4", fp8_flavor="fn", table=None):
    """(values fp32 [B, N, topk], indices int32 [B, N, topk]) of ``paged_indexer_logits``:
    request-local row numbers, descending (ties: lower row), -inf / -1 past the visible count."""
    logits = paged_indexer_logits(q, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table)
    b, n, max_len = logits.shape
    ctx = context_lens.long().clamp(0, max_len).view(-1, 1, 1)
    visible = (torch.arange(max_len, device=logits.device) < ctx).expand(b, n, max_len)
    vals, idx = topk_from_logits(logits.reshape(b * n, max_len), topk, visible.reshape(b * n, max_len))
    return vals.reshape(b, n, topk), idx.reshape(b, n, topk)
