"""The top-k selection engine: top-TOPK of fp32 rows over per-row column ranges [s, e).

Semantics (README, "Top-k"): descending by score; ties go to the lower column; NaN ranks below
every number (-inf included) and reads -inf when selected; +0.0 and -0.0 are one score; slots
past the row's visible count are index -1, value -inf. Results are deterministic run to run and
no launch decision reads data (CUDA-graph capturable).

Scores become order-preserving uint32 keys (``sel_key``). The k-th largest key is found by a
radix select, most significant BITS-bit digit first: a histogram of the digit over the keys
that share the prefix fixed so far, then the digit whose bin holds the k-th largest. The passes
stop once the threshold bin is wholly needed (lower digits cannot change the set). Winners are
the keys above the threshold prefix plus the lowest columns among those equal to it; they are
then sorted by (key, -column) (``sort_keys``: a bitonic ``tl.sort`` of 64-bit (key, column)
words, or, where the winners' sort stays in the selecting kernel, of the 32-bit keys alone with
each column placed at its key's rank, SORT32).

Three shapes of work, chosen by shapes only (kernels/select_launch.py):
  ``select_kernel`` (here): one program per row (many rows of at most ``row_max`` columns). Its
    ``select_row`` loops over the row in steps of BLOCK_SELECT columns for every digit pass
    (with PREFETCH each step's load is issued a step ahead), then compacts the winners (a tie
    rank per column only when the threshold bin is partly needed) and sorts them (bitonic,
    ``sort_keys``), or, for top-k of at least ``SelectConfig.sort_apart``, leaves them to
    ``sort_rows_kernel`` on more warps (SORT_HERE off). Its 4-bit histograms come
    from ``tl.histogram`` (per step: warp ballots, then shared-memory atomics between three
    barriers) or, with ``SelectConfig.packed`` (gfx942's autotuning candidate, not yet timed), from
    per-slot packed counts reduced once per pass (``_packed_histogram``: sm90 PTX 73 instructions
    per step and no barrier, against 103 and three). The paged decode indexer uses ``select_row``
    for its chunk selects and final merge.
  the sampled filter (many long rows): kernels/select_filter.py.
  chunked (long rows, or few rows; the filter's fallback): kernels/select_chunked.py.
The paged decode indexer's split top-k selects from an 11-bit key histogram its score kernel
counts: kernels/select_hist.py.
"""
import triton
import triton.language as tl

NEG_INF_KEY = tl.constexpr(0x00800000)  # sel_key(-inf); NaN's key 0 lies below it


@triton.jit
def sel_key(x):
    """Order-preserving uint32 key of a float32, 2**31 +- its magnitude bits: -0.0 and +0.0 share
    0x80000000, NaN is 0 (below -inf's key, 0x00800000). Integer ops only (no float compare)."""
    i = x.to(tl.int32, bitcast=True)
    mag = i & 0x7FFFFFFF
    neg = i >> 31  # 0, or -1 for a set sign bit
    key = ((mag ^ neg) - neg) ^ -2147483648  # 2**31 + mag, or 2**31 - mag
    return tl.where(mag > 0x7F800000, 0, key.to(tl.uint32, bitcast=True))


@triton.jit
def key_to_f32(key):
    """Inverse of sel_key (NaN and -0.0 come back as the keys they were mapped to)."""
    d = (key ^ 0x80000000).to(tl.int32, bitcast=True)  # +mag or -mag
    return tl.where(d < 0, (-d) | -2147483648, d).to(tl.float32, bitcast=True)


@triton.jit
def key_value(key):
    """The score a key stands for, NaN (key below -inf's) read as -inf."""
    return tl.where(key < NEG_INF_KEY, float("-inf"), key_to_f32(key))


@triton.jit
def top_bits(nbits):
    """uint32 mask of the top ``nbits`` bits (0 <= nbits <= 32)."""
    ones = tl.full((), 0xFFFFFFFF, tl.uint32)
    return tl.where(nbits >= 32, ones, ones ^ (ones >> tl.minimum(nbits, 31).to(tl.uint32)))


@triton.jit
def digit_step(hist, thr, need, nbits, BITS: tl.constexpr):
    """One radix level: from the histogram of the next digit (keys with prefix ``thr``), the
    digit holding the need-th largest key. Returns (thr, need, nbits, bin count), need now
    counted inside the chosen bin."""
    bins = tl.arange(0, 1 << BITS)
    at_least = tl.cumsum(hist, 0, reverse=True)
    digit = tl.max(tl.where(at_least >= need, bins, 0), 0)
    need -= tl.sum(tl.where(bins > digit, hist, 0), 0)
    thr = thr | (digit.to(tl.uint32) << (32 - BITS - nbits).to(tl.uint32))
    return thr, need, nbits + BITS, tl.sum(tl.where(bins == digit, hist, 0), 0)


