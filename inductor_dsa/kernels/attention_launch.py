"""Launcher of the sparse-attention kernels (kernels/sparse_attention.py): split-KV factor, head
blocks, the optional combine pass, AOT variants. Launch decisions read shapes only."""
from __future__ import annotations

import torch
import triton.language as tl

from . import autotune, configs
from .autotune import bucket
from .host import TL_DTYPES, cdiv, next_pow2
from .sparse_attention import LOG2E, combine_kernel, sparse_attention_kernel



def sparse_attention_splits(device: torch.device, cfg: configs.SparseAttentionConfig,
                            programs: int, topk: int) -> int:
    """Split-KV factor for a grid of ``programs`` (query, head block) pairs: the most splits that
    still run in one wave, min(max_splits, SMs // P, topk // (2 bn)) (>= 2 tiles of bn slots per
    split), at least 1. A program is latency-bound, so splits that spill into a second wave lose
    (H200, P=64, top-1152: 1 split 93 us, 2 66, 3 90, 4 83).
    """
    if device.type == "cpu":
        return 1
    idx = device.index if device.index is not None else torch.cuda.current_device()
    sms = configs.multiprocessors(idx)
    return max(1, min(cfg.max_splits, sms // programs, topk // (2 * cfg.bn)))


def sparse_attention_heads(cfg: configs.SparseAttentionConfig, h: int) -> int:
    """Heads per program: the config's block, shrunk to H rounded up to a power of two (>= 16)."""
    return min(cfg.bh, max(16, next_pow2(h)))


def sparse_attention(q, kv, indices, sink, scale: float, splits: int | None = None):
    """(out [B, M, H, D] q.dtype, lse fp32 [B, M, H]) on validated operands; see the kernel module.
    The config: shipped, or tuned per bucket of (B x M, N, topk) (kernels/autotune.py)."""
    target = configs.target_for(q.device)
    cfg = configs.for_target(configs.SPARSE_ATTENTION, target)
    if q.numel() == 0:
        return _sparse_attention(q, kv, indices, sink, scale, splits, cfg, target)
    b, m, h, d = q.shape
    key = (bucket(b * m), bucket(kv.shape[1]), h, d, bucket(indices.shape[2]), str(q.dtype), sink is not None)

    def run(c):
        return _sparse_attention(q, kv, indices, sink, scale, splits, c, target)
    return run(autotune.pick("sparse_attention", target, q.device, cfg, key, run))


def _sparse_attention(q, kv, indices, sink, scale: float, splits: int | None, cfg, target: str):
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
        dot = TL_DTYPES[q.dtype]
    grid_qh = (b * m, cdiv(h, bh))
    if splits is None:
        splits = sparse_attention_splits(q.device, cfg, grid_qh[0] * grid_qh[1], topk)
    has_sink = sink is not None
    sink_t = sink.to(torch.float32).contiguous() if has_sink else lse
    partials = (torch.empty((b * m, splits, h, d + 4), dtype=torch.float32, device=q.device)
                if splits > 1 else lse)
    opts = configs.launch_options(cfg, target)
    sparse_attention_kernel[grid_qh + (splits,)](
        q, kv, indices, sink_t, out, lse, partials, m, kv.shape[1], h, topk, scale * LOG2E,
        *q.stride(), *kv.stride(), *indices.stride(),
        HAS_SINK=has_sink, SPLITS=splits, DOT_DTYPE=dot, D=d, BLOCK_H=bh, BLOCK_N=cfg.bn, GATHER=cfg.gather, **opts)
    if splits > 1:
        dc = min(d, 64)
        combine_kernel[grid_qh + (d // dc,)](partials, sink_t, out, lse, h,
                                            HAS_SINK=has_sink, SPLITS=splits, D=d, BLOCK_H=bh, BLOCK_D=dc,
                                            num_warps=4)
    return out, lse


def sparse_attention_aot_variants(target: str, cfg: configs.SparseAttentionConfig, b=64, m=1, h=64, d=512, n=8320,
                                  topk=1152):
    """AOT variants of the sparse-attention kernels with ``cfg`` for a V4 decode launch (splits 1 and 2)."""
    bh = sparse_attention_heads(cfg, h)
    pointers = dict(q="*bf16", kv="*bf16", indices="*i32", sink="*fp32", out="*bf16", lse="*fp32",
                    partials="*fp32", qk_scale="fp32")
    ints = dict(M=m, N=n, H=h, TOPK=topk, stride_q_b=m * h * d, stride_q_m=h * d, stride_q_h=d, stride_q_d=1,
                stride_kv_b=n * d, stride_kv_n=d, stride_kv_d=1, stride_idx_b=m * topk, stride_idx_m=topk,
                stride_idx_k=1)
    opts = configs.launch_options(cfg, target)
    for splits in (1, 2):
        consts = dict(HAS_SINK=True, SPLITS=splits, DOT_DTYPE=tl.bfloat16, D=d, BLOCK_H=bh, BLOCK_N=cfg.bn,
                      GATHER=cfg.gather)
        sig = {a: ("constexpr" if a in consts else pointers.get(a, "i32")) for a in sparse_attention_kernel.arg_names}
        yield f"sparse_attention[splits={splits}] D={d} H={h}", sparse_attention_kernel, sig, consts, opts, ints
    consts = dict(HAS_SINK=True, SPLITS=2, D=d, BLOCK_H=bh, BLOCK_D=min(d, 64))
    sig = {a: ("constexpr" if a in consts else pointers.get(a, "i32")) for a in combine_kernel.arg_names}
    yield f"sparse_attention_merge[splits=2] D={d} H={h}", combine_kernel, sig, consts, dict(num_warps=4), ints
