"""Launchers of the prefill indexer (logits, fused top-k) and the select alone: validated operands
onto kernel arguments and per-target configs. A mask first has its rows' visible hulls computed
(``mask_hull_kernel``), which replace k_start / k_end for the logits kernel and the select
(kernels/indexer.py explains the design)."""
from __future__ import annotations

import torch
import triton.language as tl

from . import autotune, configs, decode, select_launch
from .autotune import bucket
from .host import TL_DTYPES, cdiv, next_pow2
from .indexer import MASK_BIAS, MASK_BOOL, MASK_NONE, hide_kernel, logits_kernel, mask_hull_kernel
from .select import select_kernel

FMT_TENSOR, FMT_MXFP4, FMT_FP8_BYTES = decode.FMT_TENSOR.value, decode.FMT_MXFP4.value, decode.FMT_FP8_BYTES.value

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
    fmt = FMT_TENSOR
    if x.dtype in (torch.float8_e4m3fn, torch.float8_e4m3fnuz) and not native_fp8:
        x, fmt = x.view(torch.uint8), FMT_FP8_BYTES
    aux, aux_strides = (xs, xs.stride()[:r]) if xs is not None else (x, (0,) * r)
    return x, aux, x.stride()[:r], aux_strides, x.stride(-1), fmt


def _plan(q, q_scale, k, k_scale, weights, target: str):
    kq, kk = _kind(q, q_scale), _kind(k, k_scale)
    fp8 = kk == "fp8"
    native = fp8 and q.dtype == k.dtype and _NATIVE_FP8.get(target) == k.dtype
    if native:
        dot = TL_DTYPES[k.dtype]
    elif kq == "tensor" and kk == "tensor" and q.dtype in (torch.float16, torch.float32):
        dot = TL_DTYPES[q.dtype]
    else:
        dot = tl.bfloat16
    if target == "interpreter":
        dot = tl.float32  # the interpreter's bf16 tl.dot is wrong (triton 3.7); fp32 of bf16 values is exact
    qd, qx, (sq_t, sq_h), (sqx_t, sqx_h), sq_d, qf = _operand(q, q_scale, kq, native)
    kd, kx, (sk_k,), (skx_k,), sk_d, kf = _operand(k, k_scale, kk, native)
    h = q.shape[1]
    fnuz = fp8 and k.dtype == torch.float8_e4m3fnuz
    args = dict(q=qd, q_scale=qx, k=kd, k_scale=kx, weights=weights,
                stride_q_t=sq_t, stride_q_h=sq_h, stride_q_d=sq_d, stride_q_scale_t=sqx_t, stride_q_scale_h=sqx_h,
                stride_k_n=sk_k, stride_k_d=sk_d, stride_k_scale_n=skx_k,
                stride_weights_t=weights.stride(0), stride_weights_h=weights.stride(1),
                Q_FMT=qf, K_FMT=kf, K_ROW_SCALE=fp8, FNUZ=fnuz, DOT_DTYPE=dot, DEC_DTYPE=configs.decode_dtype(target),
                ALIGNED=kf != FMT_MXFP4 or kd.data_ptr() % 4 == 0,  # MXFP4 codes: 32-bit word loads
                D=q.shape[2] * (2 if kq == "mxfp4" else 1), BLOCK_H=next_pow2(h))
    return args, h


_HULL_T, _HULL_N, _HULL_WARPS = 16, 256, 8  # mask_hull_kernel tile: rows x columns per step, warps


def mask_kind(mask) -> int:
    if mask is None:
        return MASK_NONE.value
    return MASK_BOOL.value if mask.dtype == torch.bool else MASK_BIAS.value


def _mask_args(mask, k_start) -> dict:
    """The logits kernel's mask arguments: none (any pointer, unused), a bool mask's bytes, or the bias."""
    if mask is None:
        return dict(mask=k_start, row_mask=k_start, stride_mask_t=0, stride_mask_k=0, MASK_KIND=MASK_NONE.value)
    data = mask.view(torch.uint8) if mask.dtype == torch.bool else mask
    return dict(mask=data, row_mask=data, stride_mask_t=mask.stride(0), stride_mask_k=mask.stride(1),
                MASK_KIND=mask_kind(mask))


