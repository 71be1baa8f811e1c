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
then sorted by (key, -column).

Two shapes of work, chosen by shapes only (kernels/select_launch.py):
  ``select_kernel``: one program per row (many rows of at most ``row_max`` columns). Its
    ``select_row`` loops over the row in steps of BLOCK_SELECT columns for every digit pass
    (with PREFETCH each step's load is issued a step ahead), then compacts the winners (a tie
    rank per column only when the threshold bin is partly needed) and sorts them (bitonic,
    ``_sort_keys``), or, for top-k of at least ``SelectConfig.sort_apart``, leaves them to
    ``sort_rows_kernel`` on more warps (SORT_HERE off). Its 4-bit histograms come
    from ``tl.histogram`` (per step: warp ballots, then shared-memory atomics between three
    barriers) or, with ``SelectConfig.packed`` (gfx942's autotuning candidate, not yet timed), from
    per-slot packed counts reduced once per pass (``_packed_histogram``: sm90 PTX 73 instructions
    per step and no barrier, against 103 and three). The paged decode indexer uses ``select_row``
    for its chunk selects and final merge.
  sampled filter (many long rows): ``sample_kernel`` takes a candidate bound per row, the
    j-th largest of SAMPLE evenly spaced keys with j a few binomial deviations past the expected
    sample rank of the k-th key; ``filter_kernel`` copies the keys at or above it into candidate
    slots (one read of the row); ``cand_select_kernel`` runs ``select_row`` over them. A row whose
    candidates are too few (the sample missed), too many for their slots, or whose threshold
    splits a run of equal keys (the candidates are in no column order) is flagged and selected
    again by the chunked passes, which skip every other row: exact whatever the data, fast when
    the scores are continuous.
  chunked (long rows, or few rows): every row is cut into chunks of CHUNK columns, one program
    per (row, chunk), a launch per digit pass. ``radix_pass_kernel`` adds its chunk's digit
    histogram to the row's (int atomics: deterministic); its last launch (PASS == PASSES) counts,
    per chunk, the keys equal to a threshold that is only partly needed (a no-op otherwise);
    ``radix_collect_kernel`` writes each chunk's winners at a position taken from a row
    counter; ``sort_rows_kernel`` sorts them, or, for a few rows, ``rank_sort_kernel`` places
    each winner at its rank from several programs per row. Positions taken from the counter
    depend on timing; the sorted result does not.
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
def _key_value(key):
    """The score a key stands for, NaN (key below -inf's) read as -inf."""
    return tl.where(key < NEG_INF_KEY, float("-inf"), key_to_f32(key))


@triton.jit
def _top_bits(nbits):
    """uint32 mask of the top ``nbits`` bits (0 <= nbits <= 32)."""
    ones = tl.full((), 0xFFFFFFFF, tl.uint32)
    return tl.where(nbits >= 32, ones, ones ^ (ones >> tl.minimum(nbits, 31).to(tl.uint32)))


@triton.jit
def _digit_step(hist, thr, need, nbits, BITS: tl.constexpr):
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
def _winners(key, m, thr, need, nbits, eq, eq_before):
    """Mask of the winners among keys under m: above the prefix, or equal to it and among the
    first ``need`` such (counting ``eq_before`` equal keys at lower columns elsewhere)."""
    km = key & _top_bits(nbits)
    hit = m & (km == thr)
    if eq > need:
        hit = hit & (eq_before + tl.cumsum(hit.to(tl.int32), 0) - 1 < need)
    return (m & (km > thr)) | hit


@triton.jit
def _store_winners(out_keys, out_indices, take, key, cols, base):
    """Winners' keys (uint32 bits into the fp32 output) and columns at base, base + 1, ... in column order."""
    pos = base + tl.cumsum(take.to(tl.int32), 0) - 1
    tl.store(out_keys + pos, key, mask=take)
    tl.store(out_indices + pos, cols, mask=take)


@triton.jit
def _word(key, col):
    """The sort word of a (key, column) pair: larger key first, then lower column."""
    return (key.to(tl.uint64) << 32) | (col.to(tl.uint32) ^ 0xFFFFFFFF).to(tl.uint64)


@triton.jit
def _sort_keys(out_values, out_indices, taken, TOPK: tl.constexpr, TOPK_P2: tl.constexpr):
    """Sort the ``taken`` (key bits, column) pairs at out_values/out_indices descending by key, ties
    by lower column; write scores and columns, -inf / -1 past ``taken`` up to TOPK."""
    out_keys = out_values.to(tl.pointer_type(tl.uint32))
    p = tl.arange(0, TOPK_P2)
    valid = p < taken
    key = tl.load(out_keys + p, mask=valid, other=0)
    i = tl.load(out_indices + p, mask=valid, other=0)
    word = tl.sort(tl.where(valid, _word(key, i), 0), 0, descending=True)
    v = _key_value((word >> 32).to(tl.uint32))
    i = ((word & 0xFFFFFFFF).to(tl.uint32) ^ 0xFFFFFFFF).to(tl.int32)
    tl.debug_barrier()
    tl.store(out_values + p, tl.where(valid, v, float("-inf")), mask=p < TOPK)
    tl.store(out_indices + p, tl.where(valid, i, -1), mask=p < TOPK)


@triton.jit
def _row_range(k_start, k_end, t, K):
    """Row t's visible columns [s, e), clamped to [0, K] (an empty or inverted range is empty)."""
    s = tl.minimum(tl.maximum(tl.load(k_start + t), 0), K)
    e = tl.maximum(tl.minimum(tl.load(k_end + t), K), s)
    return s, e


@triton.jit
def _state_row(state, r, n_chunks, PASSES: tl.constexpr, BITS: tl.constexpr):
    """Row r's int32 state: PASSES digit histograms, PASSES arrival counters, the radix state
    (thr bits, need, nbits, eq, done), the collect counter, then n_chunks tie counts (offsets: _at)."""
    return state + r.to(tl.int64) * (PASSES * ((1 << BITS) + 1) + 6 + n_chunks)


@triton.jit
def _at(what: tl.constexpr, PASSES: tl.constexpr, BITS: tl.constexpr):
    """Offset in a state row of: 0 arrival counters, 1 radix state, 2 collect counter, 3 tie counts."""
    base = PASSES * (1 << BITS)
    if what == 1:
        base += PASSES
    elif what == 2:
        base += PASSES + 5
    elif what == 3:
        base += PASSES + 6
    return base


@triton.jit
def _radix_state(row_state, n, TOPK: tl.constexpr, PASS: tl.constexpr, PASSES: tl.constexpr, BITS: tl.constexpr):
    """(thr, need, nbits, eq, done) of a row before digit pass PASS (PASS == PASSES: the final
    state); done once the set is fixed (n <= TOPK, the bin wholly needed, or all 32 bits)."""
    if PASS == 0:
        thr = tl.zeros((), tl.uint32)
        need = tl.full((), TOPK, tl.int32)
        nbits = tl.zeros((), tl.int32)
        eq = tl.zeros((), tl.int32)
        done = (n <= TOPK).to(tl.int32)
    else:
        rs = row_state + _at(1, PASSES, BITS)
        thr = tl.load(rs).to(tl.uint32, bitcast=True)
        need = tl.load(rs + 1)
        nbits = tl.load(rs + 2)
        eq = tl.load(rs + 3)
        done = tl.load(rs + 4)
    return thr, need, nbits, eq, done


@triton.jit
def _active(t, T, redo, r):
    """Token t (row r of the launch) is selected here: t < T and, given a redo list, r is flagged in it."""
    go = t < T
    if redo is not None:
        go = go & (tl.load(redo + r, mask=go, other=0) != 0)
    return go


@triton.jit
def _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK: tl.constexpr):
    """Chunk c of row r (token t): (columns, visible mask, keys, n = visible count of the row,
    any = the chunk holds a visible column)."""
    s, e = _row_range(k_start, k_end, t, K)
    cols = c * CHUNK + tl.arange(0, CHUNK)
    any_ = (c * CHUNK < e) & (c * CHUNK + CHUNK > s)
    m = (cols >= s) & (cols < e) & any_
    key = sel_key(tl.load(scores + r.to(tl.int64) * stride_scores_r + cols, mask=m, other=0.0))
    return cols, m, key, e - s, any_


