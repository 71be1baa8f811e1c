"""Input validation shared by the public functions and the op implementations.

Metadata checks (types, dtypes, shapes, sizes, devices) run before any launch and raise
TypeError (wrong kind or dtype) or ValueError (wrong shape, size, device) naming the
argument. They read no tensor data, so they never sync and are valid under tracing and
CUDA-graph capture.

Value checks (``paged_values``, ``index_range``, ``mask_values``) read the data: a reduction, or the counts of
a counting kernel its caller launched, and one device-to-host copy (a sync) per call. They run by default and are skipped

  - while a CUDA graph is being captured, under torch.compile tracing, on fake / meta tensors;
  - with the environment variable ``INDUCTOR_DSA_CHECK_VALUES=0``;
  - inside ``with inductor_dsa.checks.values(False):``.

The kernels never read out of bounds without them (bad values are clamped or masked in-kernel,
see README "What each op promises on bad input").
"""
from __future__ import annotations

import contextlib
import os
from contextvars import ContextVar

import torch
from torch._subclasses.fake_tensor import is_fake

from .formats import FMTS, FP8_DTYPES as FP8_FORMATS, MXFP4_BLOCK, PAGE_ROWS, row_bytes

FLOAT_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
FP8_DTYPES = (torch.float8_e4m3fn, torch.float8_e4m3fnuz)
INT_DTYPES = (torch.int32, torch.int64, torch.int16, torch.int8, torch.uint8)
from .limits import MAX_HEADS  # noqa: E402  (re-exported: checks.MAX_HEADS)
VALUES_ENV = "INDUCTOR_DSA_CHECK_VALUES"
_values_override: ContextVar = ContextVar("inductor_dsa_check_values", default=None)  # per thread / task


@contextlib.contextmanager
def values(enabled: bool):
    """Turn the data value checks on or off inside the block (overrides ``INDUCTOR_DSA_CHECK_VALUES``)."""
    token = _values_override.set(bool(enabled))
    try:
        yield
    finally:
        _values_override.reset(token)


def values_enabled() -> bool:
    """Whether value checks are on: the innermost ``values()`` context, else the environment (default on)."""
    override = _values_override.get()
    if override is not None:
        return override
    return os.environ.get(VALUES_ENV, "1").strip().lower() not in ("0", "false", "off", "no")


def can_read(requested, *tensors) -> bool:
    """Run the value checks of one call? ``requested`` (the op's keyword) None follows
    ``values_enabled()``. Never while tracing, on fake / meta tensors or during CUDA-graph capture."""
    if torch.compiler.is_compiling():
        return False
    if not (values_enabled() if requested is None else requested):
        return False
    for t in tensors:
        # plain tensors first: is_fake costs ~2 us a call, and a plain non-functional tensor is never fake
        if not (type(t) is torch.Tensor and not torch._is_functional_tensor(t)) and is_fake(t):
            return False
        if t.device.type == "meta":
            return False
    return not (any(t.is_cuda for t in tensors) and torch.cuda.is_current_stream_capturing())


def tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    return x


def split_operand(x, name: str):
    """A tensor -> (x, None); a pair (data, scale) -> (data, scale)."""
    if isinstance(x, (tuple, list)):
        if len(x) != 2:
            raise TypeError(f"{name} must be a tensor or a (values, scales) pair, got {len(x)} items")
        return tensor(x[0], f"{name}[0]"), tensor(x[1], f"{name}[1]")
    return tensor(x, name), None


def _dim(x: torch.Tensor, name: str, ndim: int, what: str) -> None:
    if x.dim() != ndim:
        raise ValueError(f"{name} must be {what}, got shape {tuple(x.shape)}")