@triton.jit
def winners(key, m, thr, need, nbits, eq, eq_before):
    """Mask of the winners among keys under m: above the prefix, or equal to it and among the
    first ``need`` such (counting ``eq_before`` equal keys at lower columns elsewhere)."""
    km = key & top_bits(nbits)
    hit = m & (km == thr)
    if eq > need:
        hit = hit & (eq_before + tl.cumsum(hit.to(tl.int32), 0) - 1 < need)
    return (m & (km > thr)) | hit


@triton.jit
def store_winners(out_keys, out_indices, take, key, cols, base):
    """Winners' keys (uint32 bits into the fp32 output) and columns at base, base + 1, ... in column order."""
    pos = base + tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(out_keys + pos, key, mask=take)
    tl.store(out_indices + pos, cols, mask=take)


@triton.jit
def _word(key, col):
    """The sort word of a (key, column) pair: larger key first, then lower column."""
    return (key.to(tl.uint64) << 32) | (col.to(tl.uint32) ^ 0xFFFFFFFF).to(tl.uint64)


@triton.jit
def sort_keys(out_values, out_indices, taken, TOPK: tl.constexpr, TOPK_P2: tl.constexpr,
              SORT32: tl.constexpr = False):
    """Sort the ``taken`` (key bits, column) pairs at out_values/out_indices descending by key, ties
    by lower column; write scores and columns, -inf / -1 past ``taken`` up to TOPK.

    SORT32: the keys alone go through the bitonic network (32-bit words, half of what a 64-bit
    (key, column) word moves), are written back sorted, and each column lands at the count of keys
    above its own (a binary search of the sorted keys); a row holding a repeated key (whose columns
    must be ordered too) takes the 64-bit sort instead."""
    out_keys = out_values.to(tl.pointer_type(tl.uint32))
    p = tl.arange(0, TOPK_P2)
    valid = p < taken
    key = tl.load(out_keys + p, mask=valid, other=0)
    repeated = tl.full((), 1, tl.int1)  # the 64-bit sort below: without SORT32, or for a repeated key
    if SORT32:  # columns and sorted keys are reloaded from memory, not kept live (sm90 AOT spilled)
        s = tl.sort(key, 0, descending=True)  # the padding's key 0 is the smallest: the first taken are the row's
        tl.debug_barrier()
        tl.store(out_keys + p, s, mask=valid)
        tl.debug_barrier()
        nxt = tl.load(out_keys + p + 1, mask=p + 1 < taken, other=0)
        repeated = tl.sum(((s == nxt) & (p + 1 < taken)).to(tl.int32), 0) > 0
        if repeated == 0:
            above = tl.zeros((TOPK_P2,), tl.int32)  # keys above key: the largest prefix of s that is
            for b in tl.static_range(16):  # above it, by binary lifting over its length's bits
                if (TOPK_P2 >> (b + 1)) > 0:
                    probe = above + (TOPK_P2 >> (b + 1))
                    up = tl.load(out_keys + probe - 1, mask=valid & (probe <= taken), other=0)
                    above = tl.where(valid & (probe <= taken) & (up > key), probe, above)
            v = key_value(tl.load(out_keys + p, mask=valid, other=0))
            i = tl.load(out_indices + p, mask=valid, other=0)
            tl.debug_barrier()
            tl.store(out_values + p, tl.where(valid, v, float("-inf")), mask=p < TOPK)
            tl.store(out_indices + above, i, mask=valid)
            tl.store(out_indices + p, -1, mask=(p >= taken) & (p < TOPK))
    if repeated:
        _sort_words(out_values, out_indices, key, tl.load(out_indices + p, mask=valid, other=0), valid, p, TOPK)


@triton.jit
def _sort_words(out_values, out_indices, key, i, valid, p, TOPK: tl.constexpr):
    """sort_keys by 64-bit (key, column) words, which order repeated keys by column too."""
    word = tl.sort(tl.where(valid, _word(key, i), 0), 0, descending=True)
    v = key_value((word >> 32).to(tl.uint32))
    i = ((word & 0xFFFFFFFF).to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int32)
    tl.debug_barrier()
    tl.store(out_values + p, tl.where(valid, v, float("-inf")), mask=p < TOPK)
    tl.store(out_indices + p, tl.where(valid, i, -1), mask=p < TOPK)


