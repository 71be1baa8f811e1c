"""The selection engine's chunked radix passes (long rows, few rows, and the rows the sampled
filter flags); keys, digits and winners as in kernels/select.py. ``place_ranked`` also places the
winners of the histogram select for a few rows (kernels/select_hist.py).

Every row is cut into chunks of CHUNK columns, one program per (row, chunk), a launch per digit
pass. ``radix_pass_kernel`` adds its chunk's digit histogram to the row's (int atomics:
deterministic); its last launch (PASS == PASSES) counts, per chunk, the keys equal to a threshold
that is only partly needed (a no-op otherwise); ``radix_collect_kernel`` writes each chunk's
winners at a position taken from a row counter; ``sort_rows_kernel`` sorts them.
Positions taken from the counter depend on timing; the sorted result does not.

The ranked path (at most ``SelectConfig.rank_rows`` rows, too few to fill the GPU) stops after
``rank_passes`` digit passes: ``compact_kernel`` copies every key whose top bits reach the
threshold prefix (the winners, and the few others sharing the prefix: about k on continuous
scores), and ``cand_rank_kernel`` places each candidate at its rank among them, rank = larger keys
plus equal keys at lower columns, from topk / rank_slice programs per row. Five launches instead
of eight; the rank does not depend on where the candidates were copied, so the result is
deterministic. A row whose candidates overflow their slots (a run of equal or nearly equal scores
at the threshold) is selected by one program, ``select_row`` below the prefix: exact, slower.
"""
import triton
import triton.language as tl

from .select import digit_step, key_value, row_range, select_row, sel_key, sort_keys, store_winners, top_bits, winners


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
def _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK: tl.constexpr):
    """Chunk c of row r (token t): (columns, visible mask, keys, n = visible count of the row,
    any = the chunk holds a visible column)."""
    s, e = row_range(k_start, k_end, t, K)
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
    redo,  # [1 + rows] int32 or None: a count, then the rows to select (the filter's fallback)
    PASS: tl.constexpr,  # the digit of this launch, most significant first; PASSES: the tie count
    PASSES: tl.constexpr,  # digit passes of the state's layout: 32 // BITS, or rank_passes (the ranked path)
    TOPK: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per program
    BITS: tl.constexpr,  # radix digit width
):
    """Grid (rows, n_chunks), or (any, n_chunks) given ``redo``. PASS < PASSES, digit pass PASS:
    chunk c's histogram of digit PASS over the keys sharing the threshold prefix so far, added to
    the row's hist[PASS]; the row's last program to arrive (acq_rel counter: it sees every other
    program's histogram) advances the row's radix state. PASS == PASSES, the tie count: ties[c] =
    chunk c's keys equal to the row's final threshold prefix when only part of them is taken (else
    nothing is read or written). Given ``redo``, program (g, c) takes chunk c of the listed rows
    g, g + grid rows, ..."""
    if redo is None:
        _radix_pass_row(scores, k_start, k_end, state, tl.program_id(0), row0, T, K, stride_scores_r, n_chunks,
                        PASS, PASSES, TOPK, CHUNK, BITS)
    else:
        for i in range(tl.program_id(0), tl.load(redo), tl.num_programs(0)):
            _radix_pass_row(scores, k_start, k_end, state, tl.load(redo + 1 + i), row0, T, K, stride_scores_r,
                            n_chunks, PASS, PASSES, TOPK, CHUNK, BITS)


