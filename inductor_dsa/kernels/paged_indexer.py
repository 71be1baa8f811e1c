"""Triton kernels for the paged (decode) DSA indexer: docs/semantics.md (the paged cache).

    logits[b, n, j] = sum_h w[b, n, h] * relu(q[b, n, h, :] . key_b[j, :])   for j < context_lens[b]

key_b[j] is row ``j % 64`` of page ``block_table[b, j // 64]`` of a uint8 cache laid out as in
``formats.py`` (MXFP4: 64 x D/2 code bytes then 64 x D/32 E8M0 bytes per page; FP8: 64 x D e4m3
bytes then 64 x 4 fp32-scale bytes). Every query token of a request sees the same rows.

Score block (all kernels): a program holds the BLOCK_T query tokens of one request with all their
heads (padded to BLOCK_H), Q^T [D, BLOCK_T*BLOCK_H] (the prefill ``query_tile``), and streams
blocks of BLOCK_N key rows (BLOCK_N divides the 64-row page, so one block-table read per block,
prefetched a block ahead), loads the rows' bytes straight from their page, decodes them in
registers (MXFP4: ``decode.mxfp4_rows_mma``, whose permuted columns Q^T follows; FP8: e4m3 -> bf16
with the fp32 row scale after the dot) and runs the prefill ``score_rows`` epilogue (dot, relu,
x weights, head sum). No dense key copy, no [B, H, L] scores. Page ids outside [0, num_pages) and rows at or past
``clamp(context_lens[b], 0, max_len)`` are never loaded (masked loads; such a page id inside the
context reads as a zero row, score 0), so no data value can cause an out-of-bounds access.

Top-k. Work items are (request, token group, sequence chunk of C rows); a request's rows are
split into S chunks so that B x S items fill the GPU even at B = 1. The launcher runs the items in
waves of at most P (P = multiprocessors x progs_per_sm). With S > 1 it first zeroes an 11-bit
key histogram per token row (``select_hist.zero_kernel``; kernels/select_hist.py holds the
histogram select); then per wave

  ``paged_scores_kernel`` (SUB programs per item, several when the items fill at most half a
    wave: a small batch) writes the chunk's BLOCK_T x C scores into workspace slot p of the wave
    (P x BLOCK_T x C fp32 in all, L2-sized; the [B, N, L] logits never exist) and, with S > 1,
    counts each score in its row's histogram (int atomics: deterministic);
  ``paged_select_kernel`` (one program per item and token): with S = 1 the prefill ``select_row``
    radix select writes the final sorted, padded top-k. With S > 1 the row's threshold bin T (the
    bin of its k-th largest key, from the histogram) bounds the winners: one pass copies the
    chunk's scores in bins >= T, in row order, into its partial list (typically k/S plus a bin's
    worth), falling back to the chunk's exact top min(k, C) when more than that many pass
    (``select_hist.chunk_list``).

Scores and selection are separate kernels: the score loop wants registers (decode + dot), the
select is latency-bound and wants many light programs; fused (one persistent kernel, as first
written) the gfx942 build spilled ~230 SGPRs. After the last wave, when S > 1:

  ``select_hist.list_merge_kernel`` (one program per token): concatenates the partial lists (row
    order is preserved, so position order is row order) and runs ``select_row`` over those
    candidates with their row numbers as indices: typically k plus one bin's worth instead of S x k
    (in one-wave plans about k: the fine cut). For at most ``PagedConfig.rank_rows`` token rows
    ``select_hist.list_rank_kernel`` replaces it: the select packs each list per row and many
    programs place the packed entries at or above the fine cut by rank.

Ties: each select keeps the lowest rows among equal scores and the final sort orders ties by
row, so the result equals a stable descending sort (the oracle), whatever the split.
"""
import triton
import triton.language as tl

from .decode import FMT_FP8_NATIVE, FMT_MXFP4, e4m3_bytes_to_f32, mxfp4_rows_mma
from .indexer import query_tile, score_rows
from .select import sel_key, select_row
from .select_hist import HIST_BINS, HIST_SHIFT, RANK_STATE, chunk_list, rank_arrive

PAGE = tl.constexpr(64)


