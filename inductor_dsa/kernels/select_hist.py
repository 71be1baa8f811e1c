"""The selection engine's histogram select, used by the paged decode indexer's split top-k
(kernels/paged_indexer.py): keys, semantics and ``select_row`` as in kernels/select.py.

A row is cut into S chunks of C columns. Its keys are counted in an 11-bit histogram of their top
bits (the paged score kernel counts as it writes them: int atomics, deterministic; ``HIST_COPIES``
copies, chunk s counting into copy s % COPIES, because the counts of one hot bin serialise at its
address). The row's threshold bin T, the bin of its k-th largest key (``threshold``), bounds the
winners: every chunk copies its keys in bins >= T, in column order, into its partial list of
LIST_SIZE = min(k, C) entries (``chunk_list``), or, when more than that many pass, its exact top
LIST_SIZE (``select_row``, unsorted, column order), which holds every winner the chunk can give.
With FINE (complete histograms when the lists are made) the bin-T keys are also counted by their
next 11 bits, and the merge keeps only the entries whose top 22 bits reach the k-th key's: about k
candidates.

``list_merge_kernel`` concatenates a row's lists (column order kept, so ties still go to the
lower column) and runs ``select_row`` over them, sorted there. For a few rows (RANKED in the
select kernel) each chunk also copies its list to the row's candidates, packed from a row counter,
and ``list_rank_kernel`` places every candidate at or above the 22-bit prefix at its rank among them
from many programs per row (``select_chunked.place_ranked``): a one-program merge is latency-bound.
A row with too many packed entries (the ranking's compares grow as their square) is merged by the
rank kernel's program 0 (``merge_row``, the merge kernel's work).

Tried for ``logits_topk``'s few long rows (a counting kernel and a list kernel over (row, chunk)
programs, then this merge), and slower than the chunked radix passes on an H100: 1 x 131072
top-2048 51.7 us against 29.9 replayed, 1 x 2**20 66.2 against 53.9. Without a score kernel to
hide them in, the counts of a row's hot bins serialise (18-20 us), and the one-program merge
(17-22 us) is as long as all of the radix passes.
"""
import triton
import triton.language as tl

from .select import sel_key, select_row
from .select_chunked import place_ranked

HIST_BINS = tl.constexpr(2048)  # histogram of the top 11 bits of the order-preserving key
HIST_SHIFT = tl.constexpr(21)
FINE_SHIFT = tl.constexpr(10)  # the fine histogram: key bits [10, 21) of the keys in the threshold bin
RANK_STATE = tl.constexpr(5)  # int32 words per row of the ranked lists' state (list_rank_kernel)


@triton.jit
def row_histogram(hist_row, COPIES: tl.constexpr):
    """The sum of a row's COPIES key histograms at hist_row (one copy in registers at a time:
    [8, 2048] at once spilled on sm90 under triton 3.6)."""
    at = hist_row + tl.arange(0, HIST_BINS)
    h = tl.load(at)
    for c in tl.static_range(1, COPIES):
        h += tl.load(at + c * HIST_BINS)
    return h


@triton.jit
def threshold(h, k):
    """(T, above) of histogram h: the largest bin T with at least k counts in bins >= T (0 when
    there are fewer), and the counts in bins > T."""
    bins = tl.arange(0, HIST_BINS)
    t = tl.max(tl.where(tl.cumsum(h, 0, reverse=True) >= k, bins, 0), 0)
    return t, tl.sum(tl.where(bins > t, h, 0), 0)


