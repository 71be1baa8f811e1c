"""Launchers: map validated operands onto kernel arguments and per-target configs."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from . import configs
from .indexer import FMT_FP8_BYTES, FMT_MXFP4, FMT_TENSOR, logits_kernel, topk_kernel

_TL_DTYPES = {
    torch.bfloat16: tl.bfloat16,
    torch.float16: tl.float16,
    torch.float32: tl.float32,
    torch.float8_e4m3fn: tl.float8e4nv,
    torch.float8_e4m3fnuz: tl.float8e4b8,
}
_NATIVE_FP8 = {"sm90": torch.float8_e4m3fn, "gfx942": torch.float8_e4m3fnuz}


def _kind(x, xs) -> str:
    if xs is None:
        return "tensor"
    return "mxfp4" if x.dtype == torch.uint8 else "fp8"


def _operand(x, xs, kind: str, native_fp8: bool):
    """(data, aux, row strides, aux row strides, last-dim stride, FMT); rows = all dims but the last."""
    r = x.dim() - 1
    if kind == "mxfp4":
        x, xs = x.contiguous(), xs.contiguous()
        return x, xs, x.stride()[:r], xs.stride()[:r], 1, FMT_MXFP4
    aux, aux_strides = (xs, xs.stride()[:r]) if xs is not None else (x, (0,) * r)
    fmt = FMT_TENSOR
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) and not native_fp8:
        x, fmt = x.view(torch.uint8), FMT_FP8_BYTES
    return x, aux, x.stride()[:r], aux_strides, x.stride(-1), fmt


def _plan(q, q_scale, k, k_scale, weights, target: str):
    kq, kk = _kind(q, q_scale), _kind(k, k_scale)
    fp8 = kk == "fp8"
    native = fp8 and q.dtype == k.dtype and _NATIVE_FP8.get(target) == k.dtype
    if native:
        dot = _TL_DTYPES[k.dtype]
    elif kq == "tensor" and kk == "tensor" and q.dtype in (torch.float16, torch.float32):
        dot = _TL_DTYPES[q.dtype]
    else:
        dot = tl.bfloat16
    if target == "interpreter":
        dot = tl.float32  # the interpreter's bf16 tl.dot is wrong (triton 3.7); fp32 of bf16 values is exact
    qd, qx, (sq_t, sq_h), (sqx_t, sqx_h), sq_d, qf = _operand(q, q_scale, kq, native)
    kd, kx, (sk_k,), (skx_k,), sk_d, kf = _operand(k, k_scale, kk, native)
    h = q.shape[1]
    fnuz = fp8 and k.dtype == torch.float8_e4m3fnuz
    args = dict(q=qd, qx=qx, k=kd, kx=kx, w=weights,
                sq_t=sq_t, sq_h=sq_h, sq_d=sq_d, sqx_t=sqx_t, sqx_h=sqx_h,
                sk_k=sk_k, sk_d=sk_d, skx_k=skx_k, sw_t=weights.stride(0), sw_h=weights.stride(1),
                Q_FMT=qf, K_FMT=kf, K_ROW_SCALE=fp8, FNUZ=fnuz, DOT_DTYPE=dot,
                D=q.shape[2] * (2 if kq == "mxfp4" else 1), HP=triton.next_power_of_2(h))
    return args, h


def _launch_opts(cfg: configs.IndexerConfig, target: str) -> dict:
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if target == "gfx942":
        opts.update(cfg.extra)
    return opts


def indexer_logits(q, q_scale, k, k_scale, weights, k_start, k_end) -> torch.Tensor:
    target = configs.target_for(q.device)
    cfg = configs.INDEXER[target]
    args, h = _plan(q, q_scale, k, k_scale, weights, target)
    t, n = q.shape[0], k.shape[0]
    out = torch.empty((t, n), dtype=torch.float32, device=q.device)
    if t == 0 or n == 0:
        return out
    bt = cfg.tokens(args["HP"])
    logits_kernel[(triton.cdiv(t, bt),)](
        k_start=k_start, k_end=k_end, out=out, T=t, K=n, H=h, so_t=out.stride(0),
        BT=bt, BN=cfg.bn, **args, **_launch_opts(cfg, target))
    return out


def indexer_topk(q, q_scale, k, k_scale, weights, k_start, k_end, topk: int):
    target = configs.target_for(q.device)
    cfg = configs.INDEXER[target]
    args, h = _plan(q, q_scale, k, k_scale, weights, target)
    t, n = q.shape[0], k.shape[0]
    out_v = torch.empty((t, topk), dtype=torch.float32, device=q.device)
    out_i = torch.empty((t, topk), dtype=torch.int32, device=q.device)
    if t == 0:
        return out_v, out_i
    bt = cfg.tokens(args["HP"])
    tiles = triton.cdiv(t, bt)
    nprog = configs.num_programs(q.device, cfg, tiles)
    ws = torch.empty((nprog, bt, max(n, 1)), dtype=torch.float32, device=q.device)
    topk_kernel[(nprog,)](
        k_start=k_start, k_end=k_end, ws=ws, out_v=out_v, out_i=out_i, T=t, K=n, H=h,
        BT=bt, BN=cfg.bn, TOPK=topk, TOPK_P2=triton.next_power_of_2(topk), CH=cfg.ch,
        **args, **_launch_opts(cfg, target))
    return out_v, out_i


# --- sparse attention -------------------------------------------------------------------------
from .sparse_attention import LOG2E, combine_kernel, sparse_attention_kernel  # noqa: E402


def sparse_attention_splits(device: torch.device, cfg: configs.SparseAttentionConfig,
                            programs: int, topk: int) -> int:
    """Split-KV factor for a grid of ``programs`` (query, head block) pairs.

    1 once the grid fills a wave of multiprocessors; else the fewest splits minimising
    waves per unit of work, ceil(P*s/SMs)/s, keeping >= 2 tiles of BN slots per split.
    """
    if device.type == "cpu":
        return 1
    idx = device.index if device.index is not None else torch.cuda.current_device()
    sms = configs.multiprocessors(idx)
    if programs >= sms:
        return 1
    best, best_cost = 1, float(triton.cdiv(programs, sms))
    for s in range(2, cfg.max_splits + 1):
        if topk < 2 * s * cfg.bn:
            break
        cost = triton.cdiv(programs * s, sms) / s
        if cost < best_cost - 1e-9:
            best, best_cost = s, cost
    return best


def sparse_attention_heads(cfg: configs.SparseAttentionConfig, h: int) -> int:
    """Heads per program: the config's block, shrunk to H rounded up to a power of two (>= 16)."""
    return min(cfg.bh, max(16, triton.next_power_of_2(h)))


