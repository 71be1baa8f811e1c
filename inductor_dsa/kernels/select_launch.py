"""Launcher of the selection engine (kernels/select*.py): top-k of fp32 rows over per-row ranges.

The method depends only on shapes, never on data: one program per row (``select_kernel``) while
rows are many and at most ``row_max`` long; the sampled filter for many longer rows (at least
``filter_rows``): a candidate bound per row from a sample, one pass copying the keys above it,
``select_row`` over those, and the chunked passes for the rows it flags; otherwise the chunked
radix passes over (row, chunk) programs, whose winners are sorted per row; when the rows are too
few to fill the GPU (at most ``rank_rows``), the ranked path: two of those passes, then the keys at
or above the threshold prefix compacted and ranked by several programs per row.
"""
from __future__ import annotations

import torch

from . import configs
from .host import cdiv, next_pow2
from .select import select_kernel
from .select_chunked import cand_rank_kernel, compact_kernel, radix_collect_kernel, radix_pass_kernel, sort_rows_kernel
from .select_filter import cand_select_kernel, filter_kernel, sample_kernel

_TYPES = dict(z="fp32", scores="*fp32", k_start="*i32", k_end="*i32", state="*i32", out_values="*fp32",
              out_indices="*i32", win_keys="*fp32", win_indices="*i32", filt="*i32", redo="*i32",
              cand_scores="*fp32", cand_cols="*i32", cand_keys="*i32")  # argument types for the AOT signatures (else i32)


def chunked(rows: int, n: int, cfg: configs.SelectConfig) -> bool:
    """Rows of n columns go through the chunked passes (else one program per row)."""
    return n > cfg.row_max or (rows < cfg.few_rows and n > cfg.chunk)


def filtered(rows: int, n: int, cfg: configs.SelectConfig) -> bool:
    """Rows of n columns go through the sampled filter (with the chunked passes as its fallback)."""
    return n > cfg.row_max and rows >= cfg.filter_rows


def cand_slots(n: int, topk: int, cfg: configs.SelectConfig) -> int:
    """Candidate slots per row of the sampled filter."""
    return min(cfg.cand_factor * next_pow2(topk), next_pow2(n))


def scratch_bytes(rows: int, n: int, topk: int, cfg: configs.SelectConfig) -> int:
    """Device bytes the select of rows x n scores allocates beyond its outputs (the sampled filter's
    or the ranked path's candidates; the radix state, smaller, is left out)."""
    if not chunked(rows, n, cfg):
        return 0
    if rows <= cfg.rank_rows:
        return rows * rank_cap(topk, cfg) * 8
    return rows * cand_slots(n, topk, cfg) * 8 if filtered(rows, n, cfg) else 0


