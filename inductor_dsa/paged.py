"""Public paged (decode) DSA indexer functions: validated entry points to the ``inductor_dsa`` ops.

    logits[b, n, j] = sum_h weights[b, n, h] * relu(q[b, n, h, :] . key_b[j, :])   for j < context_lens[b]

The key cache is paged (docs/semantics.md, "Paged key cache"; layout in ``inductor_dsa.formats``):
``kv_cache`` uint8 [num_pages, 64 * row_bytes], a page = 64 rows of payload then their 64 scales:

    fmt="mxfp4": row = D/2 code bytes + D/32 E8M0 bytes   (D=128: 68 B)
    fmt="fp8":   row = D e4m3 bytes + a 4-byte fp32 scale (D=128: 132 B); ``fp8_flavor`` "fn"
                 (OCP e4m3fn: Hopper, gfx950) or "fnuz" (e4m3fnuz: the native fp8 of gfx942)

Row j of request b is cache row ``j % 64`` of page ``block_table[b, j // 64]``; rows
j < context_lens[b] are visible to all N query tokens of request b (N = 1 plus MTP drafts).

Arguments
    q             bf16 / fp16 / fp32 [B, N, H, D] (fp16 / fp32: fp32-accurate products, as 2 / 3 bf16 dots),
                  or an MXFP4 pair (uint8 [B, N, H, D/2], uint8 [B, N, H, D/32])
    kv_cache      uint8 [num_pages, 64 * row_bytes], pages contiguous
    weights       bf16 / fp16 / fp32 [B, N, H] (signed)
    block_table   int32 [B, max_pages]
    context_lens  int32 [B]

Bounds. Shapes, dtypes and devices are checked before any launch (TypeError / ValueError naming
the argument); those checks read no data. Value checks (``checks.paged_values``: context_lens
within [0, max_len], the block-table entries the context uses within [0, num_pages)) read the
data and sync: on by default, skipped under CUDA-graph capture and torch.compile tracing, off
with ``check_values=False``, ``INDUCTOR_DSA_CHECK_VALUES=0`` or ``checks.values(False)``
(``check_values=None`` follows those). Unchecked, the kernels still never read out of bounds:
context_lens are clamped to [0, max_pages * 64]; a page id outside [0, num_pages) inside the
context reads as an all-zero key row (score 0; the oracle does the same); block-table entries
past the context are never read.
"""
from __future__ import annotations

import torch

from . import checks, formats, ops
from .kernels import configs


def _split_q(q):
    q, q_scale = checks.split_operand(q, "q")
    return q, q_scale


def _values(check_values, kv_cache, block_table, context_lens) -> None:
    """The value check: on a GPU (and under the interpreter) one counting kernel, then
    ``checks.paged_values`` on its counts."""
    if checks.can_read(check_values, kv_cache, block_table, context_lens):
        counts = None
        if block_table.shape[0] and configs.use_kernels(kv_cache.device):
            from .kernels.paged_launch import paged_check
            counts = paged_check(kv_cache, block_table, context_lens)
        checks.paged_values(kv_cache, block_table, context_lens, counts)


def _checked(check_values, q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor) -> None:
    """Metadata checks, then the value checks, when the value checks are on or while tracing (errors
    at compile time). Otherwise the op's own metadata checks are the only ones (once, not twice)."""
    if torch.compiler.is_compiling() or (checks.values_enabled() if check_values is None else check_values):
        checks.paged(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor)
        _values(check_values, kv_cache, block_table, context_lens)


def paged_indexer_logits(q, kv_cache, weights, block_table, context_lens, *, fmt="mxfp4", fp8_flavor="fn",
                         check_values=None, table=None) -> torch.Tensor:
    """fp32 [B, N, max_len] indexer logits, max_len = block_table.shape[1] * 64; columns
    j >= context_lens[b] are -inf. (A dense output; use ``paged_indexer_topk`` to never build it.)
    ``table`` (MXFP4): 16 floats decoding the codes instead of E2M1, key = fp32(table[code] * 2^(s - 127))."""
    q, q_scale = _split_q(q)
    _checked(check_values, q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor)
    return ops.paged_indexer_logits(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table)


def paged_indexer_topk(q, kv_cache, weights, block_table, context_lens, topk, *, fmt="mxfp4", fp8_flavor="fn",
                       check_values=None, table=None):
    """(values fp32 [B, N, topk], indices int32 [B, N, topk]) of the largest visible logits per query
    token: request-local row numbers j < context_lens[b], sorted by descending score (ties: lower
    row first), slots past the visible count hold -1 / -inf. NaN scores rank lowest.

    One fused kernel family: page walk, in-register decode, dot with all heads, relu, weighted
    head sum and top-k; long contexts are split across programs and the partial top-ks merged
    (kernels/paged_indexer.py). topk > 2048 falls back to the logits kernel plus a device sort.
    ``table``: as in ``paged_indexer_logits``."""
    topk = checks.topk_arg(topk)
    q, q_scale = _split_q(q)
    _checked(check_values, q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor)
    return ops.paged_indexer_topk(q, q_scale, kv_cache, weights, block_table, context_lens, topk, fmt, fp8_flavor,
                                  table)


def paged_gather(kv_cache, block_table, context_lens, *, fmt="mxfp4", fp8_flavor="fn", total_rows=None,
                 check_values=None):
    """Flat-buffer form: copy the raw cache rows of every request back to back (no dequant, no top-k),
    so that the prefill ``indexer_topk`` / ``indexer_logits`` can consume them.

    Returns ``(k, k_start, k_end)``: ``k`` the key operand for ``inductor_dsa.indexer_*`` --
    an MXFP4 pair (uint8 [R, D/2], uint8 [R, D/32]) or an FP8 pair (e4m3 [R, D] of ``fp8_flavor``,
    fp32 [R]) -- and int32 [B] ranges: request b's row j < clamp(context_lens[b], 0, max_len) is
    flat row k_start[b] + j, k_end[b] = k_start[b] + that length. For N query tokens per request
    use ``token_ranges(k_start, k_end, N)``; then ``indexer_topk`` indices minus the token's
    k_start are request-local rows, as ``paged_indexer_topk`` returns them.

    R = ``total_rows`` when given (rows past sum(context) are zero; ranges are clamped to R;
    no sync, CUDA-graph safe); by default R = sum of the clamped context_lens, which reads that
    sum back from the device (a sync). Rows of out-of-range page ids are zero.
    """
    checks.paged_cache(kv_cache, block_table, context_lens, fmt, fp8_flavor)
    _values(check_values, kv_cache, block_table, context_lens)
    if total_rows is None:
        max_len = block_table.shape[1] * formats.PAGE_ROWS
        total_rows = int(context_lens.long().clamp(0, max_len).sum()) if block_table.shape[0] else 0
    if isinstance(total_rows, bool) or not isinstance(total_rows, int) or total_rows < 0:
        raise ValueError(f"total_rows must be a non-negative int, got {total_rows!r}")
    payload, scale, k_start, k_end = ops.paged_gather(kv_cache, block_table, context_lens, total_rows, fmt)
    if fmt == "fp8":
        k = (payload.view(formats.FP8_DTYPES[fp8_flavor]), scale.view(torch.float32).reshape(-1))
    else:
        k = (payload, scale)
    return k, k_start, k_end


def token_ranges(k_start, k_end, n: int):
    """Per-request ranges [B] -> per-token ranges [B * n] (each request's n query tokens share them)."""
    return k_start.repeat_interleave(n), k_end.repeat_interleave(n)
