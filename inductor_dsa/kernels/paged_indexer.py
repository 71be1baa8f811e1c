"""Triton kernels for the paged (decode) DSA indexer: docs/semantics.md (the paged cache).

    logits[b, n, j] = sum_h w[b, n, h] * relu(q[b, n, h, :] . key_b[j, :])   for j < context_lens[b]

key_b[j] is row ``j % 64`` of page ``block_table[b, j // 64]`` of a uint8 cache laid out as in
``formats.py`` (MXFP4: 64 x D/2 code bytes then 64 x D/32 E8M0 bytes per page; FP8: 64 x D e4m3
bytes then 64 x 4 fp32-scale bytes). Every query token of a request sees the same rows.

Score block (all kernels): a program holds the NT query tokens of one request with all their
heads, Q^T [D, NT*HP] (the prefill ``query_tile``), and streams blocks of BN key rows (BN divides
the 64-row page, so one block-table read per block, prefetched a block ahead), loads the rows'
bytes straight from their page, decodes them in registers (MXFP4: ``decode.mxfp4_rows_mma``, whose
permuted columns Q^T follows; FP8: e4m3 -> bf16 with the fp32 row scale after the dot) and runs
the prefill ``score_rows`` epilogue (dot, relu, x weights, head sum). No dense
key copy, no [B, H, L] scores. Page ids outside [0, num_pages) and rows at or past
``clamp(context_lens[b], 0, max_len)`` are never loaded (masked loads; such a page id inside the
context reads as a zero row, score 0), so no data value can cause an out-of-bounds access.

Top-k. Work items are (request, token group, sequence chunk of C rows); a request's rows are
split into S chunks so that B x S items fill the GPU even at B = 1. The launcher runs the items in
waves of at most P (P = multiprocessors x progs_per_sm); per wave

  ``paged_scores_kernel`` (one program per item) writes the chunk's NT x C scores into workspace
    slot p of the wave (P x NT x C fp32 in all, L2-sized; the [B, N, L] logits never exist);
  ``paged_select_kernel`` (one program per item and token) runs the prefill ``select_row`` radix
    select over the chunk. With S = 1 it writes the final sorted, padded top-k. With S > 1 it
    keeps the chunk's top min(topk, C) unsorted, in row order, in a partial list, and adds an
    11-bit histogram of the list's keys to the row's global histogram (int atomics: deterministic).

Scores and selection are separate kernels: the score loop wants registers (decode + dot), the
select is latency-bound and wants many light programs; fused (one persistent kernel, as first
written) the gfx942 build spilled ~230 SGPRs. After the last wave, when S > 1:

  ``paged_filter_kernel`` (one program per list): the row's threshold bin T is the largest bin
    with at least topk list entries at or above it; every final winner lies in bins >= T. The list
    keeps only those entries, compacted in place, in row order, and records their count;
  ``paged_final_kernel`` (one program per token): concatenates the filtered lists (row order is
    preserved, so position order is row order) and runs ``select_row`` over those candidates with
    their row numbers as ``src_idx``: typically topk plus one bin's worth instead of S x topk.

Ties: each select keeps the lowest rows among equal scores and the final sort orders ties by
row, so the result equals a stable descending sort (the oracle), whatever the split.
"""
import triton
import triton.language as tl

from .decode import FMT_FP8_NATIVE, FMT_MXFP4, e4m3_bytes_to_f32, mxfp4_rows_mma
from .indexer import query_tile, score_rows
from .select import sel_key, select_row

PAGE = tl.constexpr(64)
HIST_BINS = tl.constexpr(2048)  # histogram of the top 11 bits of the order-preserving key
HIST_SHIFT = tl.constexpr(21)


