"""Triton kernel for DSA sparse attention over gathered KV rows (one KV head, K = V).

    s_j = scale * q[b, m, h, :] . kv[b, indices[b, m, j], :]   for indices[b, m, j] >= 0
    out[b, m, h, :] = sum_j exp(s_j - mx) kv[b, indices_j, :] / (sum_j exp(s_j - mx) + exp(sink[h] - mx))
    lse[b, m, h] = log sum_j exp(s_j)                           (sink not included)

A program owns one query (b, m) and a block of BLOCK_H heads (all of them when H <= BLOCK_H). Its Q
tile [BLOCK_H, D] stays resident; the query's index list is walked BLOCK_N slots at a time, and each
gathered KV tile [BLOCK_N, D] is loaded ONCE and shared by all BLOCK_H heads, first as K, then as V:

    S [BLOCK_H, BLOCK_N] = Q @ KV_tile^T           (fp32 accumulate, log2-domain: scale * log2(e) folded in)
    online softmax: mx' = max(mx, rowmax S), alpha = 2^(mx - mx'), P = 2^(S - mx')
    l = l * alpha + rowsum P;  acc [BLOCK_H, D] = acc * alpha + P @ KV_tile   (fp32 accumulate)

Empty slots (index < 0) and, defensively, index >= N score -inf and load nothing, so the kernel
never reads outside kv. The sink joins at the end: mx_f = max(mx, sink * log2 e), both acc
and l rescaled by 2^(mx - mx_f), l += 2^(sink * log2 e - mx_f). A query with no valid slot
has acc = 0 and l = 0 (no sink) or l > 0 (sink): out is 0 either way, never NaN. NaN inputs
(a NaN score or sink) give NaN out, and a NaN score NaN lse (see ``_finish``).

Gather: ``GATHER`` picks how the loop overlaps the indirect KV load with the MMAs (see
``_attend``). D is not chunked: Q and the KV tile go through shared memory / LDS and the
[BLOCK_H, D] accumulator is split across warps by the MMA layout (no spills, see configs.py).

Split-KV (``SPLITS`` > 1, for launches with too few programs to fill the GPU): program
(query, head block, split) walks only its share of the slots and writes fp32 partials
(acc / l, row max, l) to a workspace; ``combine_kernel`` merges the splits and adds the sink.
"""
import triton
import triton.language as tl

LOG2E = 1.4426950408889634  # host-side (folded into qk_scale by the launcher)
_LOG2E = tl.constexpr(LOG2E)
_LN2 = tl.constexpr(0.6931471805599453)


@triton.jit
def _mm(a, b, acc, DOT_DTYPE: tl.constexpr):
    """acc + a @ b in DOT_DTYPE with fp32 accumulation (fp32 uses IEEE: no TF32, interpreter-safe)."""
    if DOT_DTYPE == tl.float32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    return tl.dot(a.to(DOT_DTYPE), b.to(DOT_DTYPE), acc)


@triton.jit
def _indices(indices, idx_off, k0, hi, stride_idx_k, BLOCK_N: tl.constexpr):
    """Index slots k0 .. k0+BLOCK_N-1 (slots >= hi read as -1)."""
    slot = k0 + tl.arange(0, BLOCK_N)
    return tl.load(indices + idx_off + slot * stride_idx_k, mask=slot < hi, other=-1)


@triton.jit
def _gather(kv, j, kv_off, N, stride_kv_n, stride_kv_d, D: tl.constexpr):
    """(KV rows [BLOCK_N, D], validity [BLOCK_N]) for indices j; invalid rows (j < 0 or j >= N) are 0,
    never read."""
    ok = (j >= 0) & (j < N)
    rows = kv + kv_off + tl.where(ok, j, 0).to(tl.int64) * stride_kv_n
    return tl.load(rows[:, None] + tl.arange(0, D)[None, :] * stride_kv_d, mask=ok[:, None], other=0.0), ok