@triton.jit
def _radix_pass_row(scores, k_start, k_end, state, r, row0, T, K, stride_scores_r, n_chunks, PASS: tl.constexpr,
                    PASSES: tl.constexpr, TOPK: tl.constexpr, CHUNK: tl.constexpr, BITS: tl.constexpr):
    """radix_pass_kernel's work on chunk program_id(1) of row r."""
    c = tl.program_id(1)
    t = row0 + r
    if t < T:
        st = _state_row(state, r, n_chunks, PASSES, BITS)
        if PASS == PASSES:
            s, e = row_range(k_start, k_end, t, K)
            thr, need, nbits, eq, done = _radix_state(st, e - s, TOPK, PASSES, PASSES, BITS)
            if (e - s > TOPK) & (eq > need):
                cols, m, key, n, any_ = _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK)
                hit = m & ((key & top_bits(nbits)) == thr)
                tl.store(st + _at(3, PASSES, BITS) + c, tl.sum(hit.to(tl.int32), 0))
        else:
            s, e = row_range(k_start, k_end, t, K)
            thr, need, nbits, eq, done = _radix_state(st, e - s, TOPK, PASS, PASSES, BITS)
            bins = tl.arange(0, 1 << BITS)
            hist = st + PASS * (1 << BITS) + bins
            if (done == 0) & (c * CHUNK < e) & (c * CHUNK + CHUNK > s):  # nothing is read once the set is fixed
                cols, m, key, n, any_ = _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK)
                m = m & ((key & top_bits(nbits)) == thr)
                digit = ((key >> (32 - BITS - PASS * BITS)) & ((1 << BITS) - 1)).to(tl.int32)
                h = tl.histogram(digit, 1 << BITS, mask=m)
                tl.atomic_add(hist, h, mask=h > 0, sem="relaxed")
            if tl.atomic_add(st + _at(0, PASSES, BITS) + PASS, 1, sem="acq_rel") == n_chunks - 1:
                if done == 0:
                    thr, need, nbits, eq = digit_step(tl.load(hist, volatile=True), thr, need, nbits, BITS)
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
    win_keys,  # [T, TOPK] fp32 out: the winners' key bits
    win_indices,  # [T, TOPK] int32 out: their columns
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    stride_scores_r,
    n_chunks,  # chunks per row: cdiv(K, CHUNK)
    redo,  # [1 + rows] int32 or None: a count, then the rows to collect (as radix_pass_kernel)
    PASSES: tl.constexpr,  # 32 // BITS
    TOPK: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per program
    BITS: tl.constexpr,  # radix digit width
    N_CHUNKS_P2: tl.constexpr,  # next power of two of n_chunks
):
    """Grid (rows, n_chunks), or (any, n_chunks) walking ``redo`` as radix_pass_kernel does:
    chunk c's winners (key bits, column), unsorted, into token t's rows of win_keys / win_indices
    at positions reserved from the row's counter."""
    if redo is None:
        _collect_row(scores, k_start, k_end, state, win_keys, win_indices, tl.program_id(0), row0, T, K,
                     stride_scores_r, n_chunks, PASSES, TOPK, CHUNK, BITS, N_CHUNKS_P2)
    else:
        for i in range(tl.program_id(0), tl.load(redo), tl.num_programs(0)):
            _collect_row(scores, k_start, k_end, state, win_keys, win_indices, tl.load(redo + 1 + i), row0, T, K,
                         stride_scores_r, n_chunks, PASSES, TOPK, CHUNK, BITS, N_CHUNKS_P2)


@triton.jit
def _collect_row(scores, k_start, k_end, state, win_keys, win_indices, r, row0, T, K, stride_scores_r, n_chunks,
                 PASSES: tl.constexpr, TOPK: tl.constexpr, CHUNK: tl.constexpr, BITS: tl.constexpr,
                 N_CHUNKS_P2: tl.constexpr):
    """radix_collect_kernel's work on chunk program_id(1) of row r."""
    c = tl.program_id(1)
    t = row0 + r
    if t < T:
        st = _state_row(state, r, n_chunks, PASSES, BITS)
        cols, m, key, n, any_ = _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK)
        if any_:
            take = m
            if n > TOPK:
                thr, need, nbits, eq, done = _radix_state(st, n, TOPK, PASSES, PASSES, BITS)
                sl = tl.arange(0, N_CHUNKS_P2)
                before = tl.sum(tl.load(st + _at(3, PASSES, BITS) + sl, mask=sl < c, other=0), 0)
                take = winners(key, m, thr, need, nbits, eq, before)
            cnt = tl.sum(take.to(tl.int32), 0)
            base = tl.atomic_add(st + _at(2, PASSES, BITS), cnt, sem="relaxed")
            row = t.to(tl.int64) * TOPK
            store_winners(win_keys.to(tl.pointer_type(tl.uint32)) + row, win_indices + row, take, key, cols, base)