def operand_dim(x: torch.Tensor, xs, name: str, lead: int) -> tuple[str, int]:
    """Format ('tensor' | 'mxfp4' | 'fp8') and head_dim of an operand with ``lead`` leading dims."""
    shape_txt = "[" + ", ".join(["*"] * lead + ["D"]) + "]"
    if xs is None:
        _dim(x, name, lead + 1, f"a tensor {shape_txt}")
        if x.dtype not in FLOAT_DTYPES + FP8_DTYPES:
            raise TypeError(f"{name} must be bf16/fp16/fp32/fp8, got {x.dtype}")
        return ("fp8" if x.dtype in FP8_DTYPES else "tensor"), x.shape[-1]
    _dim(x, f"{name}[0]", lead + 1, f"{shape_txt}-shaped")
    if x.dtype == torch.uint8:
        if xs.dtype != torch.uint8:
            raise TypeError(f"{name}[1] (MXFP4 E8M0 scales) must be uint8, got {xs.dtype}")
        d = 2 * x.shape[-1]
        if xs.dim() != lead + 1 or xs.shape[:-1] != x.shape[:-1] or xs.shape[-1] * MXFP4_BLOCK != d:
            raise ValueError(
                f"{name}[1] (MXFP4 scales) must have shape {tuple(x.shape[:-1]) + (d // MXFP4_BLOCK,)} "
                f"for codes of shape {tuple(x.shape)} (one scale per {MXFP4_BLOCK} elements), got {tuple(xs.shape)}")
        return "mxfp4", d
    if x.dtype in FP8_DTYPES:
        if xs.dtype != torch.float32:
            raise TypeError(f"{name}[1] (FP8 row scales) must be float32, got {xs.dtype}")
        if xs.shape != x.shape[:-1]:
            raise ValueError(f"{name}[1] (FP8 row scales) must have shape {tuple(x.shape[:-1])}, got {tuple(xs.shape)}")
        return "fp8", x.shape[-1]
    raise TypeError(f"{name}[0] must be uint8 (MXFP4 codes) or float8 (FP8 values), got {x.dtype}")


def head_dim(d: int, name: str) -> None:
    if d < 16 or d > 512 or d & (d - 1):
        raise ValueError(f"{name}: head_dim must be a power of two in [16, 512], got {d}")


def same_device(pairs) -> None:
    """ValueError naming the first tensor not on the most common device (ties: the earlier argument's)."""
    pairs = [(n, t.device) for n, t in pairs if t is not None]
    if all(d == pairs[0][1] for _, d in pairs):  # the common case, without counting
        return
    counts = [sum(1 for _, e in pairs if e == d) for _, d in pairs]
    common = pairs[counts.index(max(counts))][1]
    for n, d in pairs:
        if d != common:
            raise ValueError(f"{n} is on {d} but other inputs are on {common}")