@triton.jit
def row_range(k_start, k_end, t, K):
    """Row t's visible columns [s, e), clamped to [0, K] (an empty or inverted range is empty)."""
    s = tl.minimum(tl.maximum(tl.load(k_start + t), 0), K)
    e = tl.maximum(tl.minimum(tl.load(k_end + t), K), s)
    return s, e



@triton.jit
def _packed_histogram(scores, s, e, thr, fixed, shift, BLOCK_SELECT: tl.constexpr):
    """16-bin histogram of the 4-bit digit at ``shift`` of the keys of scores[s:e] whose top bits
    (``fixed``) equal ``thr``, without ``tl.histogram``: each column slot keeps 8-bit counts,
    four bins to an int32, added elementwise (no cross-thread work or barrier inside the loop),
    then summed once as 16-bit pairs. A slot counts at most one key per step, so its counts hold
    while (e - s) / BLOCK_SELECT <= 255 (``SelectConfig`` checks row_max / ch)."""
    a0 = tl.zeros((BLOCK_SELECT,), tl.int32)
    a1 = tl.zeros((BLOCK_SELECT,), tl.int32)
    a2 = tl.zeros((BLOCK_SELECT,), tl.int32)
    a3 = tl.zeros((BLOCK_SELECT,), tl.int32)
    for c0 in range(s, e, BLOCK_SELECT):
        cols = c0 + tl.arange(0, BLOCK_SELECT)
        key = sel_key(tl.load(scores + cols, mask=cols < e, other=0.0))
        d = ((key >> shift) & 15).to(tl.int32)
        inc = tl.where((cols < e) & ((key & fixed) == thr), 1 << ((d & 3) * 8), 0)
        w = d >> 2
        a0 += tl.where(w == 0, inc, 0)
        a1 += tl.where(w == 1, inc, 0)
        a2 += tl.where(w == 2, inc, 0)
        a3 += tl.where(w == 3, inc, 0)
    bins = tl.arange(0, 16)
    hist = _unpack_counts(a0, bins, 0) + _unpack_counts(a1, bins, 4)
    return hist + _unpack_counts(a2, bins, 8) + _unpack_counts(a3, bins, 12)


@triton.jit
def _unpack_counts(acc, bins, first):
    """Bins first .. first + 3 of packed 8-bit counts summed over the slots, placed in ``bins``:
    fields 0 and 2 (then 1 and 3) summed as 16-bit halves, which hold any bin's total (at most
    the row's length, < 2**16: ``SelectConfig`` checks row_max)."""
    even = tl.sum(acc & 0x00FF00FF, 0)
    odd = tl.sum((acc >> 8) & 0x00FF00FF, 0)
    hist = tl.where(bins == first, even & 0xFFFF, 0) + tl.where(bins == first + 2, even >> 16, 0)
    return hist + tl.where(bins == first + 1, odd & 0xFFFF, 0) + tl.where(bins == first + 3, odd >> 16, 0)


@triton.jit
def _digit_histogram(scores, s, e, thr, fixed, shift, NBINS: tl.constexpr, BLOCK_SELECT: tl.constexpr,
                     PACKED: tl.constexpr, PREFETCH: tl.constexpr):
    """NBINS-bin histogram of the digit at ``shift`` of the keys of scores[s:e] whose top bits
    (``fixed``) equal ``thr``: ``tl.histogram`` per step, or ``_packed_histogram`` (PACKED)."""
    if PACKED:
        tl.static_assert(NBINS == 16, "packed histograms have 16 bins")
        hist = _packed_histogram(scores, s, e, thr, fixed, shift, BLOCK_SELECT)
    else:
        hist = tl.zeros((NBINS,), tl.int32)
        carry = first_step(scores, s, e, BLOCK_SELECT, PREFETCH)
        for c0 in range(s, e, BLOCK_SELECT):
            cols = c0 + tl.arange(0, BLOCK_SELECT)
            x, key, carry = next_step(scores, cols, e, carry, BLOCK_SELECT, PREFETCH)
            m = (cols < e) & ((key & fixed) == thr)
            hist += tl.histogram(((key >> shift) & (NBINS - 1)).to(tl.int32), NBINS, mask=m)
    return hist


@triton.jit
def first_step(scores, s, e, BLOCK_SELECT: tl.constexpr, PREFETCH: tl.constexpr):
    """The carry of ``next_step`` into a loop over scores[s:e]: with PREFETCH the first step's scores."""
    cols = s + tl.arange(0, BLOCK_SELECT)
    if PREFETCH:
        return tl.load(scores + cols, mask=cols < e, other=0.0)
    return tl.zeros((BLOCK_SELECT,), tl.float32)