@triton.jit
def radix_pass_kernel(
    scores,  # [rows, >= K] fp32: token t's scores in row r = t - row0
    k_start,  # [T] int32
    k_end,  # [T] int32
    state,  # [rows, PASSES * (2**BITS + 1) + 6 + n_chunks] int32, zeroed (layout: _state_row)
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    stride_scores_r,
    n_chunks,  # chunks per row: cdiv(K, CHUNK)
    redo,  # [rows] int32 or None: only rows flagged nonzero are selected (the filter path's fallback)
    PASS: tl.constexpr,  # the digit of this launch, most significant first; PASSES: the tie count
    PASSES: tl.constexpr,  # 32 // BITS
    TOPK: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per program
    BITS: tl.constexpr,  # radix digit width
):
    """Grid (rows, n_chunks). PASS < PASSES, digit pass PASS: chunk c's histogram of digit PASS
    over the keys sharing the threshold prefix so far, added to the row's hist[PASS]; the row's
    last program to arrive (acq_rel counter: it sees every other program's histogram) advances
    the row's radix state. PASS == PASSES, the tie count: ties[c] = chunk c's keys equal to the
    row's final threshold prefix when only part of them is taken (else nothing is read or written)."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    t = row0 + r
    if _active(t, T, redo, r):
        st = _state_row(state, r, n_chunks, PASSES, BITS)
        if PASS == PASSES:
            s, e = _row_range(k_start, k_end, t, K)
            thr, need, nbits, eq, done = _radix_state(st, e - s, TOPK, PASSES, PASSES, BITS)
            if (e - s > TOPK) & (eq > need):
                cols, m, key, n, any_ = _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK)
                hit = m & ((key & _top_bits(nbits)) == thr)
                tl.store(st + _at(3, PASSES, BITS) + c, tl.sum(hit.to(tl.int32), 0))
        else:
            s, e = _row_range(k_start, k_end, t, K)
            thr, need, nbits, eq, done = _radix_state(st, e - s, TOPK, PASS, PASSES, BITS)
            bins = tl.arange(0, 1 << BITS)
            hist = st + PASS * (1 << BITS) + bins
            if (done == 0) & (c * CHUNK < e) & (c * CHUNK + CHUNK > s):  # nothing is read once the set is fixed
                cols, m, key, n, any_ = _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK)
                m = m & ((key & _top_bits(nbits)) == thr)
                digit = ((key >> (32 - BITS - PASS * BITS)) & ((1 << BITS) - 1)).to(tl.int32)
                h = tl.histogram(digit, 1 << BITS, mask=m)
                tl.atomic_add(hist, h, mask=h > 0, sem="relaxed")
            if tl.atomic_add(st + _at(0, PASSES, BITS) + PASS, 1, sem="acq_rel") == n_chunks - 1:
                if done == 0:
                    thr, need, nbits, eq = _digit_step(tl.load(hist, volatile=True), thr, need, nbits, BITS)
                    done = ((nbits == 32) | (eq == need)).to(tl.int32)
                rs = st + _at(1, PASSES, BITS)
                tl.store(rs, thr.to(tl.int32, bitcast=True))
                tl.store(rs + 1, need)
                tl.store(rs + 2, nbits)
                tl.store(rs + 3, eq)
                tl.store(rs + 4, done)


@triton.jit
def radix_collect_kernel(
    scores,  # [rows, >= K] fp32: token t's scores in row r = t - row0
    k_start,  # [T] int32
    k_end,  # [T] int32
    state,  # [rows, PASSES * (2**BITS + 1) + 6 + n_chunks] int32, zeroed (layout: _state_row)
    win_keys,  # [T, TOPK] fp32 out (key bits), or scratch [rows, TOPK] int32 (by_token 0)
    win_indices,  # [T, TOPK] int32 out, or scratch [rows, TOPK] int32 (by_token 0)
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    stride_scores_r,
    n_chunks,  # chunks per row: cdiv(K, CHUNK)
    redo,  # [rows] int32 or None: only rows flagged nonzero are collected
    by_token,  # 1: win_* rows are indexed by token t (the outputs), 0: by r (a scratch)
    PASSES: tl.constexpr,  # 32 // BITS
    TOPK: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per program
    BITS: tl.constexpr,  # radix digit width
    N_CHUNKS_P2: tl.constexpr,  # next power of two of n_chunks
):
    """Grid (rows, n_chunks): chunk c's winners (key bits, column), unsorted, into win_keys /
    win_indices (the output rows, indexed by token, or a scratch indexed by r: ``by_token`` = 0
    selects the latter) at positions reserved from the row's counter."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    t = row0 + r
    if _active(t, T, redo, r):
        st = _state_row(state, r, n_chunks, PASSES, BITS)
        cols, m, key, n, any_ = _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK)
        if any_:
            take = m
            if n > TOPK:
                thr, need, nbits, eq, done = _radix_state(st, n, TOPK, PASSES, PASSES, BITS)
                sl = tl.arange(0, N_CHUNKS_P2)
                before = tl.sum(tl.load(st + _at(3, PASSES, BITS) + sl, mask=sl < c, other=0), 0)
                take = _winners(key, m, thr, need, nbits, eq, before)
            cnt = tl.sum(take.to(tl.int32), 0)
            base = tl.atomic_add(st + _at(2, PASSES, BITS), cnt, sem="relaxed")
            row = tl.where(by_token == 0, r, t).to(tl.int64) * TOPK
            _store_winners(win_keys.to(tl.pointer_type(tl.uint32)) + row, win_indices + row, take, key, cols, base)