def _hull(k_start, k_end, margs, t: int, n: int):
    """Each row's [first, last + 1) of the columns inside [k_start, k_end) that the mask shows ([0, 0): none),
    and into ``margs["row_mask"]`` per row True / 0 where the mask shows its hull whole with no nonzero
    bias (the value a tile of such rows reads instead of the mask), else False / NaN."""
    if margs["MASK_KIND"] == MASK_NONE.value or not (t and n):
        return k_start, k_end
    hs, he = torch.empty((2, t), dtype=torch.int32, device=k_start.device)
    margs["row_mask"] = torch.empty(t, dtype=margs["mask"].dtype, device=k_start.device)
    mask_hull_kernel[(cdiv(t, _HULL_T),)](k_start, k_end, margs["mask"], hs, he, margs["row_mask"], t, n,
                                          margs["stride_mask_t"], margs["stride_mask_k"], MASK_KIND=margs["MASK_KIND"],
                                          BLOCK_T=_HULL_T, BLOCK_N=_HULL_N, num_warps=_HULL_WARPS)
    return hs, he


_HIDE_BLOCK = 1024  # hide_kernel: slots per program (num_warps 4)


def _hide(out_v, out_i, margs) -> None:
    """Slots of ``out_i`` holding a column the mask hides become -1 (``hide_kernel``, one pass)."""
    if margs["MASK_KIND"] == MASK_NONE.value or not out_i.numel():
        return
    n = out_i.numel()
    hide_kernel[(cdiv(n, _HIDE_BLOCK),)](out_v, out_i, margs["mask"], n, out_i.shape[1], margs["stride_mask_t"],
                                         margs["stride_mask_k"], MASK_KIND=margs["MASK_KIND"], BLOCK=_HIDE_BLOCK,
                                         num_warps=4)


def _logits_into(out, row0, rows, t, n, h, plan, k_start, k_end, target, fill, cfg):
    """Launch logits_kernel for tokens row0 .. min(t, row0 + rows) - 1 into out[t - row0]."""
    bt = cfg.tokens(plan["BLOCK_H"])
    logits_kernel[(cdiv(rows, bt),)](
        k_start=k_start, k_end=k_end, out=out, T=min(t, row0 + rows), K=n, H=h, row0=row0,
        stride_out_t=out.stride(0), BLOCK_T=bt, BLOCK_N=cfg.bn, FILL=fill, **plan,
        **configs.launch_options(cfg, target))


def _dense(k_start, k_end):
    """The row ranges as the kernels index them: dense [T] (a strided view would be misread)."""
    return k_start.contiguous(), k_end.contiguous()


def _logits_cfg(op: str, q, k, plan, target: str, run, *extra):
    """The logits config for this launch: shipped, or tuned per bucket of (T, K) (kernels/autotune.py)."""
    key = (op, bucket(q.shape[0]), bucket(k.shape[0]), q.shape[1], plan["D"], str(q.dtype), plan["Q_FMT"],
           plan["K_FMT"], plan["MASK_KIND"], *extra)
    default = configs.logits_config(target, bool(plan["K_FMT"] == FMT_MXFP4))
    return autotune.pick("indexer_logits", target, q.device, default, key, run)


def indexer_logits(q, q_scale, k, k_scale, weights, k_start, k_end, mask=None) -> torch.Tensor:
    k_start, k_end = _dense(k_start, k_end)
    t, n = q.shape[0], k.shape[0]
    if not (t and n):
        return torch.empty((t, n), dtype=torch.float32, device=q.device)
    target = configs.target_for(q.device)
    plan, h = _plan(q, q_scale, k, k_scale, weights, target)
    plan.update(_mask_args(mask, k_start))
    k_start, k_end = _hull(k_start, k_end, plan, t, n)

    def run(cfg):
        out = torch.empty((t, n), dtype=torch.float32, device=q.device)
        _logits_into(out, 0, t, t, n, h, plan, k_start, k_end, target, True, cfg)
        return (out,)
    return run(_logits_cfg("logits", q, k, plan, target, run))[0]


def indexer_topk(q, q_scale, k, k_scale, weights, k_start, k_end, topk: int, mask=None):
    """Chunks of C rows: logits into a workspace of at most max(outputs, min_rows x K) fp32, then select
    (over the mask's hulls, then the slots of hidden columns -1)."""
    k_start, k_end = _dense(k_start, k_end)
    target = configs.target_for(q.device)
    plan, h = _plan(q, q_scale, k, k_scale, weights, target)
    plan.update(_mask_args(mask, k_start))
    k_start, k_end = _hull(k_start, k_end, plan, q.shape[0], k.shape[0])

    def run(cfg):
        out_v, out_i = _indexer_topk(plan, h, q, k, k_start, k_end, topk, target, cfg)
        _hide(out_v, out_i, plan)
        return out_v, out_i
    if q.shape[0] == 0 or k.shape[0] == 0:
        return run(None)
    return run(_logits_cfg("topk", q, k, plan, target, run, topk))