def sparse_attention(q, kv, indices, sink, scale: float, splits: int | None = None):
    """(out [B, M, H, D] q.dtype, lse fp32 [B, M, H]) on validated operands; see the kernel module."""
    target = configs.target_for(q.device)
    cfg = configs.SPARSE_ATTENTION[target]
    b, m, h, d = q.shape
    topk = indices.shape[2]
    out = torch.empty((b, m, h, d), dtype=q.dtype, device=q.device)
    lse = torch.empty((b, m, h), dtype=torch.float32, device=q.device)
    if out.numel() == 0:
        return out, lse.fill_(float("-inf"))
    bh = sparse_attention_heads(cfg, h)
    if target == "interpreter":
        dot = tl.float32  # the interpreter's bf16 tl.dot is wrong (triton 3.7); fp32 of bf16 values is exact
    else:
        dot = _TL_DTYPES[q.dtype]
    grid_qh = (b * m, triton.cdiv(h, bh))
    if splits is None:
        splits = sparse_attention_splits(q.device, cfg, grid_qh[0] * grid_qh[1], topk)
    has_sink = sink is not None
    sink_t = sink.to(torch.float32).contiguous() if has_sink else lse
    ws = (torch.empty((b * m, splits, h, d + 4), dtype=torch.float32, device=q.device)
          if splits > 1 else lse)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    if target == "gfx942":
        opts.update(cfg.extra)
    sparse_attention_kernel[grid_qh + (splits,)](
        q, kv, indices, sink_t, out, lse, ws, m, kv.shape[1], h, topk, scale * LOG2E,
        *q.stride(), *kv.stride(), *indices.stride(), *out.stride()[:3], *lse.stride()[:2],
        HAS_SINK=has_sink, SPLITS=splits, DOT_DTYPE=dot, D=d, BH=bh, BN=cfg.bn, PREFETCH=cfg.prefetch, **opts)
    if splits > 1:
        dc = min(d, 64)
        combine_kernel[grid_qh + (d // dc,)](ws, sink_t, out, lse, m, h, *out.stride()[:3], *lse.stride()[:2],
                                            HAS_SINK=has_sink, SPLITS=splits, D=d, BH=bh, DC=dc, num_warps=4)
    return out, lse
