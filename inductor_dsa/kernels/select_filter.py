"""The selection engine's sampled filter, for many long rows; keys and ``select_row`` from
kernels/select.py.

``sample_kernel`` takes a candidate bound per row, the j-th largest of SAMPLE evenly spaced keys
with j a few binomial deviations past the expected sample rank of the k-th key; ``filter_kernel``
copies the keys at or above it into candidate slots (one read of the row); ``cand_select_kernel``
runs ``select_row`` over them. A row whose candidates are too few (the sample missed), too many
for their slots, or whose threshold splits a run of equal keys (the candidates are in no column
order) is listed and selected again by the chunked passes (kernels/select_chunked.py), which walk
only the listed rows: exact whatever the data, fast when the scores are continuous.
"""
import triton
import triton.language as tl

from .select import digit_step, first_step, next_step, row_range, sel_key, select_row, top_bits


@triton.jit
def _kth_largest_key(key, need, BITS: tl.constexpr):
    """The need-th largest (1-based) of the uint32 keys held in registers: 32 // BITS histogram
    passes over them, most significant digit first."""
    thr = tl.zeros((), tl.uint32)
    nbits = tl.zeros((), tl.int32)
    for p in tl.static_range(32 // BITS):
        digit = ((key >> (32 - BITS - p * BITS)) & ((1 << BITS) - 1)).to(tl.int32)
        hist = tl.histogram(digit, 1 << BITS, mask=(key & top_bits(nbits)) == thr)
        thr, need, nbits, _ = digit_step(hist, thr, need, nbits, BITS)
    return thr


@triton.jit
def sample_kernel(
    scores,  # [rows, >= K] fp32: token t's scores in row r = t - row0
    k_start,  # [T] int32
    k_end,  # [T] int32
    filt,  # [rows, 2] int32 out: column 0 the row's candidate bound (a key), column 1 zeroed (the count)
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    stride_scores_r,
    z,  # fp32: binomial deviations of margin below the expected sample rank of the k-th key
    TOPK: tl.constexpr,
    SAMPLE: tl.constexpr,  # keys sampled per row, evenly spaced over its visible columns
    BITS: tl.constexpr,  # digit width of the sample's radix select
):
    """One program per row: the candidate bound lo = the j-th largest of SAMPLE evenly spaced keys,
    j = E + z sqrt(E) + 2 with E = TOPK * SAMPLE / n the expected sample rank of the row's k-th
    largest key; rows of at most TOPK visible columns get lo = 0 (every key, NaN's included)."""
    r = tl.program_id(0)
    t = row0 + r
    if t < T:
        s, e = row_range(k_start, k_end, t, K)
        n = e - s
        lo = tl.zeros((), tl.uint32)
        if n > TOPK:
            i = tl.arange(0, SAMPLE).to(tl.int64)
            x = tl.load(scores + r.to(tl.int64) * stride_scores_r + s + i * n // SAMPLE)
            mean = TOPK * SAMPLE / n.to(tl.float32)
            rank = tl.minimum(mean + z * tl.sqrt(mean) + 2.0, SAMPLE).to(tl.int32)
            lo = _kth_largest_key(sel_key(x), tl.maximum(rank, 1), BITS)
        tl.store(filt + r.to(tl.int64) * 2, lo.to(tl.int32, bitcast=True))


@triton.jit
def filter_kernel(
    scores,  # [rows, >= K] fp32: token t's scores in row r = t - row0
    k_start,  # [T] int32
    k_end,  # [T] int32
    filt,  # [rows, 2] int32: the bound (sample_kernel) and the candidate count, zeroed
    cand_scores,  # [rows, CAP] fp32 out: the row's candidates, in no fixed order
    cand_cols,  # [rows, CAP] int32 out: their columns
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    stride_scores_r,
    CAP: tl.constexpr,  # candidate slots per row
    CHUNK: tl.constexpr,  # columns per program
    STEP: tl.constexpr,  # columns per step of its loop
):
    """Grid (rows, cdiv(K, CHUNK)): chunk c's visible scores whose key is at least the row's bound
    into the row's candidate slots, at positions reserved from its count (counted past CAP too,
    so an overflow shows). Program j takes chunk cdiv(K, CHUNK) - 1 - j: the candidates are out
    of column order under the interpreter too (which runs programs in order), as on a GPU."""
    r = tl.program_id(0)
    t = row0 + r
    if t < T:
        s, e = row_range(k_start, k_end, t, K)
        c = tl.num_programs(1) - 1 - tl.program_id(1)
        c0 = tl.maximum(c * CHUNK, s)
        c1 = tl.minimum(c * CHUNK + CHUNK, e)
        fr = filt + r.to(tl.int64) * 2
        lo = tl.load(fr).to(tl.uint32, bitcast=True)
        src = scores + r.to(tl.int64) * stride_scores_r
        dst = r.to(tl.int64) * CAP
        carry = first_step(src, c0, c1, STEP, True)
        for b in range(c0, c1, STEP):  # each step's scores loaded a step ahead, beside the atomic
            cols = b + tl.arange(0, STEP)
            x, key, carry = next_step(src, cols, c1, carry, STEP, True)
            take = (cols < c1) & (key >= lo)
            cnt = tl.sum(take.to(tl.int32), 0)
            if cnt > 0:
                pos = tl.atomic_add(fr + 1, cnt, sem="relaxed") + tl.cumsum(take.to(tl.int32), 0) - 1
                tl.store(cand_scores + dst + pos, x, mask=take & (pos < CAP))
                tl.store(cand_cols + dst + pos, cols, mask=take & (pos < CAP))


@triton.jit
def cand_select_kernel(
    k_start,  # [T] int32
    k_end,  # [T] int32
    filt,  # [rows, 2] int32: the bound and the candidate count
    redo,  # [1 + rows] int32 out, zeroed: a count, then the rows the fallback must select
    cand_scores,  # [rows, CAP] fp32: the candidates
    cand_cols,  # [rows, CAP] int32: their columns
    out_values,  # [T, TOPK] fp32 out
    out_indices,  # [T, TOPK] int32 out
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    CAP: tl.constexpr,
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,
    BLOCK_SELECT: tl.constexpr,
    BITS: tl.constexpr,
    SORT_HERE: tl.constexpr,  # else the winners are left unsorted for sort_rows_kernel
    PREFETCH: tl.constexpr,
    SORT32: tl.constexpr,  # sort_keys' 32-bit sort
):
    """One program per row: top-k of its candidates (``select_row``, columns as indices), exact
    when the candidates hold at least min(visible, TOPK) keys, fit CAP, and the threshold needs
    all keys equal to it (candidates are in no column order, so a partial tie cannot be
    resolved here). Otherwise the row is listed in ``redo`` for the chunked passes (in no fixed order)."""
    r = tl.program_id(0)
    t = row0 + r
    if t < T:
        s, e = row_range(k_start, k_end, t, K)
        cnt = tl.load(filt + r.to(tl.int64) * 2 + 1)
        flag = (cnt < tl.minimum(e - s, TOPK)) | (cnt > CAP)
        if flag == 0:
            at = r.to(tl.int64) * CAP
            flag = select_row(cand_scores + at, 0, cnt, out_values + t.to(tl.int64) * TOPK,
                              out_indices + t.to(tl.int64) * TOPK, TOPK, TOPK_P2, BLOCK_SELECT,
                              score_indices=cand_cols + at, BITS=BITS, SORT_HERE=SORT_HERE, PREFETCH=PREFETCH,
                              SORT32=SORT32)
        if flag:
            tl.store(redo + 1 + tl.atomic_add(redo, 1, sem="relaxed"), r)
