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

Top-k (``select_kernel``) over scores staged in a bounded workspace: the launcher walks
the tokens in chunks of C rows, ``logits_kernel`` writes a chunk's C x K fp32 scores into a
workspace no larger than the outputs (the [T, K] logits never exist), then one program per
row finds the k-th largest score by a radix select (BITS-bit digits) over order-preserving uint32
keys (histograms over the row's visible range), compacts the winners (ties at the threshold
go to the lowest columns) and sorts them with a bitonic sort of (key << 32 | ~column) words.
"""
import triton
import triton.language as tl

from .decode import e4m3_bytes_to_f32, f32_to_key, key_to_f32, load_mxfp4_rows, mma_k_cols, mxfp4_rows_mma

FMT_TENSOR = tl.constexpr(0)     # plain floating tensor (bf16 / fp16 / fp32 / native fp8), loaded as is
FMT_MXFP4 = tl.constexpr(1)      # uint8 codes + E8M0 scales, decoded to fp32 in registers
FMT_FP8_BYTES = tl.constexpr(2)  # e4m3 bytes decoded arithmetically (targets without that fp8 flavour)


@triton.jit
def _load_rows(ptr, xptr, off, xoff, mask, sd, FMT: tl.constexpr, FNUZ: tl.constexpr,
               R: tl.constexpr, D: tl.constexpr, cols=None):
    """R rows of D elements starting at element offsets ``off`` (MXFP4 scales at ``xoff``); a
    plain or FP8 row can be read at element columns ``cols`` (int32 [D]) instead of in order."""
    if cols is None:
        cols = tl.arange(0, D)
    if FMT == FMT_MXFP4:
        x = load_mxfp4_rows(ptr, xptr, off, xoff, mask, R, D)
    elif FMT == FMT_FP8_BYTES:
        x = tl.load(ptr + off[:, None] + cols[None, :] * sd, mask=mask[:, None], other=0)
        x = e4m3_bytes_to_f32(x.to(tl.int32), FNUZ)
    else:
        x = tl.load(ptr + off[:, None] + cols[None, :] * sd, mask=mask[:, None], other=0.0)
    return x


@triton.jit
def _query_tile(q, qx, w, t0, T, H, sq_t, sq_h, sq_d, sqx_t, sqx_h, sw_t, sw_h,
                Q_FMT: tl.constexpr, FNUZ: tl.constexpr, BT: tl.constexpr, HP: tl.constexpr,
                D: tl.constexpr, DOT_DTYPE: tl.constexpr, K_ORDER: tl.constexpr):
    """(Q^T [D, BT*HP] in the dot dtype, weights [BT*HP] fp32) for tokens t0 .. t0+BT-1. With
    K_ORDER (MXFP4 keys) row c of Q^T is element ``mma_k_cols(D)[c]``, the keys' column order:
    an MXFP4 query goes through the keys' own decoder (byte loads: it is read once; fp32 then a
    cast: with the decoder's bf16 output feeding tl.trans directly, triton 3.6's sm90
    OptimizeDotOperands folds the permute into an illegal shared layout), a plain one is loaded
    at those columns."""
    r = tl.arange(0, BT * HP)
    t = (t0 + r // HP).to(tl.int64)
    h = r % HP
    m = (t < T) & (h < H)
    off = t * sq_t + h * sq_h
    xoff = t * sqx_t + h * sqx_h
    if K_ORDER and Q_FMT == FMT_MXFP4:
        x = mxfp4_rows_mma(q, qx, off, xoff, m, BT * HP, D, tl.float32, False, DOT_DTYPE)
    elif K_ORDER:
        x = _load_rows(q, qx, off, xoff, m, sq_d, Q_FMT, FNUZ, BT * HP, D, mma_k_cols(D)).to(DOT_DTYPE)
    else:
        x = _load_rows(q, qx, off, xoff, m, sq_d, Q_FMT, FNUZ, BT * HP, D).to(DOT_DTYPE)
    wv = tl.load(w + t * sw_t + h * sw_h, mask=m, other=0.0).to(tl.float32)
    return tl.trans(x), wv


@triton.jit
def _score_rows(qT, wv, kt, row_scale, BT: tl.constexpr, HP: tl.constexpr, BN: tl.constexpr,
                DOT_DTYPE: tl.constexpr):
    """logits^T [BN, BT] fp32 of a decoded key tile ``kt`` [BN, D] (already in the dot dtype):
    sum over each token's HP columns of relu(kt @ qT * row_scale) * w. ``row_scale`` (fp32 [BN],
    FP8 keys) multiplies before the relu; None means 1."""
    if DOT_DTYPE == tl.float32:
        acc = tl.dot(kt, qT, input_precision="ieee")
    else:
        acc = tl.dot(kt, qT)
    if row_scale is not None:
        acc = acc * row_scale[:, None]
    # relu as eager computes it: NaN stays NaN (the default max would map it to 0 on GPUs, not here)
    acc = tl.maximum(acc, 0.0, propagate_nan=tl.PropagateNan.ALL) * wv[None, :]
    return tl.sum(tl.reshape(acc, (BN, BT, HP)), axis=2)


@triton.jit
def _score_block(qT, wv, k, kx, j0, K, sk_k, sk_d, skx_k,
                 K_FMT: tl.constexpr, K_ROW_SCALE: tl.constexpr, FNUZ: tl.constexpr,
                 BT: tl.constexpr, HP: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
                 DOT_DTYPE: tl.constexpr, DEC_DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """logits^T [BN, BT] fp32 for key rows j0 .. j0+BN-1 (rows >= K score 0). MXFP4 keys come in
    the ``mma_k_cols`` column order: Q^T must be in that order too."""
    j = j0 + tl.arange(0, BN)
    jm = j < K
    j64 = j.to(tl.int64)
    if K_FMT == FMT_MXFP4:
        kt = mxfp4_rows_mma(k, kx, j64 * sk_k, j64 * skx_k, jm, BN, D, DEC_DTYPE, ALIGNED, DOT_DTYPE)
    else:
        kt = _load_rows(k, kx, j64 * sk_k, j64 * skx_k, jm, sk_d, K_FMT, FNUZ, BN, D).to(DOT_DTYPE)
    if K_ROW_SCALE:
        blk = _score_rows(qT, wv, kt, tl.load(kx + j64 * skx_k, mask=jm, other=0.0), BT, HP, BN, DOT_DTYPE)
    else:
        blk = _score_rows(qT, wv, kt, None, BT, HP, BN, DOT_DTYPE)
    return blk


@triton.jit
def _tile_ranges(k_start, k_end, t0, T, K, BT: tl.constexpr, BN: tl.constexpr):
    """Per-row [s, e) clamped to [0, K] (empty rows: s=K, e=0) and the tile's block span."""
    t = t0 + tl.arange(0, BT)
    tm = t < T
    s = tl.maximum(tl.load(k_start + t, mask=tm, other=0), 0)
    e = tl.minimum(tl.load(k_end + t, mask=tm, other=0), K)
    live = tm & (e > s)
    s = tl.where(live, s, K)
    e = tl.where(live, e, 0)
    lo = (tl.min(s) // BN) * BN
    hi = tl.max(e)
    return t, tm, s, e, lo, hi


@triton.jit
def logits_kernel(q, qx, k, kx, w, k_start, k_end, out, T, K, H, row0,
                  sq_t, sq_h, sq_d, sqx_t, sqx_h, sk_k, sk_d, skx_k, sw_t, sw_h, so_t,
                  Q_FMT: tl.constexpr, K_FMT: tl.constexpr, K_ROW_SCALE: tl.constexpr,
                  FNUZ: tl.constexpr, DOT_DTYPE: tl.constexpr, DEC_DTYPE: tl.constexpr, ALIGNED: tl.constexpr,
                  D: tl.constexpr,
                  HP: tl.constexpr, BT: tl.constexpr, BN: tl.constexpr, FILL: tl.constexpr):
    """out[t - row0, :] for tokens row0 <= t < T, one program per BT tokens: scores inside each
    row's range; with FILL, -inf elsewhere (without, masked columns are left unwritten)."""
    t0 = row0 + tl.program_id(0) * BT
    qT, wv = _query_tile(q, qx, w, t0, T, H, sq_t, sq_h, sq_d, sqx_t, sqx_h, sw_t, sw_h,
                         Q_FMT, FNUZ, BT, HP, D, DOT_DTYPE, K_FMT == FMT_MXFP4)
    t, tm, s, e, lo, hi = _tile_ranges(k_start, k_end, t0, T, K, BT, BN)
    row = out + (t - row0).to(tl.int64)[None, :] * so_t
    for j0 in range(lo, hi, BN):
        blk = _score_block(qT, wv, k, kx, j0, K, sk_k, sk_d, skx_k, K_FMT, K_ROW_SCALE, FNUZ,
                           BT, HP, BN, D, DOT_DTYPE, DEC_DTYPE, ALIGNED)
        j = (j0 + tl.arange(0, BN))[:, None]
        vis = (j >= s[None, :]) & (j < e[None, :])
        tl.store(row + j, tl.where(vis, blk, float("-inf")), mask=tm[None, :] & (j < K))
    if FILL:
        _fill_outside(row, tm, lo, hi, K, BT, BN)


@triton.jit
def _fill_outside(row, tm, lo, hi, K, BT: tl.constexpr, BN: tl.constexpr):
    """-inf into the columns of a tile outside its computed block span [lo, hi)."""
    hi_blk = tl.maximum(tl.cdiv(hi, BN) * BN, lo)
    ninf = tl.full((BN, BT), float("-inf"), tl.float32)
    for j0 in range(0, lo, BN):
        j = (j0 + tl.arange(0, BN))[:, None]
        tl.store(row + j, ninf, mask=tm[None, :])
    for j0 in range(hi_blk, K, BN):
        j = (j0 + tl.arange(0, BN))[:, None]
        tl.store(row + j, ninf, mask=tm[None, :] & (j < K))


@triton.jit
def select_row(src, s, e, out_v, out_i, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, CH: tl.constexpr,
               SORTED: tl.constexpr = True, src_idx=None, BITS: tl.constexpr = 8,
               EARLY_EXIT: tl.constexpr = True):
    """Top-TOPK of src[s:e] (fp32, columns s..e-1) into out_v/out_i[0:TOPK], sorted descending.

    ``src_idx`` (int32, same positions as ``src``) replaces the column number written to out_i
    (a merge of candidate lists); ties still go to the lower position, so positions must be in
    ascending index order among equal scores. Without SORTED the min(TOPK, e - s) winners are
    left in ascending position order, values as loaded (NaN kept), and nothing else is written
    (no sort, no padding).

    Radix select, most significant digit first: up to 32/BITS passes of 2**BITS-bin histograms
    over uint32 keys find the threshold prefix ``thr`` (the top ``nbits`` bits) and how many
    elements with that prefix to keep (``need``). With EARLY_EXIT the passes stop once every
    element with the prefix is needed (its bin count == need): lower digits cannot change the
    set, so the output is the same. Then one compaction pass and a bitonic sort of the <= TOPK
    winners. Slots past the visible count get -inf / -1. On the H200 ``tl.histogram`` cost grew
    with the bin count (4096 rows: 4 x 256 bins 293 us, 4 x 1024 bins 1.4 ms); 8 passes of 4-bit
    one-hot counts (no histogram) measured 1.8x slower than 8-bit histograms.
    """
    NBINS: tl.constexpr = 1 << BITS
    n = e - s
    thr = tl.zeros((), tl.uint32)  # the threshold prefix, in the top nbits bits of a key
    need = tl.zeros((), tl.int32)
    nbits = tl.full((), 32, tl.int32)  # n <= TOPK: all 32, thr 0 (every key is > 0: all are taken)
    ones = tl.full((), 0xFFFFFFFF, tl.uint32)
    bins = tl.arange(0, NBINS)
    if n > TOPK:
        need += TOPK
        nbits = tl.zeros((), tl.int32)
        done = tl.zeros((), tl.int32)
        while done == 0:
            shift = 32 - BITS - nbits
            fixed = ones ^ (ones >> nbits.to(tl.uint32))  # the top nbits bits
            hist = tl.zeros((NBINS,), tl.int32)
            for c0 in range(s, e, CH):
                cols = c0 + tl.arange(0, CH)
                key = f32_to_key(tl.load(src + cols, mask=cols < e, other=0.0))
                m = (cols < e) & ((key & fixed) == thr)
                hist += tl.histogram(((key >> shift.to(tl.uint32)) & (NBINS - 1)).to(tl.int32), NBINS, mask=m)
            at_least = tl.cumsum(hist, 0, reverse=True)
            digit = tl.max(tl.where(at_least >= need, bins, 0), 0)
            need -= tl.sum(tl.where(bins > digit, hist, 0), 0)
            thr = thr | (digit.to(tl.uint32) << shift.to(tl.uint32))
            nbits += BITS
            # stop at the last digit, or once every element of the threshold bin is needed
            # (lower digits cannot change the set then)
            whole_bin = tl.sum(tl.where(bins == digit, hist, 0), 0) == need
            done = ((nbits == 32) | (EARLY_EXIT & whole_bin)).to(tl.int32)
    # keys compared on their top nbits (all 32 unless the passes stopped early)
    low = (32 - nbits).to(tl.uint32)
    hi_mask = (ones >> low) << low
    taken = tl.zeros((), tl.int32)
    eq_seen = tl.zeros((), tl.int32)
    for c0 in range(s, e, CH):
        cols = c0 + tl.arange(0, CH)
        m = cols < e
        x = tl.load(src + cols, mask=m, other=0.0)
        key = f32_to_key(x) & hi_mask
        eq = m & (key == thr)
        eq_rank = eq_seen + tl.cumsum(eq.to(tl.int32), 0) - 1
        take = (m & (key > thr)) | (eq & (eq_rank < need))
        pos = taken + tl.cumsum(take.to(tl.int32), 0) - 1
        if src_idx is not None:
            idx = tl.load(src_idx + cols, mask=take, other=-1)
        else:
            idx = cols
        tl.store(out_v + pos, x, mask=take & (pos < TOPK))  # NaN kept: its key ranks it (the sort reads -inf)
        tl.store(out_i + pos, idx, mask=take & (pos < TOPK))
        taken += tl.sum(take.to(tl.int32), 0)
        eq_seen += tl.sum(eq.to(tl.int32), 0)
    if SORTED:
        _sort_winners(out_v, out_i, taken, TOPK, TOPK_P2)


@triton.jit
def _sort_winners(out_v, out_i, taken, TOPK: tl.constexpr, TOPK_P2: tl.constexpr):
    """Sort the ``taken`` winners in out_v/out_i descending (ties: lower index first); pad to TOPK."""
    tl.debug_barrier()
    p = tl.arange(0, TOPK_P2)
    valid = p < taken
    v = tl.load(out_v + p, mask=valid, other=0.0)
    i = tl.load(out_i + p, mask=valid, other=0)
    word = (f32_to_key(v).to(tl.uint64) << 32) | (i.to(tl.uint32) ^ 0xFFFFFFFF).to(tl.uint64)
    word = tl.where(valid, word, 0)
    word = tl.sort(word, 0, descending=True)
    v = key_to_f32((word >> 32).to(tl.uint32))
    i = ((word & 0xFFFFFFFF).to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int32)
    ok = p < taken
    tl.debug_barrier()
    tl.store(out_v + p, tl.where(ok, v, float("-inf")), mask=p < TOPK)
    tl.store(out_i + p, tl.where(ok, i, -1), mask=p < TOPK)


@triton.jit
def select_kernel(ws, k_start, k_end, out_v, out_i, row0, T, K, s_ws,
                  TOPK: tl.constexpr, TOPK_P2: tl.constexpr, CH: tl.constexpr, BITS: tl.constexpr):
    """Top-k of the staged scores ws[t - row0, k_start[t]:k_end[t]] for one token t per program."""
    t = row0 + tl.program_id(0)
    if t < T:
        s = tl.maximum(tl.load(k_start + t), 0)
        e = tl.maximum(tl.minimum(tl.load(k_end + t), K), s)
        select_row(ws + tl.program_id(0).to(tl.int64) * s_ws, s, e,
                   out_v + t.to(tl.int64) * TOPK, out_i + t.to(tl.int64) * TOPK, TOPK, TOPK_P2, CH, BITS=BITS)
