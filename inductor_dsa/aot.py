"""Ahead-of-time compile report for every shipped kernel config; no GPU needed.

    python -m inductor_dsa.aot gfx942      # AMD MI300 (CDNA3), wave64
    python -m inductor_dsa.aot sm90        # NVIDIA Hopper

Each variant is specialised as a V4-sized launch would be (integer arguments equal to 1
become constants, multiples of 16 get divisibility hints), so software pipelining and
vector widths match the real kernels. For each variant it prints registers, spills, LDS / shared-memory bytes, whether the
matrix instructions are used (``v_mfma`` on gfx942, ``wgmma`` on sm90) and an occupancy
estimate (waves per SIMD on gfx942, CTAs per SM on sm90). Exit status 1 on any spill
(more than ``--spill-budget`` bytes), LDS/shared overflow, missing matrix instruction, or
compile error. It reports for the installed Triton; CI runs it with the newest and the oldest
supported one (3.6, paired with torch 2.11), whose passes and register allocation differ.
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from .kernels import aot_variants

TARGETS = {"gfx942": GPUTarget("hip", "gfx942", 64), "sm90": GPUTarget("cuda", 90, 32)}
LDS_LIMIT = {"gfx942": 65536, "sm90": 232448}


@dataclass
class Report:
    name: str
    regs: int = 0
    spills: int = 0
    lds: int = 0
    matrix: bool = False
    occupancy: str = ""
    error: str = ""
    needs_matrix: bool = True  # the kernel has a tl.dot (a tt.dot in its TTIR)

    def ok(self, target: str, spill_budget: int = 0) -> bool:
        matrix_ok = self.matrix or not self.needs_matrix
        return not self.error and self.spills <= spill_budget and self.lds <= LDS_LIMIT[target] and matrix_ok


def _field(text: str, key: str) -> int:
    m = re.search(rf"\.{key}:\s+(\d+)", text)
    return int(m.group(1)) if m else 0


def _amd(rep: Report, kernel, num_warps: int) -> None:
    gcn = kernel.asm["amdgcn"]
    rep.regs = _field(gcn, "vgpr_count")  # gfx90a+: unified file, this count includes the AGPRs
    rep.spills = _field(gcn, "vgpr_spill_count") + _field(gcn, "sgpr_spill_count")
    rep.lds = max(_field(gcn, "group_segment_fixed_size"), kernel.metadata.shared)
    rep.matrix = "v_mfma" in gcn
    regs = -(-max(rep.regs, 1) // 8) * 8  # unified VGPR+AGPR file: 512 per lane per SIMD
    by_regs = min(8, 512 // regs)
    by_lds = (65536 // rep.lds) * num_warps / 4 if rep.lds else 8
    rep.occupancy = f"{min(by_regs, by_lds):g} waves/SIMD"


def _ptxas() -> str:
    import triton.backends.nvidia as nv
    return os.path.join(os.path.dirname(nv.__file__), "bin", "ptxas")


def _cuda(rep: Report, kernel, num_warps: int) -> None:
    ptx = kernel.asm["ptx"]
    with tempfile.NamedTemporaryFile("w", suffix=".ptx", delete=False) as f:
        f.write(ptx)
    try:
        res = subprocess.run([_ptxas(), "-v", "--gpu-name=sm_90a", f.name, "-o", os.devnull],
                             capture_output=True, text=True, check=True)
    finally:
        os.unlink(f.name)
    info = res.stderr
    rep.regs = int(re.search(r"Used (\d+) registers", info).group(1))
    rep.spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", info))
    rep.lds = kernel.metadata.shared
    rep.matrix = "wgmma" in ptx
    threads = 32 * num_warps
    by_regs = 65536 // (-(-rep.regs // 8) * 8 * threads)
    by_smem = 232448 // (rep.lds + 1024) if rep.lds else 32
    rep.occupancy = f"{min(by_regs, by_smem, 32)} CTA/SM"


def specialise(fn, signature: dict, constexprs: dict, ints: dict):
    """Specialise like a JIT launch with these integer values: 1 becomes a constant, multiples of
    16 (and every pointer) get ``tt.divisibility=16``, which the software pipeliner needs."""
    sig, consts, attrs = dict(signature), dict(constexprs), {}
    for name, value in ints.items():
        if value == 1 and name in sig:
            sig[name], consts[name] = "constexpr", 1
    for i, name in enumerate(fn.arg_names):
        if sig[name].startswith("*") or (sig[name] == "i32" and ints.get(name, 1) % 16 == 0):
            attrs[(i,)] = [["tt.divisibility", 16]]
    return ASTSource(fn, sig, consts, attrs=attrs)


def compile_variant(target: str, name, fn, signature, constexprs, options, spec=None) -> Report:
    """Compile one variant; a kernel with a ``tl.dot`` must use the matrix unit, others need not.

    ``spec``: either example values of the integer arguments ({name: int}, a representative
    launch to specialise on, see ``specialise``) or ready ASTSource attrs ({(index,): [...]}).
    """
    rep = Report(name)
    try:
        spec = spec or {}
        if all(isinstance(key, str) for key in spec):
            src = specialise(fn, signature, constexprs, spec)
        else:
            src = ASTSource(fn, signature, constexprs, spec)
        kernel = triton.compile(src, target=TARGETS[target], options=options)
        rep.needs_matrix = "tt.dot" in kernel.asm["ttir"]
        (_amd if target == "gfx942" else _cuda)(rep, kernel, options.get("num_warps", 4))
    except Exception as e:  # noqa: BLE001 - reported, and fails the run
        rep.error = f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    return rep


def run(target: str, only: str | None = None, spill_budget: int = 0) -> list[Report]:
    reports = []
    for name, fn, sig, consts, opts, spec in aot_variants(target):
        if only and only not in name:
            continue
        rep = compile_variant(target, name, fn, sig, consts, opts, spec)
        status = "ok" if rep.ok(target, spill_budget) else "FAIL"
        print(f"{status:4} {name:58} regs={rep.regs:<4} spills={rep.spills:<4} lds={rep.lds:<6} "
              f"{'mfma' if target == 'gfx942' else 'wgmma'}={'yes' if rep.matrix else ('NO' if rep.needs_matrix else '-')} "
              f"{rep.occupancy}{'  ' + rep.error if rep.error else ''}", flush=True)
        reports.append(rep)
    return reports


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", choices=sorted(TARGETS))
    ap.add_argument("--only", help="compile only variants whose name contains this")
    ap.add_argument("--spill-budget", type=int, default=0, metavar="BYTES",
                    help="pass variants spilling at most this many bytes (an older Triton's allocation)")
    args = ap.parse_args(argv)
    reports = run(args.target, args.only, args.spill_budget)
    bad = [r.name for r in reports if not r.ok(args.target, args.spill_budget)]
    budget = f", spills <= {args.spill_budget} B" if args.spill_budget else ""
    print(f"{len(reports) - len(bad)}/{len(reports)} {args.target} variants clean "
          f"(triton {triton.__version__}{budget})")
    return 1 if bad or not reports else 0


if __name__ == "__main__":
    sys.exit(main())