@triton.jit
def sort_rows_kernel(
    k_start,  # [T] int32
    k_end,  # [T] int32
    out_values,  # [T, TOPK] fp32: the collected winners' key bits in, the sorted scores out
    out_indices,  # [T, TOPK] int32: their columns in, sorted out
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    redo,  # [rows] int32 or None: only rows flagged nonzero are sorted
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,  # next power of two of TOPK
):
    """One program per token t = row0 + pid: sort its min(visible, TOPK) collected winners."""
    t = row0 + tl.program_id(0)
    if _active(t, T, redo, tl.program_id(0)):
        s, e = _row_range(k_start, k_end, t, K)
        _sort_keys(out_values + t.to(tl.int64) * TOPK, out_indices + t.to(tl.int64) * TOPK,
                   tl.minimum(e - s, TOPK), TOPK, TOPK_P2)


@triton.jit
def rank_sort_kernel(
    k_start,  # [T] int32
    k_end,  # [T] int32
    win_keys,  # [rows, TOPK] int32: the collected winners' key bits (scratch row r)
    win_indices,  # [rows, TOPK] int32: their columns
    out_values,  # [T, TOPK] fp32 out
    out_indices,  # [T, TOPK] int32 out
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,  # next power of two of TOPK
    SLICE: tl.constexpr,  # winners placed per program
):
    """Grid (rows, cdiv(TOPK, SLICE)), for few rows: each program places SLICE of row r's collected
    winners (scratch row r) at their rank among all of them, rank = how many have a larger
    key, or the same key and a lower column (columns are distinct), and pads its share of slots
    past the count. Many small programs: a row's sort is a single latency-bound program else."""
    r = tl.program_id(0)
    t = row0 + r
    if t < T:
        s, e = _row_range(k_start, k_end, t, K)
        taken = tl.minimum(e - s, TOPK)
        keys = win_keys.to(tl.pointer_type(tl.uint32)) + r.to(tl.int64) * TOPK
        cols = win_indices + r.to(tl.int64) * TOPK
        q = tl.program_id(1) * SLICE + tl.arange(0, SLICE)
        mk = tl.load(keys + q, mask=q < taken, other=0)
        mi = tl.load(cols + q, mask=q < taken, other=0)
        p = tl.arange(0, TOPK_P2)
        k = tl.load(keys + p, mask=p < taken, other=0)[None, :]
        i = tl.load(cols + p, mask=p < taken, other=0)[None, :]
        before = (k > mk[:, None]) | ((k == mk[:, None]) & (i < mi[:, None]))
        rank = tl.sum((before & (p < taken)[None, :]).to(tl.int32), 1)
        dst = t.to(tl.int64) * TOPK
        tl.store(out_values + dst + rank, _key_value(mk), mask=q < taken)
        tl.store(out_indices + dst + rank, mi, mask=q < taken)
        pad = (q >= taken) & (q < TOPK)
        tl.store(out_values + dst + q, float("-inf"), mask=pad)
        tl.store(out_indices + dst + q, -1, mask=pad)


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
        carry = _first_step(scores, s, e, BLOCK_SELECT, PREFETCH)
        for c0 in range(s, e, BLOCK_SELECT):
            cols = c0 + tl.arange(0, BLOCK_SELECT)
            x, key, carry = _step(scores, cols, e, carry, BLOCK_SELECT, PREFETCH)
            m = (cols < e) & ((key & fixed) == thr)
            hist += tl.histogram(((key >> shift) & (NBINS - 1)).to(tl.int32), NBINS, mask=m)
    return hist


