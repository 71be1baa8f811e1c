"""torch.library ops in namespace ``inductor_dsa``, with fake (meta) implementations.

They are ``custom_op``s: opaque to Inductor, called by name from its generated code
(``torch.ops.inductor_dsa.*``). ``triton_op`` would let Inductor see the Triton kernel,
but its decomposition cannot run Triton's CPU interpreter inside torch.compile (see
docs/design.md); nothing useful fuses into a top-k, so opacity costs nothing here.

Dispatch: CUDA/ROCm tensors run the Triton kernels; CPU tensors run the same kernels
under ``TRITON_INTERPRET=1`` and the float64 reference otherwise.
"""
from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from . import checks, reference
from .kernels import configs

TOPK_FUSED_MAX = 2048  # larger top-k: logits kernel, then a device sort


def _use_kernels(device: torch.device) -> bool:
    return device.type != "cpu" or configs.interpreting()


def _pair(x, xs):
    return x if xs is None else (x, xs)


@torch.library.custom_op("inductor_dsa::indexer_logits", mutates_args=())
def indexer_logits(q: Tensor, q_scale: Optional[Tensor], k: Tensor, k_scale: Optional[Tensor],
                   weights: Tensor, k_start: Tensor, k_end: Tensor) -> Tensor:
    checks.indexer(q, q_scale, k, k_scale, weights)
    if _use_kernels(q.device):
        from .kernels import launch
        return launch.indexer_logits(q, q_scale, k, k_scale, weights, k_start, k_end)
    return reference.indexer_logits(_pair(q, q_scale), _pair(k, k_scale), weights, k_start, k_end).float()


@indexer_logits.register_fake
def _(q, q_scale, k, k_scale, weights, k_start, k_end):
    return q.new_empty((q.shape[0], k.shape[0]), dtype=torch.float32)


@torch.library.custom_op("inductor_dsa::indexer_topk", mutates_args=())
def indexer_topk(q: Tensor, q_scale: Optional[Tensor], k: Tensor, k_scale: Optional[Tensor],
                 weights: Tensor, k_start: Tensor, k_end: Tensor, topk: int) -> tuple[Tensor, Tensor]:
    checks.indexer(q, q_scale, k, k_scale, weights)
    checks.topk_arg(topk)
    if _use_kernels(q.device) and topk <= TOPK_FUSED_MAX:
        from .kernels import launch
        return launch.indexer_topk(q, q_scale, k, k_scale, weights, k_start, k_end, topk)
    logits = indexer_logits(q, q_scale, k, k_scale, weights, k_start, k_end)
    return reference.topk_from_logits(logits, topk, reference.visible_mask(k_start, k_end, logits.shape[1]))


@indexer_topk.register_fake
def _(q, q_scale, k, k_scale, weights, k_start, k_end, topk):
    shape = (q.shape[0], topk)
    return q.new_empty(shape, dtype=torch.float32), q.new_empty(shape, dtype=torch.int32)


@torch.library.custom_op("inductor_dsa::sparse_attention", mutates_args=())
def sparse_attention(q: Tensor, kv: Tensor, indices: Tensor, sink: Optional[Tensor],
                     scale: float) -> tuple[Tensor, Tensor]:
    """(out [B, M, H, D] q.dtype, lse fp32 [B, M, H]); index values outside [-1, N) are treated as -1 here."""
    checks.sparse_attention(q, kv, indices, sink, scale)
    if _use_kernels(q.device):
        from .kernels import launch
        return launch.sparse_attention(q, kv, indices, sink, scale)
    ok = (indices >= 0) & (indices < kv.shape[1])
    out, lse = reference.sparse_attention(q, kv, torch.where(ok, indices, -1), sink, scale)
    return out.to(q.dtype), lse.float()


@sparse_attention.register_fake
def _(q, kv, indices, sink, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:3], dtype=torch.float32)