@triton.jit
def _step(q, kt, ok, acc, mx, l, qk_scale, BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """One online-softmax update with KV tile kt [BLOCK_N, D] (rows with ok = False score -inf)."""
    s = _mm(q, tl.trans(kt), tl.zeros((BLOCK_H, BLOCK_N), tl.float32), DOT_DTYPE) * qk_scale
    s = tl.where(ok[None, :], s, float("-inf"))
    mx_new = tl.maximum(mx, tl.max(s, 1))
    base = tl.where(mx_new == float("-inf"), 0.0, mx_new)  # all-empty so far: keep 2^(.) finite
    alpha = tl.exp2(mx - base)
    p = tl.exp2(s - base[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = _mm(p, kt, acc * alpha[:, None], DOT_DTYPE)
    return acc, mx_new, l


@triton.jit
def _attend(q, kv, indices, idx_off, kv_off, lo, hi, N, qk_scale, stride_kv_n, stride_kv_d, stride_idx_k,
            BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, DOT_DTYPE: tl.constexpr,
            GATHER: tl.constexpr):
    """Online softmax of Q [BLOCK_H, D] over index slots lo .. hi-1: (acc [BLOCK_H, D], row max,
    row sum), log2 units.

    GATHER picks how the indirect KV load overlaps the MMAs:
    0 the plain loop: with num_stages > 1 Triton's pipeliner loads tile i+1's indices and
    issues its KV copy into shared memory while tile i is multiplied (sm90);
    1 by hand, for num_stages = 1: while tile i is multiplied, the KV rows of tile i+1
    (registers, BLOCK_N * D / threads of them) and the indices of tile i+2 are in flight.
    """
    mx = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, D), tl.float32)
    if GATHER == 1:
        j_n = _indices(indices, idx_off, lo, hi, stride_idx_k, BLOCK_N)
        kt_n, ok_n = _gather(kv, j_n, kv_off, N, stride_kv_n, stride_kv_d, D)
        j_nn = _indices(indices, idx_off, lo + BLOCK_N, hi, stride_idx_k, BLOCK_N)
        for k0 in range(lo, hi, BLOCK_N):
            kt, ok = kt_n, ok_n
            kt_n, ok_n = _gather(kv, j_nn, kv_off, N, stride_kv_n, stride_kv_d, D)
            j_nn = _indices(indices, idx_off, k0 + 2 * BLOCK_N, hi, stride_idx_k, BLOCK_N)
            acc, mx, l = _step(q, kt, ok, acc, mx, l, qk_scale, BLOCK_H, BLOCK_N, DOT_DTYPE)
    else:
        for k0 in range(lo, hi, BLOCK_N):
            j = _indices(indices, idx_off, k0, hi, stride_idx_k, BLOCK_N)
            kt, ok = _gather(kv, j, kv_off, N, stride_kv_n, stride_kv_d, D)
            acc, mx, l = _step(q, kt, ok, acc, mx, l, qk_scale, BLOCK_H, BLOCK_N, DOT_DTYPE)
    return acc, mx, l


@triton.jit
def _inv(l):
    """1 / l, with 0 for l == 0 (no slot, no sink: out = acc * 0 = 0); a NaN l stays NaN."""
    return tl.where(l == 0, 0.0, 1.0 / tl.where(l == 0, 1.0, l))


@triton.jit
def _finish(acc, mx, l, sink, heads, hm, HAS_SINK: tl.constexpr):
    """(out fp32 [BLOCK_H, D], lse natural-log [BLOCK_H]) from online-softmax state (sink added here).

    l == 0 (no slot): lse -inf. A NaN score makes l NaN: lse and out NaN (never the -inf of "no
    slot"). The sink joins the denominator only: top = max(mx, sink) (NaN-propagating), its term
    exp2(sink - top) taken as 1 when sink == top, so sink = +inf gives out = 0 (every
    exp2(s - inf) = 0) and a NaN sink gives out NaN."""
    lse = tl.where(l == 0, float("-inf"), (mx + tl.log2(tl.where(l == 0, 1.0, l))) * _LN2)
    if HAS_SINK:
        sk = tl.load(sink + heads, mask=hm, other=0.0).to(tl.float32) * _LOG2E
        top = tl.maximum(mx, sk, propagate_nan=tl.PropagateNan.ALL)
        top = tl.where(top == float("-inf"), 0.0, top)
        alpha = tl.exp2(mx - top)
        l = l * alpha + tl.where(sk == top, 1.0, tl.exp2(sk - top))
        acc = acc * alpha[:, None]
    return acc * _inv(l)[:, None], lse


@triton.jit
def _write_out(out, lse, pid, heads, hm, cols, o, ls, H, D: tl.constexpr, with_lse):
    """out[pid, heads, cols] = o and, ``with_lse``, lse[pid, heads] = ls: query pid = b * M + m of
    the launcher's contiguous out [B*M, H, D] and lse [B*M, H]."""
    row = pid.to(tl.int64) * H + heads
    tl.store(out + row[:, None] * D + cols[None, :], o.to(out.dtype.element_ty), mask=hm[:, None])
    if with_lse:
        tl.store(lse + row, ls, mask=hm)


@triton.jit
def sparse_attention_kernel(
    q,  # [B, M, H, D] bf16/fp16/fp32, any strides
    kv,  # [B, N, D] keys = values, q's dtype, any strides
    indices,  # [B, M, TOPK] int32 rows of kv (< 0: empty slot), any strides
    sink,  # HAS_SINK: fp32 [H] per-head sink logits; else unused
    out,  # [B, M, H, D] q's dtype, contiguous
    lse,  # fp32 [B, M, H], contiguous
    partials,  # SPLITS > 1: fp32 [B*M, SPLITS, H, D + 4] workspace; else unused
    M,  # queries per batch entry
    N,  # kv rows per batch entry
    H,  # heads
    TOPK,  # index slots per query
    qk_scale,  # softmax scale * log2(e)
    stride_q_b,
    stride_q_m,
    stride_q_h,
    stride_q_d,
    stride_kv_b,
    stride_kv_n,
    stride_kv_d,
    stride_idx_b,
    stride_idx_m,
    stride_idx_k,
    HAS_SINK: tl.constexpr,  # add the sink to every softmax denominator
    SPLITS: tl.constexpr,  # programs per (query, head block) along the slots (split-KV)
    DOT_DTYPE: tl.constexpr,  # dot operand type (fp32 under the interpreter)
    D: tl.constexpr,  # head_dim
    BLOCK_H: tl.constexpr,  # heads per program
    BLOCK_N: tl.constexpr,  # index slots (gathered kv rows) per step
    GATHER: tl.constexpr,  # how the kv gather overlaps the MMAs (``_attend``)
):
    """Grid (B * M, cdiv(H, BLOCK_H), SPLITS). SPLITS == 1 writes out / lse; else fp32 partials.

    partials layout (SPLITS > 1): [B*M, SPLITS, H, D + 4] fp32: acc / l (D), row max (log2), l,
    2 pad (16-byte rows).
    """
    pid = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    b = (pid // M).to(tl.int64)
    m = (pid % M).to(tl.int64)
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = heads < H
    dd = tl.arange(0, D)
    q_ptr = q + b * stride_q_b + m * stride_q_m + heads.to(tl.int64)[:, None] * stride_q_h + dd[None, :] * stride_q_d
    qt = tl.load(q_ptr, mask=hm[:, None], other=0.0)
    per = tl.cdiv(tl.cdiv(TOPK, SPLITS), BLOCK_N) * BLOCK_N
    lo = sp * per
    hi = tl.minimum(lo + per, TOPK)
    acc, mx, l = _attend(qt, kv, indices, b * stride_idx_b + m * stride_idx_m, b * stride_kv_b, lo, hi, N, qk_scale,
                         stride_kv_n, stride_kv_d, stride_idx_k, BLOCK_H, BLOCK_N, D, DOT_DTYPE, GATHER)
    if SPLITS == 1:
        o, ls = _finish(acc, mx, l, sink, heads, hm, HAS_SINK)
        _write_out(out, lse, pid, heads, hm, dd, o, ls, H, D, True)
    else:
        row = ((pid.to(tl.int64) * SPLITS + sp) * H + heads) * (D + 4)
        tl.store(partials + row[:, None] + dd[None, :], acc * _inv(l)[:, None], mask=hm[:, None])
        tl.store(partials + row + D, mx, mask=hm)
        tl.store(partials + row + D + 1, l, mask=hm)


@triton.jit
def combine_kernel(
    partials,  # fp32 [B*M, SPLITS, H, D + 4] from sparse_attention_kernel
    sink,  # HAS_SINK: fp32 [H] per-head sink logits; else unused
    out,  # [B, M, H, D] q's dtype, contiguous
    lse,  # fp32 [B, M, H], contiguous
    H,  # heads
    HAS_SINK: tl.constexpr,  # add the sink to every softmax denominator
    SPLITS: tl.constexpr,  # partials per (query, head)
    D: tl.constexpr,  # head_dim
    BLOCK_H: tl.constexpr,  # heads per program
    BLOCK_D: tl.constexpr,  # output columns per program
):
    """Merge SPLITS partials per (query, head): acc = sum_s 2^(mx_s - mx) l_s o_s, l likewise.

    Grid (B * M, cdiv(H, BLOCK_H), D // BLOCK_D): a program merges BLOCK_D output columns of BLOCK_H heads.
    """
    pid = tl.program_id(0)
    hb = tl.program_id(1)
    d0 = tl.program_id(2) * BLOCK_D
    heads = hb * BLOCK_H + tl.arange(0, BLOCK_H)
    hm = heads < H
    dd = d0 + tl.arange(0, BLOCK_D)
    mx = tl.full((BLOCK_H,), float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):
        row = ((pid.to(tl.int64) * SPLITS + s) * H + heads) * (D + 4)
        mx = tl.maximum(mx, tl.load(partials + row + D, mask=hm, other=float("-inf")))
    base = tl.where(mx == float("-inf"), 0.0, mx)
    l = tl.zeros((BLOCK_H,), tl.float32)
    acc = tl.zeros((BLOCK_H, BLOCK_D), tl.float32)
    for s in tl.static_range(SPLITS):
        row = ((pid.to(tl.int64) * SPLITS + s) * H + heads) * (D + 4)
        w = tl.exp2(tl.load(partials + row + D, mask=hm, other=float("-inf")) - base)
        w = w * tl.load(partials + row + D + 1, mask=hm, other=0.0)
        l += w
        acc += tl.load(partials + row[:, None] + dd[None, :], mask=hm[:, None], other=0.0) * w[:, None]
    o, ls = _finish(acc, base, l, sink, heads, hm, HAS_SINK)
    _write_out(out, lse, pid, heads, hm, dd, o, ls, H, D, d0 == 0)