@triton.jit
def chunk_list(src, c0, c1, hist_row, fine_row, list_values, list_indices, TOPK,
               LIST_SIZE: tl.constexpr, LIST_SIZE_P2: tl.constexpr, BLOCK_SELECT: tl.constexpr,
               HIST_COPIES: tl.constexpr, FINE: tl.constexpr, BITS: tl.constexpr):
    """The partial list of the chunk src[c0:c1] (index j for src[j]) of a row whose histograms are at
    hist_row: its scores in bins >= the row's threshold bin T, in column order, into list_values /
    list_indices, or its exact top LIST_SIZE when more pass. With FINE its bin-T keys are counted by
    their next 11 bits at fine_row. Returns (the list's length, T, the keys in bins above T, the keys
    counted)."""
    h = row_histogram(hist_row, HIST_COPIES)
    thr, above = threshold(h, TOPK)
    counted = tl.sum(h, 0)
    taken = tl.zeros((), tl.int32)
    for j0 in range(c0, c1, BLOCK_SELECT):
        j = j0 + tl.arange(0, BLOCK_SELECT)
        x = tl.load(src + j, mask=j < c1, other=0.0)
        key = sel_key(x)
        bin = (key >> HIST_SHIFT).to(tl.int32)
        take = (j < c1) & (bin >= thr)
        if FINE:
            sub = ((key >> FINE_SHIFT) & (HIST_BINS - 1)).to(tl.int32)
            tl.atomic_add(fine_row + sub, 1, mask=(j < c1) & (bin == thr), sem="relaxed")
        pos = taken + tl.cumsum(take.to(tl.int32), 0) - 1
        tl.store(list_values + pos, x, mask=take & (pos < LIST_SIZE))
        tl.store(list_indices + pos, j, mask=take & (pos < LIST_SIZE))
        taken += tl.sum(take.to(tl.int32), 0)
    if taken > LIST_SIZE:
        tl.debug_barrier()
        select_row(src, c0, c1, list_values, list_indices, LIST_SIZE, LIST_SIZE_P2, BLOCK_SELECT, False, BITS=BITS)
        taken = LIST_SIZE
    return taken, thr, above, counted


@triton.jit
def zero_kernel(buf, n, BLOCK: tl.constexpr):
    """buf[0:n] = 0 (int32), BLOCK words per program."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    tl.store(buf + i, tl.zeros((BLOCK,), tl.int32), mask=i < n)


@triton.jit
def prefix22(fine_row, t1, above, TOPK, FINE: tl.constexpr):
    """(lo, need) of a row whose k-th largest key lies in bin t1 with ``above`` keys in higher bins:
    with FINE (the fine histogram at fine_row complete) the top 22 bits of that key, (t1 << 11) |
    t2, and how many of the keys with that prefix are winners; else t1 << 11 and bin t1's need."""
    lo = (t1 << (HIST_SHIFT - FINE_SHIFT)).to(tl.uint32)
    need = TOPK - above
    if FINE:
        t2, above2 = threshold(tl.load(fine_row + tl.arange(0, HIST_BINS)), need)
        lo = lo | t2.to(tl.uint32)
        need -= above2
    return lo, need


@triton.jit
def list_merge_kernel(
    part_values,  # fp32 [rows*S, LIST_SIZE] partial lists
    part_indices,  # int32, same shape: their indices
    list_counts,  # int32 [rows*S] entries per list
    histogram,  # FINE: int32 [rows, HIST_COPIES, HIST_BINS] key histograms; else unused
    fine,  # FINE: int32 [rows, HIST_BINS] fine histograms of the threshold bins; else unused
    cand_values,  # fp32 [rows, S * LIST_SIZE] scratch: the row's concatenated lists
    cand_indices,  # int32, same shape
    out_values,  # fp32 [rows, TOPK] out
    out_indices,  # int32 [rows, TOPK] out
    S,  # lists per row
    LIST_SIZE: tl.constexpr,  # entries per partial list
    TOPK: tl.constexpr,  # k of the top-k
    TOPK_P2: tl.constexpr,  # next power of two of TOPK
    BLOCK_SELECT: tl.constexpr,  # elements per step of the radix-select passes
    S_P2: tl.constexpr,  # next power of two of S
    BLOCK_COPY: tl.constexpr,  # entries per list copied per step
    HIST_COPIES: tl.constexpr,  # copies of each row's key histogram
    FINE: tl.constexpr,  # the fine histograms are counted (complete when the lists were made)
    BITS: tl.constexpr,  # radix digit width
):
    """One program per row: concatenate its S lists (order kept) into cand[row] and select the final
    sorted, padded top-TOPK from them. With FINE only the entries whose top 22 key bits
    reach the k-th largest key's, (T << 11) | T2, are copied: T from the key histogram, T2 the fine
    histogram's threshold for the TOPK - (keys above bin T) still needed from bin T (about TOPK
    candidates instead of TOPK plus bin T's population), and the select starts below that prefix."""
    merge_row(tl.program_id(0).to(tl.int64), part_values, part_indices, list_counts, histogram, fine, cand_values,
              cand_indices, out_values, out_indices, S, LIST_SIZE, TOPK, TOPK_P2, BLOCK_SELECT, S_P2, BLOCK_COPY,
              HIST_COPIES, FINE, BITS)


