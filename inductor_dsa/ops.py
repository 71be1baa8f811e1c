"""torch.library ops in namespace ``inductor_dsa``, with fake (meta) implementations.

They are opaque to Inductor, called by name from its generated code (``torch.ops.inductor_dsa.*``).
``triton_op`` would let Inductor see the Triton kernel, but its decomposition cannot run
Triton's CPU interpreter inside torch.compile (see docs/design.md); nothing useful fuses into
a top-k, so opacity costs nothing here. They are registered on a plain ``torch.library.Library``
(``_op``), not as ``torch.library.custom_op``, whose Python autograd and aliasing wrappers cost
more per call (a trivial 9-argument op on the CPU box: ~15 us as a custom_op, ~9 us here; decode
calls are host-bound, see BENCHMARKS.md). The ops are inference-only: backward raises.

Dispatch: CUDA/ROCm tensors run the Triton kernels; CPU tensors run the same kernels
under ``TRITON_INTERPRET=1`` and ``fallback.py`` (plain torch, fp32) otherwise; top-k above
TOPK_FUSED_MAX is the logits kernel then ``fallback.topk_from_logits`` on every device.
"""
from __future__ import annotations

import functools
from typing import Optional

import torch
from torch import Tensor

from . import checks, fallback, formats
from .kernels import configs

from .limits import TOPK_FUSED_MAX  # noqa: E402  (larger top-k: logits kernel, then a device sort)


_LIB = torch.library.Library("inductor_dsa", "DEF")


class _NoBackward(torch.autograd.Function):
    """Runs an op on inputs that require grad; backward raises (the ops are inference-only)."""

    @staticmethod
    def forward(ctx, run, name, *args):
        ctx.name = name
        return run(*args)

    @staticmethod
    def backward(ctx, *grads):
        raise RuntimeError(f"inductor_dsa::{ctx.name} has no backward: the inductor_dsa ops are inference-only")


def _on_input_device(fn):
    """fn run with its first argument's GPU as the current device: Triton launches on the current
    device, which need not be the inputs' (eager calls with tensors on cuda:1)."""
    @functools.wraps(fn)
    def run(*args):
        dev = args[0].device
        if dev.type == "cuda" and dev.index != torch.cuda.current_device():
            with torch.cuda.device(dev):
                return fn(*args)
        return fn(*args)
    return run


def _plain(args) -> bool:
    """A plain eager call: not traced (Dynamo, TorchScript), no dispatch or function mode, no
    functorch transform, every tensor a plain ``Tensor`` that needs no grad. Such a call may run
    an op's kernel function directly: the dispatcher's round trip (Autograd kernel, then
    CompositeExplicitAutograd) measured ~40 us per call on the H200's host, more than a
    batch-1 decode step's GPU work."""
    if (torch.compiler.is_compiling() or torch.jit.is_tracing() or torch._C._len_torch_dispatch_stack()
            or torch._C._is_torch_function_mode_enabled() or torch._C._functorch.peek_interpreter_stack() is not None):
        return False
    grad = torch.is_grad_enabled()
    return not any(isinstance(a, Tensor) and (type(a) is not Tensor or (grad and a.requires_grad)) for a in args)


class _Entry:
    """An op's Python entry point: ``run`` (the kernel function) for a ``_plain`` call, else the
    ``torch.ops`` packet; other attributes are the packet's. (No ``__slots__``: Dynamo guards on
    the instance ``__dict__`` when it traces a call.)"""

    def __init__(self, packet, run):
        self.packet, self.run = packet, run

    def __call__(self, *args):
        return self.run(*args) if _plain(args) else self.packet(*args)

    def __getattr__(self, name):
        return getattr(self.packet, name)


