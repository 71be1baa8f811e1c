"""Production fallback in plain torch (fp32 math, int32 sort keys; any device): what the ops run
where the Triton kernels do not (CPU without ``TRITON_INTERPRET=1``), and the top-k of
``topk > 2048`` on every device (the logits kernel, then ``topk_from_logits``' stable sort).

It implements the README semantics itself: NaN scores rank below every number including -inf
and read -inf; +0.0 == -0.0; ties go to the lower column; -1 / -inf past the visible count;
the sink only enters the softmax denominator. (``reference.py`` is the float64 test oracle;
no production module imports it.)
"""
from __future__ import annotations

import torch

from . import formats

NAN_KEY = -2**31 + 1   # f32_keys of every NaN: below key(-inf) = -(2**31 - 2**23)
HIDDEN_KEY = -2**31    # not visible: below everything


def dequantize(x, xs=None, dtype=torch.float32) -> torch.Tensor:
    """x as a contiguous ``dtype`` tensor (so that results do not depend on the input's strides): a
    plain tensor (xs None), an MXFP4 pair (uint8 codes, uint8 E8M0) or an FP8 pair (e4m3, fp32 row scale)."""
    if xs is not None:
        x = (formats.mxfp4_decode if x.dtype == torch.uint8 else formats.fp8_decode_rows)(x, xs, torch.float32)
    return x.to(dtype).contiguous()   # .to(memory_format=) kept a same-dtype view's strides on torch 2.11 CUDA


def visible_mask(k_start: torch.Tensor, k_end: torch.Tensor, cols: int) -> torch.Tensor:
    """Bool [T, K]: k_start[t] <= j < k_end[t]."""
    j = torch.arange(cols, device=k_start.device)
    return (j >= k_start.long().unsqueeze(1)) & (j < k_end.long().unsqueeze(1))


def mask_visible(mask) -> torch.Tensor:
    """Bool [T, K] of the columns a mask shows: a bool mask itself, an additive one where != -inf."""
    return mask if mask.dtype == torch.bool else mask != float("-inf")


def visible(k_start, k_end, cols: int, mask=None) -> torch.Tensor:
    """Bool [T, K]: inside the row's range and (mask given) shown by the mask."""
    vis = visible_mask(k_start, k_end, cols)
    return vis if mask is None else vis & mask_visible(mask)


