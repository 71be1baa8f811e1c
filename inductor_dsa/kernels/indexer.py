"""Triton kernels for the DSA indexer: logits, and logits fused with top-k.

    logits[t, j] = sum_h w[t, h] * relu(q[t, h, :] . k[j, :])   for k_start[t] <= j < k_end[t]

Score tile (both kernels). A program owns BT tokens and all their heads: the BT*HP
query rows (HP = H rounded up to a power of two, padded heads have weight 0) are
loaded once, transposed, and stay resident while key tiles of BN rows stream past:

    S^T = K_tile [BN, D] @ Q^T [D, BT*HP]          (fp32 accumulate)
    S^T *= k_scale[j]                               (FP8 keys: per-row scale, before relu)
    logits^T [BN, BT] = sum over each token's HP columns of relu(S^T) * w

The head reduction runs along the accumulator's N axis, which on both MMA layouts
is mostly in-thread. Only blocks intersecting [min k_start, max k_end) of the tile
are computed. MXFP4 operands are decoded in registers right after their byte loads
(E2M1 via arithmetic, E8M0 via exponent bits); no dense dequantised copy exists.

Top-k: the launcher walks the tokens in chunks of C rows, ``logits_kernel`` writes a chunk's
C x K fp32 scores into a workspace no larger than the outputs (the [T, K] logits never exist),
then the selection engine (kernels/select.py) picks each row's top-k from it.

Masks given as data (MASK_KIND, a [T, K] tensor of any strides, 0 included): bool (True =
visible) or an additive fp32/bf16/fp16 bias (score + bias; a -inf bias hides). ``mask_hull_kernel``
first narrows each row's [k_start, k_end) to the hull [first, last + 1) of its visible columns
(empty: [0, 0)), written to fresh range tensors, and marks the rows whose hull is wholly visible
with no nonzero bias (dense: causal, sliding-window and padding masks, bool or 0 / -inf). The
logits kernel skips blocks outside the hull exactly as it does for ranges; a tile whose rows are
all dense reads one cached value per row instead of the mask, other tiles read the mask block by
block. Shapes alone decide every launch (CUDA-graph capturable: the dense marks are read inside
the kernel). In the top-k workspace (FILL off) a hidden column inside the hull is written NaN and
a visible NaN score -inf: the select engine ranks NaN below -inf, so hidden columns come after
every visible one, and ``hide_kernel`` turns the slots holding them into -1 (docs/semantics.md).
"""
import triton
import triton.language as tl

from .decode import (FMT_FP8_BYTES, FMT_MXFP4, e4m3_bytes_to_f32, load_mxfp4_rows, mma_k_order,
                     mxfp4_rows_mma)


@triton.jit
def _load_rows(ptr, scale_ptr, off, scale_off, mask, stride_d, FMT: tl.constexpr, FNUZ: tl.constexpr,
               R: tl.constexpr, D: tl.constexpr):
    """R rows of D elements starting at element offsets ``off`` (MXFP4 scales at ``scale_off``)."""
    cols = tl.arange(0, D)
    if FMT == FMT_MXFP4:
        x = load_mxfp4_rows(ptr, scale_ptr, off, scale_off, mask, R, D)
    elif FMT == FMT_FP8_BYTES:
        x = tl.load(ptr + off[:, None] + cols[None, :] * stride_d, mask=mask[:, None], other=0)
        x = e4m3_bytes_to_f32(x.to(tl.int32), FNUZ)
    else:
        x = tl.load(ptr + off[:, None] + cols[None, :] * stride_d, mask=mask[:, None], other=0.0)
    return x


