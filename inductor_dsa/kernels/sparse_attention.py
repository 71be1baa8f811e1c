"""Triton kernel for DSA sparse attention over gathered KV rows (one KV head, K = V).

    s_j = scale * q[b, m, h, :] . kv[b, idx[b, m, j], :]       for idx[b, m, j] >= 0
    out[b, m, h, :] = sum_j exp(s_j - mx) kv[b, idx_j, :] / (sum_j exp(s_j - mx) + exp(sink[h] - mx))
    lse[b, m, h] = log sum_j exp(s_j)                           (sink not included)

A program owns one query (b, m) and a block of BH heads (all of them when H <= BH). Its Q
tile [BH, D] stays resident; the query's index list is walked BN slots at a time, and each
gathered KV tile [BN, D] is loaded ONCE and shared by all BH heads, first as K, then as V:

    S [BH, BN] = Q @ KV_tile^T           (fp32 accumulate, log2-domain: scale * log2(e) folded in)
    online softmax: mx' = max(mx, rowmax S), alpha = 2^(mx - mx'), P = 2^(S - mx')
    l = l * alpha + rowsum P;  acc [BH, D] = acc * alpha + P @ KV_tile   (fp32 accumulate)

Empty slots (idx < 0) and, defensively, idx >= N score -inf and load nothing, so the kernel
never reads outside kv. The sink joins at the end: mx_f = max(mx, sink * log2 e), both acc
and l rescaled by 2^(mx - mx_f), l += 2^(sink * log2 e - mx_f). A query with no valid slot
has acc = 0 and l = 0 (no sink) or l > 0 (sink): out is 0 either way, never NaN. NaN inputs
(a NaN score or sink) give NaN out, and a NaN score NaN lse (see ``_finish``).

Gather: ``GATHER`` picks how the loop overlaps the indirect KV load with the MMAs (see
``_attend``). D is not chunked: Q and the KV tile go through shared memory / LDS and the
[BH, D] accumulator is split across warps by the MMA layout (no spills, see configs.py).

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
def _indices(idx, i_off, k0, hi, si_k, BN: tl.constexpr):
    """Index slots k0 .. k0+BN-1 (slots >= hi read as -1)."""
    slot = k0 + tl.arange(0, BN)
    return tl.load(idx + i_off + slot * si_k, mask=slot < hi, other=-1)


@triton.jit
def _gather(kv, j, kv_off, N, skv_n, skv_d, D: tl.constexpr):
    """(KV rows [BN, D], validity [BN]) for indices j; invalid rows (j < 0 or j >= N) are 0, never read."""
    ok = (j >= 0) & (j < N)
    rows = kv + kv_off + tl.where(ok, j, 0).to(tl.int64) * skv_n
    return tl.load(rows[:, None] + tl.arange(0, D)[None, :] * skv_d, mask=ok[:, None], other=0.0), ok


@triton.jit
def _step(q, kt, ok, acc, mx, l, qk_scale, BH: tl.constexpr, BN: tl.constexpr, DOT_DTYPE: tl.constexpr):
    """One online-softmax update with KV tile kt [BN, D] (rows with ok = False score -inf)."""
    s = _mm(q, tl.trans(kt), tl.zeros((BH, BN), tl.float32), DOT_DTYPE) * qk_scale
    s = tl.where(ok[None, :], s, float("-inf"))
    mx_new = tl.maximum(mx, tl.max(s, 1))
    base = tl.where(mx_new == float("-inf"), 0.0, mx_new)  # all-empty so far: keep 2^(.) finite
    alpha = tl.exp2(mx - base)
    p = tl.exp2(s - base[:, None])
    l = l * alpha + tl.sum(p, 1)
    acc = _mm(p, kt, acc * alpha[:, None], DOT_DTYPE)
    return acc, mx_new, l


@triton.jit
def _attend(q, kv, idx, i_off, kv_off, lo, hi, N, qk_scale, skv_n, skv_d, si_k,
            BH: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, DOT_DTYPE: tl.constexpr,
            GATHER: tl.constexpr):
    """Online softmax of Q [BH, D] over index slots lo .. hi-1: (acc [BH, D], row max, row sum), log2 units.

    GATHER picks how the indirect KV load overlaps the MMAs:
    0 the plain loop: with num_stages > 1 Triton's pipeliner loads tile i+1's indices and
    issues its KV copy into shared memory while tile i is multiplied (sm90);
    1 by hand, for num_stages = 1: while tile i is multiplied, the KV rows of tile i+1
    (registers, BN * D / threads of them) and the indices of tile i+2 are in flight.
    """
    mx = tl.full((BH,), float("-inf"), tl.float32)
    l = tl.zeros((BH,), tl.float32)
    acc = tl.zeros((BH, D), tl.float32)
    if GATHER == 1:
        kt_n, ok_n = _gather(kv, _indices(idx, i_off, lo, hi, si_k, BN), kv_off, N, skv_n, skv_d, D)
        j_nn = _indices(idx, i_off, lo + BN, hi, si_k, BN)
        for k0 in range(lo, hi, BN):
            kt, ok = kt_n, ok_n
            kt_n, ok_n = _gather(kv, j_nn, kv_off, N, skv_n, skv_d, D)
            j_nn = _indices(idx, i_off, k0 + 2 * BN, hi, si_k, BN)
            acc, mx, l = _step(q, kt, ok, acc, mx, l, qk_scale, BH, BN, DOT_DTYPE)
    else:
        for k0 in range(lo, hi, BN):
            kt, ok = _gather(kv, _indices(idx, i_off, k0, hi, si_k, BN), kv_off, N, skv_n, skv_d, D)
            acc, mx, l = _step(q, kt, ok, acc, mx, l, qk_scale, BH, BN, DOT_DTYPE)
    return acc, mx, l


@triton.jit
def _inv(l):
    """1 / l, with 0 for l == 0 (no slot, no sink: out = acc * 0 = 0); a NaN l stays NaN."""
    return tl.where(l == 0, 0.0, 1.0 / tl.where(l == 0, 1.0, l))


@triton.jit
def _finish(acc, mx, l, sink, heads, hm, HAS_SINK: tl.constexpr):
    """(out fp32 [BH, D], lse natural-log [BH]) from online-softmax state (sink added here).

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
def sparse_attention_kernel(q, kv, idx, sink, out, lse, ws, M, N, H, TOPK, qk_scale,
                            sq_b, sq_m, sq_h, sq_d, skv_b, skv_n, skv_d, si_b, si_m, si_k,
                            so_b, so_m, so_h, sl_b, sl_m,
                            HAS_SINK: tl.constexpr, SPLITS: tl.constexpr, DOT_DTYPE: tl.constexpr,
                            D: tl.constexpr, BH: tl.constexpr, BN: tl.constexpr, GATHER: tl.constexpr):
    """Grid (B * M, cdiv(H, BH), SPLITS). SPLITS == 1 writes out / lse; else fp32 partials to ws.

    ws layout (SPLITS > 1): [B*M, SPLITS, H, D + 4] fp32: acc / l (D), row max (log2), l, 2 pad (16-byte rows).
    """
    pid = tl.program_id(0)
    hb = tl.program_id(1)
    sp = tl.program_id(2)
    b = (pid // M).to(tl.int64)
    m = (pid % M).to(tl.int64)
    heads = hb * BH + tl.arange(0, BH)
    hm = heads < H
    dd = tl.arange(0, D)
    q_ptr = q + b * sq_b + m * sq_m + heads.to(tl.int64)[:, None] * sq_h + dd[None, :] * sq_d
    qt = tl.load(q_ptr, mask=hm[:, None], other=0.0)
    per = tl.cdiv(tl.cdiv(TOPK, SPLITS), BN) * BN
    lo = sp * per
    hi = tl.minimum(lo + per, TOPK)
    acc, mx, l = _attend(qt, kv, idx, b * si_b + m * si_m, b * skv_b, lo, hi, N, qk_scale,
                         skv_n, skv_d, si_k, BH, BN, D, DOT_DTYPE, GATHER)
    if SPLITS == 1:
        o, ls = _finish(acc, mx, l, sink, heads, hm, HAS_SINK)
        o_ptr = out + b * so_b + m * so_m + heads.to(tl.int64)[:, None] * so_h + dd[None, :]
        tl.store(o_ptr, o.to(out.dtype.element_ty), mask=hm[:, None])
        tl.store(lse + b * sl_b + m * sl_m + heads, ls, mask=hm)
    else:
        row = ((pid.to(tl.int64) * SPLITS + sp) * H + heads) * (D + 4)
        tl.store(ws + row[:, None] + dd[None, :], acc * _inv(l)[:, None], mask=hm[:, None])
        tl.store(ws + row + D, mx, mask=hm)
        tl.store(ws + row + D + 1, l, mask=hm)


@triton.jit
def combine_kernel(ws, sink, out, lse, M, H, so_b, so_m, so_h, sl_b, sl_m,
                   HAS_SINK: tl.constexpr, SPLITS: tl.constexpr, D: tl.constexpr, BH: tl.constexpr,
                   DC: tl.constexpr):
    """Merge SPLITS partials per (query, head): acc = sum_s 2^(mx_s - mx) l_s o_s, l likewise.

    Grid (B * M, cdiv(H, BH), D // DC): a program merges DC output columns of BH heads.
    """
    pid = tl.program_id(0)
    hb = tl.program_id(1)
    d0 = tl.program_id(2) * DC
    b = (pid // M).to(tl.int64)
    m = (pid % M).to(tl.int64)
    heads = hb * BH + tl.arange(0, BH)
    hm = heads < H
    dd = d0 + tl.arange(0, DC)
    mx = tl.full((BH,), float("-inf"), tl.float32)
    for s in tl.static_range(SPLITS):
        row = ((pid.to(tl.int64) * SPLITS + s) * H + heads) * (D + 4)
        mx = tl.maximum(mx, tl.load(ws + row + D, mask=hm, other=float("-inf")))
    base = tl.where(mx == float("-inf"), 0.0, mx)
    l = tl.zeros((BH,), tl.float32)
    acc = tl.zeros((BH, DC), tl.float32)
    for s in tl.static_range(SPLITS):
        row = ((pid.to(tl.int64) * SPLITS + s) * H + heads) * (D + 4)
        w = tl.exp2(tl.load(ws + row + D, mask=hm, other=float("-inf")) - base)
        w = w * tl.load(ws + row + D + 1, mask=hm, other=0.0)
        l += w
        acc += tl.load(ws + row[:, None] + dd[None, :], mask=hm[:, None], other=0.0) * w[:, None]
    o, ls = _finish(acc, base, l, sink, heads, hm, HAS_SINK)
    o_ptr = out + b * so_b + m * so_m + heads.to(tl.int64)[:, None] * so_h + dd[None, :]
    tl.store(o_ptr, o.to(out.dtype.element_ty), mask=hm[:, None])
    if d0 == 0:
        tl.store(lse + b * sl_b + m * sl_m + heads, ls, mask=hm)