def _op(fn):
    """Define ``inductor_dsa::<fn.__name__>`` with the schema of fn's annotations and fn as its
    kernel on every device (CompositeExplicitAutograd, on the inputs' device); returns its
    ``_Entry`` (``torch.ops.inductor_dsa.<name>`` unless the call is plain).

    Its Autograd kernel redispatches below autograd; with inputs that require grad (and grad
    mode on) the outputs get a backward that raises, eager or compiled, never a silent None."""
    name = fn.__name__
    _LIB.define(name + torch.library.infer_schema(fn, mutates_args=()))
    run = _on_input_device(fn)
    _LIB.impl(name, run, "CompositeExplicitAutograd")
    packet = getattr(torch.ops.inductor_dsa, name)
    op = packet.default

    def autograd(keyset, *args):
        below = keyset & torch._C._after_autograd_keyset
        if torch.is_grad_enabled() and any(isinstance(a, Tensor) and a.requires_grad for a in args):
            return _NoBackward.apply(lambda *a: op.redispatch(below, *a), name, *args)
        return op.redispatch(below, *args)

    _LIB.impl(name, autograd, "Autograd", with_keyset=True)
    return _Entry(packet, run)


def _fake(op):
    """Decorator: the fake (meta) implementation of ``op``, used while tracing."""
    return torch.library.register_fake(op._qualified_op_name)


def _mask(mask, info, device):
    """The mask expanded to [T, K] (a view) and, where value checks run, its values checked."""
    mask = checks.mask(mask, info["T"], info["K"], device)
    if mask is not None and checks.can_read(None, mask):
        checks.mask_values(mask)
    return mask


@_op
def indexer_logits(q: Tensor, q_scale: Optional[Tensor], k: Tensor, k_scale: Optional[Tensor],
                   weights: Tensor, k_start: Tensor, k_end: Tensor, mask: Optional[Tensor] = None) -> Tensor:
    """fp32 [T, K] logits; ``mask`` (broadcastable to [T, K]): bool, True = visible, or an additive bias."""
    mask = _mask(mask, checks.indexer(q, q_scale, k, k_scale, weights), q.device)
    if configs.use_kernels(q.device):
        from .kernels import indexer_launch
        return indexer_launch.indexer_logits(q, q_scale, k, k_scale, weights, k_start, k_end, mask)
    return fallback.indexer_logits(q, q_scale, k, k_scale, weights, k_start, k_end, mask)


@_fake(indexer_logits)
def _(q, q_scale, k, k_scale, weights, k_start, k_end, mask=None):
    return q.new_empty((q.shape[0], k.shape[0]), dtype=torch.float32)


