"""Public DSA indexer functions: validated entry points to the ``inductor_dsa`` ops.

    logits[t, j] = sum_h weights[t, h] * relu(q[t, h, :] . k[j, :])   for k_start[t] <= j < k_end[t]

q: tensor [T, H, D] (bf16 / fp16 / fp32, or fp8 with k an FP8 pair of the same dtype) or an
MXFP4 pair (uint8 codes [T, H, D/2], uint8 E8M0 [T, H, D/32]).
k: tensor [K, D], an MXFP4 pair ([K, D/2], [K, D/32]) or an FP8 pair (e4m3 [K, D], fp32 [K]).
weights [T, H]; k_start / k_end integer [T], default the whole of K.
"""
from __future__ import annotations

import torch

from . import checks, ops


def _prepare(q, k, weights, k_start, k_end):
    q, q_scale = checks.split_operand(q, "q")
    k, k_scale = checks.split_operand(k, "k")
    info = checks.indexer(q, q_scale, k, k_scale, weights)
    if (k_start is None) != (k_end is None):
        raise ValueError("pass both k_start and k_end, or neither")
    if k_start is None:
        k_start = torch.zeros(info["T"], dtype=torch.int32, device=q.device)
        k_end = torch.full_like(k_start, info["K"])
    k_start, k_end = checks.ranges(k_start, k_end, info["T"], q.device)
    return q, q_scale, k, k_scale, weights, k_start, k_end


def indexer_logits(q, k, weights, *, k_start=None, k_end=None) -> torch.Tensor:
    """fp32 [T, K] indexer logits, -inf outside each row's [k_start, k_end)."""
    return ops.indexer_logits(*_prepare(q, k, weights, k_start, k_end))


def indexer_topk(q, k, weights, topk, *, k_start=None, k_end=None):
    """(values fp32 [T, topk], indices int32 [T, topk]) of the largest visible logits per row.

    Sorted by descending score (ties: lower column first). Slots past the row's visible
    count hold index -1 and value -inf. NaN scores rank below every other score.
    """
    topk = checks.topk_arg(topk)
    return ops.indexer_topk(*_prepare(q, k, weights, k_start, k_end), topk)