def row_sort_warps(topk: int, cfg: configs.SelectConfig) -> int:
    """Warps of a ``sort_rows_kernel`` launch over rows of topk winners: ``cfg.row_sort_warps`` per
    1024 (the winners per thread kept as topk grows), at least 4."""
    return max(4, cfg.row_sort_warps * next_pow2(topk) // 1024)


def chunk_size(device, rows: int, n: int, cfg: configs.SelectConfig) -> int:
    """Columns per program of the chunked passes: ``cfg.chunk``, halved (down to chunk_min) while
    the rows x chunks programs would not fill ``chunk_programs`` per multiprocessor."""
    chunk = cfg.chunk
    want = configs.wave_programs(device, cfg.chunk_programs)
    while chunk > cfg.chunk_min and rows * cdiv(n, chunk) < want:
        chunk //= 2
    return chunk


def select(src, row0: int, rows: int, t: int, n: int, k_start, k_end, out_v, out_i, topk: int,
           cfg: configs.SelectConfig):
    """Top-k of tokens row0 .. row0 + rows - 1 (< t), whose scores are src[t - row0, :n] (last dim
    contiguous), into out_v / out_i [T, topk] rows row0 ...; columns k_start[t] <= j < k_end[t].
    Returns the sampled filter's fallback list ([1 + rows] int32: a count, then the rows, launch-
    relative and in no fixed order, that went through the chunked passes), or None on the other paths."""
    topk_p2 = next_pow2(topk)
    if not chunked(rows, n, cfg):
        apart = topk >= cfg.sort_apart
        select_kernel[(rows,)](src, k_start, k_end, out_v, out_i, row0, t, n, src.stride(0),
                               TOPK=topk, TOPK_P2=topk_p2, BLOCK_SELECT=cfg.ch, BITS=cfg.bits, PACKED=cfg.packed,
                               SORT_HERE=not apart, PREFETCH=cfg.prefetch, SORT32=cfg.sort32,
                               num_warps=cfg.num_warps)
        if apart:
            sort_rows_kernel[(rows,)](k_start, k_end, out_v, out_i, row0, t, n, None, TOPK=topk, TOPK_P2=topk_p2,
                                      num_warps=row_sort_warps(topk, cfg))
        return None
    if rows <= cfg.rank_rows:  # never filtered: filter_rows > rank_rows
        _ranked(src, row0, rows, t, n, k_start, k_end, out_v, out_i, topk, cfg)
        return None
    redo = _filter(src, row0, rows, t, n, k_start, k_end, out_v, out_i, topk, cfg) if filtered(rows, n, cfg) else None
    _chunked(src, row0, rows, t, n, k_start, k_end, out_v, out_i, topk, cfg, redo)
    return redo


def _filter(src, row0, rows, t, n, k_start, k_end, out_v, out_i, topk, cfg):
    """The sampled filter: a candidate bound per row (``sample_kernel``), the keys at or above it
    copied out (``filter_kernel``), their top-k (``cand_select_kernel``; sorted there below
    ``sort_apart``). Returns the list of rows it leaves to the chunked passes."""
    cap = cand_slots(n, topk, cfg)
    ints = torch.zeros(rows * 3 + 1, dtype=torch.int32, device=src.device)
    filt, redo = ints[:rows * 2], ints[rows * 2:]
    cand_scores = torch.empty((rows, cap), dtype=torch.float32, device=src.device)
    cand_cols = torch.empty((rows, cap), dtype=torch.int32, device=src.device)
    sample_kernel[(rows,)](src, k_start, k_end, filt, row0, t, n, src.stride(0), float(cfg.sample_z), TOPK=topk,
                           SAMPLE=cfg.sample, BITS=cfg.sample_bits, num_warps=cfg.filter_warps)
    filter_kernel[(rows, cdiv(n, cfg.filter_chunk))](src, k_start, k_end, filt, cand_scores, cand_cols, row0, t, n,
                                                     src.stride(0), CAP=cap, CHUNK=cfg.filter_chunk,
                                                     STEP=cfg.filter_step, num_warps=cfg.filter_warps)
    cand_select_kernel[(rows,)](k_start, k_end, filt, redo, cand_scores, cand_cols, out_v, out_i, row0, t, n, CAP=cap,
                                TOPK=topk, TOPK_P2=next_pow2(topk), BLOCK_SELECT=cfg.ch, BITS=cfg.bits,
                                SORT_HERE=topk < cfg.sort_apart, PREFETCH=cfg.prefetch, SORT32=cfg.sort32,
                                num_warps=cfg.num_warps)
    return redo


def _chunked(src, row0, rows, t, n, k_start, k_end, out_v, out_i, topk, cfg, redo=None):
    """The chunked radix passes over the rows (only those listed in ``redo`` when given, on a grid of
    about ``chunk_programs`` per multiprocessor whose programs walk the list), then the per-row sort
    (of every row unless the filter sorted the others)."""
    topk_p2 = next_pow2(topk)
    bits, chunk = cfg.pass_bits, chunk_size(src.device, rows, n, cfg)
    passes = 32 // bits
    s = cdiv(n, chunk)
    grid_rows = rows if redo is None else min(rows, cdiv(configs.wave_programs(src.device, cfg.chunk_programs), s))
    state = _state(rows, passes, bits, s, src.device)
    common = dict(TOPK=topk, CHUNK=chunk, BITS=bits, num_warps=cfg.chunk_warps if redo is None else cfg.fallback_warps)
    args = (src, k_start, k_end, state, row0, t, n, src.stride(0), s, redo)
    for p in range(passes + 1):  # the digit passes, then the tie count
        radix_pass_kernel[(grid_rows, s)](*args, PASS=p, PASSES=passes, **common)
    radix_collect_kernel[(grid_rows, s)](*args[:4], out_v, out_i, *args[4:], PASSES=passes,
                                         N_CHUNKS_P2=next_pow2(s), **common)
    listed = redo is not None and topk < cfg.sort_apart  # the filter sorted the other rows
    grid = min(rows, configs.wave_programs(src.device, 1)) if listed else rows
    sort_rows_kernel[(grid,)](k_start, k_end, out_v, out_i, row0, t, n, redo if listed else None, TOPK=topk,
                              TOPK_P2=topk_p2, num_warps=cfg.sort_warps if redo is None else row_sort_warps(topk, cfg))


def rank_cap(topk: int, cfg: configs.SelectConfig) -> int:
    """Candidate slots per row of the ranked path."""
    return cfg.rank_cap * next_pow2(topk)


def _ranked(src, row0, rows, t, n, k_start, k_end, out_v, out_i, topk, cfg):
    """Few rows (at most ``rank_rows``): ``rank_passes`` digit passes fix the threshold's top bits, the
    keys at or above that prefix (the winners and the few others sharing it) are compacted, and
    ``topk / rank_slice`` programs per row place each at its rank among them (a row whose candidates
    overflow ``rank_cap`` slots is selected below the prefix by one program)."""
    bits, chunk, passes = cfg.pass_bits, chunk_size(src.device, rows, n, cfg), cfg.rank_passes
    s, cap = cdiv(n, chunk), rank_cap(topk, cfg)
    state = _state(rows, passes, bits, s, src.device)
    common = dict(PASSES=passes, TOPK=topk, CHUNK=chunk, BITS=bits, num_warps=cfg.chunk_warps)
    args = (src, k_start, k_end, state, row0, t, n, src.stride(0), s)
    for p in range(passes):
        radix_pass_kernel[(rows, s)](*args, None, PASS=p, **common)
    cand_keys, cand_cols = torch.empty((2, rows, cap), dtype=torch.int32, device=src.device)
    compact_kernel[(rows, s)](*args[:4], cand_keys, cand_cols, *args[4:], cap, **common)
    cand_rank_kernel[(rows, cdiv(topk, cfg.rank_slice))](
        *args[:4], cand_keys, cand_cols, out_v, out_i, *args[4:], cap, PASSES=passes, TOPK=topk,
        TOPK_P2=next_pow2(topk), SLICE=cfg.rank_slice, TILE=min(next_pow2(topk), cfg.rank_tile), BITS=bits,
        BLOCK_SELECT=cfg.ch, num_warps=cfg.rank_warps)


def _state(rows, passes, bits, n_chunks, device):
    """The zeroed radix state of select_chunked._state_row's layout."""
    return torch.zeros((rows, passes * ((1 << bits) + 1) + 6 + n_chunks), dtype=torch.int32, device=device)


def aot_variants(cfg: configs.SelectConfig, n: int = 1 << 20, tokens: int = 4096, filter_n: int = 65536):
    """(name, kernel, signature, constexprs, options, example ints) of the chunked path's kernels
    with ``cfg`` (shipped or an autotuning candidate) for rows of n columns, top-512 and top-2048;
    of the sampled filter and its fallback for ``tokens`` rows of ``filter_n``; and of the second
    launch sorting the one-program-per-row path's winners (top-k of at least ``cfg.sort_apart``,
    ``tokens`` rows) (``python -m inductor_dsa.aot``)."""
    passes = 32 // cfg.pass_bits
    s = cdiv(n, cfg.chunk)

    def variant(name, topk, kernel, consts, warps, ints):
        sig = {a: ("constexpr" if a in consts else _TYPES.get(a, "i32")) for a in kernel.arg_names}
        return (f"select_{name}[topk={topk}]", kernel, sig, consts, dict(num_warps=warps),
                {a: v for a, v in ints.items() if a in kernel.arg_names})

    ints = dict(row0=0, T=1, K=n, stride_scores_r=n, n_chunks=s, CAP=1 << 13)
    many = dict(ints, T=tokens, K=filter_n, stride_scores_r=filter_n, n_chunks=cdiv(filter_n, cfg.chunk))
    for topk in (512, 2048):
        common = dict(TOPK=topk, CHUNK=cfg.chunk, BITS=cfg.pass_bits, PASSES=passes)
        sort = dict(TOPK=topk, TOPK_P2=next_pow2(topk))
        ranked = dict(common, PASSES=cfg.rank_passes)
        kernels = [("radix_pass[pass=0]", radix_pass_kernel, dict(common, PASS=0), cfg.chunk_warps),
                   ("radix_pass[pass=1]", radix_pass_kernel, dict(common, PASS=1), cfg.chunk_warps),
                   ("radix_ties", radix_pass_kernel, dict(common, PASS=passes), cfg.chunk_warps),
                   ("radix_collect", radix_collect_kernel, dict(common, N_CHUNKS_P2=next_pow2(s)), cfg.chunk_warps),
                   ("sort_rows", sort_rows_kernel, sort, cfg.sort_warps),
                   ("ranked_pass", radix_pass_kernel, dict(ranked, PASS=cfg.rank_passes - 1), cfg.chunk_warps),
                   ("compact", compact_kernel, ranked, cfg.chunk_warps),
                   ("cand_rank", cand_rank_kernel,
                    dict(sort, PASSES=cfg.rank_passes, SLICE=cfg.rank_slice, TILE=min(next_pow2(topk), cfg.rank_tile),
                         BITS=cfg.pass_bits, BLOCK_SELECT=cfg.ch), cfg.rank_warps)]
        for name, kernel, consts, warps in kernels:
            yield variant(name, topk, kernel, dict(consts, redo=None) if "redo" in kernel.arg_names else consts,
                          warps, ints)
        cap = cand_slots(filter_n, topk, cfg)
        filt = [("sample", sample_kernel, dict(TOPK=topk, SAMPLE=cfg.sample, BITS=cfg.sample_bits),
                 cfg.filter_warps),
                ("filter", filter_kernel, dict(CAP=cap, CHUNK=cfg.filter_chunk, STEP=cfg.filter_step),
                 cfg.filter_warps),
                ("cand_select", cand_select_kernel, dict(sort, CAP=cap, BLOCK_SELECT=cfg.ch, BITS=cfg.bits,
                                                         SORT_HERE=topk < cfg.sort_apart, PREFETCH=cfg.prefetch,
                                                         SORT32=cfg.sort32),
                 cfg.num_warps),
                ("fallback_pass", radix_pass_kernel, dict(common, PASS=0), cfg.fallback_warps),
                ("fallback_collect", radix_collect_kernel,
                 dict(common, N_CHUNKS_P2=next_pow2(many["n_chunks"])), cfg.fallback_warps),
                ("fallback_sort", sort_rows_kernel, sort, row_sort_warps(topk, cfg))]
        for name, kernel, consts, warps in filt:
            yield variant(name, topk, kernel, consts, warps, many)
    for topk in (512, 1024, 2048):
        if topk >= cfg.sort_apart:
            yield variant("row_sort", topk, sort_rows_kernel, dict(TOPK=topk, TOPK_P2=next_pow2(topk), redo=None),
                          row_sort_warps(topk, cfg), dict(row0=0, T=tokens, K=tokens))