def ranges(k_start, k_end, rows: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """int32 [rows] contiguous (k_start, k_end); both None means the full range (filled by caller).
    Wider integers are saturated to the int32 range first (no wrap-around; the kernels clamp to [0, K])."""
    out = []
    for x, name in ((k_start, "k_start"), (k_end, "k_end")):
        x = tensor(x, name)
        if x.dtype not in INT_DTYPES:
            raise TypeError(f"{name} must be an integer tensor, got {x.dtype}")
        if x.shape != (rows,):
            raise ValueError(f"{name} must have shape ({rows},), got {tuple(x.shape)}")
        if x.device != device:
            raise ValueError(f"{name} is on {x.device} but q is on {device}")
        if x.dtype == torch.int64:
            x = x.clamp(torch.iinfo(torch.int32).min, torch.iinfo(torch.int32).max)
        out.append(x.to(torch.int32).contiguous())
    return out[0], out[1]


MASK_DTYPES = (torch.bool,) + FLOAT_DTYPES


def mask(m, rows: int, cols: int, device):
    """None, or ``m`` expanded (a view, never a copy) to [rows, cols]: a bool (True = visible) or
    fp32/bf16/fp16 additive-bias tensor of a shape that broadcasts to [T, K]."""
    if m is None:
        return None
    m = tensor(m, "mask")
    if m.dtype not in MASK_DTYPES:
        raise TypeError(f"mask must be bool (True = visible) or a bf16/fp16/fp32 additive bias, got {m.dtype}")
    if m.dim() > 2 or any(s not in (1, want) for s, want in zip(m.shape[::-1], (cols, rows))):
        raise ValueError(f"mask must have shape ({rows}, {cols}) = [T, K] or one that broadcasts to it, "
                         f"got {tuple(m.shape)}")
    if m.device != device:
        raise ValueError(f"mask is on {m.device} but q is on {device}")
    return m.expand(rows, cols)


def mask_values(m) -> None:
    """Value check: ValueError if an additive mask holds NaN or +inf (-inf hides; finite values add).
    READS the data (one reduction, one sync)."""
    if m is None or m.dtype == torch.bool or not m.numel():
        return
    nan, pos = torch.stack([m.isnan().any(), m.isposinf().any()]).tolist()
    if nan or pos:
        raise ValueError(f"mask: an additive mask must hold finite values or -inf, found "
                         f"{' and '.join(w for w, bad in (('NaN', nan), ('+inf', pos)) if bad)}")


def topk_arg(topk) -> int:
    if isinstance(topk, bool) or not isinstance(topk, int):
        raise TypeError(f"topk must be an int, got {type(topk).__name__}")
    if topk < 1:
        raise ValueError(f"topk must be >= 1, got {topk}")
    return topk


def logits(x) -> tuple[int, int]:
    """(T, K) of a float32 logits tensor [T, K]."""
    x = tensor(x, "logits")
    _dim(x, "logits", 2, "a tensor [T, K]")
    if x.dtype != torch.float32:
        raise TypeError(f"logits must be float32, got {x.dtype}")
    return x.shape[0], x.shape[1]


def indexer(q, q_scale, k, k_scale, weights) -> dict:
    """Validate indexer operands; returns T, H, D, K and the two formats."""
    q, k, weights = tensor(q, "q"), tensor(k, "k"), tensor(weights, "weights")
    qf, dq = operand_dim(q, q_scale, "q", 2)
    kf, dk = operand_dim(k, k_scale, "k", 1)
    if qf == "mxfp4" and dq < MXFP4_BLOCK:
        raise ValueError(f"q: MXFP4 head_dim must be >= {MXFP4_BLOCK}, got {dq}")
    if dq != dk:
        raise ValueError(f"q head_dim {dq} does not match k head_dim {dk}")
    head_dim(dq, "q")
    t, h = q.shape[0], q.shape[1]
    if h < 1 or h > MAX_HEADS:
        raise ValueError(f"q: number of heads must be in [1, {MAX_HEADS}], got {h}")
    if weights.dim() != 2 or tuple(weights.shape) != (t, h):
        raise ValueError(f"weights must have shape ({t}, {h}) = [T, H] of q, got {tuple(weights.shape)}")
    if weights.dtype not in FLOAT_DTYPES:
        raise TypeError(f"weights must be bf16/fp16/fp32, got {weights.dtype}")
    if qf == "fp8" and not (kf == "fp8" and k.dtype == q.dtype):
        raise TypeError(f"an fp8 q ({q.dtype}) needs k as an FP8 pair of the same dtype")
    if qf == "tensor" and kf == "tensor" and q.dtype != k.dtype:
        raise TypeError(f"q and k must share a dtype, got {q.dtype} and {k.dtype}")
    if kf in ("mxfp4", "fp8") and qf == "tensor" and q.dtype != torch.bfloat16:
        raise TypeError(f"with a quantised k, q must be bf16, an MXFP4 pair or fp8; got {q.dtype}")
    if qf == "mxfp4" and kf == "tensor" and k.dtype != torch.bfloat16:
        raise TypeError(f"with an MXFP4 q, k must be bf16 or quantised; got {k.dtype}")
    same_device([("q", q), ("q scales", q_scale), ("k", k), ("k scales", k_scale), ("weights", weights)])
    return dict(T=t, H=h, D=dq, K=k.shape[0], q_fmt=qf, k_fmt=kf)


def sparse_attention(q, kv, indices, sink, scale) -> dict:
    """Validate sparse-attention operands (shapes, dtypes, devices; no data read); returns B, M, H, D, N, topk, scale.

    q [B, M, H, D] bf16/fp16/fp32, kv [B, N, D] same dtype, indices int32/int64 [B, M, topk],
    sink None or floating [H], scale None (-> D**-0.5) or a finite real number.
    Index VALUES are not checked here (see ``index_range``).
    """
    q, kv, indices = tensor(q, "q"), tensor(kv, "kv"), tensor(indices, "indices")
    _dim(q, "q", 4, "a tensor [B, M, H, D]")
    _dim(kv, "kv", 3, "a tensor [B, N, D]")
    _dim(indices, "indices", 3, "a tensor [B, M, topk]")
    if q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must be bf16/fp16/fp32, got {q.dtype}")
    if kv.dtype != q.dtype:
        raise TypeError(f"kv must have q's dtype {q.dtype}, got {kv.dtype}")
    if indices.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"indices must be int32 or int64, got {indices.dtype}")
    b, m, h, d = q.shape
    head_dim(d, "q")
    if h < 1 or h > MAX_HEADS:
        raise ValueError(f"q: number of heads must be in [1, {MAX_HEADS}], got {h}")
    if kv.shape[0] != b or kv.shape[2] != d:
        raise ValueError(f"kv must have shape [B={b}, N, D={d}] to match q, got {tuple(kv.shape)}")
    if indices.shape[:2] != (b, m) or indices.shape[2] < 1:
        raise ValueError(f"indices must have shape [B={b}, M={m}, topk >= 1], got {tuple(indices.shape)}")
    if sink is not None:
        sink = tensor(sink, "sink")
        if not sink.is_floating_point() or sink.dtype in FP8_DTYPES:
            raise TypeError(f"sink must be a float tensor (fp32 in V4), got {sink.dtype}")
        if tuple(sink.shape) != (h,):
            raise ValueError(f"sink must have shape ({h},) = [H] of q, got {tuple(sink.shape)}")
    if scale is None:
        scale = d ** -0.5
    elif isinstance(scale, bool) or not isinstance(scale, (int, float)):
        raise TypeError(f"scale must be a float or None, got {type(scale).__name__}")
    elif not (abs(scale) < float("inf")):
        raise ValueError(f"scale must be finite, got {scale}")
    same_device([("q", q), ("kv", kv), ("indices", indices), ("sink", sink)])
    return dict(B=b, M=m, H=h, D=d, N=kv.shape[1], topk=indices.shape[2], scale=float(scale))