def _head_sum(q: torch.Tensor, keys: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_h w[..., h] * relu(q[..., h, :] @ keys^T) in fp32, one head at a time (no [.., H, K]
    intermediate): q [*, R, H, D], keys [*, K, D], w [*, R, H] -> [*, R, K]. relu keeps NaN."""
    kt = keys.transpose(-1, -2)
    out = None
    for h in range(q.shape[-2]):
        s = torch.relu(q[..., h, :] @ kt) * w[..., h, None]
        out = s if out is None else out + s
    return out


def indexer_logits(q, q_scale, k, k_scale, weights, k_start, k_end, mask=None) -> torch.Tensor:
    """fp32 [T, K]: sum_h w[t, h] relu(q[t, h] . k[j]) (+ an additive mask, in fp32) where visible
    (k_start[t] <= j < k_end[t], and shown by the mask), else -inf."""
    logits = _head_sum(dequantize(q, q_scale), dequantize(k, k_scale), dequantize(weights))
    if mask is not None and mask.dtype != torch.bool:
        logits = logits + mask.float()
    return logits.masked_fill(~visible(k_start, k_end, k.shape[0], mask), float("-inf"))


def f32_keys(x: torch.Tensor) -> torch.Tensor:
    """int32 order-preserving keys of fp32 ``x``, the torch twin of ``kernels.select.sel_key``
    (uint32 2**31 +- magnitude, NaN key 0) less 2**31: +-magnitude bits; a < b => key(a) < key(b);
    key(-0.0) == key(+0.0) == 0; every NaN -> NAN_KEY < key(-inf)."""
    x = x.float()
    bits = x.view(torch.int32)
    return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits).masked_fill(x.isnan(), NAN_KEY)


def topk_from_logits(logits: torch.Tensor, topk: int, visible: torch.Tensor):
    """(values fp32 [R, topk], indices int32 [R, topk]) of fp32 logits [R, K] over ``visible``:
    a stable descending sort of ``f32_keys`` (ties: lower column), NaN values read -inf,
    -inf / -1 past the visible count."""
    rows, cols = logits.shape
    m = min(topk, cols)
    key = f32_keys(logits).masked_fill(~visible, HIDDEN_KEY)
    key, order = torch.sort(key, dim=-1, descending=True, stable=True)
    key, order = key[:, :m], order[:, :m]
    taken = key > HIDDEN_KEY
    vals = torch.where(taken & (key > NAN_KEY), logits.gather(1, order), float("-inf"))
    idx = torch.where(taken, order, -1).to(torch.int32)
    if m < topk:
        vals = torch.nn.functional.pad(vals, (0, topk - m), value=float("-inf"))
        idx = torch.nn.functional.pad(idx, (0, topk - m), value=-1)
    return vals.float(), idx


def logits_topk(logits, k_start, k_end, topk: int, mask=None):
    """``topk_from_logits`` over each row's range k_start[t] <= j < k_end[t]; with a mask, over the
    columns it shows too, and a visible NaN score ranks as -inf (docs/semantics.md, "Masks")."""
    if mask is not None:
        logits = logits.nan_to_num(nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    return topk_from_logits(logits, topk, visible(k_start, k_end, logits.shape[1], mask))


def sparse_attention(q, kv, indices, sink, scale: float):
    """(out [B, M, H, D] q.dtype, lse fp32 [B, M, H]) in fp32; indices outside [0, N) are empty slots.

        s_j = scale * q . kv[idx_j],  mx = max(max_j s_j, sink)  (a shift; 0 when -inf)
        out = sum_j exp(s_j - mx) kv[idx_j] / (sum_j exp(s_j - mx) + exp(sink - mx))
        lse = log sum_j exp(s_j)         (-inf with no slot, NaN when a score is NaN)

    No slot and no (or a -inf) sink: out = 0. sink = +inf: out = 0 (its term is exp(0) = 1, every
    exp(s_j - inf) = 0). A NaN sink or score: out NaN. The sink never enters lse.
    """
    b, m, h, d = q.shape
    n = kv.shape[1]
    idx = indices.long()
    valid = (idx >= 0) & (idx < n)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(q.shape[:3], dtype=torch.float32, device=q.device)
    step = max(1, 2**26 // max(1, b * idx.shape[2] * d))  # queries per chunk: <= 2**26 gathered values
    kvf, qf = dequantize(kv), dequantize(q)
    for m0 in range(0, m, step):
        sl = slice(m0, m0 + step)
        ok = valid[:, sl]
        rows = torch.gather(kvf, 1, torch.where(ok, idx[:, sl], 0).flatten(1).unsqueeze(-1).expand(-1, -1, d))
        rows = rows.view(b, -1, idx.shape[2], d)
        s = (qf[:, sl] @ rows.transpose(-1, -2)) * scale                 # [B, m, H, topk]
        s = s.masked_fill(~ok.unsqueeze(2), float("-inf"))
        lse[:, sl] = torch.logsumexp(s, dim=-1)
        top = s.amax(-1)                                                          # topk >= 1
        if sink is not None:
            sk = sink.float().view(1, 1, h)
            top = torch.maximum(top, sk)
        shift = torch.where(top == float("-inf"), 0.0, top)
        p = torch.exp(s - shift.unsqueeze(-1))
        den = p.sum(-1)
        if sink is not None:
            den = den + torch.where(sk == shift, 1.0, torch.exp(sk - shift))
        o = (p @ rows) / torch.where(den == 0, 1.0, den).unsqueeze(-1)
        out[:, sl] = o.to(q.dtype)
    return out, lse


# --- paged (decode) indexer --------------------------------------------------------------------

def paged_keys(kv_cache, block_table, context_lens, fmt, head_dim, fp8_flavor="fn", dtype=torch.float32, table=None):
    """Decoded keys [B, max_len, D] (``dtype``; MXFP4 through ``table`` when given, as
    ``formats.mxfp4_decode``), max_len = block_table.shape[1] * 64: row j of
    request b is cache row ``j % 64`` of page ``block_table[b, j // 64]``; rows at or past
    ``clamp(context_lens[b], 0, max_len)`` and rows of page ids outside [0, num_pages) are zero."""
    payload, scale = formats.unpack_pages(kv_cache, fmt, head_dim)
    keys = formats.decode_rows(payload, scale, fmt, fp8_flavor, table).to(dtype)
    b, pages = block_table.shape
    max_len = pages * formats.PAGE_ROWS
    if keys.shape[0] == 0:
        return torch.zeros(b, max_len, head_dim, dtype=dtype, device=kv_cache.device)
    page = block_table.long().unsqueeze(-1)                                   # [B, P, 1]
    ok = (page >= 0) & (page < kv_cache.shape[0])
    rows = (page.clamp(0, kv_cache.shape[0] - 1) * formats.PAGE_ROWS
            + torch.arange(formats.PAGE_ROWS, device=page.device)).reshape(b, max_len)
    ctx = context_lens.long().clamp(0, max_len).unsqueeze(1)
    live = ok.expand(b, pages, formats.PAGE_ROWS).reshape(b, max_len) & (torch.arange(max_len, device=ctx.device) < ctx)
    return torch.where(live.unsqueeze(-1), keys[rows], 0.0)


def paged_visible(context_lens, n: int, max_len: int) -> torch.Tensor:
    """Bool [B, N, max_len]: j < clamp(context_lens[b], 0, max_len)."""
    ctx = context_lens.long().clamp(0, max_len).view(-1, 1, 1)
    return (torch.arange(max_len, device=ctx.device) < ctx).expand(-1, n, max_len)


def paged_indexer_logits(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table=None):
    """fp32 [B, N, max_len]: sum_h w[b, n, h] relu(q[b, n, h] . key_b[j]), -inf at j >= context_lens[b]."""
    qf = dequantize(q, q_scale)
    n = qf.shape[1]
    keys = paged_keys(kv_cache, block_table, context_lens, fmt, qf.shape[-1], fp8_flavor, table=table)
    logits = _head_sum(qf, keys, dequantize(weights))
    return logits.masked_fill(~paged_visible(context_lens, n, keys.shape[1]), float("-inf"))


def paged_topk(logits, context_lens, topk: int):
    """Top-k of paged logits [B, N, max_len] over each request's context (``topk_from_logits``)."""
    b, n, max_len = logits.shape
    vis = paged_visible(context_lens, n, max_len).reshape(b * n, max_len)
    vals, idx = topk_from_logits(logits.reshape(b * n, max_len), topk, vis)
    return vals.reshape(b, n, topk), idx.reshape(b, n, topk)


def paged_gather(kv_cache, block_table, context_lens, fmt="mxfp4", head_dim=128, total_rows=None):
    """Raw cache rows of every request, back to back: (payload uint8 [R, A], scales uint8 [R, S],
    k_start int32 [B], k_end int32 [B]). Request b's rows j < ctx_b = clamp(context_lens[b], 0,
    max_len) land at flat rows k_start[b] + j, k_start = exclusive cumsum of ctx. R = total_rows
    (default sum ctx); rows past the sum, and rows of out-of-range page ids, are zero; the
    ranges are clamped to R."""
    a, s = formats.row_bytes(fmt, head_dim)
    b, pages = block_table.shape
    max_len = pages * formats.PAGE_ROWS
    ctx = context_lens.long().clamp(0, max_len)
    end = torch.cumsum(ctx, 0)
    start = end - ctx
    r = int(end[-1]) if total_rows is None and b else (total_rows or 0)
    out_a = torch.zeros(r, a, dtype=torch.uint8, device=kv_cache.device)
    out_s = torch.zeros(r, s, dtype=torch.uint8, device=kv_cache.device)
    j = torch.arange(max_len, device=kv_cache.device)
    page = block_table.long()[:, j // formats.PAGE_ROWS] if max_len else block_table.long()
    dst = start.unsqueeze(1) + j
    live = (j < ctx.unsqueeze(1)) & (dst < r)
    ok = live & (page >= 0) & (page < kv_cache.shape[0])
    if ok.any():
        payload, scale = formats.unpack_pages(kv_cache, fmt, head_dim)
        src = page[ok] * formats.PAGE_ROWS + (j % formats.PAGE_ROWS).expand_as(page)[ok]
        out_a[dst[ok]] = payload[src]
        out_s[dst[ok]] = scale[src]
    return out_a, out_s, start.clamp(max=r).to(torch.int32), end.clamp(max=r).to(torch.int32)