def _indexer_topk(plan, h, q, k, k_start, k_end, topk: int, target: str, cfg):
    sel = configs.for_target(configs.SELECT, target)
    t, n = q.shape[0], k.shape[0]
    out_v = torch.empty((t, topk), dtype=torch.float32, device=q.device)
    out_i = torch.empty((t, topk), dtype=torch.int32, device=q.device)
    if t == 0:
        return out_v, out_i
    rows = min(t, max(sel.min_rows, (t * topk * 8) // (4 * max(n, 1))))
    extra = select_launch.scratch_bytes(rows, n, topk, sel) // rows
    if extra:  # the sampled filter's (or, for a few rows, the ranked path's) candidates come out of the same budget
        rows = max(sel.filter_rows, rows * 4 * n // (4 * n + extra))
    rows = cdiv(t, cdiv(t, rows))  # equal chunks
    ws = torch.empty((rows, max(n, 1)), dtype=torch.float32, device=q.device)
    for row0 in range(0, t, rows):
        if n:
            _logits_into(ws, row0, rows, t, n, h, plan, k_start, k_end, target, False, cfg)
        _select(ws, row0, min(rows, t - row0), t, n, k_start, k_end, out_v, out_i, topk, sel, target)
    return out_v, out_i


def _select(ws, row0, rows, t, n, k_start, k_end, out_v, out_i, topk, sel, target):
    """Top-k of rows row0 .. row0 + rows - 1, whose scores are ws[t - row0, :n] (the selection engine),
    with the shipped config ``sel`` or, when tuning, this bucket's winner (scratch outputs while timing)."""
    def run(cfg):
        v, i = torch.empty_like(out_v), torch.empty_like(out_i)
        select_launch.select(ws, row0, rows, t, n, k_start, k_end, v, i, topk, cfg)
        return v[row0:row0 + rows], i[row0:row0 + rows]
    sel = autotune.pick("select", target, ws.device, sel, (bucket(rows), bucket(n), topk), run)
    select_launch.select(ws, row0, rows, t, n, k_start, k_end, out_v, out_i, topk, sel)


def logits_topk(logits, k_start, k_end, topk: int):
    """Top-k of given fp32 logits [T, K] (last dim contiguous) over per-row ranges: the select alone."""
    k_start, k_end = _dense(k_start, k_end)
    t, n = logits.shape
    out_v = torch.empty((t, topk), dtype=torch.float32, device=logits.device)
    out_i = torch.empty((t, topk), dtype=torch.int32, device=logits.device)
    if t and n:
        target = configs.target_for(logits.device)
        _select(logits, 0, t, t, n, k_start, k_end, out_v, out_i, topk, configs.for_target(configs.SELECT, target),
                target)
    else:
        out_v.fill_(float("-inf"))
        out_i.fill_(-1)
    return out_v, out_i


_AOT_FORMATS = {  # name: (q pointer, q aux, k pointer, k aux, Q_FMT, K_FMT, K_ROW_SCALE, fp8)
    "bf16": ("*bf16", "*bf16", "*bf16", "*bf16", FMT_TENSOR, FMT_TENSOR, False, False),
    "bf16q-mxfp4k": ("*bf16", "*bf16", "*u8", "*u8", FMT_TENSOR, FMT_MXFP4, False, False),
    "mxfp4": ("*u8", "*u8", "*u8", "*u8", FMT_MXFP4, FMT_MXFP4, False, False),
    "fp8": (None, None, None, "*fp32", FMT_TENSOR, FMT_TENSOR, True, True),
}
_FP8_PTR = {"gfx942": "*fp8e4b8", "sm90": "*fp8e4nv"}
_FP8_TL = {"gfx942": tl.float8e4b8, "sm90": tl.float8e4nv}


def _v4_strides(fmt: str, t: int, n: int, h: int, d: int) -> dict:
    """Integer arguments of a contiguous V4 launch (T=t, K=n, H=h, D=d) for AOT specialisation."""
    qmx, kmx = fmt == "mxfp4", fmt in ("mxfp4", "bf16q-mxfp4k")
    return dict(T=t, K=n, H=h, row0=0, stride_q_t=h * d // (2 if qmx else 1), stride_q_h=d // (2 if qmx else 1),
                stride_q_d=1, stride_q_scale_t=h * d // 32 if qmx else 0, stride_q_scale_h=d // 32 if qmx else 0,
                stride_k_n=d // (2 if kmx else 1), stride_k_d=1,
                stride_k_scale_n=d // 32 if kmx else (1 if fmt == "fp8" else 0),
                stride_weights_t=h, stride_weights_h=1, stride_mask_t=0, stride_mask_k=0, stride_out_t=n)


_AOT_MASKS = {  # name: (pointer, MASK_KIND, FILL); the bf16 format, dense [T, K] masks
    "bool": ("*u8", MASK_BOOL.value, False),       # the fused top-k's workspace
    "bias bf16": ("*bf16", MASK_BIAS.value, True),   # indexer_logits
    "bias fp32": ("*fp32", MASK_BIAS.value, False),
}


def logits_aot_variants(target: str, cfg: configs.IndexerConfig | None = None, head_dim: int = 128,
                        heads: int = 64, tokens: int = 4096):
    """(name, kernel, signature, constexprs, options, example ints) of the logits kernel in every
    operand format and, bf16, every mask kind, with ``cfg`` (an autotuning candidate) or else each
    format's shipped config; then the mask hull kernel of every mask dtype."""
    hp = next_pow2(heads)
    variants = [(fmt, spec, None) for fmt, spec in _AOT_FORMATS.items()]
    variants += [("bf16", _AOT_FORMATS["bf16"], m) for m in _AOT_MASKS]
    for fmt, (qp, qxp, kp, kxp, qf, kf, scaled, fp8), mname in variants:
        c = cfg or configs.logits_config(target, bool(kf == FMT_MXFP4))
        if fp8:
            qp = qxp = kp = _FP8_PTR[target]
        mp, kind, fill = _AOT_MASKS[mname] if mname else ("*i32", MASK_NONE.value, True)
        pointers = dict(q=qp, q_scale=qxp, k=kp, k_scale=kxp, weights="*bf16", k_start="*i32", k_end="*i32",
                        mask=mp, row_mask=mp, out="*fp32")
        consts = dict(Q_FMT=qf, K_FMT=kf, K_ROW_SCALE=scaled, FNUZ=target == "gfx942" and scaled,
                      DOT_DTYPE=_FP8_TL[target] if fp8 else tl.bfloat16, DEC_DTYPE=configs.decode_dtype(target),
                      ALIGNED=True, D=head_dim, BLOCK_H=hp,
                      BLOCK_T=c.tokens(hp), BLOCK_N=c.bn, MASK_KIND=kind, FILL=fill)
        sig = {a: ("constexpr" if a in consts else pointers.get(a, "i32")) for a in logits_kernel.arg_names}
        ints = _v4_strides(fmt, tokens, tokens, heads, head_dim)
        if mname:
            ints.update(stride_mask_t=tokens, stride_mask_k=1)
        yield (f"indexer_logits[{fmt}{', mask ' + mname if mname else ''}] D={head_dim} H={heads}", logits_kernel,
               sig, consts, configs.launch_options(c, target), ints)
    for mname, mp in (("bool", "*u8"), ("bias bf16", "*bf16"), ("bias fp32", "*fp32")):
        consts = dict(MASK_KIND=_AOT_MASKS[mname][1], BLOCK_T=_HULL_T, BLOCK_N=_HULL_N)
        pointers = dict(k_start="*i32", k_end="*i32", mask=mp, hull_start="*i32", hull_end="*i32", row_mask=mp)
        sig = {a: ("constexpr" if a in consts else pointers.get(a, "i32")) for a in mask_hull_kernel.arg_names}
        yield (f"indexer_mask_hull[{mname}]", mask_hull_kernel, sig, consts, dict(num_warps=_HULL_WARPS),
               dict(T=tokens, K=tokens, stride_mask_t=tokens, stride_mask_k=1))
        consts = dict(MASK_KIND=_AOT_MASKS[mname][1], BLOCK=_HIDE_BLOCK)
        pointers = dict(out_values="*fp32", out_indices="*i32", mask=mp)
        sig = {a: ("constexpr" if a in consts else pointers.get(a, "i32")) for a in hide_kernel.arg_names}
        yield (f"indexer_mask_hide[{mname}]", hide_kernel, sig, consts, dict(num_warps=4),
               dict(n=tokens * 512, TOPK=512, stride_mask_t=tokens, stride_mask_k=1))


def select_aot_variants(target: str, sel: configs.SelectConfig, tokens: int = 4096):
    """The selection engine's kernels with config ``sel``: one program per row, and the chunked passes."""
    for n in (512, 1024, 2048):
        consts = dict(TOPK=n, TOPK_P2=next_pow2(n), BLOCK_SELECT=sel.ch, BITS=sel.bits, PACKED=sel.packed,
                      SORT_HERE=n < sel.sort_apart, PREFETCH=sel.prefetch)
        pointers = dict(scores="*fp32", k_start="*i32", k_end="*i32", out_values="*fp32", out_indices="*i32")
        sig = {a: ("constexpr" if a in consts else pointers.get(a, "i32")) for a in select_kernel.arg_names}
        yield (f"indexer_select[topk={n}]", select_kernel, sig, consts, dict(num_warps=sel.num_warps),
               dict(row0=0, T=tokens, K=tokens, stride_scores_r=tokens))
    yield from select_launch.aot_variants(sel, tokens=tokens)