def index_range(indices: torch.Tensor, n: int) -> None:
    """Value check: ValueError unless every index is in [-1, n). READS the data (one reduction, one sync)."""
    if indices.numel() == 0:
        return
    lo, hi = torch.stack(torch.aminmax(indices)).tolist()
    if lo < -1 or hi >= n:
        raise ValueError(f"indices must lie in [-1, {n}) (N = kv.shape[1]; -1 = empty slot), "
                         f"got values in [{lo}, {hi}]")


FP8_FLAVORS = tuple(FP8_FORMATS)


def fmt_arg(fmt, fp8_flavor) -> None:
    if fmt not in FMTS:
        raise ValueError(f"fmt must be one of {FMTS}, got {fmt!r}")
    if fp8_flavor not in FP8_FLAVORS:
        raise ValueError(f"fp8_flavor must be one of {FP8_FLAVORS}, got {fp8_flavor!r}")


def paged_cache(kv_cache, block_table, context_lens, fmt, fp8_flavor, head_dim_: int | None = None,
                batch: int | None = None) -> dict:
    """Validate a paged key cache and its block table; returns num_pages, max_pages, B, D.

    ``head_dim_`` None derives D from the row size (``paged_gather``)."""
    fmt_arg(fmt, fp8_flavor)
    kv_cache = tensor(kv_cache, "kv_cache")
    block_table = tensor(block_table, "block_table")
    context_lens = tensor(context_lens, "context_lens")
    if kv_cache.dtype != torch.uint8:
        raise TypeError(f"kv_cache must be uint8 pages, got {kv_cache.dtype}")
    if kv_cache.dim() != 2:
        raise ValueError(f"kv_cache must be [num_pages, {PAGE_ROWS} * row_bytes], got shape {tuple(kv_cache.shape)}")
    if head_dim_ is None:
        row = kv_cache.shape[1] // PAGE_ROWS
        head_dim_ = row * 32 // 17 if fmt == "mxfp4" else row - 4
        if head_dim_ < 16 or head_dim_ & (head_dim_ - 1) or (fmt == "mxfp4" and head_dim_ < MXFP4_BLOCK):
            raise ValueError(f"kv_cache: row size {kv_cache.shape[1]} / {PAGE_ROWS} B fits no power-of-two "
                             f"head_dim for fmt={fmt!r}")
    a, s = row_bytes(fmt, head_dim_)
    if kv_cache.shape[1] != PAGE_ROWS * (a + s):
        raise ValueError(f"kv_cache must be [num_pages, {PAGE_ROWS * (a + s)}] for fmt={fmt!r} and head_dim "
                         f"{head_dim_} ({a} + {s} B per row), got shape {tuple(kv_cache.shape)}")
    if kv_cache.shape[1] > 1 and kv_cache.stride(1) != 1:
        raise ValueError(f"kv_cache: each page must be contiguous (stride(1) == 1), got strides {kv_cache.stride()}")
    if block_table.dtype != torch.int32:
        raise TypeError(f"block_table must be int32, got {block_table.dtype}")
    if block_table.dim() != 2:
        raise ValueError(f"block_table must be [B, max_pages], got shape {tuple(block_table.shape)}")
    b = block_table.shape[0]
    if batch is not None and b != batch:
        raise ValueError(f"block_table has {b} rows but q has batch {batch}")
    if context_lens.dtype != torch.int32:
        raise TypeError(f"context_lens must be int32, got {context_lens.dtype}")
    if tuple(context_lens.shape) != (b,):
        raise ValueError(f"context_lens must have shape ({b},) = [B] of block_table, got {tuple(context_lens.shape)}")
    same_device([("kv_cache", kv_cache), ("block_table", block_table), ("context_lens", context_lens)])
    return dict(B=b, max_pages=block_table.shape[1], num_pages=kv_cache.shape[0], D=head_dim_)