@triton.jit
def _first_step(scores, s, e, BLOCK_SELECT: tl.constexpr, PREFETCH: tl.constexpr):
    """The carry of ``_step`` into a loop over scores[s:e]: with PREFETCH the first step's scores."""
    cols = s + tl.arange(0, BLOCK_SELECT)
    if PREFETCH:
        return tl.load(scores + cols, mask=cols < e, other=0.0)
    return tl.zeros((BLOCK_SELECT,), tl.float32)


@triton.jit
def _step(scores, cols, e, carry, BLOCK_SELECT: tl.constexpr, PREFETCH: tl.constexpr):
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
):
    """Top-TOPK of scores[col_start:col_end] into out_values/out_indices[0:TOPK], sorted descending.

    ``score_indices`` (int32, same positions as ``scores``) replaces the column number written to
    out_indices (a merge of candidate lists); ties still go to the lower position, so positions must
    be in ascending index order among equal scores. Without SORTED the min(TOPK, col_end - col_start) winners' scores
    are left in ascending position order and nothing else is written (no sort, no padding). SORTED
    without SORT_HERE leaves their key bits (and indices) in that order, for ``sort_rows_kernel``.

    Returns whether only part of the keys equal to the threshold were taken (then the winners
    among them were picked by position).

    Radix select, most significant digit first: up to 32/BITS passes of 2**BITS-bin histograms
    over uint32 keys find the threshold prefix ``thr`` (the top ``nbits`` bits) and how many
    elements with that prefix to keep (``need``). With EARLY_EXIT the passes stop once every
    element with the prefix is needed (its bin count == need): lower digits cannot change the
    set, so the output is the same. Then one compaction pass and a bitonic sort of the <= TOPK
    winners (``_sort_keys``). Slots past the visible count get -inf / -1.

    On the H200 ``tl.histogram`` cost grew with the bin count (4096 rows: 4 x 256 bins 293 us,
    4 x 1024 bins 1.4 ms); 8 passes of 4-bit one-hot counts (no histogram) measured 1.8x slower
    than 8-bit histograms.
    """
    NBINS: tl.constexpr = 1 << BITS
    s, e = col_start, col_end
    n = e - s
    ones = tl.full((), 0xFFFFFFFF, tl.uint32)
    thr = tl.zeros((), tl.uint32)  # the threshold prefix, in the top nbits bits of a key
    need = tl.zeros((), tl.int32) + tl.minimum(n, TOPK)
    nbits = tl.full((), 32, tl.int32)  # n <= TOPK: all 32, thr 0, all n keys (> 0, or NaN's 0) taken
    partial = tl.zeros((), tl.int1)  # only part of the keys equal to the threshold prefix are winners
    bins = tl.arange(0, NBINS)
    if n > TOPK:
        nbits = tl.zeros((), tl.int32)
        done = tl.zeros((), tl.int32)
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
    carry = _first_step(scores, s, e, BLOCK_SELECT, PREFETCH)
    for c0 in range(s, e, BLOCK_SELECT):
        cols = c0 + tl.arange(0, BLOCK_SELECT)
        m = cols < e
        x, key, carry = _step(scores, cols, e, carry, BLOCK_SELECT, PREFETCH)
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
        if SORTED:  # key bits, for _sort_keys
            tl.store(out_values.to(tl.pointer_type(tl.uint32)) + pos, key, mask=take & (pos < TOPK))
        else:
            tl.store(out_values + pos, x, mask=take & (pos < TOPK))
        tl.store(out_indices + pos, idx, mask=take & (pos < TOPK))
        taken += tl.sum(take.to(tl.int32), 0)
    if SORTED and SORT_HERE:
        tl.debug_barrier()
        _sort_keys(out_values, out_indices, taken, TOPK, TOPK_P2)
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
):
    """Top-k of the staged scores[t - row0, k_start[t]:k_end[t]] for one token t per program."""
    t = row0 + tl.program_id(0)
    if t < T:
        s = tl.maximum(tl.load(k_start + t), 0)
        e = tl.maximum(tl.minimum(tl.load(k_end + t), K), s)
        select_row(scores + tl.program_id(0).to(tl.int64) * stride_scores_r, s, e,
                   out_values + t.to(tl.int64) * TOPK, out_indices + t.to(tl.int64) * TOPK, TOPK, TOPK_P2,
                   BLOCK_SELECT, BITS=BITS, PACKED=PACKED, SORT_HERE=SORT_HERE, PREFETCH=PREFETCH)