@triton.jit
def query_tile(
    q,  # [T, H, D] bf16/fp16/fp32/fp8, or MXFP4 codes [T, H, D/2] uint8
    q_scale,  # MXFP4 E8M0 scales [T, H, D/32] uint8 (other formats: unused)
    weights,  # [T, H] bf16/fp16/fp32
    t0,  # first token of the tile
    T,
    H,
    stride_q_t,
    stride_q_h,
    stride_q_d,
    stride_q_scale_t,
    stride_q_scale_h,
    stride_weights_t,
    stride_weights_h,
    Q_FMT: tl.constexpr,
    FNUZ: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,  # H rounded up to a power of two
    D: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    K_ORDER: tl.constexpr,  # rows of Q^T in the MXFP4 keys' column order
):
    """(Q^T [D, BLOCK_T*BLOCK_H] in the dot dtype, weights [BLOCK_T*BLOCK_H] fp32) for tokens
    t0 .. t0+BLOCK_T-1 (padded heads weigh 0). With
    K_ORDER (MXFP4 keys) the rows of Q^T are in the keys' column order (``mma_k_order``):
    an MXFP4 query goes through the keys' own decoder (byte loads: it is read once; fp32 then a
    cast: with the decoder's bf16 output feeding tl.trans directly, triton 3.6's sm90
    OptimizeDotOperands folds the permute into an illegal shared layout), a plain one is loaded
    in order (vector loads; gathered at the permuted columns it took 2-byte loads) and permuted in
    registers."""
    r = tl.arange(0, BLOCK_T * BLOCK_H)
    t = (t0 + r // BLOCK_H).to(tl.int64)
    h = r % BLOCK_H
    m = (t < T) & (h < H)
    off = t * stride_q_t + h * stride_q_h
    scale_off = t * stride_q_scale_t + h * stride_q_scale_h
    if K_ORDER and Q_FMT == FMT_MXFP4:
        x = mxfp4_rows_mma(q, q_scale, off, scale_off, m, BLOCK_T * BLOCK_H, D, tl.float32, False, DOT_DTYPE)
    elif K_ORDER:  # loaded in order (coalesced), permuted in registers (in fp32, exact; then cast)
        x = _load_rows(q, q_scale, off, scale_off, m, stride_q_d, Q_FMT, FNUZ, BLOCK_T * BLOCK_H, D).to(tl.float32)
        x = mma_k_order(x, BLOCK_T * BLOCK_H, D).to(DOT_DTYPE)
    else:
        x = _load_rows(q, q_scale, off, scale_off, m, stride_q_d, Q_FMT, FNUZ, BLOCK_T * BLOCK_H, D).to(DOT_DTYPE)
    wv = tl.load(weights + t * stride_weights_t + h * stride_weights_h, mask=m, other=0.0).to(tl.float32)
    return tl.trans(x), wv


@triton.jit
def _dot(k_tile, q_tile, acc, DOT_DTYPE: tl.constexpr):
    """k_tile @ q_tile (+ acc), fp32 accumulation."""
    if DOT_DTYPE == tl.float32:
        out = tl.dot(k_tile, q_tile, acc, input_precision="ieee")
    else:
        out = tl.dot(k_tile, q_tile, acc)
    return out


@triton.jit
def _dot_parts(k_tile, q_tile, q_tile_mid, q_tile_lo, acc, Q_PARTS: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """k_tile @ (q_tile + q_tile_mid + q_tile_lo) (+ acc) over the query's Q_PARTS parts (1: q_tile
    alone, 2: + q_tile_lo, 3: all), smallest part first."""
    if Q_PARTS >= 2:
        acc = _dot(k_tile, q_tile_lo, acc, DOT_DTYPE)
    if Q_PARTS == 3:
        acc = _dot(k_tile, q_tile_mid, acc, DOT_DTYPE)
    return _dot(k_tile, q_tile, acc, DOT_DTYPE)


@triton.jit
def score_rows(
    q_tile,  # Q^T [D, BLOCK_T*BLOCK_H] in the dot dtype (``query_tile``)
    head_weights,  # [BLOCK_T*BLOCK_H] fp32 (``query_tile``)
    k_tile,  # [BLOCK_N, D] decoded keys in the dot dtype
    row_scale,  # [BLOCK_N] fp32 (FP8 keys), or None
    BLOCK_T: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_N: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    q_tile_mid=None,  # the lower bf16 parts of a split query (paged ``split_query``; Q_PARTS)
    q_tile_lo=None,
    k_tile_mid=None,  # the lower bf16 parts of a split fp32 key (paged table decode; K_PARTS)
    k_tile_lo=None,
    Q_PARTS: tl.constexpr = 1,  # 1: q_tile alone, 2: + q_tile_lo, 3: + q_tile_mid too
    K_PARTS: tl.constexpr = 1,  # 1 or 3
):
    """logits^T [BLOCK_N, BLOCK_T] fp32 of a decoded key tile: sum over each token's BLOCK_H
    columns of relu(k_tile @ q_tile * row_scale) * head_weights; ``row_scale`` multiplies before
    the relu, None means 1. A query split into bf16 terms is k_tile @ (q_tile + q_tile_mid +
    q_tile_lo), a split key (k_tile + k_tile_mid + k_tile_lo) @ Q likewise: every part product,
    smallest parts first, into one fp32 accumulator."""
    if K_PARTS == 3:
        acc = _dot_parts(k_tile_lo, q_tile, q_tile_mid, q_tile_lo, None, Q_PARTS, DOT_DTYPE)
        acc = _dot_parts(k_tile_mid, q_tile, q_tile_mid, q_tile_lo, acc, Q_PARTS, DOT_DTYPE)
        acc = _dot_parts(k_tile, q_tile, q_tile_mid, q_tile_lo, acc, Q_PARTS, DOT_DTYPE)
    else:
        acc = _dot_parts(k_tile, q_tile, q_tile_mid, q_tile_lo, None, Q_PARTS, DOT_DTYPE)
    if row_scale is not None:
        acc = acc * row_scale[:, None]
    # relu as eager computes it: NaN stays NaN (the default max would map it to 0 on GPUs, not here)
    acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL) * head_weights[None, :]
    return tl.sum(tl.reshape(acc, (BLOCK_N, BLOCK_T, BLOCK_H)), axis=2)


@triton.jit
def _score_block(qT, wv, k, k_scale, j0, K, stride_k_n, stride_k_d, stride_k_scale_n,
                 K_FMT: tl.constexpr, K_ROW_SCALE: tl.constexpr, FNUZ: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                 DOT_DTYPE: tl.constexpr, DEC_DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """logits^T [BLOCK_N, BLOCK_T] fp32 for key rows j0 .. j0+BLOCK_N-1 (rows >= K score 0). MXFP4
    keys come in the ``mma_k_order`` column order: Q^T must be in that order too."""
    j = j0 + tl.arange(0, BLOCK_N)
    jm = j < K
    row, scale_row = j.to(tl.int64) * stride_k_n, j.to(tl.int64) * stride_k_scale_n
    if K_FMT == FMT_MXFP4:
        kt = mxfp4_rows_mma(k, k_scale, row, scale_row, jm, BLOCK_N, D, DEC_DTYPE, ALIGNED, DOT_DTYPE)
    else:
        kt = _load_rows(k, k_scale, row, scale_row, jm, stride_k_d, K_FMT, FNUZ, BLOCK_N, D).to(DOT_DTYPE)
    if K_ROW_SCALE:
        blk = score_rows(qT, wv, kt, tl.load(k_scale + scale_row, mask=jm, other=0.0), BLOCK_T, BLOCK_H, BLOCK_N,
                         DOT_DTYPE)
    else:
        blk = score_rows(qT, wv, kt, None, BLOCK_T, BLOCK_H, BLOCK_N, DOT_DTYPE)
    return blk


MASK_NONE = tl.constexpr(0)
MASK_BOOL = tl.constexpr(1)   # uint8 view of a bool mask, nonzero = visible
MASK_BIAS = tl.constexpr(2)   # additive float bias, -inf = hidden


@triton.jit
def _row_ranges(k_start, k_end, t, tm, K):
    """Per-row [s, e) clamped to [0, K]; empty rows (and rows past T) s=K, e=0."""
    s = tl.maximum(tl.load(k_start + t, mask=tm, other=0), 0)
    e = tl.minimum(tl.load(k_end + t, mask=tm, other=0), K)
    live = tm & (e > s)
    return tl.where(live, s, K), tl.where(live, e, 0)


@triton.jit
def _tile_ranges(k_start, k_end, t0, T, K, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr):
    """Per-row [s, e) of tokens t0 .. t0+BLOCK_T-1 and the tile's block span [lo, hi)."""
    t = t0 + tl.arange(0, BLOCK_T)
    tm = t < T
    s, e = _row_ranges(k_start, k_end, t, tm, K)
    lo = (tl.min(s) // BLOCK_N) * BLOCK_N
    hi = tl.max(e)
    return t, tm, s, e, lo, hi


@triton.jit
def _mask_visible(mask, t, j, inside, stride_mask_t, stride_mask_k, MASK_KIND: tl.constexpr):
    """(visible, bias fp32) of the mask at rows t, columns j (broadcast shapes), read only where
    ``inside``; visible = inside and (bool: nonzero, bias: != -inf)."""
    m = tl.load(mask + t.to(tl.int64) * stride_mask_t + j.to(tl.int64) * stride_mask_k, mask=inside, other=0)
    bias = m.to(tl.float32)  # a bool mask's is unused
    if MASK_KIND == MASK_BOOL:
        vis = inside & (m != 0)
    else:
        vis = inside & (bias != float("-inf"))
    return vis, bias


@triton.jit
def mask_hull_kernel(
    k_start,  # [T] int32
    k_end,  # [T] int32
    mask,  # [T, K] uint8 (a bool mask's bytes) or fp32/bf16/fp16 bias, any strides
    hull_start,  # [T] int32 out: first visible column (empty row: 0)
    hull_end,  # [T] int32 out: last visible column + 1 (empty row: 0)
    row_mask,  # [T] the mask's dtype, out: the kind's neutral value (True / 0) where the row is dense, else False / NaN
    T,
    K,
    stride_mask_t,
    stride_mask_k,
    MASK_KIND: tl.constexpr,
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    """hull = [first, last + 1) of the columns j in [k_start[t], k_end[t]) the mask shows, per row;
    a row is dense when its hull holds last + 1 - first shown columns of bias 0 (a NaN bias is
    not). Elementwise accumulators, reduced once after the loop."""
    t, tm, s, e, lo, hi = _tile_ranges(k_start, k_end, tl.program_id(0) * BLOCK_T, T, K, BLOCK_T, BLOCK_N)
    first = tl.full((BLOCK_T, BLOCK_N), 0, tl.int32) + K
    last = tl.full((BLOCK_T, BLOCK_N), -1, tl.int32)
    shown = tl.zeros((BLOCK_T, BLOCK_N), tl.int32)
    for j0 in range(lo, hi, BLOCK_N):
        j = (j0 + tl.arange(0, BLOCK_N))[None, :]
        inside = (j >= s[:, None]) & (j < e[:, None])
        vis, bias = _mask_visible(mask, t[:, None], j, inside, stride_mask_t, stride_mask_k, MASK_KIND)
        first = tl.minimum(first, tl.where(vis, j, K))
        last = tl.where(vis, j, last)
        if MASK_KIND == MASK_BIAS:
            vis = vis & (bias == 0.0)  # only unbiased columns count (a NaN bias is not 0)
        shown += vis.to(tl.int32)
    first, last, shown = tl.min(first, axis=1), tl.max(last, axis=1), tl.sum(shown, axis=1)
    live = last >= first
    tl.store(hull_start + t, tl.where(live, first, 0), mask=tm)
    tl.store(hull_end + t, tl.where(live, last + 1, 0), mask=tm)
    dense = shown == tl.where(live, last + 1 - first, 0)
    if MASK_KIND == MASK_BOOL:
        flag = dense.to(tl.uint8)
    else:
        flag = tl.where(dense, 0.0, float("nan"))
    tl.store(row_mask + t, flag.to(row_mask.dtype.element_ty), mask=tm)


@triton.jit
def _tile_mask(mask, row_mask, t, tm, stride_mask_t, stride_mask_k, MASK_KIND: tl.constexpr):
    """(pointer, row stride, column stride) a logits tile reads its mask through: when every row
    of the tile is dense, ``row_mask`` with column stride 0 (one cached value per row: True or a
    bias of 0, the loads hit L1), else the mask itself. A pointer select, not a branch: the tile
    loop keeps one body (a branch around the mask load measured slower than the reads it saved)."""
    if MASK_KIND != MASK_NONE:
        if MASK_KIND == MASK_BOOL:
            dense = tl.min((tl.load(row_mask + t, mask=tm, other=1) != 0).to(tl.int32)) != 0
        else:
            dense = tl.min((tl.load(row_mask + t, mask=tm, other=0.0) == 0.0).to(tl.int32)) != 0
        mask = tl.where(dense, row_mask, mask)
        stride_mask_t = tl.where(dense, 1, stride_mask_t)
        stride_mask_k = tl.where(dense, 0, stride_mask_k)
    return mask, stride_mask_t, stride_mask_k


@triton.jit
def hide_kernel(
    out_values,  # [n] fp32, the select's values (contiguous [T, topk] flattened)
    out_indices,  # [n] int32, in place
    mask,  # [T, K] uint8 (a bool mask's bytes) or fp32/bf16/fp16 bias, any strides
    n,
    TOPK,
    stride_mask_t,
    stride_mask_k,
    MASK_KIND: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """out_indices[t, s] = -1 where the mask hides column out_indices[t, s]; only slots whose value
    reads -inf are looked up (the select ranks hidden columns last, as NaN, and returns -inf)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    col = tl.load(out_indices + i, mask=live, other=-1)
    maybe = (tl.load(out_values + i, mask=live, other=0.0) == float("-inf")) & (col >= 0)
    vis, _ = _mask_visible(mask, i // TOPK, col, maybe, stride_mask_t, stride_mask_k, MASK_KIND)
    tl.store(out_indices + i, tl.full((BLOCK,), -1, tl.int32), mask=maybe & ~vis)


@triton.jit
def logits_kernel(
    q,  # [T, H, D] bf16/fp16/fp32/fp8, or MXFP4 codes [T, H, D/2] uint8 (fp8 without native dot: uint8)
    q_scale,  # MXFP4 E8M0 scales [T, H, D/32] uint8 (other formats: unused)
    k,  # [K, D] like q, or MXFP4 codes [K, D/2] uint8
    k_scale,  # MXFP4 scales [K, D/32] uint8, FP8 row scales [K] fp32 (else unused)
    weights,  # [T, H] bf16/fp16/fp32
    k_start,  # [T] int32
    k_end,  # [T] int32
    mask,  # [T, K] uint8 (bool mask bytes) or fp32/bf16/fp16 bias, any strides (MASK_NONE: unused)
    row_mask,  # [T] like mask: mask_hull_kernel's per-row value (MASK_NONE: unused)
    out,  # [rows, >= K] fp32: token t's row is t - row0
    T,
    K,
    H,
    row0,
    stride_q_t,
    stride_q_h,
    stride_q_d,
    stride_q_scale_t,
    stride_q_scale_h,
    stride_k_n,
    stride_k_d,
    stride_k_scale_n,
    stride_weights_t,
    stride_weights_h,
    stride_mask_t,
    stride_mask_k,
    stride_out_t,
    Q_FMT: tl.constexpr,
    K_FMT: tl.constexpr,
    K_ROW_SCALE: tl.constexpr,
    FNUZ: tl.constexpr,
    DOT_DTYPE: tl.constexpr,
    DEC_DTYPE: tl.constexpr,
    ALIGNED: tl.constexpr,
    D: tl.constexpr,
    BLOCK_H: tl.constexpr,  # H rounded up to a power of two
    BLOCK_T: tl.constexpr,
    BLOCK_N: tl.constexpr,
    MASK_KIND: tl.constexpr,
    FILL: tl.constexpr,
):
    """out[t - row0, :] for tokens row0 <= t < T, one program per BLOCK_T tokens: score (+ bias)
    where visible (inside the row's range and shown by the mask); hidden columns of computed
    blocks -inf (FILL) or, with a mask and no FILL (the top-k workspace), NaN with visible NaN
    scores -inf; with FILL, -inf everywhere else (without, the rest is left unwritten). A tile of
    dense rows only (``row_mask``) reads no mask: its ranges are the visible columns, its bias 0."""
    t0 = row0 + tl.program_id(0) * BLOCK_T
    qT, wv = query_tile(q, q_scale, weights, t0, T, H, stride_q_t, stride_q_h, stride_q_d, stride_q_scale_t,
                        stride_q_scale_h, stride_weights_t, stride_weights_h,
                        Q_FMT, FNUZ, BLOCK_T, BLOCK_H, D, DOT_DTYPE, K_FMT == FMT_MXFP4)
    t, tm, s, e, lo, hi = _tile_ranges(k_start, k_end, t0, T, K, BLOCK_T, BLOCK_N)
    row = out + (t - row0).to(tl.int64)[None, :] * stride_out_t
    mask, stride_mask_t, stride_mask_k = _tile_mask(mask, row_mask, t, tm, stride_mask_t, stride_mask_k, MASK_KIND)
    for j0 in range(lo, hi, BLOCK_N):
        blk = _score_block(qT, wv, k, k_scale, j0, K, stride_k_n, stride_k_d, stride_k_scale_n, K_FMT, K_ROW_SCALE,
                           FNUZ, BLOCK_T, BLOCK_H, BLOCK_N, D, DOT_DTYPE, DEC_DTYPE, ALIGNED)
        j = (j0 + tl.arange(0, BLOCK_N))[:, None]
        vis = (j >= s[None, :]) & (j < e[None, :])
        hidden = float("-inf")
        if MASK_KIND != MASK_NONE:
            vis, bias = _mask_visible(mask, t[None, :], j, vis, stride_mask_t, stride_mask_k, MASK_KIND)
            if MASK_KIND == MASK_BIAS:
                blk += bias
            if not FILL:
                blk = tl.where(blk != blk, float("-inf"), blk)
                hidden = float("nan")
        tl.store(row + j, tl.where(vis, blk, hidden), mask=tm[None, :] & (j < K))
    if FILL:
        _fill_outside(row, tm, lo, hi, K, BLOCK_T, BLOCK_N)


@triton.jit
def _fill_outside(row, tm, lo, hi, K, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr):
    """-inf into the columns of a tile outside its computed block span [lo, hi)."""
    hi_blk = tl.maximum(tl.cdiv(hi, BLOCK_N) * BLOCK_N, lo)
    ninf = tl.full((BLOCK_N, BLOCK_T), float("-inf"), tl.float32)
    for j0 in range(0, lo, BLOCK_N):
        j = (j0 + tl.arange(0, BLOCK_N))[:, None]
        tl.store(row + j, ninf, mask=tm[None, :])
    for j0 in range(hi_blk, K, BLOCK_N):
        j = (j0 + tl.arange(0, BLOCK_N))[:, None]
        tl.store(row + j, ninf, mask=tm[None, :] & (j < K))