_PASSED: dict = {}  # paged(): metadata key -> result of a call that passed
PASSED_MAX = 1024  # keys kept (all dropped when full)


def _meta(t):
    """What the metadata checks read of an optional tensor argument (AttributeError if not one)."""
    return None if t is None else (type(t), t.dtype, t.shape, t.device)


def paged(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table=None) -> dict:
    """Validate the paged indexer operands; returns B, N, H, D, max_pages, num_pages, q_fmt.
    ``table``: None, or (MXFP4 only) 16 bf16/fp16/fp32 values of the codes on the cache's device.
    Memoised per call signature: arguments equal to those of a call that passed in everything
    the checks read (each tensor's type, dtype, shape and device, the cache's strides, fmt,
    fp8_flavor) pass again, a plain decode call's largest host cost after its launches."""
    # No memo while tracing: dynamo would guard on the _PASSED lookup, which this call then changes,
    # so the next call would recompile.
    if torch.compiler.is_compiling():
        return dict(_paged(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table))
    try:
        key = (fmt, fp8_flavor, kv_cache.stride(), _meta(q), _meta(q_scale), _meta(kv_cache), _meta(weights),
               _meta(block_table), _meta(context_lens), _meta(table))
        info = _PASSED.get(key)
    except (AttributeError, TypeError):  # not tensors, or unhashable: the checks below name the problem
        key = info = None
    if info is None:
        info = _paged(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table)
        if key is not None:
            if len(_PASSED) >= PASSED_MAX:
                _PASSED.clear()
            _PASSED[key] = info
    return dict(info)