@triton.jit
def next_step(scores, cols, e, carry, BLOCK_SELECT: tl.constexpr, PREFETCH: tl.constexpr):
    """(scores, keys, carry) of one step's columns. With PREFETCH the carry in holds their scores
    (loaded a step ahead) and the carry out the next step's, loaded now so that the load overlaps
    this step's work; else the scores are loaded here (the carry is unused)."""
    if PREFETCH:
        nxt = cols + BLOCK_SELECT
        return carry, sel_key(carry), tl.load(scores + nxt, mask=nxt < e, other=0.0)
    x = tl.load(scores + cols, mask=cols < e, other=0.0)
    return x, sel_key(x), carry


@triton.jit
def select_row(
    scores,  # [>= col_end] fp32: the row
    col_start,  # first column of the range
    col_end,  # end of the range (exclusive)
    out_values,  # [TOPK] fp32 out
    out_indices,  # [TOPK] int32 out
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,  # next power of two of TOPK
    BLOCK_SELECT: tl.constexpr,  # columns per step of every pass
    SORTED: tl.constexpr = True,
    score_indices=None,  # [>= col_end] int32 or None: the index written for each position
    BITS: tl.constexpr = 8,  # radix digit width
    EARLY_EXIT: tl.constexpr = True,
    PACKED: tl.constexpr = False,  # BITS 4 only: histograms by ``_packed_histogram``
    SORT_HERE: tl.constexpr = True,  # SORTED: sort here, else leave the winners' key bits to sort_rows_kernel
    PREFETCH: tl.constexpr = False,  # load each step's scores one step ahead
    SORT32: tl.constexpr = False,  # sort_keys' 32-bit sort (the paged decode kernels: off)
    START_BITS: tl.constexpr = 0,  # the top START_BITS bits of the threshold are known: ...
    start_thr=0,  # ... they are these (uint32, the rest 0), and ...
    start_need=0,  # ... this many of the keys with that prefix are winners (32 - START_BITS: a multiple of BITS)
):
    """Top-TOPK of scores[col_start:col_end] into out_values/out_indices[0:TOPK], sorted descending.

    ``score_indices`` (int32, same positions as ``scores``) replaces the column number written to
    out_indices (a merge of candidate lists); ties still go to the lower position, so positions must
    be in ascending index order among equal scores. Without SORTED the min(TOPK, col_end - col_start) winners' scores
    are left in ascending position order and nothing else is written (no sort, no padding). SORTED
    without SORT_HERE leaves their key bits (and indices) in that order, for ``sort_rows_kernel``.

    Returns whether only part of the keys equal to the threshold were taken (then the winners
    among them were picked by position). With START_BITS the passes start below a known prefix
    (the caller's histograms found it; every key lies at or above it).

    Radix select, most significant digit first: up to 32/BITS passes of 2**BITS-bin histograms
    over uint32 keys find the threshold prefix ``thr`` (the top ``nbits`` bits) and how many
    elements with that prefix to keep (``need``). With EARLY_EXIT the passes stop once every
    element with the prefix is needed (its bin count == need): lower digits cannot change the
    set, so the output is the same. Then one compaction pass and a bitonic sort of the <= TOPK
    winners (``sort_keys``). Slots past the visible count get -inf / -1.

    On the H200 ``tl.histogram`` cost grew with the bin count (4096 rows: 4 x 256 bins 293 us,
    4 x 1024 bins 1.4 ms); 8 passes of 4-bit one-hot counts (no histogram) measured 1.8x slower
    than 8-bit histograms.
    """
    NBINS: tl.constexpr = 1 << BITS
    tl.static_assert((32 - START_BITS) % BITS == 0, "the bits below START_BITS must be whole digits")
    s, e = col_start, col_end
    n = e - s
    ones = tl.full((), 0xFFFFFFFF, tl.uint32)
    thr = tl.zeros((), tl.uint32)  # the threshold prefix, in the top nbits bits of a key
    need = tl.zeros((), tl.int32) + tl.minimum(n, TOPK)
    nbits = tl.full((), 32, tl.int32)  # n <= TOPK: all 32, thr 0, all n keys (> 0, or NaN's 0) taken
    partial = tl.zeros((), tl.int1)  # only part of the keys equal to the threshold prefix are winners
    bins = tl.arange(0, NBINS)
    if n > TOPK:
        nbits = tl.zeros((), tl.int32) + START_BITS
        if START_BITS > 0:
            thr = tl.zeros((), tl.uint32) + start_thr.to(tl.uint32)
            need = tl.zeros((), tl.int32) + start_need
        done = (nbits == 32).to(tl.int32)
        while done == 0:
            shift = (32 - BITS - nbits).to(tl.uint32)
            fixed = ones ^ (ones >> nbits.to(tl.uint32))  # the top nbits bits
            hist = _digit_histogram(scores, s, e, thr, fixed, shift, NBINS, BLOCK_SELECT, PACKED, PREFETCH)
            at_least = tl.cumsum(hist, 0, reverse=True)
            digit = tl.max(tl.where(at_least >= need, bins, 0), 0)
            need -= tl.sum(tl.where(bins > digit, hist, 0), 0)
            thr = thr | (digit.to(tl.uint32) << shift)
            nbits += BITS
            # stop at the last digit, or once every element of the threshold bin is needed
            # (lower digits cannot change the set then)
            in_bin = tl.sum(tl.where(bins == digit, hist, 0), 0)
            partial = in_bin > need
            done = ((nbits == 32) | (EARLY_EXIT & (in_bin == need))).to(tl.int32)
    # keys compared on their top nbits (all 32 unless the passes stopped early)
    low = (32 - nbits).to(tl.uint32)
    hi_mask = (ones >> low) << low
    taken = tl.zeros((), tl.int32)
    eq_seen = tl.zeros((), tl.int32)
    carry = first_step(scores, s, e, BLOCK_SELECT, PREFETCH)
    for c0 in range(s, e, BLOCK_SELECT):
        cols = c0 + tl.arange(0, BLOCK_SELECT)
        m = cols < e
        x, key, carry = next_step(scores, cols, e, carry, BLOCK_SELECT, PREFETCH)
        kt = key & hi_mask
        eq = m & (kt == thr)
        if partial:  # the first `need` of them in column order
            eq_rank = eq_seen + tl.cumsum(eq.to(tl.int32), 0) - 1
            eq_seen += tl.sum(eq.to(tl.int32), 0)
            eq = eq & (eq_rank < need)
        take = (m & (kt > thr)) | eq
        pos = taken + tl.cumsum(take.to(tl.int32), 0) - 1
        if score_indices is not None:
            idx = tl.load(score_indices + cols, mask=take, other=-1)
        else:
            idx = cols
        if SORTED:  # key bits, for sort_keys
            tl.store(out_values.to(tl.pointer_type(tl.uint32)) + pos, key, mask=take & (pos < TOPK))
        else:
            tl.store(out_values + pos, x, mask=take & (pos < TOPK))
        tl.store(out_indices + pos, idx, mask=take & (pos < TOPK))
        taken += tl.sum(take.to(tl.int32), 0)
    if SORTED and SORT_HERE:
        tl.debug_barrier()
        sort_keys(out_values, out_indices, taken, TOPK, TOPK_P2, SORT32)
    return partial