@triton.jit
def sort_rows_kernel(
    k_start,  # [T] int32
    k_end,  # [T] int32
    out_values,  # [T, TOPK] fp32: the collected winners' key bits in, the sorted scores out
    out_indices,  # [T, TOPK] int32: their columns in, sorted out
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    redo,  # [1 + rows] int32 or None: a count, then the rows to sort (program g: entries g, g + grid, ...)
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,  # next power of two of TOPK
):
    """Sort the min(visible, TOPK) collected winners of token t = row0 + r: r = pid, or each listed row."""
    if redo is None:
        _sort_row(k_start, k_end, out_values, out_indices, row0 + tl.program_id(0), T, K, TOPK, TOPK_P2)
    else:
        for i in range(tl.program_id(0), tl.load(redo), tl.num_programs(0)):
            _sort_row(k_start, k_end, out_values, out_indices, row0 + tl.load(redo + 1 + i), T, K, TOPK, TOPK_P2)


@triton.jit
def _sort_row(k_start, k_end, out_values, out_indices, t, T, K, TOPK: tl.constexpr, TOPK_P2: tl.constexpr):
    if t < T:
        s, e = row_range(k_start, k_end, t, K)
        sort_keys(out_values + t.to(tl.int64) * TOPK, out_indices + t.to(tl.int64) * TOPK,
                  tl.minimum(e - s, TOPK), TOPK, TOPK_P2)


@triton.jit
def place_ranked(keys, cols, m, valid, out_values, out_indices, TOPK: tl.constexpr, SLICE: tl.constexpr,
                 TILE: tl.constexpr, lo=0):
    """Program (r, g) of a (rows, G) grid places a row's entries g * SLICE, (g + G) * SLICE, ... of
    its m (key bits at ``keys``, distinct columns at ``cols``) at out_values / out_indices [rank],
    rank = how many candidates have a larger key, or the same key and a lower column, when below
    TOPK; candidates are the entries whose key is at least ``lo`` (entries below it are neither
    placed nor counted). It pads its share of the slots from ``valid`` up to TOPK with -inf / -1.
    The entries are compared TILE at a time."""
    for q0 in range(tl.program_id(1) * SLICE, tl.maximum(m, TOPK), tl.num_programs(1) * SLICE):
        q = q0 + tl.arange(0, SLICE)
        mk = tl.load(keys + q, mask=q < m, other=0)
        mi = tl.load(cols + q, mask=q < m, other=0)
        rank = tl.zeros((SLICE,), tl.int32)
        for p0 in range(0, m, TILE):
            p = p0 + tl.arange(0, TILE)
            k = tl.load(keys + p, mask=p < m, other=0)
            i = tl.load(cols + p, mask=p < m, other=0)[None, :]
            before = (k[None, :] > mk[:, None]) | ((k[None, :] == mk[:, None]) & (i < mi[:, None]))
            rank += tl.sum((before & ((p < m) & (k >= lo))[None, :]).to(tl.int32), 1)
        win = (q < m) & (mk >= lo) & (rank < TOPK)
        tl.store(out_values + rank, key_value(mk), mask=win)
        tl.store(out_indices + rank, mi, mask=win)
        pad = (q >= valid) & (q < TOPK)
        tl.store(out_values + q, float("-inf"), mask=pad)
        tl.store(out_indices + q, -1, mask=pad)