@_op
def indexer_topk(q: Tensor, q_scale: Optional[Tensor], k: Tensor, k_scale: Optional[Tensor],
                 weights: Tensor, k_start: Tensor, k_end: Tensor, topk: int,
                 mask: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    mask = _mask(mask, checks.indexer(q, q_scale, k, k_scale, weights), q.device)
    checks.topk_arg(topk)
    if configs.use_kernels(q.device) and topk <= TOPK_FUSED_MAX:
        from .kernels import indexer_launch
        return indexer_launch.indexer_topk(q, q_scale, k, k_scale, weights, k_start, k_end, topk, mask)
    logits = indexer_logits(q, q_scale, k, k_scale, weights, k_start, k_end, mask)
    return fallback.logits_topk(logits, k_start, k_end, topk, mask)


@_fake(indexer_topk)
def _(q, q_scale, k, k_scale, weights, k_start, k_end, topk, mask=None):
    shape = (q.shape[0], topk)
    return q.new_empty(shape, dtype=torch.float32), q.new_empty(shape, dtype=torch.int32)


@_op
def logits_topk(logits: Tensor, k_start: Tensor, k_end: Tensor, topk: int) -> tuple[Tensor, Tensor]:
    """Top-k of given fp32 logits [T, K] over k_start[t] <= j < k_end[t] (the select of indexer_topk)."""
    checks.logits(logits)
    checks.topk_arg(topk)
    if configs.use_kernels(logits.device) and topk <= TOPK_FUSED_MAX:
        from .kernels import indexer_launch
        return indexer_launch.logits_topk(logits.contiguous(), k_start, k_end, topk)
    return fallback.logits_topk(logits, k_start, k_end, topk)


@_fake(logits_topk)
def _(logits, k_start, k_end, topk):
    shape = (logits.shape[0], topk)
    return logits.new_empty(shape), logits.new_empty(shape, dtype=torch.int32)


@_op
def sparse_attention(q: Tensor, kv: Tensor, indices: Tensor, sink: Optional[Tensor],
                     scale: float) -> tuple[Tensor, Tensor]:
    """(out [B, M, H, D] q.dtype, lse fp32 [B, M, H]); index values outside [-1, N) are treated as -1 here."""
    checks.sparse_attention(q, kv, indices, sink, scale)
    if configs.use_kernels(q.device):
        from .kernels import attention_launch
        return attention_launch.sparse_attention(q, kv, indices, sink, scale)
    return fallback.sparse_attention(q, kv, indices, sink, scale)


@_fake(sparse_attention)
def _(q, kv, indices, sink, scale):
    return torch.empty_like(q, memory_format=torch.contiguous_format), q.new_empty(q.shape[:3], dtype=torch.float32)


# --- paged (decode) indexer ------------------------------------------------------------------

def _paged_len(block_table: Tensor) -> int:
    return block_table.shape[1] * formats.PAGE_ROWS


@_op
def paged_indexer_logits(q: Tensor, q_scale: Optional[Tensor], kv_cache: Tensor, weights: Tensor,
                         block_table: Tensor, context_lens: Tensor, fmt: str, fp8_flavor: str,
                         table: Optional[Tensor] = None) -> Tensor:
    checks.paged(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table)
    if configs.use_kernels(q.device):
        from .kernels import paged_launch
        return paged_launch.paged_logits(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor,
                                         table)
    return fallback.paged_indexer_logits(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor,
                                         table)


@_fake(paged_indexer_logits)
def _(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table=None):
    return q.new_empty((q.shape[0], q.shape[1], _paged_len(block_table)), dtype=torch.float32)


@_op
def paged_indexer_topk(q: Tensor, q_scale: Optional[Tensor], kv_cache: Tensor, weights: Tensor,
                       block_table: Tensor, context_lens: Tensor, topk: int, fmt: str,
                       fp8_flavor: str, table: Optional[Tensor] = None) -> tuple[Tensor, Tensor]:
    checks.paged(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table)
    checks.topk_arg(topk)
    if configs.use_kernels(q.device) and topk <= TOPK_FUSED_MAX:
        from .kernels import paged_launch
        return paged_launch.paged_topk(q, q_scale, kv_cache, weights, block_table, context_lens, topk,
                                       fmt, fp8_flavor, table)
    logits = paged_indexer_logits(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table)
    return fallback.paged_topk(logits, context_lens, topk)


@_fake(paged_indexer_topk)
def _(q, q_scale, kv_cache, weights, block_table, context_lens, topk, fmt, fp8_flavor, table=None):
    shape = (q.shape[0], q.shape[1], topk)
    return q.new_empty(shape, dtype=torch.float32), q.new_empty(shape, dtype=torch.int32)


@_op
def paged_gather(kv_cache: Tensor, block_table: Tensor, context_lens: Tensor, total_rows: int,
                 fmt: str) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    info = checks.paged_cache(kv_cache, block_table, context_lens, fmt, "fn")
    if configs.use_kernels(kv_cache.device):
        from .formats import row_bytes
        from .kernels import paged_launch
        return paged_launch.paged_gather(kv_cache, block_table, context_lens, total_rows,
                                         *row_bytes(fmt, info["D"]))
    return fallback.paged_gather(kv_cache, block_table, context_lens, fmt, info["D"], total_rows)


@_fake(paged_gather)
def _(kv_cache, block_table, context_lens, total_rows, fmt):
    from .formats import row_bytes
    a, s = row_bytes(fmt, checks.paged_cache(kv_cache, block_table, context_lens, fmt, "fn")["D"])
    b = block_table.shape[0]
    return (kv_cache.new_empty((total_rows, a)), kv_cache.new_empty((total_rows, s)),
            context_lens.new_empty((b,)), context_lens.new_empty((b,)))