@triton.jit
def _kth_largest_key(key, need, BITS: tl.constexpr):
    """The need-th largest (1-based) of the uint32 keys held in registers: 32 // BITS histogram
    passes over them, most significant digit first."""
    thr = tl.zeros((), tl.uint32)
    nbits = tl.zeros((), tl.int32)
    for p in tl.static_range(32 // BITS):
        digit = ((key >> (32 - BITS - p * BITS)) & ((1 << BITS) - 1)).to(tl.int32)
        hist = tl.histogram(digit, 1 << BITS, mask=(key & _top_bits(nbits)) == thr)
        thr, need, nbits, _ = _digit_step(hist, thr, need, nbits, BITS)
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
        s, e = _row_range(k_start, k_end, t, K)
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
        s, e = _row_range(k_start, k_end, t, K)
        c = tl.num_programs(1) - 1 - tl.program_id(1)
        c0 = tl.maximum(c * CHUNK, s)
        c1 = tl.minimum(c * CHUNK + CHUNK, e)
        fr = filt + r.to(tl.int64) * 2
        lo = tl.load(fr).to(tl.uint32, bitcast=True)
        src = scores + r.to(tl.int64) * stride_scores_r
        dst = r.to(tl.int64) * CAP
        carry = _first_step(src, c0, c1, STEP, True)
        for b in range(c0, c1, STEP):  # each step's scores loaded a step ahead, beside the atomic
            cols = b + tl.arange(0, STEP)
            x, key, carry = _step(src, cols, c1, carry, STEP, True)
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
    redo,  # [rows] int32 out, zeroed: 1 where the row must be selected by the fallback
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
):
    """One program per row: top-k of its candidates (``select_row``, columns as indices), exact
    when the candidates hold at least min(visible, TOPK) keys, fit CAP, and the threshold needs
    all keys equal to it (candidates are in no column order, so a partial tie cannot be
    resolved here). Otherwise the row is flagged in ``redo`` for the chunked passes."""
    r = tl.program_id(0)
    t = row0 + r
    if t < T:
        s, e = _row_range(k_start, k_end, t, K)
        cnt = tl.load(filt + r.to(tl.int64) * 2 + 1)
        if (cnt < tl.minimum(e - s, TOPK)) | (cnt > CAP):
            tl.store(redo + r, 1)
        else:
            at = r.to(tl.int64) * CAP
            partial = select_row(cand_scores + at, 0, cnt, out_values + t.to(tl.int64) * TOPK,
                                 out_indices + t.to(tl.int64) * TOPK, TOPK, TOPK_P2, BLOCK_SELECT,
                                 score_indices=cand_cols + at, BITS=BITS, SORT_HERE=SORT_HERE, PREFETCH=PREFETCH)
            if partial:
                tl.store(redo + r, 1)
