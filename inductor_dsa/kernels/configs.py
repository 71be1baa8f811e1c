"""Per-target launch configurations. One portable kernel source; these numbers differ.

gfx942 (MI300): 64-wide wavefronts, 64 KiB LDS per workgroup, MFMA 16x16 preferred
(``matrix_instr_nonkdim=16``), the AMD pipeliner wants ``num_stages=2``; tiles are
kept at 128 query rows x 64 keys so Q^T + two K stages fit LDS with no spills.
sm90 (H100/H200): 256 query rows (wgmma N=256) x 128 keys, 8 warps, 3 stages.
Targets are named by their arch (``device_target``: gfx942, gfx950, sm90, sm89, sm100, ...); a
table's ``OTHER`` entry is the conservative config of every arch it does not name.
``CANDIDATES`` lists, per family and target, the configs ``kernels/autotune.py`` may time in place
of the shipped one. Every config and candidate of gfx942 / sm90 is compiled by
``python -m inductor_dsa.aot`` for its target.
"""
from __future__ import annotations

import dataclasses
import functools
import os
from dataclasses import dataclass, field

import torch
import triton.language as tl


@dataclass(frozen=True)
class IndexerConfig:
    rows: int          # query rows (tokens x padded heads) resident per tile
    bn: int            # key rows per block
    num_warps: int
    num_stages: int
    extra: dict = field(default_factory=dict)  # backend-specific knobs

    def tokens(self, hp: int) -> int:
        return max(1, self.rows // hp)


INDEXER_LOGITS = {
    "sm90": IndexerConfig(rows=256, bn=64, num_warps=8, num_stages=3),
    "gfx942": IndexerConfig(rows=128, bn=64, num_warps=8, num_stages=2,
                            extra={"matrix_instr_nonkdim": 16}),
    "other": IndexerConfig(rows=128, bn=64, num_warps=4, num_stages=2),
    "interpreter": IndexerConfig(rows=32, bn=32, num_warps=4, num_stages=1),
}

# MXFP4 keys are decoded in registers: with 2 warpgroups each decodes the whole key tile (wgmma
# splits the query columns between them), so sm90 uses one warpgroup, 128 query rows.
# H200 (torch 2.11, triton 3.6), bf16 q + MXFP4 k, causal T=K=4096: 220 -> 254 TFLOP/s.
INDEXER_LOGITS_MXFP4K = {
    "sm90": IndexerConfig(rows=128, bn=64, num_warps=4, num_stages=3),
}


def logits_config(target: str, mxfp4_k: bool) -> IndexerConfig:
    """The score-tile config of a target, for MXFP4 or other keys."""
    if mxfp4_k and target in INDEXER_LOGITS_MXFP4K:
        return INDEXER_LOGITS_MXFP4K[target]
    return for_target(INDEXER_LOGITS, target)


# MXFP4 keys (decode.mxfp4_rows_mma) are decoded and block-scaled as packed bf16 pairs on targets
# with a native bf16x2 multiply, else in fp32 and truncated to bf16 (exact either way). Paged score
# loop, instructions per 64-row block (AOT): sm90 453 as bf16 (HMUL2), 556 as fp32 (the per-element
# decode before: 813); gfx942 (no packed bf16 multiply, no bf16 convert) 288 as fp32 (before: 474).
BF16_DECODE = ("sm90",)


def decode_dtype(target: str):
    return tl.bfloat16 if target in BF16_DECODE else tl.float32


@dataclass(frozen=True)
class SelectConfig:
    """The selection engine (kernels/select*.py, launched by kernels/select_launch.py)."""
    num_warps: int    # one program per row (select_kernel)
    ch: int           # ... elements per step of its radix-select passes
    min_rows: int     # a prefill workspace chunk holds at least this many rows (fills the GPU)
    bits: int = 4     # ... and its digit width: up to 32/bits histograms of 2**bits bins
    packed: bool = False  # ... counted in packed per-slot registers, not tl.histogram (bits 4, row_max/ch <= 255)
    prefetch: bool = True  # ... loading each step's scores one step ahead
    row_max: int = 16384   # longer rows take the chunked passes ...
    few_rows: int = 128    # ... and so do rows longer than a chunk when there are fewer rows than this
    chunk: int = 2048      # columns per program of the chunked passes, at most ...
    chunk_min: int = 512   # ... and at least (smaller while rows x chunks < chunk_programs per SM)
    chunk_programs: int = 4
    chunk_warps: int = 4
    pass_bits: int = 8     # digit width of the chunked passes (one launch each)
    sort_apart: int = 1024  # one program per row: top-k of at least this many sorted by a second launch ...
    row_sort_warps: int = 8  # ... on this many warps per 1024 winners (sort_rows_kernel)
    sort32: bool = True    # winners sorted in-kernel by 32-bit keys (64-bit (key, column) words if a key repeats)
    sort_warps: int = 4    # per-row bitonic sort of the chunked path's winners
    rank_rows: int = 8     # at most this many rows: the ranked path (select_launch._ranked): ...
    rank_passes: int = 2   # ... digit passes fixing the threshold's top bits, then the keys at or above them ...
    rank_cap: int = 4      # ... compacted into rank_cap x next_pow2(topk) slots per row ...
    rank_slice: int = 8    # ... and ranked by topk / rank_slice programs per row, [rank_slice, rank_tile]
    rank_tile: int = 2048  # comparisons per step over rank_warps warps (AOT gfx942: [64, 2048] and
    rank_warps: int = 16   # [8, 2048] over 4-8 warps spilled SGPRs)
    filter_rows: int = 64  # rows longer than row_max, at least this many: the sampled filter path
    sample: int = 2048     # ... keys sampled per row for its candidate bound
    sample_bits: int = 4   # ... digit width of its in-register radix select (sample_kernel)
    sample_z: float = 4.0  # ... binomial deviations of margin (fewer: fewer candidates, more fallbacks)
    cand_factor: int = 4   # ... candidate slots per row: cand_factor x next_pow2(topk)
    filter_chunk: int = 8192  # ... columns per program of its filter pass
    filter_step: int = 1024   # ... columns per step of that program's loop (H100: one 2048-column
    #                           step per program with one atomic, 624 us at [2048, 65536], against 365)
    filter_warps: int = 4
    fallback_warps: int = 8  # the chunked passes walking the filter's fallback list (gfx942 AOT: 4 warps
    #                          spill 7 registers in the list-walking collect, 8 do not)

    def __post_init__(self):
        if not 0 < self.rank_passes * self.pass_bits < 32 or 32 % self.pass_bits:
            raise ValueError(f"the ranked path's passes must leave whole digits of the 32-bit key below them "
                             f"(rank_passes={self.rank_passes}, pass_bits={self.pass_bits})")
        if self.packed and (self.bits != 4 or -(-self.row_max // self.ch) > 255 or self.row_max >= 1 << 16):
            raise ValueError(f"packed select histograms need bits=4, rows under 2**16 columns and at most 255 "
                             f"steps of ch per row (row_max {self.row_max}, ch {self.ch}), got bits={self.bits}")


# H200 (torch 2.11, triton 3.6), one program per row, 4096 causal rows of 4096, top-512: 8-bit
# digits / chunk 512: 292 us; 4-bit / 256: 238 us. Chunked passes: 2048 columns x 4 warps beat
# 4096 x 8 and 8192 x 8 on every long-row case (e.g. [64, 65536] k=512: 137 / 142 / 152 us
# replayed); 4-bit chunked digits (8 launches) lost everywhere. A one-program-per-row variant
# holding the whole row in registers lost to the memory loop: [4096, 4096] causal k=512 0.277
# vs 0.187 ms, [8192, 8192] k=1024 1.47 vs 0.93 ms (it computes the masked columns too).
# H100 (same versions, 2026-12-06, graph replay, [4096, 4096] / [8192, 8192] / [16384, 4096]):
# prefetch on 0.175 / 0.818 / 0.630 ms, off 0.179 / 0.843 / 0.644; sorting top-1024 apart on 8
# warps 0.818 against 0.855 in-kernel (16 warps 0.832; apart at top-512 0.211 vs 0.204); CH 512
# and 8 warps lost everywhere. A sampled bracket (sort 256+ sampled keys, radix passes over the
# candidates only) lost by 12-15%.
SELECT = {
    "sm90": SelectConfig(num_warps=4, ch=256, min_rows=512),
    # wave64 (AOT: 16 warps spill in sort_rows_kernel; a [8, 2048] ranking step spilled 15 B, [8, 1024] none)
    "gfx942": SelectConfig(num_warps=4, ch=256, min_rows=512, row_sort_warps=4, rank_tile=1024),
    "other": SelectConfig(num_warps=4, ch=256, min_rows=512),
    "interpreter": SelectConfig(num_warps=4, ch=64, min_rows=8, row_max=256, few_rows=3, chunk=64, chunk_min=32,
                                chunk_programs=8, rank_rows=2, filter_rows=4, sample=256, filter_chunk=256,
                                filter_step=64),
}
TARGETS = ("gfx942", "sm90")
OTHER = "other"  # the key of a table's conservative config, for any arch the table does not name


def for_target(table: dict, target: str):
    """The table's config for ``target``, else its conservative ``OTHER`` entry."""
    return table[target] if target in table else table[OTHER]


def launch_options(cfg, target: str) -> dict:
    """Triton launch options of a config: warps, stages and its target's own knobs (``extra``)."""
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    opts.update(cfg.extra)
    return opts


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def use_kernels(device) -> bool:
    """Run the Triton kernels for tensors on ``device``: a GPU, or the CPU under the interpreter."""
    return device.type != "cpu" or interpreting()


@functools.lru_cache(maxsize=None)
def device_target(index: int) -> str:
    """The arch of a torch device index: 'gfx942', 'gfx950', ... (ROCm) or 'sm90', 'sm89', 'sm100', ..."""
    props = torch.cuda.get_device_properties(index)
    if torch.version.hip is not None:
        return getattr(props, "gcnArchName", "").split(":")[0] or OTHER
    return f"sm{props.major}{props.minor}"


def target_for(device: torch.device) -> str:
    if device.type == "cpu":
        return "interpreter"
    return device_target(device.index if device.index is not None else torch.cuda.current_device())


@functools.lru_cache(maxsize=None)
def multiprocessors(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


@dataclass(frozen=True)
class SparseAttentionConfig:
    """Sparse attention tiles: BLOCK_H = bh heads share each gathered [BLOCK_N = bn, D] KV tile (see
    kernels/sparse_attention.py)."""
    bh: int            # BLOCK_H, heads per program (fewer when H is smaller; at least 16 for the MMA)
    bn: int            # BLOCK_N, index slots (gathered KV rows) per tile
    num_warps: int
    num_stages: int
    gather: int = 1    # 0 plain loop (the pipeliner stages it), 1 tile i+1 prefetched into registers
    max_splits: int = 8  # split-KV programs per (query, head block) when the grid is too small: a
                         # program is latency-bound (H200, top-1152: ~85 us whether 1 or 64 run),
                         # so a small grid gains until one wave is full (B=1: 85 -> 33 us at 8)
    extra: dict = field(default_factory=dict)  # backend-specific knobs


# sm90: acc [64, 512] fp32 = 128 regs/thread over 8 warps (wgmma N split across the two warpgroups);
#   BLOCK_N = 64 tiles staged by the pipeliner (2 stages: Q + 2 KV tiles = 192 KiB of shared memory,
#   255 regs, 0 spills). The plain loop (GATHER=0) needs no hand-written look-ahead: in its SASS
#   (triton 3.6) tile i+1's index loads and KV copies are issued while tile i is multiplied. H200
#   (torch 2.11, triton 3.6), kernel time by CUDA-graph replay: prefill M=4096 H=64 top-640
#   GATHER=0 1.33 ms, 1.39 ms with the indices loaded a tile ahead by hand, BLOCK_N=32 1.9-2.1 ms,
#   BLOCK_N=16 with the register prefetch (GATHER=1) 2.92 ms; decode B=64 equal (0.062-0.177 ms).
# gfx942: 4 waves with up to 512 VGPR+AGPR each; LDS (64 KiB) stages Q once, then KV tiles.
# Both: 0 spills, see python -m inductor_dsa.aot. Untimed on MI300; H200 timings come from the lead.
SPARSE_ATTENTION = {
    "sm90": SparseAttentionConfig(bh=64, bn=64, num_warps=8, num_stages=2, gather=0),
    "gfx942": SparseAttentionConfig(bh=64, bn=32, num_warps=4, num_stages=1,
                                    extra={"matrix_instr_nonkdim": 16, "waves_per_eu": 1}),
    "other": SparseAttentionConfig(bh=64, bn=16, num_warps=8, num_stages=1),
    "interpreter": SparseAttentionConfig(bh=32, bn=16, num_warps=4, num_stages=1),
}


# --- paged (decode) indexer, kernels/paged_indexer.py ----------------------------------------
# Scores: 64-row blocks (one page). gfx942: 8 warps, up to 256 query rows (N=4 tokens x 64 heads)
# resident (N=1 at 4 warps: 140 VGPRs, at 8 warps 116). sm90: 4 warps (one warpgroup), 128 query
# rows (N=4 runs as 2 token groups): with 2 warpgroups wgmma splits the query columns between them
# and BOTH decode the whole MXFP4 key tile (SASS: 64 I2FP per thread x 256 threads for 8192 codes);
# the score loop is issue-bound (ncu: 231 M instructions for B=64, L=32768), so one warpgroup at
# 4 CTAs/SM halves it: H200, torch 2.11 + triton 3.6, B=64 L=32768 N=1 logits 449 -> 229 us,
# top-512 596 -> 443 us. Select/merge: 4 warps. After the packed MXFP4 decode (profiler, kernel
# time, B=64 L=32768 / B=128 L=65536 / B=8 L=262144): scores 140/543/139 us at 2 stages, 133/516/131
# at 4; chunk select, 4-bit digits: 69/279/77 us (1024-element chunks: 65/245/70, but the unsplit
# select spills 12 B on sm90) vs 8-bit 73/314/93. split_min: H200 B=1 top-512 (do_bench, launch
# gaps included), L=1088: 2 chunks 456 us vs one 196 us; L=2048: 431 vs 201; L=4096: 268 vs 153.

@dataclass(frozen=True)
class PagedConfig:
    bn: int             # BLOCK_N, key rows per block: a divisor of the 64-row page, >= 16
    rows: int           # query rows (tokens x padded heads) resident per program; more tokens -> groups
    num_warps: int
    num_stages: int
    progs_per_sm: int   # programs (workspace slots) per multiprocessor in one wave of score programs
    chunk_min: int      # rows per sequence split, at least ...
    chunk_max: int      # ... and at most this (bounds the per-program workspace: tokens x chunk fp32)
    ch: int             # BLOCK_SELECT, elements per chunk in the radix-select passes
    logits_rows: int    # rows per program of paged_indexer_logits
    score_min: int = 256  # rows per score program, at least, when a chunk's rows are shared by several
                          # (few items: paged_launch.split_plan's sub)
    split_min: int = 0  # contexts of at most this many rows are never split: at small batch the
                        # split's two extra launches (filter, merge) cost more than they save
    merge_warps: int = 4  # chunk select and filter
    final_warps: int = 8  # final merge, one program per token row (at B = 1 a single program):
                          # H200 B=1 L=262144 top-1024 25 -> 19 us from 4 warps (16: 18)
    final_ch: int = 512   # BLOCK_SELECT of the final merge (sm90 at 1024: 12 B spilled, triton 3.7)
    bits: int = 8       # radix digit width of the chunk select and the final merge
    hist_span: int = 131072  # context rows per copy of a token row's key histogram (paged_launch.hist_copies)
    rank_rows: int = 2  # at most this many token rows (split): no merge, the lists' entries are ranked
                        # by many programs per row (select_hist.list_rank_kernel; SelectConfig's rank_*) ...
    rank_entries: int = 8  # ... while they are at most rank_entries x next_pow2(topk) (else, a run of
                           # ties crowding the threshold, the ranking's compares would grow as their
                           # square: one program merges them)
                        # H100, replay: B=1 L=2**20 top-2048 157 -> 131 us; B=8 L=262144 top-1024 201 -> 206
    extra: dict = field(default_factory=dict)  # backend-specific knobs


PAGED = {
    # ch 1024 (H100 replay against 512, merge included; the merge now stays at 512): B=64 L=32768 top-512
    # 185.4 / 185.7 us (select 16.6 / 18.5), B=128 L=65536 top-1024 651.5 / 658.0 (46.8 / 56.8),
    # B=1 L=131072 45.7 / 46.9, B=1 L=2**20 128.7 / 130.7
    "sm90": PagedConfig(bn=64, rows=128, num_warps=4, num_stages=4, progs_per_sm=4,
                        chunk_min=1024, chunk_max=8192, ch=1024, logits_rows=1024, split_min=2048, bits=4),
    "gfx942": PagedConfig(bn=64, rows=256, num_warps=8, num_stages=2, progs_per_sm=2,
                          chunk_min=1024, chunk_max=8192, ch=512, logits_rows=1024, split_min=2048,
                          extra={"matrix_instr_nonkdim": 16}),
    "other": PagedConfig(bn=64, rows=128, num_warps=4, num_stages=2, progs_per_sm=2,
                        chunk_min=1024, chunk_max=8192, ch=512, logits_rows=1024, split_min=2048),
    "interpreter": PagedConfig(bn=32, rows=16, num_warps=4, num_stages=1, progs_per_sm=1,
                               chunk_min=64, chunk_max=128, ch=64, logits_rows=64, final_ch=64, score_min=32),
}
PAGED_CPU_PROGRAMS = 3  # programs per wave under the interpreter (small: exercises several waves)


def wave_programs(device: torch.device, per_sm: int) -> int:
    """Programs per wave: multiprocessors x per_sm on a GPU, a few under the interpreter."""
    if device.type == "cpu":
        return PAGED_CPU_PROGRAMS
    return multiprocessors(device.index if device.index is not None else torch.cuda.current_device()) * per_sm


# --- autotuning candidates (kernels/autotune.py) ----------------------------------------------
# Per family and target, the configs timed against the shipped one on the user's GPU (the shipped
# config always runs first and is the reference). Every gfx942 / sm90 candidate is compiled by
# ``python -m inductor_dsa.aot`` (0 spills, LDS within limits); ``OTHER`` serves any arch not named
# (a candidate that fails to compile there is rejected at tuning time). None of these is timed yet.
_NK16 = {"matrix_instr_nonkdim": 16}
CANDIDATES = {
    "indexer_logits": {
        "sm90": (INDEXER_LOGITS["sm90"], INDEXER_LOGITS_MXFP4K["sm90"],
                 IndexerConfig(rows=128, bn=64, num_warps=4, num_stages=4),
                 IndexerConfig(rows=256, bn=64, num_warps=8, num_stages=2)),
        "gfx942": (INDEXER_LOGITS["gfx942"],
                   IndexerConfig(rows=128, bn=32, num_warps=8, num_stages=2, extra=_NK16),
                   IndexerConfig(rows=128, bn=64, num_warps=8, num_stages=1, extra=_NK16),
                   IndexerConfig(rows=64, bn=64, num_warps=4, num_stages=2, extra=_NK16)),
        OTHER: (INDEXER_LOGITS[OTHER], IndexerConfig(rows=128, bn=64, num_warps=4, num_stages=3),
                IndexerConfig(rows=128, bn=32, num_warps=4, num_stages=2),
                IndexerConfig(rows=256, bn=64, num_warps=8, num_stages=2)),
        "interpreter": (INDEXER_LOGITS["interpreter"], IndexerConfig(rows=16, bn=32, num_warps=4, num_stages=1)),
    },
    "select": {
        # packed histograms: gfx942 only; triton 3.6's sm90 build of top-512 spilled 24 B (3.7: none)
        **{t: (SELECT[t], dataclasses.replace(SELECT[t], num_warps=8), dataclasses.replace(SELECT[t], ch=128),
               dataclasses.replace(SELECT[t], chunk_warps=8))
              + ((dataclasses.replace(SELECT[t], packed=True),) if t == "gfx942" else ())
           for t in ("sm90", "gfx942", OTHER)},
        "interpreter": (SELECT["interpreter"], dataclasses.replace(SELECT["interpreter"], ch=128),
                        dataclasses.replace(SELECT["interpreter"], packed=True)),
    },
    "paged": {
        "sm90": (PAGED["sm90"], dataclasses.replace(PAGED["sm90"], num_stages=3),
                 dataclasses.replace(PAGED["sm90"], progs_per_sm=2), dataclasses.replace(PAGED["sm90"], progs_per_sm=8)),
        "gfx942": (PAGED["gfx942"], dataclasses.replace(PAGED["gfx942"], num_stages=1),
                   dataclasses.replace(PAGED["gfx942"], rows=128, progs_per_sm=4),  # 4 warps: 5 B spilled (fp32 q, table)
                   dataclasses.replace(PAGED["gfx942"], progs_per_sm=4)),
        OTHER: (PAGED[OTHER], dataclasses.replace(PAGED[OTHER], num_stages=3),
                dataclasses.replace(PAGED[OTHER], progs_per_sm=4)),
        "interpreter": (PAGED["interpreter"], dataclasses.replace(PAGED["interpreter"], chunk_min=32, chunk_max=64)),
    },
    "sparse_attention": {
        "sm90": (SPARSE_ATTENTION["sm90"], dataclasses.replace(SPARSE_ATTENTION["sm90"], max_splits=4),
                 dataclasses.replace(SPARSE_ATTENTION["sm90"], max_splits=16),
                 dataclasses.replace(SPARSE_ATTENTION["sm90"], bn=32, num_stages=3)),
        "gfx942": (SPARSE_ATTENTION["gfx942"],
                   SparseAttentionConfig(bh=64, bn=16, num_warps=8, num_stages=1, gather=1, extra=_NK16),
                   dataclasses.replace(SPARSE_ATTENTION["gfx942"], max_splits=4),
                   dataclasses.replace(SPARSE_ATTENTION["gfx942"], max_splits=16)),
        OTHER: (SPARSE_ATTENTION[OTHER], dataclasses.replace(SPARSE_ATTENTION[OTHER], bn=32, num_stages=2, gather=0),
                dataclasses.replace(SPARSE_ATTENTION[OTHER], max_splits=4)),
        "interpreter": (SPARSE_ATTENTION["interpreter"], dataclasses.replace(SPARSE_ATTENTION["interpreter"], bn=32)),
    },
}


def candidates(family: str, target: str, default) -> list:
    """``default`` first, then the family's other candidates for ``target`` (its ``OTHER`` set if unnamed)."""
    return [default] + [c for c in for_target(CANDIDATES[family], target) if c != default]


def describe(cfg, base=None) -> str:
    """The fields of ``cfg`` that differ from ``base`` ('shipped' when none), or all of them."""
    fields = dataclasses.asdict(cfg)
    if base is not None:
        ref = dataclasses.asdict(base)
        fields = {k: v for k, v in fields.items() if v != ref[k]}
        if not fields:
            return "shipped"
    return " ".join(f"{k}={v}" for k, v in fields.items() if v != {})