@triton.jit
def select_kernel(
    scores,  # [rows, >= K] fp32: token t's scores in row t - row0
    k_start,  # [T] int32
    k_end,  # [T] int32
    out_values,  # [T, TOPK] fp32 out
    out_indices,  # [T, TOPK] int32 out
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    stride_scores_r,
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,  # next power of two of TOPK
    BLOCK_SELECT: tl.constexpr,  # columns per step of every pass
    BITS: tl.constexpr,  # radix digit width
    PACKED: tl.constexpr,  # histograms without tl.histogram (select_row)
    SORT_HERE: tl.constexpr,  # else the winners are left unsorted for sort_rows_kernel
    PREFETCH: tl.constexpr,  # select_row loads each step one step ahead
    SORT32: tl.constexpr,  # sort_keys' 32-bit sort
):
    """Top-k of the staged scores[t - row0, k_start[t]:k_end[t]] for one token t per program."""
    t = row0 + tl.program_id(0)
    if t < T:
        s = tl.maximum(tl.load(k_start + t), 0)
        e = tl.maximum(tl.minimum(tl.load(k_end + t), K), s)
        select_row(scores + tl.program_id(0).to(tl.int64) * stride_scores_r, s, e,
                   out_values + t.to(tl.int64) * TOPK, out_indices + t.to(tl.int64) * TOPK, TOPK, TOPK_P2,
                   BLOCK_SELECT, BITS=BITS, PACKED=PACKED, SORT_HERE=SORT_HERE, PREFETCH=PREFETCH, SORT32=SORT32)

