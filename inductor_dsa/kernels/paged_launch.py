"""Launchers of the paged (decode) indexer kernels: operands -> kernel arguments, split plan, AOT list.

Nothing here reads tensor data: every launch decision comes from shapes, dtypes and the device,
so the launchers are valid under CUDA-graph capture (workspaces come from the caching allocator;
a split top-k zeroes its histograms with its first launch).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton.language as tl

from . import autotune, configs, fastlaunch
from .autotune import bucket
from .fastlaunch import Arg, Launch
from .host import cdiv, next_pow2
from ..formats import PAGE_ROWS
from .decode import FMT_FP8_BYTES, FMT_FP8_NATIVE, FMT_MXFP4, FMT_TENSOR
from .paged_indexer import paged_check_kernel, paged_gather_kernel, paged_scores_kernel, paged_select_kernel
from .select_hist import HIST_BINS, RANK_STATE, list_merge_kernel, list_rank_kernel, zero_kernel

S_MAX = 512            # most sequence chunks per request (the final kernel holds S counts in registers)
FINAL_TILE = 1024      # list entries per copy step of the merge (list_merge_kernel): 4096 spilled 8 B on
                       # sm90 once a ranked merge left its sort out, 2048 16 B with triton 3.6 once it
                       # started below the fine prefix (ptxas capped it at 128 / 80 registers)
GATHER_ROWS = 64
ZERO_BLOCK = 1024      # words per program of zero_kernel
HIST_COPIES_MAX = 8
CHECK_PAGES = 256      # block-table entries per step of paged_check_kernel
_NATIVE_FP8 = {"sm90": ("fn", tl.float8e4nv), "gfx942": ("fnuz", tl.float8e4b8)}


def _kv_format(fmt: str, fp8_flavor: str, target: str):
    """(K_FMT, FNUZ, FP8_DTYPE) for a cache format on a target."""
    if fmt == "mxfp4":
        return FMT_MXFP4.value, False, tl.float8e4nv
    flavor, dtype = _NATIVE_FP8.get(target, (None, None))
    if flavor == fp8_flavor:
        return FMT_FP8_NATIVE.value, fp8_flavor == "fnuz", dtype
    return FMT_FP8_BYTES.value, fp8_flavor == "fnuz", tl.float8e4nv


def tiles(n_tokens: int, heads: int, rows: int) -> tuple[int, int, int]:
    """(BLOCK_H, BLOCK_T, G): padded heads, tokens per program, token groups; BLOCK_T * BLOCK_H >= 16
    (the dot's minimum)."""
    hp = next_pow2(heads)
    nt = min(next_pow2(max(n_tokens, 1)), max(1, rows // hp))
    hp = max(hp, 16 // nt)
    return hp, nt, cdiv(max(n_tokens, 1), nt)


@dataclass(frozen=True)
class SplitPlan:
    chunk: int   # C, rows per chunk (multiple of bn * sub)
    splits: int  # S = cdiv(max_len, C)
    kp: int      # partial-list capacity: topk when S == 1, else min(topk, C)
    sub: int = 1  # score programs per item (paged_scores_kernel's SUB), C / sub rows each


def split_plan(batch: int, groups: int, max_len: int, topk: int, cfg: configs.PagedConfig,
               programs: int) -> SplitPlan:
    """Chunks so that the batch x groups x S items fill one wave of ``programs`` (never just over
    it: a second, nearly empty wave would idle the GPU), with chunk_min <= C <= chunk_max (C grows
    past chunk_max only to keep S <= S_MAX); S = 1 when max_len <= split_min. When the items fill
    at most half of the wave, each chunk is scored by sub (a power of two) programs of at least
    ``score_min`` rows: chunk_min bounds the lists the merge reads, not the score parallelism."""
    if max_len <= cfg.split_min:
        c = max_len
    else:
        want = max(1, programs // max(1, batch * groups))
        c = min(max(cdiv(max_len, want), cfg.chunk_min), cfg.chunk_max)
        c = max(c, cdiv(max_len, S_MAX))
    c = cdiv(c, cfg.bn) * cfg.bn
    s = cdiv(max_len, c)
    sub = 1
    while (2 * sub * batch * groups * s <= programs and c % (2 * sub * cfg.bn) == 0
           and c // (2 * sub) >= cfg.score_min):
        sub *= 2
    return SplitPlan(c, s, topk if s == 1 else min(topk, c), sub)


def hist_copies(max_len: int, cfg: configs.PagedConfig) -> int:
    """Copies of each token row's key histogram: one per ``cfg.hist_span`` rows of context (a power
    of two, at most HIST_COPIES_MAX). Counts of one bin serialise at its address; the copies spread
    a long row's (hundreds of thousands at L = 2**20 on random scores) over several."""
    return min(HIST_COPIES_MAX, next_pow2(cdiv(max_len, cfg.hist_span)))


def _dot_dtype(target: str):
    # the interpreter's bf16 tl.dot is wrong (triton 3.7); an fp32 dot of bf16-exact values is exact
    return tl.float32 if target == "interpreter" else tl.bfloat16


# bf16 parts of a tensor query (paged_indexer.split_query): fp16 = hi + lo, fp32 = hi + mid + lo
Q_PARTS = {torch.bfloat16: 1, torch.float16: 2, torch.float32: 3, torch.uint8: 1}


def query_rows(cfg: configs.PagedConfig, q_parts: int, table: bool = False) -> int:
    """Query rows per program: a quarter of ``cfg.rows`` for a split query, whose 2-3 bf16 parts stay
    resident (AOT gfx942, 4 tokens x 64 heads: fp8 keys 14-90 B spilled at the full 256 rows,
    triton 3.6 36-132 B at half of them), half for keys decoded through a table (3 bf16 key parts:
    29 B spilled at 2 x 64 of 128 rows). Never fewer than one token's padded heads (``tiles``)."""
    return cfg.rows if q_parts == 1 and not table else max(1, cfg.rows // (4 if q_parts > 1 else 2))


def _score_args(q_shape, q_dtype, mx: bool, kv_cache, block_table_shape, fmt, fp8_flavor, target, cfg,
                aligned4: bool, table: bool):
    """Arguments of ``paged_scores_kernel`` fixed by shapes and dtypes (tensors as ``Arg``
    placeholders: q, q_scale, weights, kv_cache, table, block_table, context_lens), plus (B, N, G);
    ``table``: MXFP4 codes decoded through a table operand."""
    b, n, h = q_shape[:3]
    d = q_shape[3] * (2 if mx else 1)
    hp, nt, g = tiles(n, h, query_rows(cfg, Q_PARTS[q_dtype], table))
    k_fmt, fnuz, fp8_dtype = _kv_format(fmt, fp8_flavor, target)
    args = dict(q=Arg("q"), q_scale=Arg("q_scale"), weights=Arg("weights"), kv_cache=Arg("kv_cache"),
                table=Arg("table"), block_table=Arg("block_table"), context_lens=Arg("context_lens"), N=n, H=h, G=g,
                max_pages=block_table_shape[1],
                num_pages=kv_cache.shape[0], stride_page=kv_cache.stride(0),
                Q_FMT=(FMT_MXFP4 if mx else FMT_TENSOR).value, K_FMT=k_fmt, K_TABLE=table, FNUZ=fnuz, FP8_DTYPE=fp8_dtype,
                DOT_DTYPE=_dot_dtype(target), DEC_DTYPE=configs.decode_dtype(target), Q_PARTS=Q_PARTS[q_dtype],
                D=d, BLOCK_H=hp, BLOCK_T=nt,
                BLOCK_N=cfg.bn, ALIGNED=aligned4)
    return args, b, n, g


def _check_cfg(cfg: configs.PagedConfig) -> None:
    if PAGE_ROWS % cfg.bn or cfg.bn < 16:
        raise ValueError(f"PagedConfig.bn must divide {PAGE_ROWS} and be >= 16, got {cfg.bn}")


_PLANS: dict = {}
PLANS_MAX = 1024  # cached launch plans (all dropped when full)


def _plan(key, build):
    """The cached plan of ``key`` (built by ``build()`` on a miss)."""
    plan = _PLANS.get(key)
    if plan is None:
        if len(_PLANS) >= PLANS_MAX:
            _PLANS.clear()
        plan = _PLANS[key] = build()
    return plan


def _inputs(q, q_scale, kv_cache, weights, block_table, context_lens, table):
    """(env of the kernels' input tensors, dense; the plan-key part they fix): shapes, dtypes,
    the cache's page stride, the device, every pointer's address mod 16 (Triton specialises on
    16-byte alignment; ``ALIGNED`` reads the cache's mod 4)."""
    q, w, bt, ctx = q.contiguous(), weights.contiguous(), block_table.contiguous(), context_lens.contiguous()
    qs = q if q_scale is None else q_scale.contiguous()
    tb = kv_cache if table is None else table.to(torch.float32).contiguous()
    env = dict(q=q, q_scale=qs, weights=w, kv_cache=kv_cache, table=tb, block_table=bt, context_lens=ctx)
    key = (q.shape, q.dtype, q_scale is None, w.dtype, kv_cache.shape, kv_cache.stride(0), bt.shape, q.device,
           q.data_ptr() % 16, qs.data_ptr() % 16, w.data_ptr() % 16, kv_cache.data_ptr() % 16,
           bt.data_ptr() % 16, ctx.data_ptr() % 16, table is None, tb.data_ptr() % 16)
    return env, key


def _config(op: str, q, q_scale, block_table, fmt, fp8_flavor, run, *extra):
    """(target, config): the shipped config, or when tuning this bucket's winner (buckets of batch
    and table length)."""
    target = configs.target_for(q.device)
    default = configs.for_target(configs.PAGED, target)
    if not autotune.enabled():  # the shipped config: no bucket key to build
        return target, autotune.shipped("paged", target, default)
    b, n, h, d = q.shape
    key = (op, bucket(b), bucket(block_table.shape[1] * PAGE_ROWS), n, h, d, q_scale is not None, str(q.dtype), fmt,
           fp8_flavor, *extra)
    return target, autotune.pick("paged", target, q.device, default, key, run)


def paged_logits(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table=None):
    def run(cfg):
        return (_paged_logits(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table, cfg),)
    return run(_config("logits", q, q_scale, block_table, fmt, fp8_flavor, run, table is not None)[1])[0]


def _paged_logits(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table, cfg):
    _check_cfg(cfg)
    env, key = _inputs(q, q_scale, kv_cache, weights, block_table, context_lens, table)
    target = configs.target_for(q.device)
    b, n = q.shape[:2]
    max_len = block_table.shape[1] * PAGE_ROWS
    out = torch.empty((b, n, max_len), dtype=torch.float32, device=q.device)
    if b == 0 or n == 0 or max_len == 0:
        return out

    def build():
        args, b, n, g = _score_args(q.shape, q.dtype, q_scale is not None, kv_cache, block_table.shape, fmt,
                                    fp8_flavor, target, cfg, key[11] % 4 == 0 and kv_cache.stride(0) % 4 == 0,
                                    table is not None)
        lc = cdiv(cfg.logits_rows, cfg.bn) * cfg.bn
        s = cdiv(max_len, lc)
        return cfg, Launch(paged_scores_kernel, (b * g * s,), configs.launch_options(cfg, target),
                           out=Arg("out"), histogram=Arg("out"), S=s, C=lc, SUB=1, item0=0,
                           n_items=b * g * s, TO_WS=False, HIST_COPIES=0, **args)

    _, launch = _plan(("logits", key, fmt, fp8_flavor, id(cfg)), build)
    env["out"] = out
    launch(env)
    return out


@dataclass(frozen=True)
class TopkPlan:
    """Everything a paged top-k call computes from its plan key: buffer layout and launches."""
    cfg: configs.PagedConfig  # held: its id() is part of the key
    split: SplitPlan
    programs: int             # programs per wave = workspace slots
    words: int                # one fp32/int32 workspace buffer ("scores") of this many 4-byte words ...
    regions: tuple            # ... holding these ``fastlaunch.run`` regions: (name, "scores", word offset,
                              # words, dtype)
    launches: tuple


def _align(words: int) -> int:
    return cdiv(words, 64) * 64  # 256-byte aligned regions: 16-byte aligned pointers, as Triton assumed


def _topk_plan(q, q_scale, kv_cache, block_table, topk, fmt, fp8_flavor, programs, target, cfg, aligned4, table):
    args, b, n, g = _score_args(q.shape, q.dtype, q_scale is not None, kv_cache, block_table.shape, fmt, fp8_flavor,
                                target, cfg, aligned4, table)
    max_pages = block_table.shape[1]
    nprog_max = programs or configs.wave_programs(q.device, cfg.progs_per_sm)
    plan = split_plan(b, g, max_pages * PAGE_ROWS, topk, cfg, nprog_max)
    items = b * g * plan.splits
    nprog = max(1, min(items, nprog_max))
    nt, rows = args["BLOCK_T"], b * n
    split = plan.splits > 1
    copies = hist_copies(max_pages * PAGE_ROWS, cfg) if split else 0
    hist_words = rows * copies * HIST_BINS.value
    if hist_words >= 2**31:  # paged_scores_kernel's int32 histogram offsets
        raise ValueError(f"paged_indexer_topk: batch x query tokens = {rows} is too large for one call "
                         f"(at most {2**31 // (copies * HIST_BINS.value) - 1} here); split the batch")
    fine = split and items <= nprog  # one wave: the select kernel reads complete histograms
    listed = rows * plan.splits * plan.kp if split else 0  # entries of one partial-list array
    # the score workspace is dead after the last wave: the final merge's candidates reuse it
    regions = dict(scores=max(nprog * nt * plan.chunk, _align(listed) + listed))
    ranked = split and rows <= cfg.rank_rows  # list_rank_kernel places the lists' entries, not a merge
    if split:
        # the key histograms, then (one wave) the fine ones, then (ranked) the lists' row state:
        # zeroed together by one launch
        regions.update(part_values=listed, part_indices=listed,
                       hist_all=hist_words + (fine * HIST_BINS.value + ranked * RANK_STATE.value) * rows,
                       list_counts=rows * plan.splits)
    if ranked:  # the lists' entries packed per row (key bits, indices)
        regions.update(rank_keys=listed, rank_cols=listed)
    offsets, words = {}, 0
    for name, size in regions.items():
        offsets[name] = (words, size)
        words += _align(size)
    opts = configs.launch_options(cfg, target)
    kp_p2 = next_pow2(plan.kp)
    launches = []
    if split:
        n_zero = regions["hist_all"]
        launches.append(Launch(zero_kernel, (cdiv(n_zero, ZERO_BLOCK),), dict(num_warps=4), buf=Arg("hist_all"),
                               n=n_zero, BLOCK=ZERO_BLOCK))
    dummy = Arg("out_indices")  # an operand the kernel does not read in this configuration
    for item0 in range(0, items, nprog):
        wave = min(nprog, items - item0)
        launches.append(Launch(paged_scores_kernel, (wave * plan.sub,), opts, out=Arg("scores"),
                               histogram=Arg("histogram") if split else dummy, S=plan.splits, C=plan.chunk,
                               SUB=plan.sub, item0=item0, n_items=items, TO_WS=True, HIST_COPIES=copies, **args))
        launches.append(Launch(
            paged_select_kernel, (wave * nt,), dict(num_warps=cfg.merge_warps), scores=Arg("scores"),
            context_lens=Arg("context_lens"), part_values=Arg("part_values" if split else "out_values"),
            part_indices=Arg("part_indices" if split else "out_indices"),
            histogram=Arg("histogram") if split else dummy, list_counts=Arg("list_counts") if split else dummy,
            fine=Arg("fine") if fine else dummy, rank_keys=Arg("rank_keys") if ranked else dummy,
            rank_cols=Arg("rank_cols") if ranked else dummy, rank_state=Arg("rank_state") if ranked else dummy,
            N=n, G=g, S=plan.splits, C=plan.chunk, item0=item0, n_items=items, max_pages=max_pages, TOPK=topk,
            BLOCK_T=nt, LIST_SIZE=plan.kp, LIST_SIZE_P2=kp_p2, BLOCK_SELECT=cfg.ch, SPLIT=split, HIST_COPIES=copies,
            FINE=fine, BITS=cfg.bits, RANKED=ranked))
    if split:
        s_p2 = next_pow2(plan.splits)
        merge = dict(part_values=Arg("part_values"), part_indices=Arg("part_indices"), list_counts=Arg("list_counts"),
                     histogram=Arg("histogram"), fine=Arg("fine") if fine else dummy, cand_values=Arg("scores"),
                     cand_indices=Arg("cand_indices"), out_values=Arg("out_values"), out_indices=Arg("out_indices"),
                     S=plan.splits, LIST_SIZE=plan.kp, TOPK=topk, TOPK_P2=next_pow2(topk), BLOCK_SELECT=cfg.final_ch,
                     S_P2=s_p2, BLOCK_COPY=max(1, FINAL_TILE // s_p2), HIST_COPIES=copies, FINE=fine, BITS=cfg.bits)
        if ranked:
            sel = configs.for_target(configs.SELECT, target)
            launches.append(Launch(
                list_rank_kernel, (rows, cdiv(topk, sel.rank_slice)), dict(num_warps=sel.rank_warps),
                rank_keys=Arg("rank_keys"), rank_cols=Arg("rank_cols"), rank_state=Arg("rank_state"),
                RANK_MAX=cfg.rank_entries * next_pow2(topk), SLICE=sel.rank_slice,
                TILE=min(next_pow2(topk), sel.rank_tile), **merge))
        else:
            launches.append(Launch(list_merge_kernel, (rows,), dict(num_warps=cfg.final_warps), **merge))
        offsets["cand_indices"] = (_align(listed), listed)  # inside scores
        at = offsets["hist_all"][0]
        offsets["histogram"] = (at, hist_words)
        at += hist_words
        if fine:
            offsets["fine"] = (at, rows * HIST_BINS.value)
            at += rows * HIST_BINS.value
        if ranked:
            offsets["rank_state"] = (at, rows * RANK_STATE.value)
    regions = tuple((name, "scores", at, size, torch.float32 if name == "part_values" else torch.int32)
                    for name, (at, size) in offsets.items() if name != "scores")
    return TopkPlan(cfg, plan, nprog, words, regions, tuple(launches))


def paged_topk(q, q_scale, kv_cache, weights, block_table, context_lens, topk, fmt, fp8_flavor, table=None,
               programs: int | None = None, stats: dict | None = None):
    """Fused paged top-k (see kernels/paged_indexer.py). ``programs`` overrides the programs per wave;
    ``stats`` (tests, benchmarks) receives the split plan and the per-list candidate counts.

    Per call: a plan lookup (cached by shapes, dtypes, alignments, device, config), three
    allocations (outputs, one workspace buffer), 2-4 launches (``fastlaunch.run``; with at most
    ``rank_rows`` token rows the fourth ranks the lists' entries instead of merging them)."""
    def run(cfg, stats=None):
        return _paged_topk(q, q_scale, kv_cache, weights, block_table, context_lens, topk, fmt, fp8_flavor,
                           table, programs, stats, cfg)
    return run(_config("topk", q, q_scale, block_table, fmt, fp8_flavor, run, topk, table is not None)[1], stats)


def _paged_topk(q, q_scale, kv_cache, weights, block_table, context_lens, topk, fmt, fp8_flavor, table, programs,
                stats, cfg):
    _check_cfg(cfg)
    env, key = _inputs(q, q_scale, kv_cache, weights, block_table, context_lens, table)
    target = configs.target_for(q.device)
    dev = q.device
    b, n = q.shape[:2]
    out_values = torch.empty((b, n, topk), dtype=torch.float32, device=dev)
    out_indices = torch.empty((b, n, topk), dtype=torch.int32, device=dev)
    if b == 0 or n == 0:
        return out_values, out_indices
    if block_table.shape[1] == 0:
        return out_values.fill_(float("-inf")), out_indices.fill_(-1)
    plan = _plan(("topk", key, topk, fmt, fp8_flavor, programs, id(cfg)),
                 lambda: _topk_plan(q, q_scale, kv_cache, block_table, topk, fmt, fp8_flavor, programs, target, cfg,
                                    key[11] % 4 == 0 and kv_cache.stride(0) % 4 == 0, table is not None))
    buf = torch.empty(plan.words, dtype=torch.float32, device=dev)
    env.update(out_values=out_values, out_indices=out_indices, scores=buf)
    fastlaunch.run(plan.launches, env, plan.regions)
    if stats is not None:
        stats.update(plan=plan.split, programs=plan.programs)
        if plan.split.splits > 1:
            counts = next(r for r in plan.regions if r[0] == "list_counts")
            stats.update(candidates=fastlaunch.region(env, *counts).view(b * n, plan.split.splits))
    return out_values, out_indices


def paged_gather(kv_cache, block_table, context_lens, total_rows: int, payload_bytes: int, scale_bytes: int):
    """(payload uint8 [total_rows, ROW_BYTES], scales uint8 [total_rows, S], k_start, k_end int32 [B])."""
    block_table, context_lens = block_table.contiguous(), context_lens.contiguous()  # dense [B, P], [B]
    dev = kv_cache.device
    b, max_pages = block_table.shape
    max_len = max_pages * PAGE_ROWS
    ctx = context_lens.clamp(0, max_len).to(torch.int64)
    end = torch.cumsum(ctx, 0)
    start = end - ctx
    out_payload = torch.zeros((total_rows, payload_bytes), dtype=torch.uint8, device=dev)
    out_scales = torch.zeros((total_rows, scale_bytes), dtype=torch.uint8, device=dev)
    if b and max_len and total_rows:
        paged_gather_kernel[(b, cdiv(max_len, GATHER_ROWS))](
            kv_cache, block_table, context_lens, start, out_payload, out_scales, total_rows, max_pages,
            kv_cache.shape[0], max_pages, kv_cache.stride(0),
            ROW_BYTES=payload_bytes, SCALE_BYTES=scale_bytes, BLOCK_ROWS=GATHER_ROWS)
    return (out_payload, out_scales, start.clamp(max=total_rows).to(torch.int32),
            end.clamp(max=total_rows).to(torch.int32))


def paged_check(kv_cache, block_table, context_lens) -> tuple[int, int]:
    """(requests whose context_lens lie outside [0, max_len], block-table entries used by a
    context that lie outside [0, num_pages)): one launch, one device-to-host copy (a sync)."""
    b, max_pages = block_table.shape
    dev = block_table.device
    bad_counts = torch.zeros(2, dtype=torch.int32, device=dev)
    key = ("check", block_table.shape, block_table.stride(), context_lens.stride(0), kv_cache.shape[0], dev,
           block_table.data_ptr() % 16, context_lens.data_ptr() % 16)
    launch = _plan(key, lambda: Launch(
        paged_check_kernel, (b,), dict(num_warps=4), block_table=Arg("block_table"), context_lens=Arg("context_lens"),
        bad_counts=Arg("bad_counts"), stride_bt_b=block_table.stride(0), stride_bt_p=block_table.stride(1),
        stride_ctx=context_lens.stride(0),
        max_len=max_pages * PAGE_ROWS, num_pages=kv_cache.shape[0], BLOCK_PAGES=CHECK_PAGES))
    env = dict(block_table=block_table, context_lens=context_lens, bad_counts=bad_counts)
    # Triton launches on the current device; the public functions call this outside the ops'
    # switch to the inputs' GPU (tests/test_devices.py)
    if bad_counts.is_cuda and dev.index != torch.cuda.current_device():
        with torch.cuda.device(dev):
            launch(env)
    else:
        launch(env)
    return tuple(bad_counts.tolist())


# --- ahead-of-time variants (python -m inductor_dsa.aot) -------------------------------------

def _aligned(fn, sig, ints=("stride_page", "C")):
    """ASTSource attrs marking pointers (and page stride / chunk) 16-divisible, as the runtime JIT
    specialises them for 16-byte aligned tensors and such integers; without it the AOT build
    would load the cache byte by byte."""
    return {(fn.arg_names.index(a),): [["tt.divisibility", 16]]
            for a, t in sig.items() if (t.startswith("*") or a in ints) and t != "constexpr"}


# pointer types of every paged kernel argument (AOT signatures; the rest are i32 or constexpr)
_POINTERS = dict(q="*bf16", q_scale="*bf16", weights="*bf16", kv_cache="*u8", table="*fp32", block_table="*i32", context_lens="*i32",
                 out="*fp32", scores="*fp32", part_values="*fp32", part_indices="*i32", histogram="*i32",
                 list_counts="*i32", cand_values="*fp32", cand_indices="*i32", out_values="*fp32", out_indices="*i32",
                 bad_counts="*i32", row_start="*i64", out_payload="*u8", out_scales="*u8", buf="*i32", fine="*i32",
                 rank_keys="*i32", rank_cols="*i32", rank_state="*i32")


_Q_POINTER = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}


def _signature(fn, consts: dict, q: str = "*bf16") -> dict:
    return {a: ("constexpr" if a in consts else q if a in ("q", "q_scale") else _POINTERS.get(a, "i32"))
            for a in fn.arg_names}


def aot_variants(target: str, cfg: configs.PagedConfig, head_dim: int = 128, heads: int = 64):
    """(name, kernel, signature, constexprs, options, attrs) of the paged kernels with ``cfg`` on a target."""
    opts = configs.launch_options(cfg, target)
    for fmt, flavor in (("mxfp4", "fn"), ("fp8", _NATIVE_FP8[target][0]), ("fp8", "fn" if target == "gfx942" else "fnuz")):
        k_fmt, fnuz, fp8_dtype = _kv_format(fmt, flavor, target)
        # bf16 q: every token count, both outputs; fp16 / fp32 q (split into bf16 parts): the workspace loop
        for q_dt, n_toks, outs in ((torch.bfloat16, (1, 2, 4), (False, True)), (torch.float16, (1, 4), (True,)),
                                   (torch.float32, (1, 4), (True,))):
            parts, q_ptr = Q_PARTS[q_dt], _Q_POINTER[q_dt]
            for n_tok in n_toks:
                hp, nt, _ = tiles(n_tok, heads, query_rows(cfg, parts))
                base = dict(H=heads, Q_FMT=FMT_TENSOR.value, K_FMT=k_fmt, K_TABLE=False, FNUZ=fnuz, FP8_DTYPE=fp8_dtype,
                            DOT_DTYPE=tl.bfloat16, DEC_DTYPE=configs.decode_dtype(target),
                            Q_PARTS=parts, D=head_dim, BLOCK_H=hp, BLOCK_T=nt,
                            BLOCK_N=cfg.bn, ALIGNED=True)
                tag = (f"{fmt}{'-' + flavor if fmt == 'fp8' else ''} N={n_tok} D={head_dim} H={heads}"
                       f"{'' if parts == 1 else ' q=' + q_ptr[1:]}")
                for to_ws in outs:  # the workspace loop as a split top-k runs it (histogram counts)
                    consts = dict(base, TO_WS=to_ws, HIST_COPIES=int(to_ws))
                    sig = _signature(paged_scores_kernel, consts, q_ptr)
                    yield (f"paged_scores[{tag}{' ws' if to_ws else ' logits'}]", paged_scores_kernel, sig, consts,
                           opts, _aligned(paged_scores_kernel, sig))
                if fmt == "mxfp4" and q_dt is not torch.float16:  # keys through a table: fp32, 3 bf16 parts
                    hp, nt, _ = tiles(n_tok, heads, query_rows(cfg, parts, True))
                    consts = dict(base, K_TABLE=True, TO_WS=True, HIST_COPIES=1, BLOCK_H=hp, BLOCK_T=nt)
                    sig = _signature(paged_scores_kernel, consts, q_ptr)
                    yield (f"paged_scores[{tag} table ws]", paged_scores_kernel, sig, consts, opts,
                           _aligned(paged_scores_kernel, sig))
    mopts = dict(num_warps=cfg.merge_warps)
    for nt in (1, 4):
        for topk, split, copies in ((512, False, 1), (1024, True, 1), (2048, True, HIST_COPIES_MAX)):
            ranked = split and nt == 1 and topk == 2048
            consts = dict(BLOCK_T=nt, LIST_SIZE=topk, LIST_SIZE_P2=next_pow2(topk), BLOCK_SELECT=cfg.ch, SPLIT=split,
                          HIST_COPIES=copies, FINE=split, BITS=cfg.bits, RANKED=ranked)
            sig = _signature(paged_select_kernel, consts)
            yield (f"paged_select[NT={nt} topk={topk}{f' split, histogram x{copies}' if split else ''}"
                   f"{', ranked' if ranked else ''}]", paged_select_kernel, sig, consts, mopts,
                   _aligned(paged_select_kernel, sig))
    for topk in (512, 1024, 2048):
        s_p2 = 256
        consts = dict(LIST_SIZE=topk, TOPK=topk, TOPK_P2=next_pow2(topk), BLOCK_SELECT=cfg.final_ch, S_P2=s_p2,
                      BLOCK_COPY=max(1, FINAL_TILE // s_p2), HIST_COPIES=HIST_COPIES_MAX if topk == 2048 else 1,
                      FINE=topk != 1024, BITS=cfg.bits)
        sig = _signature(list_merge_kernel, consts)
        yield (f"paged_merge_final[topk={topk} S<=256{', fine' if consts['FINE'] else ''}]",
               list_merge_kernel, sig, consts, dict(num_warps=cfg.final_warps), _aligned(list_merge_kernel, sig))
    sel = configs.for_target(configs.SELECT, target)
    for topk in (512, 2048):
        s_p2 = 256
        consts = dict(LIST_SIZE=topk, TOPK=topk, TOPK_P2=topk, SLICE=sel.rank_slice, TILE=min(topk, sel.rank_tile),
                      BLOCK_SELECT=cfg.final_ch, S_P2=s_p2, BLOCK_COPY=max(1, FINAL_TILE // s_p2),
                      HIST_COPIES=HIST_COPIES_MAX if topk == 2048 else 1, FINE=True, BITS=cfg.bits)
        sig = _signature(list_rank_kernel, consts)
        yield (f"paged_list_rank[topk={topk}]", list_rank_kernel, sig, consts, dict(num_warps=sel.rank_warps),
               _aligned(list_rank_kernel, sig))
    consts = dict(BLOCK=ZERO_BLOCK)
    sig = _signature(zero_kernel, consts)
    yield "paged_zero", zero_kernel, sig, consts, dict(num_warps=4), _aligned(zero_kernel, sig, ints=())
    consts = dict(BLOCK_PAGES=CHECK_PAGES)
    sig = _signature(paged_check_kernel, consts)
    yield "paged_check", paged_check_kernel, sig, consts, dict(num_warps=4), _aligned(paged_check_kernel, sig, ints=())
    consts = dict(ROW_BYTES=head_dim // 2, SCALE_BYTES=head_dim // 32, BLOCK_ROWS=GATHER_ROWS)
    sig = _signature(paged_gather_kernel, consts)
    yield (f"paged_gather[mxfp4 D={head_dim}]", paged_gather_kernel, sig, consts, dict(num_warps=4),
           _aligned(paged_gather_kernel, sig))