@triton.jit
def merge_row(row, part_values, part_indices, list_counts, histogram, fine, cand_values, cand_indices, out_values,
              out_indices, S, LIST_SIZE: tl.constexpr, TOPK: tl.constexpr, TOPK_P2: tl.constexpr,
              BLOCK_SELECT: tl.constexpr, S_P2: tl.constexpr, BLOCK_COPY: tl.constexpr, HIST_COPIES: tl.constexpr,
              FINE: tl.constexpr, BITS: tl.constexpr):
    """``list_merge_kernel``'s work on one row."""
    sl = tl.arange(0, S_P2)
    c = tl.load(list_counts + row * S + sl, mask=sl < S, other=0)
    lo = tl.zeros((), tl.uint32)
    need = tl.zeros((), tl.int32)
    if FINE:  # need: the winners among the keys whose top 22 bits are lo
        t1, above = threshold(row_histogram(histogram + row * HIST_COPIES * HIST_BINS, HIST_COPIES), TOPK)
        lo, need = prefix22(fine + row * HIST_BINS, t1, above, TOPK, True)
    src = row * S * LIST_SIZE
    lists = src + sl[:, None] * LIST_SIZE  # list starts, [S_P2, 1]
    kept = c  # entries of each list at or above lo: all of them without FINE (lo = 0)
    if FINE:  # counted first: they place each list's survivors
        kept = tl.zeros((S_P2,), tl.int32)
        for i0 in range(0, tl.max(c, 0), BLOCK_COPY):
            i = i0 + tl.arange(0, BLOCK_COPY)
            m = i[None, :] < c[:, None]
            pv = tl.load(part_values + lists + i[None, :], mask=m, other=0.0)
            kept += tl.sum((m & ((sel_key(pv) >> FINE_SHIFT) >= lo)).to(tl.int32), 1)
    off = tl.cumsum(kept, 0) - kept
    total = tl.sum(kept, 0)
    seen = tl.zeros((S_P2,), tl.int32)
    for i0 in range(0, tl.max(c, 0), BLOCK_COPY):
        i = i0 + tl.arange(0, BLOCK_COPY)
        m = i[None, :] < c[:, None]
        pv = tl.load(part_values + lists + i[None, :], mask=m, other=0.0)
        pi = tl.load(part_indices + lists + i[None, :], mask=m, other=0)
        keep = m & ((sel_key(pv) >> FINE_SHIFT) >= lo)
        pos = off[:, None] + seen[:, None] + tl.cumsum(keep.to(tl.int32), 1) - 1
        tl.store(cand_values + src + pos, pv, mask=keep)
        tl.store(cand_indices + src + pos, pi, mask=keep)
        seen += tl.sum(keep.to(tl.int32), 1)
    tl.debug_barrier()
    # with FINE the top 22 (32 - FINE_SHIFT) bits of the threshold are lo: two passes of 5-bit digits at most
    select_row(cand_values + src, 0, total, out_values + row * TOPK, out_indices + row * TOPK, TOPK, TOPK_P2,
               BLOCK_SELECT, True, cand_indices + src, 5 if FINE else BITS,
               START_BITS=22 if FINE else 0, start_thr=lo << FINE_SHIFT, start_need=need)


