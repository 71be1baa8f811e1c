"""Public DSA sparse attention: the validated entry point to ``inductor_dsa::sparse_attention``.

    s_j = scale * q[b, m, h, :] . kv[b, indices[b, m, j], :]        (slots with index -1 skipped)
    out[b, m, h] = sum_j exp(s_j - mx) kv[b, indices[b, m, j]] / (sum_j exp(s_j - mx) + exp(sink[h] - mx))

q [B, M, H, D] (bf16 in V4: D = 512, H = 64 or 128), kv [B, N, D] of q's dtype, used as both
K and V (one KV head); indices int32/int64 [B, M, topk], -1 = empty slot, a repeated index
counts once per slot; sink None or [H] (fp32), only in the denominator; scale default D**-0.5.
"""
from __future__ import annotations

from . import checks, ops


def sparse_attention(q, kv, indices, *, sink=None, scale=None, return_lse=False, check_indices=None):
    """out [B, M, H, D] (q's dtype), or (out, lse fp32 [B, M, H]) with ``return_lse``.

    lse = log sum_j exp(s_j) over the non-empty slots: natural log, sink NOT included, -inf
    for a query with no non-empty slot (such a query returns out = 0, never NaN).

    Validation, all before any launch: shapes, dtypes, devices, sink and scale raise
    TypeError / ValueError naming the argument without reading data. Index values outside
    [-1, N) raise ValueError too (a value check: one reduction + a device sync); it is skipped
    under torch.compile tracing and CUDA-graph capture, and turned off by
    ``check_indices=False``, ``INDUCTOR_DSA_CHECK_VALUES=0`` or ``checks.values(False)``
    (``check_indices=None`` follows those). Unchecked out-of-range indices are treated as -1 by
    the kernels (never read outside kv).
    """
    info = checks.sparse_attention(q, kv, indices, sink, scale)
    if checks.can_read(check_indices, indices):
        checks.index_range(indices, info["N"])
    out, lse = ops.sparse_attention(q, kv, indices, sink, info["scale"])
    return (out, lse) if return_lse else out