def _paged(q, q_scale, kv_cache, weights, block_table, context_lens, fmt, fp8_flavor, table) -> dict:
    q, weights = tensor(q, "q"), tensor(weights, "weights")
    if q_scale is None and q.dtype not in FLOAT_DTYPES:
        raise TypeError(f"q must be bf16/fp16/fp32 [B, N, H, D] or an MXFP4 pair, got {q.dtype}")
    qf, d = operand_dim(q, q_scale, "q", 3)
    if qf == "fp8":
        raise TypeError("q must be an MXFP4 pair or bf16/fp16/fp32 [B, N, H, D], got an FP8 pair")
    head_dim(d, "q")
    if fmt == "mxfp4" and d < MXFP4_BLOCK:
        raise ValueError(f"q: head_dim must be >= {MXFP4_BLOCK} for fmt='mxfp4', got {d}")
    b, n, h = q.shape[:3]
    info = paged_cache(kv_cache, block_table, context_lens, fmt, fp8_flavor, d, b)
    if h < 1 or h > MAX_HEADS:
        raise ValueError(f"q: number of heads must be in [1, {MAX_HEADS}], got {h}")
    if weights.dim() != 3 or tuple(weights.shape) != (b, n, h):
        raise ValueError(f"weights must have shape ({b}, {n}, {h}) = [B, N, H] of q, got {tuple(weights.shape)}")
    if weights.dtype not in FLOAT_DTYPES:
        raise TypeError(f"weights must be bf16/fp16/fp32, got {weights.dtype}")
    if table is not None:
        table = tensor(table, "table")
        if fmt != "mxfp4":
            raise ValueError(f"table decodes MXFP4 codes: it needs fmt='mxfp4', got {fmt!r}")
        if table.dtype not in FLOAT_DTYPES or tuple(table.shape) != (16,):
            raise TypeError(f"table must be 16 bf16/fp16/fp32 values [16], got {table.dtype} {tuple(table.shape)}")
    same_device([("q", q), ("q scales", q_scale), ("weights", weights), ("kv_cache", kv_cache), ("table", table)])
    info.update(N=n, H=h, q_fmt=qf)
    return info


def paged_values(kv_cache, block_table, context_lens, counts: tuple[int, int] | None = None) -> None:
    """Value check: ValueError unless 0 <= context_lens[b] <= max_pages * 64 and every block-table
    entry a context uses (p < cdiv(context_lens[b], 64)) lies in [0, num_pages). Entries past the
    context are never read and may hold anything. READS the data (a sync). ``counts``: the
    (bad context_lens, bad pages) that the counting kernel found (``kernels.paged_launch.
    paged_check``, launched by the caller: validation launches nothing); (0, 0) returns at
    once, otherwise torch ops find the details for the message."""
    b, pages = block_table.shape
    if b == 0 or counts == (0, 0):
        return
    max_len, num_pages = pages * PAGE_ROWS, kv_cache.shape[0]
    ctx = context_lens.long()
    used = torch.arange(pages, device=ctx.device) * PAGE_ROWS < ctx.clamp(0, max_len).unsqueeze(1)
    bad = used & ((block_table < 0) | (block_table >= num_pages))
    lo, hi, n_bad = torch.stack([ctx.min(), ctx.max(), bad.sum()]).tolist()
    if lo < 0 or hi > max_len:
        raise ValueError(f"context_lens must lie in [0, {max_len}] (block_table.shape[1] * {PAGE_ROWS}), "
                         f"got values in [{lo}, {hi}]")
    if n_bad:
        r, p = bad.nonzero()[0].tolist()
        raise ValueError(f"block_table[{r}, {p}] = {int(block_table[r, p])} is a page id outside [0, {num_pages}) "
                         f"(kv_cache.shape[0]) used by context_lens[{r}] = {int(ctx[r])} ({n_bad} such entries)")
    if counts is not None:
        raise AssertionError(f"inductor_dsa bug: paged_check counted {counts[0]} bad context_lens / {counts[1]} "
                             "bad pages that the recount does not find")