@triton.jit
def compact_kernel(
    scores,  # [rows, >= K] fp32: token t's scores in row r = t - row0
    k_start,  # [T] int32
    k_end,  # [T] int32
    state,  # [rows, ...] int32: the radix state after the digit passes (layout: _state_row)
    cand_keys,  # [rows, CAP] int32 out: candidates' key bits
    cand_cols,  # [rows, CAP] int32 out: their columns
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    stride_scores_r,
    n_chunks,  # chunks per row: cdiv(K, CHUNK)
    CAP,  # candidate slots per row
    PASSES: tl.constexpr,  # digit passes run (the state's layout)
    TOPK: tl.constexpr,
    CHUNK: tl.constexpr,  # columns per program
    BITS: tl.constexpr,  # radix digit width
):
    """Grid (rows, n_chunks), the ranked path (few rows) after PASSES digit passes: chunk c's keys whose
    top nbits reach the threshold prefix (every winner, and the others sharing its prefix) at
    positions reserved from the row's counter, as (key bits, column); past CAP they are only counted."""
    r = tl.program_id(0)
    c = tl.program_id(1)
    t = row0 + r
    if t < T:
        st = _state_row(state, r, n_chunks, PASSES, BITS)
        cols, m, key, n, any_ = _chunk(scores, k_start, k_end, r, t, c, K, stride_scores_r, CHUNK)
        if any_:
            thr, need, nbits, eq, done = _radix_state(st, n, TOPK, PASSES, PASSES, BITS)
            take = m & ((key & top_bits(nbits)) >= thr)
            base = tl.atomic_add(st + _at(2, PASSES, BITS), tl.sum(take.to(tl.int32), 0), sem="relaxed")
            pos = base + tl.cumsum(take.to(tl.int32), 0) - 1
            at = r.to(tl.int64) * CAP + pos
            tl.store(cand_keys + at, key.to(tl.int32, bitcast=True), mask=take & (pos < CAP))
            tl.store(cand_cols + at, cols, mask=take & (pos < CAP))


@triton.jit
def cand_rank_kernel(
    scores,  # [rows, >= K] fp32: token t's scores in row r = t - row0 (read only by an overflowing row)
    k_start,  # [T] int32
    k_end,  # [T] int32
    state,  # [rows, ...] int32: the radix state and the candidate count (layout: _state_row)
    cand_keys,  # [rows, CAP] int32: candidates' key bits (compact_kernel)
    cand_cols,  # [rows, CAP] int32: their columns
    out_values,  # [T, TOPK] fp32 out
    out_indices,  # [T, TOPK] int32 out
    row0,  # first token of this launch
    T,  # tokens
    K,  # columns of a row
    stride_scores_r,
    n_chunks,  # chunks per row: cdiv(K, CHUNK)
    CAP,  # candidate slots per row
    PASSES: tl.constexpr,  # digit passes run (the state's layout)
    TOPK: tl.constexpr,
    TOPK_P2: tl.constexpr,  # next power of two of TOPK
    SLICE: tl.constexpr,  # candidates placed per program and step
    TILE: tl.constexpr,  # candidates compared per step
    BITS: tl.constexpr,  # radix digit width
    BLOCK_SELECT: tl.constexpr,  # columns per step of the overflow's select_row
):
    """Grid (rows, G): program g places row r's candidates g * SLICE, (g + G) * SLICE, ... at their rank
    among the row's m candidates (``place_ranked``): the rank is order-free, so where compact_kernel put
    them does not matter. A row whose candidates overflowed CAP (keys crowding the threshold prefix:
    many ties) is selected by its program 0 alone: ``select_row`` over the row below the passes' prefix."""
    r = tl.program_id(0)
    t = row0 + r
    if t < T:
        st = _state_row(state, r, n_chunks, PASSES, BITS)
        m = tl.load(st + _at(2, PASSES, BITS))
        dst = t.to(tl.int64) * TOPK
        if m <= CAP:
            place_ranked(cand_keys.to(tl.pointer_type(tl.uint32)) + r.to(tl.int64) * CAP,
                         cand_cols + r.to(tl.int64) * CAP, m, m, out_values + dst, out_indices + dst, TOPK, SLICE, TILE)
        elif tl.program_id(1) == 0:
            s, e = row_range(k_start, k_end, t, K)
            thr, need, nbits, eq, done = _radix_state(st, e - s, TOPK, PASSES, PASSES, BITS)
            select_row(scores + r.to(tl.int64) * stride_scores_r, s, e, out_values + dst, out_indices + dst, TOPK,
                       TOPK_P2, BLOCK_SELECT, BITS=BITS, START_BITS=PASSES * BITS, start_thr=thr, start_need=need)
