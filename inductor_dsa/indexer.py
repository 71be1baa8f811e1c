"""Public DSA indexer functions: validated entry points to the ``inductor_dsa`` ops.

    logits[t, j] = sum_h weights[t, h] * relu(q[t, h, :] . k[j, :])   for k_start[t] <= j < k_end[t]

q: tensor [T, H, D] (bf16 / fp16 / fp32, or fp8 with k an FP8 pair of the same dtype) or an
MXFP4 pair (uint8 codes [T, H, D/2], uint8 E8M0 [T, H, D/32]).
``logits_topk`` is the top-k alone, over given fp32 logits [T, K].
k: tensor [K, D], an MXFP4 pair ([K, D/2], [K, D/32]) or an FP8 pair (e4m3 [K, D], fp32 [K]).
weights [T, H]; k_start / k_end integer [T], default the whole of K.
mask: None, or a tensor that broadcasts to [T, K] (any strides; an ``expand``ed one is not
copied): bool (True = visible) or fp32 / bf16 / fp16, an additive bias (logit + bias; -inf
hides; NaN / +inf are rejected where value checks run). Visible = inside [k_start, k_end) and
shown by the mask; docs/semantics.md "Masks given as data".
"""
from __future__ import annotations

import torch

from . import checks, ops


def _prepare(q, k, weights, k_start, k_end, mask):
    """(operands, k_start, k_end), and the mask expanded to [T, K]."""
    q, q_scale = checks.split_operand(q, "q")
    k, k_scale = checks.split_operand(k, "k")
    info = checks.indexer(q, q_scale, k, k_scale, weights)
    k_start, k_end = _ranges(k_start, k_end, info["T"], info["K"], q.device)
    return (q, q_scale, k, k_scale, weights, k_start, k_end), checks.mask(mask, info["T"], info["K"], q.device)


def _ranges(k_start, k_end, rows, cols, device):
    if (k_start is None) != (k_end is None):
        raise ValueError("pass both k_start and k_end, or neither")
    if k_start is None:
        k_start = torch.zeros(rows, dtype=torch.int32, device=device)
        k_end = torch.full_like(k_start, cols)
    return checks.ranges(k_start, k_end, rows, device)


def indexer_logits(q, k, weights, *, k_start=None, k_end=None, mask=None) -> torch.Tensor:
    """fp32 [T, K] indexer logits (+ an additive mask), -inf where not visible."""
    args, mask = _prepare(q, k, weights, k_start, k_end, mask)
    return ops.indexer_logits(*args, mask)


def indexer_topk(q, k, weights, topk, *, k_start=None, k_end=None, mask=None):
    """(values fp32 [T, topk], indices int32 [T, topk]) of the largest visible logits per row.

    Sorted by descending score (ties: lower column first). Slots past the row's visible
    count hold index -1 and value -inf. NaN scores rank below every other score (with a mask:
    as -inf).
    """
    topk = checks.topk_arg(topk)
    args, mask = _prepare(q, k, weights, k_start, k_end, mask)
    return ops.indexer_topk(*args, topk, mask)


def logits_topk(logits, topk, *, k_start=None, k_end=None):
    """(values fp32 [T, topk], indices int32 [T, topk]) of the largest entries of fp32 ``logits``
    [T, K] in each row's [k_start, k_end); the order and padding of ``indexer_topk``.

    The select stage of ``indexer_topk`` on logits computed elsewhere (e.g. partial scores
    summed across tensor-parallel ranks).
    """
    t, n = checks.logits(logits)
    topk = checks.topk_arg(topk)
    k_start, k_end = _ranges(k_start, k_end, t, n, logits.device)
    return ops.logits_topk(logits, k_start, k_end, topk)