@triton.jit
def rank_arrive(rank_state, row, S, t1, above, counted):
    """Called by each of a row's S chunk programs once its list is packed, with ``chunk_list``'s
    (T, above, counted): the last to arrive (acq_rel counter), whose key histograms held every chunk,
    stores them into rank_state[row, 2:5] for ``list_rank_kernel``."""
    st = rank_state + row * RANK_STATE
    if tl.atomic_add(st + 1, 1, sem="acq_rel") == S - 1:
        tl.store(st + 2, t1)
        tl.store(st + 3, above)
        tl.store(st + 4, counted)


@triton.jit
def list_rank_kernel(
    part_values,  # fp32 [rows*S, LIST_SIZE] partial lists (read only by the merge fallback)
    part_indices,  # int32, same shape: their indices
    list_counts,  # int32 [rows*S] entries per list
    histogram,  # int32 [rows, HIST_COPIES, HIST_BINS] key histograms (the merge fallback)
    fine,  # FINE: int32 [rows, HIST_BINS] fine histograms of the threshold bins; else unused
    cand_values,  # fp32 [rows, S * LIST_SIZE] scratch of the merge fallback
    cand_indices,  # int32, same shape
    rank_keys,  # int32 [rows, S * LIST_SIZE]: the row's list entries' key bits, packed
    rank_cols,  # int32, same shape: their indices
    rank_state,  # int32 [rows, RANK_STATE]: entries packed, arrivals, then (rank_arrive) T, above, keys counted
    out_values,  # fp32 [rows, TOPK] out
    out_indices,  # int32 [rows, TOPK] out
    S,  # lists per row
    RANK_MAX,  # rows with at most this many entries are ranked, others merged
    LIST_SIZE: tl.constexpr,  # entries per partial list
    TOPK: tl.constexpr,  # k of the top-k
    TOPK_P2: tl.constexpr,  # next power of two of TOPK
    SLICE: tl.constexpr,  # entries placed per program and step
    TILE: tl.constexpr,  # entries compared per step
    BLOCK_SELECT: tl.constexpr,  # the merge fallback's list_merge_kernel constants ...
    S_P2: tl.constexpr,
    BLOCK_COPY: tl.constexpr,
    HIST_COPIES: tl.constexpr,
    FINE: tl.constexpr,  # the fine histograms are complete
    BITS: tl.constexpr,
):
    """Grid (rows, G), for a few rows: program g places the row's packed entries g * SLICE, (g + G) *
    SLICE, ... whose key reaches the row's prefix bound (``prefix22``: the top 22 bits of the k-th
    key's, or without FINE its top 11) at their rank among those (``place_ranked``; exact: the
    lists hold every winner and every key that beats one), and pads the slots past the visible keys.
    The rank does not depend on the order in which the chunks packed their lists. A row of more than
    RANK_MAX entries (chunks whose keys crowd the threshold bin, each list the chunk's top) is merged
    by its program 0 instead (``merge_row``): the ranking's compares grow as the entries' square."""
    row = tl.program_id(0).to(tl.int64)
    st = rank_state + row * RANK_STATE
    m = tl.load(st)
    if m <= RANK_MAX:
        lo, need = prefix22(fine + row * HIST_BINS, tl.load(st + 2), tl.load(st + 3), TOPK, FINE)
        visible = tl.load(st + 4)
        at = row * S * LIST_SIZE
        dst = row * TOPK
        place_ranked(rank_keys.to(tl.pointer_type(tl.uint32)) + at, rank_cols + at, m, visible, out_values + dst,
                     out_indices + dst, TOPK, SLICE, TILE, lo << FINE_SHIFT)
    elif tl.program_id(1) == 0:
        merge_row(row, part_values, part_indices, list_counts, histogram, fine, cand_values, cand_indices,
                  out_values, out_indices, S, LIST_SIZE, TOPK, TOPK_P2, BLOCK_SELECT, S_P2, BLOCK_COPY, HIST_COPIES,
                  FINE, BITS)
