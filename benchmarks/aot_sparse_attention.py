"""Ahead-of-time compile of the sparse-attention kernel for gfx942 and sm90 (no GPU needed).

    python benchmarks/aot_sparse_attention.py [--target gfx942|sm90|both] [--bh 64 --bn 32 ...]

Prints, per config: registers, spills, shared memory / LDS, and the MMA instructions found
(gfx942: ``v_mfma``; sm90: ``wgmma`` in the PTX, spills from ``ptxas -v``). Argument types
mimic a real launch: bf16 tensors, int32 indices, unit last-dim strides, 16-divisible pointers.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile

import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget

from inductor_dsa.kernels import configs
from inductor_dsa.kernels.sparse_attention import combine_kernel, sparse_attention_kernel

POINTERS = {"q": "*bf16", "kv": "*bf16", "idx": "*i32", "sink": "*fp32", "out": "*bf16",
            "lse": "*fp32", "ws": "*fp32"}
UNIT = ("sq_d", "skv_d", "si_k")  # last-dim strides, specialised to 1 at launch
# other strides are multiples of 16 for V4 shapes (D = 512, H = 64/128, topk = 640/1152): a launch
# specialises such ints with tt.divisibility = 16, which is what lets the gathers vectorise
STRIDES = ("sq_b", "sq_m", "sq_h", "skv_b", "skv_n", "si_b", "si_m", "so_b", "so_m", "so_h", "sl_b", "sl_m")


def _source(fn, const: dict):
    """ASTSource with launch-like specialisation: typed pointers, unit / 16-divisible strides."""
    sig, const = {}, dict(const)
    for i, name in enumerate(fn.arg_names):
        if name in POINTERS:
            sig[name] = POINTERS[name]
        elif name == "qk_scale":
            sig[name] = "fp32"
        elif name in UNIT:
            sig[name], const[name] = "constexpr", 1
        elif fn.params[i].is_constexpr:
            sig[name] = "constexpr"
        else:
            sig[name] = "i32"
    attrs = {(fn.arg_names.index(n),): [["tt.divisibility", 16]]
             for n in (*POINTERS, *STRIDES) if n in fn.arg_names}
    return triton.compiler.ASTSource(fn, sig, const, attrs)


def _sources(cfg, d: int, splits: int):
    """(name, source, num_warps): the attention kernel and, with splits > 1, the combine kernel."""
    const = dict(HAS_SINK=True, SPLITS=splits, D=d, BH=cfg.bh)
    out = [("attention", _source(sparse_attention_kernel, dict(
        const, DOT_DTYPE=tl.bfloat16, BN=cfg.bn, PREFETCH=cfg.prefetch)), cfg.num_warps)]
    if splits > 1:
        out.append(("combine", _source(combine_kernel, dict(const, DC=min(d, 64))), 4))
    return out


def gfx942(cfg, d: int = 512, splits: int = 1) -> list[dict]:
    rows = []
    for name, src, warps in _sources(cfg, d, splits):
        opts = dict(num_warps=warps, num_stages=cfg.num_stages, **cfg.extra)
        k = triton.compile(src, target=GPUTarget("hip", "gfx942", 64), options=opts)
        asm = k.asm["amdgcn"]
        get = lambda key: int(re.search(rf"\.{key}:\s+(\d+)", asm).group(1))
        rows.append(dict(kernel=name, target="gfx942", vgpr=get("vgpr_count"), agpr=get("agpr_count"),
                         sgpr=get("sgpr_count"), vgpr_spill=get("vgpr_spill_count"),
                         sgpr_spill=get("sgpr_spill_count"), lds=k.metadata.shared,
                         mfma=sorted(set(re.findall(r"\b(v_mfma_\w+)", asm))),
                         n_mfma=len(re.findall(r"\bv_mfma_", asm))))
    return rows


def sm90(cfg, d: int = 512, splits: int = 1) -> list[dict]:
    rows = []
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    for name, src, warps in _sources(cfg, d, splits):
        k = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                           options=dict(num_warps=warps, num_stages=cfg.num_stages))
        ptx = k.asm["ptx"]
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "k.ptx")
            with open(path, "w") as f:
                f.write(ptx)
            log = subprocess.run([ptxas, "-v", "--gpu-name=sm_90a", path, "-o", os.path.join(tmp, "k.cubin")],
                                 capture_output=True, text=True).stderr
        regs = re.search(r"Used (\d+) registers", log)
        spill = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
        rows.append(dict(kernel=name, target="sm90", regs=int(regs.group(1)) if regs else None,
                         spill_stores=int(spill.group(1)) if spill else None,
                         spill_loads=int(spill.group(2)) if spill else None, smem=k.metadata.shared,
                         wgmma=len(re.findall(r"wgmma\.mma_async", ptx)),
                         mma_sync=len(re.findall(r"\bmma\.sync", ptx))))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", choices=("gfx942", "sm90", "both"), default="both")
    ap.add_argument("--d", type=int, default=512)
    ap.add_argument("--splits", type=int, default=1)
    for k in ("bh", "bn", "num_warps", "num_stages", "prefetch"):
        ap.add_argument(f"--{k}", type=int)
    a = ap.parse_args()
    for tgt, fn in (("gfx942", gfx942), ("sm90", sm90)):
        if a.target not in (tgt, "both"):
            continue
        cfg = configs.SPARSE_ATTENTION[tgt]
        over = {k: getattr(a, k) for k in ("bh", "bn", "num_warps", "num_stages", "prefetch")
                if getattr(a, k) is not None}
        if "prefetch" in over:
            over["prefetch"] = bool(over["prefetch"])
        if over:
            cfg = configs.SparseAttentionConfig(**{**cfg.__dict__, **over})
        print(tgt, cfg, flush=True)
        for row in fn(cfg, a.d, a.splits):
            print("   ", row, flush=True)


if __name__ == "__main__":
    main()