@triton.jit
def _page_id(bt_row, j0, jend):
    """Block-table entry of row j0 (-1 when j0 >= jend: never read past the context)."""
    return tl.load(bt_row + j0 // 64, mask=j0 < jend, other=-1)  # literal 64: j0 may be a Python int


@triton.jit
def _page_rows(page, j0, jend, num_pages, skv, BN: tl.constexpr):
    """Rows j0 .. j0+BN-1 of one page (BN divides 64, j0 a multiple of BN): (valid mask [BN],
    int64 byte offset of the page, row within the page [BN]). The page id is one scalar per
    block (a per-row lookup became 16 serialised scalar loads per block on gfx942)."""
    r = j0 % 64 + tl.arange(0, BN)
    live = (page >= 0) & (page < num_pages)
    base = tl.where(live, page, 0).to(tl.int64) * skv
    ok = (j0 + tl.arange(0, BN) < jend) & live
    return ok, base, r


@triton.jit
def _paged_block(qT, wv, kv, page, j0, jend, num_pages, skv,
                 K_FMT: tl.constexpr, FNUZ: tl.constexpr, FP8_DTYPE: tl.constexpr,
                 NT: tl.constexpr, HP: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
                 DOT_DTYPE: tl.constexpr, DEC_DTYPE: tl.constexpr, ALIGNED: tl.constexpr):
    """logits^T [BN, NT] of request-local rows j0 .. j0+BN-1, all in one page (rows >= jend score 0)."""
    ok, base, r = _page_rows(page, j0, jend, num_pages, skv, BN)
    if K_FMT == FMT_MXFP4:
        kt = mxfp4_rows_mma(kv, kv, base + r * (D // 2), base + PAGE * (D // 2) + r * (D // 32), ok, BN, D,
                            DEC_DTYPE, ALIGNED, DOT_DTYPE)
        blk = score_rows(qT, wv, kt, None, NT, HP, BN, DOT_DTYPE)
    else:
        x = tl.load(kv + (base + r * D)[:, None] + tl.arange(0, D)[None, :], mask=ok[:, None], other=0)
        if K_FMT == FMT_FP8_NATIVE:
            kt = x.to(FP8_DTYPE, bitcast=True).to(DOT_DTYPE)
        else:
            kt = e4m3_bytes_to_f32(x.to(tl.int32), FNUZ).to(DOT_DTYPE)
        sb = tl.arange(0, 4)
        sbytes = tl.load(kv + (base + PAGE * D + r * 4)[:, None] + sb[None, :], mask=ok[:, None], other=0)
        bits = tl.sum(sbytes.to(tl.int32) << (8 * sb)[None, :], axis=1)  # little-endian fp32, any alignment
        blk = score_rows(qT, wv, kt, bits.to(tl.float32, bitcast=True), NT, HP, BN, DOT_DTYPE)
    return blk


@triton.jit
def _request_queries(q, qx, w, t0, T, H: tl.constexpr, Q_FMT: tl.constexpr, K_FMT: tl.constexpr,
                     FNUZ: tl.constexpr, NT: tl.constexpr, HP: tl.constexpr, D: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """``query_tile`` for contiguous q [B*N, H, D] (MXFP4: codes [.., D/2], scales [.., D/32])
    and weights [B*N, H]: fewer runtime strides, fewer scalar registers. With MXFP4 keys, Q^T's
    rows are in the keys' ``mma_k_cols`` order."""
    if Q_FMT == FMT_MXFP4:
        qT, wv = query_tile(q, qx, w, t0, T, H, H * (D // 2), D // 2, 1, H * (D // 32), D // 32, H, 1,
                             Q_FMT, FNUZ, NT, HP, D, DOT_DTYPE, K_FMT == FMT_MXFP4)
    else:
        qT, wv = query_tile(q, qx, w, t0, T, H, H * D, D, 1, 0, 0, H, 1, Q_FMT, FNUZ, NT, HP, D, DOT_DTYPE,
                             K_FMT == FMT_MXFP4)
    return qT, wv


@triton.jit
def _request(context_lens, b, max_pages):
    """clamp(context_lens[b], 0, max_pages * 64)."""
    return tl.minimum(tl.maximum(tl.load(context_lens + b), 0), max_pages * PAGE)


@triton.jit
def paged_scores_kernel(q, qx, w, kv, block_table, context_lens, dst,
                        N, G, S, C, it0, n_items, max_pages, num_pages, skv, H: tl.constexpr,
                        Q_FMT: tl.constexpr, K_FMT: tl.constexpr, FNUZ: tl.constexpr,
                        FP8_DTYPE: tl.constexpr, DOT_DTYPE: tl.constexpr, DEC_DTYPE: tl.constexpr, D: tl.constexpr,
                        HP: tl.constexpr, NT: tl.constexpr, BN: tl.constexpr, TO_WS: tl.constexpr,
                        ALIGNED: tl.constexpr):
    """Scores of work item it0 + pid = (b, g, s): rows [s*C, (s+1)*C) of request b for its NT
    query tokens g*NT ... With TO_WS they go to workspace slot pid, dst[pid, t, j - s*C] (rows at
    or past the context are left unwritten); else to the logits dst[b*N + n, j] ([B*N, max_len]),
    -inf at rows >= context_lens[b]."""
    pid = tl.program_id(0)
    it = it0 + pid
    if it < n_items:
        s = it % S
        g = (it // S) % G
        b = it // (S * G)
        max_len = max_pages * PAGE
        ctx = _request(context_lens, b, max_pages)
        c0 = s * C
        c1 = tl.minimum(c0 + C, ctx)
        n0 = g * NT
        tt = tl.arange(0, NT)
        if TO_WS:
            out = dst + (pid * NT + tt).to(tl.int64)[None, :] * C - c0
            tm = tt >= 0
        else:
            out = dst + (b * N + n0 + tt).to(tl.int64)[None, :] * max_len
            tm = (n0 + tt) < N
        if c1 > c0:
            qT, wv = _request_queries(q, qx, w, b * N + n0, b * N + tl.minimum(N, n0 + NT), H,
                                      Q_FMT, K_FMT, FNUZ, NT, HP, D, DOT_DTYPE)
            bt_row = block_table + b.to(tl.int64) * max_pages
            page = _page_id(bt_row, c0, c1)
            for j0 in range(c0, c1, BN):
                nxt = _page_id(bt_row, j0 + BN, c1)  # prefetched one block ahead
                blk = _paged_block(qT, wv, kv, page, j0, c1, num_pages, skv,
                                   K_FMT, FNUZ, FP8_DTYPE, NT, HP, BN, D, DOT_DTYPE, DEC_DTYPE, ALIGNED)
                j = (j0 + tl.arange(0, BN))[:, None]
                tl.store(out + j, blk, mask=tm[None, :] & (j < c1))
                page = nxt
        if not TO_WS:
            end = tl.minimum(c0 + C, max_len)
            ninf = tl.full((BN, NT), float("-inf"), tl.float32)
            for j0 in range(tl.maximum(c0, ctx), end, BN):
                j = (j0 + tl.arange(0, BN))[:, None]
                tl.store(out + j, ninf, mask=tm[None, :] & (j < end))


@triton.jit
def paged_select_kernel(ws, context_lens, part_v, part_i, hist, N, G, S, C, it0, n_items, max_pages,
                        NT: tl.constexpr, KP: tl.constexpr, KP_P2: tl.constexpr, CH: tl.constexpr,
                        SPLIT: tl.constexpr, BITS: tl.constexpr):
    """One program per (work item it0 + pid // NT, token pid % NT) of a wave: top-KP of the chunk's
    scores in workspace slot pid // NT into part[(b*N + n) * S + s] (KP slots). Without SPLIT
    (S == 1) part is the final sorted, padded output; with SPLIT the list is unsorted, in row
    order, min(KP, rows) long, and its key histogram is added to hist[b*N + n]."""
    pid = tl.program_id(0)
    it = it0 + pid // NT
    t = pid % NT
    if it < n_items:
        s = it % S
        g = (it // S) % G
        b = it // (S * G)
        n = g * NT + t
        if n < N:
            ctx = _request(context_lens, b, max_pages)
            c0 = s * C
            c1 = tl.maximum(tl.minimum(c0 + C, ctx), c0)
            row = (b * N + n).to(tl.int64)
            dst = (row * S + s) * KP
            # S = 1 resolves every digit: with the early exit ptxas spills 8 B here on sm90
            select_row(ws + pid.to(tl.int64) * C - c0, c0, c1, part_v + dst, part_i + dst, KP, KP_P2, CH,
                       not SPLIT, BITS=BITS, EARLY_EXIT=SPLIT)
            if SPLIT:
                tl.debug_barrier()
                p = tl.arange(0, KP_P2)
                m = p < tl.minimum(c1 - c0, KP)
                key = sel_key(tl.load(part_v + dst + p, mask=m, other=0.0))
                h = tl.histogram((key >> HIST_SHIFT).to(tl.int32), HIST_BINS, mask=m)
                bins = tl.arange(0, HIST_BINS)
                tl.atomic_add(hist + row * HIST_BINS + bins, h, mask=h > 0, sem="relaxed")


@triton.jit
def _threshold_bin(hist, row, TOPK):
    """Largest bin T with at least TOPK counted keys in bins >= T (0 when there are fewer)."""
    bins = tl.arange(0, HIST_BINS)
    h = tl.load(hist + row * HIST_BINS + bins)
    at_least = tl.cumsum(h, 0, reverse=True)
    return tl.max(tl.where(at_least >= TOPK, bins, 0), 0)


@triton.jit
def paged_filter_kernel(part_v, part_i, hist, cnt, context_lens, N, S, C, max_pages, TOPK,
                        KP: tl.constexpr, KP_P2: tl.constexpr):
    """One program per partial list (row, s): keep the entries in bins >= the row's threshold bin,
    compacted in place in row order; cnt[row * S + s] = how many."""
    pid = tl.program_id(0)
    s = pid % S
    row = pid // S
    ctx = _request(context_lens, row // N, max_pages)
    n_real = tl.minimum(tl.maximum(tl.minimum(ctx - s * C, C), 0), KP)
    thr = _threshold_bin(hist, row.to(tl.int64), TOPK)
    p = tl.arange(0, KP_P2)
    m = p < n_real
    base = pid.to(tl.int64) * KP
    v = tl.load(part_v + base + p, mask=m, other=0.0)
    i = tl.load(part_i + base + p, mask=m, other=0)
    keep = m & ((sel_key(v) >> HIST_SHIFT).to(tl.int32) >= thr)
    pos = tl.cumsum(keep.to(tl.int32), 0) - 1
    tl.debug_barrier()  # every load above happens before any in-place store below
    tl.store(part_v + base + pos, v, mask=keep)
    tl.store(part_i + base + pos, i, mask=keep)
    tl.store(cnt + pid, tl.sum(keep.to(tl.int32), 0))


@triton.jit
def paged_final_kernel(part_v, part_i, cnt, cand_v, cand_i, out_v, out_i, S,
                       KP: tl.constexpr, TOPK: tl.constexpr, TOPK_P2: tl.constexpr, CH: tl.constexpr,
                       S_P2: tl.constexpr, WC: tl.constexpr, BITS: tl.constexpr):
    """One program per token row: concatenate its S filtered lists (row order kept) into
    cand[row] and select the final sorted, padded top-TOPK from them."""
    row = tl.program_id(0).to(tl.int64)
    sl = tl.arange(0, S_P2)
    c = tl.load(cnt + row * S + sl, mask=sl < S, other=0)
    off = tl.cumsum(c, 0) - c
    total = tl.sum(c, 0)
    src = row * S * KP
    for i0 in range(0, tl.max(c, 0), WC):
        i = i0 + tl.arange(0, WC)
        m = i[None, :] < c[:, None]
        pv = tl.load(part_v + src + sl[:, None] * KP + i[None, :], mask=m, other=0.0)
        pi = tl.load(part_i + src + sl[:, None] * KP + i[None, :], mask=m, other=0)
        tl.store(cand_v + src + off[:, None] + i[None, :], pv, mask=m)
        tl.store(cand_i + src + off[:, None] + i[None, :], pi, mask=m)
    tl.debug_barrier()
    select_row(cand_v + src, 0, total, out_v + row * TOPK, out_i + row * TOPK, TOPK, TOPK_P2, CH,
               True, cand_i + src, BITS)


@triton.jit
def paged_gather_kernel(kv, block_table, context_lens, cu, out_a, out_s, total_rows, max_pages, num_pages,
                        sbt, skv, A: tl.constexpr, SB: tl.constexpr, GR: tl.constexpr):
    """Raw cache rows of request b, rows j < ctx, to flat row cu[b] + j (< total_rows): payload
    bytes [A] to out_a, scale bytes [SB] to out_s. Grid (B, cdiv(max_len, GR)). Rows of
    out-of-range pages are written as zeros."""
    b = tl.program_id(0)
    j0 = tl.program_id(1) * GR
    ctx = _request(context_lens, b, max_pages)
    if j0 < ctx:
        j = j0 + tl.arange(0, GR)
        ok, base, r = _page_rows(_page_id(block_table + b.to(tl.int64) * sbt, j0, ctx), j0, ctx, num_pages, skv, GR)
        dst = tl.load(cu + b).to(tl.int64) + j
        dm = (j < ctx) & (dst < total_rows)
        a = tl.arange(0, A)[None, :]
        x = tl.load(kv + (base + r * A)[:, None] + a, mask=ok[:, None], other=0)
        tl.store(out_a + dst[:, None] * A + a, x, mask=dm[:, None])
        sc = tl.arange(0, SB)[None, :]
        y = tl.load(kv + (base + PAGE * A + r * SB)[:, None] + sc, mask=ok[:, None], other=0)
        tl.store(out_s + dst[:, None] * SB + sc, y, mask=dm[:, None])


@triton.jit
def paged_check_kernel(block_table, context_lens, bad, sbt, sbp, sctx, max_len, num_pages, BLOCK: tl.constexpr):
    """Value check counts, one program per request b (``checks.paged_values``): bad[0] += 1 when
    context_lens[b] is outside [0, max_len]; bad[1] += the entries block_table[b, p],
    p < cdiv(clamp(context_lens[b], 0, max_len), 64), outside [0, num_pages). bad is int32 [2], zeroed."""
    b = tl.program_id(0).to(tl.int64)
    ctx = tl.load(context_lens + b * sctx)
    tl.atomic_add(bad, ((ctx < 0) | (ctx > max_len)).to(tl.int32))
    used = (tl.minimum(tl.maximum(ctx, 0), max_len) + PAGE - 1) // PAGE
    n = tl.zeros((), dtype=tl.int32)
    for p0 in range(0, used, BLOCK):
        p = p0 + tl.arange(0, BLOCK)
        page = tl.load(block_table + b * sbt + p.to(tl.int64) * sbp, mask=p < used, other=0)
        n += tl.sum(((page < 0) | (page >= num_pages)).to(tl.int32))
    tl.atomic_add(bad + 1, n)