@triton.jit
def _page_id(bt_row, j0, jend):
    """Block-table entry of row j0 (-1 when j0 >= jend: never read past the context)."""
    return tl.load(bt_row + j0 // 64, mask=j0 < jend, other=-1)  # literal 64: j0 may be a Python int


@triton.jit
def _page_rows(page, j0, jend, num_pages, stride_page, BLOCK_N: tl.constexpr):
    """Rows j0 .. j0+BLOCK_N-1 of one page (BLOCK_N divides 64, j0 a multiple of BLOCK_N):
    (valid mask [BLOCK_N], int64 byte offset of the page, row within the page [BLOCK_N]). The page id is one
    scalar per block (a per-row lookup became 16 serialised scalar loads per block on gfx942)."""
    r = j0 % 64 + tl.arange(0, BLOCK_N)
    live = (page >= 0) & (page < num_pages)
    base = tl.where(live, page, 0).to(tl.int64) * stride_page
    ok = (j0 + tl.arange(0, BLOCK_N) < jend) & live
    return ok, base, r


@triton.jit
def _table_rows(kv_cache, table, base, r, ok, BLOCK_N: tl.constexpr, D: tl.constexpr):
    """fp32 [BLOCK_N, D] MXFP4 rows decoded through a 16-entry table, natural column order:
    k[d] = fp32(table[nibble d] * 2^(s - 127)) (one fp32 rounding; 2^-127 as its subnormal),
    nibble 2i / 2i + 1 the low / high half of code byte i; rows not ``ok`` are 0."""
    codes = tl.load(kv_cache + (base + r * (D // 2))[:, None] + tl.arange(0, D // 2)[None, :], mask=ok[:, None],
                    other=0).to(tl.int32)
    vals = tl.load(table + tl.reshape(tl.join(codes & 15, codes >> 4), (BLOCK_N, D)))
    s = tl.load(kv_cache + (base + PAGE * (D // 2) + r * (D // 32))[:, None] + tl.arange(0, D // 32)[None, :],
                mask=ok[:, None], other=127).to(tl.int32)
    bits = tl.where(s == 0, 0x00400000, tl.where(s == 255, 0x7FC00000, s << 23))  # 255: NaN (E8M0)
    k = tl.reshape(vals, (BLOCK_N, D // 32, 32)) * bits.to(tl.float32, bitcast=True)[:, :, None]
    return tl.where(ok[:, None], tl.reshape(k, (BLOCK_N, D)), 0.0)


@triton.jit
def _paged_block(qT, qT_mid, qT_lo, wv, kv_cache, table, page, j0, jend, num_pages, stride_page,
                 K_FMT: tl.constexpr, K_TABLE: tl.constexpr, FNUZ: tl.constexpr, FP8_DTYPE: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr,
                 DOT_DTYPE: tl.constexpr, DEC_DTYPE: tl.constexpr, ALIGNED: tl.constexpr, Q_PARTS: tl.constexpr):
    """logits^T [BLOCK_N, BLOCK_T] of request-local rows j0 .. j0+BLOCK_N-1, all in one page
    (rows >= jend score 0), for the query tile (qT, qT_mid, qT_lo) and head weights wv of
    ``_request_queries``. K_TABLE: MXFP4 codes decoded through ``table`` (``_table_rows``); the
    fp32 keys are split into three bf16 parts (``split_query``) so the dots stay fp32-accurate."""
    ok, base, r = _page_rows(page, j0, jend, num_pages, stride_page, BLOCK_N)
    if K_TABLE:
        k_hi, k_mid, k_lo = split_query(_table_rows(kv_cache, table, base, r, ok, BLOCK_N, D), 3, DOT_DTYPE)
        blk = score_rows(qT, wv, k_hi, None, BLOCK_T, BLOCK_H, BLOCK_N, DOT_DTYPE, qT_mid, qT_lo, k_mid, k_lo,
                         Q_PARTS, 3)
    elif K_FMT == FMT_MXFP4:
        kt = mxfp4_rows_mma(kv_cache, kv_cache, base + r * (D // 2), base + PAGE * (D // 2) + r * (D // 32), ok,
                            BLOCK_N, D, DEC_DTYPE, ALIGNED, DOT_DTYPE, SCALE_WORDS=True)
        blk = score_rows(qT, wv, kt, None, BLOCK_T, BLOCK_H, BLOCK_N, DOT_DTYPE, qT_mid, qT_lo, None, None, Q_PARTS)
    else:
        x = tl.load(kv_cache + (base + r * D)[:, None] + tl.arange(0, D)[None, :], mask=ok[:, None], other=0)
        if K_FMT == FMT_FP8_NATIVE:
            kt = x.to(FP8_DTYPE, bitcast=True).to(DOT_DTYPE)
        else:
            kt = e4m3_bytes_to_f32(x.to(tl.int32), FNUZ).to(DOT_DTYPE)
        if ALIGNED:  # the row's fp32 scale as one word (not 4 bytes and a sum); consumed after the dot
            words = kv_cache.to(tl.pointer_type(tl.uint32), bitcast=True)
            bits = tl.load(words + (base + PAGE * D + r * 4) // 4, mask=ok, other=0)
        else:
            sb = tl.arange(0, 4)
            sbytes = tl.load(kv_cache + (base + PAGE * D + r * 4)[:, None] + sb[None, :], mask=ok[:, None], other=0)
            bits = tl.sum(sbytes.to(tl.int32) << (8 * sb)[None, :], axis=1)  # little-endian fp32, any alignment
        blk = score_rows(qT, wv, kt, bits.to(tl.float32, bitcast=True), BLOCK_T, BLOCK_H, BLOCK_N, DOT_DTYPE,
                         qT_mid, qT_lo, None, None, Q_PARTS)
    return blk


@triton.jit
def _bf16_head(x):
    """x (fp32) with its low 16 bits cleared: a bf16 value, exact, never rounded up to inf."""
    return (x.to(tl.uint32, bitcast=True) & 0xFFFF0000).to(tl.float32, bitcast=True)


@triton.jit
def split_query(x, Q_PARTS: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """fp32 x (an fp16 or fp32 query) as bf16-exact parts in the dot dtype, x = hi + mid + lo
    exactly: hi = x's top 8 significant bits, mid the next 8 (Q_PARTS == 3, fp32), lo the rest
    (at most 8 bits for fp32, 3 for fp16). The keys are bf16-exact, so every part's products are
    exact and the dots accumulate an fp32-accurate q . k. An inf keeps its parts 0 (no inf - inf);
    a NaN's parts are NaN or inf, so its scores stay NaN. Returns (hi, mid, lo); Q_PARTS 2: mid is lo."""
    hi = _bf16_head(x)
    r = tl.where(x == hi, 0.0, x - hi)
    if Q_PARTS == 3:
        m = _bf16_head(r)
        mid, lo = m.to(tl.bfloat16).to(DOT_DTYPE), (r - m).to(tl.bfloat16).to(DOT_DTYPE)
    else:
        lo = r.to(tl.bfloat16).to(DOT_DTYPE)
        mid = lo  # unused (Q_PARTS 2): a jit function cannot return None on triton 3.6
    return hi.to(tl.bfloat16).to(DOT_DTYPE), mid, lo


@triton.jit
def _request_queries(q, q_scale, weights, t0, T, H: tl.constexpr, Q_FMT: tl.constexpr, K_ORDER: tl.constexpr,
                     FNUZ: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr, D: tl.constexpr,
                     DOT_DTYPE: tl.constexpr, Q_PARTS: tl.constexpr):
    """``query_tile`` for contiguous q [B*N, H, D] (MXFP4: codes [.., D/2], scales [.., D/32])
    and weights [B*N, H]: fewer runtime strides, fewer scalar registers. With K_ORDER (MXFP4 keys of
    ``mxfp4_rows_mma``), Q^T's rows are in the keys' ``mma_k_order``. Returns (qT, qT_mid,
    qT_lo, wv): an fp16 / fp32 q (Q_PARTS 2 / 3) is loaded in fp32 and split by ``split_query``; otherwise
    the parts are qT (unused: Q_PARTS 1; a jit function cannot return None on triton 3.6)."""
    if Q_FMT == FMT_MXFP4:
        qT, wv = query_tile(q, q_scale, weights, t0, T, H, H * (D // 2), D // 2, 1, H * (D // 32), D // 32, H, 1,
                             Q_FMT, FNUZ, BLOCK_T, BLOCK_H, D, DOT_DTYPE, K_ORDER)
        qT_mid, qT_lo = qT, qT
    elif Q_PARTS == 1:
        qT, wv = query_tile(q, q_scale, weights, t0, T, H, H * D, D, 1, 0, 0, H, 1, Q_FMT, FNUZ, BLOCK_T, BLOCK_H,
                             D, DOT_DTYPE, K_ORDER)
        qT_mid, qT_lo = qT, qT
    else:
        q32, wv = query_tile(q, q_scale, weights, t0, T, H, H * D, D, 1, 0, 0, H, 1, Q_FMT, FNUZ, BLOCK_T, BLOCK_H,
                              D, tl.float32, K_ORDER)
        qT, qT_mid, qT_lo = split_query(q32, Q_PARTS, DOT_DTYPE)
    return qT, qT_mid, qT_lo, wv


@triton.jit
def _request(context_lens, b, max_pages):
    """clamp(context_lens[b], 0, max_pages * 64)."""
    return tl.minimum(tl.maximum(tl.load(context_lens + b), 0), max_pages * PAGE)


@triton.jit
def paged_scores_kernel(
    q,  # [B*N, H, D] bf16/fp16/fp32, or MXFP4 codes [B*N, H, D/2] uint8; contiguous
    q_scale,  # MXFP4 q: E8M0 scales [B*N, H, D/32] uint8; else unused (q again)
    weights,  # [B*N, H] bf16/fp16/fp32, contiguous
    kv_cache,  # [num_pages, stride_page] uint8 pages (formats.py layout)
    table,  # K_TABLE: [16] fp32 values of the MXFP4 codes; else unused (kv_cache again)
    block_table,  # [B, max_pages] int32 page ids, contiguous
    context_lens,  # [B] int32 visible rows per request
    out,  # TO_WS: fp32 workspace [programs, BLOCK_T, C]; else fp32 logits [B*N, max_pages * 64]
    histogram,  # HIST_COPIES > 0: int32 [B*N, HIST_COPIES, HIST_BINS] key histograms (zeroed); else unused
    N,  # query tokens per request
    G,  # token groups per request, cdiv(N, BLOCK_T)
    S,  # sequence chunks per request
    C,  # rows per chunk (multiple of BLOCK_N * SUB)
    SUB,  # programs per work item, each scoring C / SUB rows of its chunk
    item0,  # first work item of this launch (wave)
    n_items,  # work items in all, B * G * S
    max_pages,  # block-table columns
    num_pages,  # pages in the cache
    stride_page,  # bytes between pages of kv_cache
    H: tl.constexpr,  # heads
    Q_FMT: tl.constexpr,  # decode.FMT_* of q
    K_FMT: tl.constexpr,  # decode.FMT_* of the cache rows
    K_TABLE: tl.constexpr,  # MXFP4 codes decoded through ``table`` (keys fp32, natural column order)
    FNUZ: tl.constexpr,  # fp8 keys are e4m3fnuz (else e4m3fn)
    FP8_DTYPE: tl.constexpr,  # the target's native fp8 type (FMT_FP8_NATIVE)
    DOT_DTYPE: tl.constexpr,  # dot operand type (fp32 under the interpreter)
    DEC_DTYPE: tl.constexpr,  # MXFP4 decoder arithmetic type (decode.mxfp4_rows_mma's OUT)
    Q_PARTS: tl.constexpr,  # bf16 parts of a tensor q: 1 (bf16), 2 (fp16), 3 (fp32); see split_query
    D: tl.constexpr,  # head_dim
    BLOCK_H: tl.constexpr,  # heads padded to a power of two
    BLOCK_T: tl.constexpr,  # query tokens per program
    BLOCK_N: tl.constexpr,  # key rows per step, divides the 64-row page
    TO_WS: tl.constexpr,  # write the workspace (top-k) instead of the logits
    HIST_COPIES: tl.constexpr,  # TO_WS of a split top-k: copies of each row's histogram (else 0: none)
    ALIGNED: tl.constexpr,  # cache address and page stride 4-byte aligned (word loads of codes and scales)
):
    """Scores of work item item0 + pid // SUB = (b, g, s): part pid % SUB of the C / SUB-row parts of rows
    [s*C, (s+1)*C) of request b, for its BLOCK_T query tokens g*BLOCK_T ... (SUB > 1 gives a small batch
    more programs than chunks). With TO_WS they go to workspace slot pid // SUB, out[pid // SUB, t, j - s*C]
    (rows at or past the context are left unwritten); else to the logits out[b*N + n, j] ([B*N, max_len]),
    -inf at rows >= context_lens[b]. With HIST_COPIES each written score also adds 1 to bin
    key >> HIST_SHIFT of histogram[b*N + n, s % HIST_COPIES] (relaxed int atomics, no return value:
    deterministic, and off the loop's critical path; the copies spread a long row's counts of one
    bin over several addresses, which serialise)."""
    pid = tl.program_id(0)
    slot = pid // SUB
    it = item0 + slot
    if it < n_items:
        s = it % S
        g = (it // S) % G
        b = it // (S * G)
        max_len = max_pages * PAGE
        ctx = _request(context_lens, b, max_pages)
        c0 = s * C
        part = C // SUB
        r0 = c0 + (pid % SUB) * part
        c1 = tl.minimum(r0 + part, ctx)
        n0 = g * BLOCK_T
        tt = tl.arange(0, BLOCK_T)
        if TO_WS:
            dst = out + (slot * BLOCK_T + tt).to(tl.int64)[None, :] * C - c0
            tm = tt >= 0
        else:
            dst = out + (b * N + n0 + tt).to(tl.int64)[None, :] * max_len
            tm = (n0 + tt) < N
        if c1 > r0:
            qT, qT_mid, qT_lo, wv = _request_queries(q, q_scale, weights, b * N + n0,
                                                     b * N + tl.minimum(N, n0 + BLOCK_T), H, Q_FMT,
                                                     K_FMT == FMT_MXFP4 and not K_TABLE, FNUZ,
                                                     BLOCK_T, BLOCK_H, D, DOT_DTYPE, Q_PARTS)
            bt_row = block_table + b.to(tl.int64) * max_pages
            page = _page_id(bt_row, r0, c1)
            for j0 in range(r0, c1, BLOCK_N):
                nxt = _page_id(bt_row, j0 + BLOCK_N, c1)  # prefetched one block ahead
                blk = _paged_block(qT, qT_mid, qT_lo, wv, kv_cache, table, page, j0, c1, num_pages, stride_page,
                                   K_FMT, K_TABLE, FNUZ, FP8_DTYPE, BLOCK_T, BLOCK_H, BLOCK_N, D, DOT_DTYPE, DEC_DTYPE, ALIGNED,
                                   Q_PARTS)
                j = (j0 + tl.arange(0, BLOCK_N))[:, None]
                tl.store(dst + j, blk, mask=tm[None, :] & (j < c1))
                if HIST_COPIES > 0:  # int32 offsets (the launcher bounds them): fewer registers than pointers
                    hist = ((b * N + n0 + tt) * HIST_COPIES + s % HIST_COPIES) * HIST_BINS
                    bins = (sel_key(blk) >> HIST_SHIFT).to(tl.int32)
                    tl.atomic_add(histogram + (hist[None, :] + bins), 1,
                                  mask=((n0 + tt) < N)[None, :] & (j < c1), sem="relaxed")  # not padding tokens
                page = nxt
        if not TO_WS:
            end = tl.minimum(r0 + part, max_len)
            ninf = tl.full((BLOCK_N, BLOCK_T), float("-inf"), tl.float32)
            for j0 in range(tl.maximum(r0, ctx), end, BLOCK_N):
                j = (j0 + tl.arange(0, BLOCK_N))[:, None]
                tl.store(dst + j, ninf, mask=tm[None, :] & (j < end))


@triton.jit
def paged_select_kernel(
    scores,  # fp32 workspace [programs, BLOCK_T, C] written by paged_scores_kernel
    context_lens,  # [B] int32
    part_values,  # fp32 [B*N*S, LIST_SIZE]: partial lists (SPLIT), else the output values [B*N, TOPK]
    part_indices,  # int32, same shape: their row numbers
    histogram,  # SPLIT: int32 [B*N, HIST_COPIES, HIST_BINS] key histograms of the rows scored so far; else unused
    list_counts,  # SPLIT: int32 [B*N*S] out: entries per partial list; else unused
    fine,  # FINE: int32 [B*N, HIST_BINS] fine histograms (zeroed) of the keys in each row's threshold bin
    rank_keys,  # RANKED: int32 [B*N, S * LIST_SIZE] out: the row's list entries' key bits, packed; else unused
    rank_cols,  # RANKED: int32, same shape: their indices
    rank_state,  # RANKED: int32 [B*N, RANK_STATE] (zeroed): select_hist.list_rank_kernel's row state
    N,  # query tokens per request
    G,  # token groups per request
    S,  # sequence chunks per request
    C,  # rows per chunk
    item0,  # first work item of this launch (wave)
    n_items,  # work items in all
    max_pages,  # block-table columns
    TOPK,  # k of the top-k
    BLOCK_T: tl.constexpr,  # query tokens per score program
    LIST_SIZE: tl.constexpr,  # entries per list: topk, or min(topk, C) when SPLIT
    LIST_SIZE_P2: tl.constexpr,  # next power of two of LIST_SIZE
    BLOCK_SELECT: tl.constexpr,  # elements per step of the radix-select passes
    SPLIT: tl.constexpr,  # S > 1: partial lists of the candidates
    HIST_COPIES: tl.constexpr,  # SPLIT: copies of each row's histogram (summed here)
    FINE: tl.constexpr,  # SPLIT in a one-wave plan (the histograms are complete): count the fine histogram
    BITS: tl.constexpr,  # radix digit width
    RANKED: tl.constexpr,  # SPLIT, few rows: each list also packed into rank_keys for list_rank_kernel
):
    """One program per (work item item0 + pid // BLOCK_T, token pid % BLOCK_T) of a wave, over the
    chunk's scores in workspace slot pid // BLOCK_T. Without SPLIT (S == 1): the final sorted, padded
    top-TOPK into part (the outputs). With SPLIT: the chunk's candidates into the partial list
    part[(b*N + n) * S + s], in row order, and their count into list_counts. Candidates are the
    scores in bins >= the row's threshold bin T (``select_hist.threshold`` of its histogram: every final
    winner lies there; a histogram still missing later waves' chunks gives a lower T, so a superset);
    when more than LIST_SIZE of them fall in this chunk, the list is instead the chunk's exact top
    LIST_SIZE (``select_row``, unsorted, row order), which holds every winner the chunk can give.
    With FINE the chunk's keys in bin T are also counted by their next 11 bits in fine[b*N + n].
    RANKED: the list is also copied, as (key bits, index), to the row's packed entries at a position
    reserved from a row counter, and the row's last chunk to arrive leaves its histograms' threshold
    for ``select_hist.list_rank_kernel`` (``rank_arrive``)."""
    pid = tl.program_id(0)
    it = item0 + pid // BLOCK_T
    t = pid % BLOCK_T
    if it < n_items:
        s = it % S
        g = (it // S) % G
        b = it // (S * G)
        n = g * BLOCK_T + t
        if n < N:
            ctx = _request(context_lens, b, max_pages)
            c0 = s * C
            c1 = tl.maximum(tl.minimum(c0 + C, ctx), c0)
            row = (b * N + n).to(tl.int64)
            at = (row * S + s) * LIST_SIZE
            src = scores + pid.to(tl.int64) * C - c0
            if SPLIT:
                taken, t1, above, counted = chunk_list(
                    src, c0, c1, histogram + row * HIST_COPIES * HIST_BINS, fine + row * HIST_BINS, part_values + at,
                    part_indices + at, TOPK, LIST_SIZE, LIST_SIZE_P2, BLOCK_SELECT, HIST_COPIES, FINE, BITS)
                tl.store(list_counts + row * S + s, taken)
                if RANKED:
                    tl.debug_barrier()  # the list, written by every thread, is read back by others
                    to = row * S * LIST_SIZE + tl.atomic_add(rank_state + row * RANK_STATE, taken, sem="relaxed")
                    for e0 in range(0, taken, BLOCK_SELECT):
                        e = e0 + tl.arange(0, BLOCK_SELECT)
                        v = tl.load(part_values + at + e, mask=e < taken, other=0.0)
                        i = tl.load(part_indices + at + e, mask=e < taken, other=0)
                        tl.store(rank_keys + to + e, sel_key(v).to(tl.int32, bitcast=True), mask=e < taken)
                        tl.store(rank_cols + to + e, i, mask=e < taken)
                    rank_arrive(rank_state, row, S, t1, above, counted)
            else:
                # S = 1 resolves every digit: with the early exit ptxas spills 8 B here on sm90
                select_row(src, c0, c1, part_values + at, part_indices + at, LIST_SIZE, LIST_SIZE_P2, BLOCK_SELECT,
                           True, BITS=BITS, EARLY_EXIT=False)


@triton.jit
def paged_gather_kernel(
    kv_cache,  # [num_pages, stride_page] uint8 pages (formats.py layout)
    block_table,  # [B, stride_bt_b] int32 page ids (unit column stride)
    context_lens,  # [B] int32, contiguous
    row_start,  # int64 [B] first flat row of each request
    out_payload,  # uint8 [total_rows, ROW_BYTES] out
    out_scales,  # uint8 [total_rows, SCALE_BYTES] out
    total_rows,  # rows of the outputs
    max_pages,  # block-table columns
    num_pages,  # pages in the cache
    stride_bt_b,  # block_table row stride
    stride_page,  # bytes between pages of kv_cache
    ROW_BYTES: tl.constexpr,  # payload bytes per cache row
    SCALE_BYTES: tl.constexpr,  # scale bytes per cache row
    BLOCK_ROWS: tl.constexpr,  # rows per program
):
    """Raw cache rows of request b, rows j < ctx, to flat row row_start[b] + j (< total_rows): payload
    bytes [ROW_BYTES] to out_payload, scale bytes [SCALE_BYTES] to out_scales. Grid (B, cdiv(max_len,
    BLOCK_ROWS)). Rows of out-of-range pages are written as zeros."""
    b = tl.program_id(0)
    j0 = tl.program_id(1) * BLOCK_ROWS
    ctx = _request(context_lens, b, max_pages)
    if j0 < ctx:
        j = j0 + tl.arange(0, BLOCK_ROWS)
        page = _page_id(block_table + b.to(tl.int64) * stride_bt_b, j0, ctx)
        ok, base, r = _page_rows(page, j0, ctx, num_pages, stride_page, BLOCK_ROWS)
        dst = tl.load(row_start + b).to(tl.int64) + j
        dm = (j < ctx) & (dst < total_rows)
        a = tl.arange(0, ROW_BYTES)[None, :]
        x = tl.load(kv_cache + (base + r * ROW_BYTES)[:, None] + a, mask=ok[:, None], other=0)
        tl.store(out_payload + dst[:, None] * ROW_BYTES + a, x, mask=dm[:, None])
        sc = tl.arange(0, SCALE_BYTES)[None, :]
        y = tl.load(kv_cache + (base + PAGE * ROW_BYTES + r * SCALE_BYTES)[:, None] + sc, mask=ok[:, None], other=0)
        tl.store(out_scales + dst[:, None] * SCALE_BYTES + sc, y, mask=dm[:, None])


@triton.jit
def paged_check_kernel(
    block_table,  # [B, max_pages] int32 page ids, any strides
    context_lens,  # [B] int32
    bad_counts,  # int32 [2] out, zeroed
    stride_bt_b,  # block_table strides
    stride_bt_p,
    stride_ctx,  # context_lens stride
    max_len,  # max_pages * 64
    num_pages,  # pages in the cache
    BLOCK_PAGES: tl.constexpr,  # block-table entries per step
):
    """Value check counts, one program per request b (``checks.paged_values``): bad_counts[0] += 1 when
    context_lens[b] is outside [0, max_len]; bad_counts[1] += the entries block_table[b, p],
    p < cdiv(clamp(context_lens[b], 0, max_len), 64), outside [0, num_pages). bad_counts is int32 [2], zeroed."""
    b = tl.program_id(0).to(tl.int64)
    ctx = tl.load(context_lens + b * stride_ctx)
    tl.atomic_add(bad_counts, ((ctx < 0) | (ctx > max_len)).to(tl.int32))
    used = (tl.minimum(tl.maximum(ctx, 0), max_len) + PAGE - 1) // PAGE
    n = tl.zeros((), dtype=tl.int32)
    for p0 in range(0, used, BLOCK_PAGES):
        p = p0 + tl.arange(0, BLOCK_PAGES)
        page = tl.load(block_table + b * stride_bt_b + p.to(tl.int64) * stride_bt_p, mask=p < used, other=0)
        n += tl.sum(((page < 0) | (page >= num_pages)).to(tl.int32))
    tl.atomic_add(bad_counts + 1, n)
