"""Shared benchmark helpers: timing, peak memory, environment line, table and JSON output.

Floors use CEILINGS, measured on one H200 by ``measure_ceilings`` (see BENCHMARKS.md): bf16 dense
749 TFLOP/s, device copy 4.24 TB/s. No fp8 ceiling is recorded (none was ever measured and no
floor uses one); ``python benchmarks/common.py`` re-measures all three on this GPU.

Without a GPU the benchmarks run on the CPU (``--smoke``: tiny sizes, Triton's interpreter), so
that CI executes them; CPU times are wall-clock medians and mean nothing for the kernels.
Import this module before ``inductor_dsa``: it sets TRITON_INTERPRET=1 when there is no GPU.
"""
from __future__ import annotations

import json
import os
import platform
import time

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")  # before any @triton.jit is defined

import triton  # noqa: E402

# Time the ops' fast path: the data value checks (a device sync per call) are off unless asked for.
os.environ.setdefault("INDUCTOR_DSA_CHECK_VALUES", "0")

CEILINGS = {"bf16_tflops": 749.0, "copy_tbps": 4.24}  # measured (measure_ceilings), H200


def env_line() -> str:
    dev = torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor() or "cpu"
    return f"{dev}, torch {torch.__version__}, triton {triton.__version__}"


def time_ms(fn, warmup=25, rep=100) -> float:
    """Median milliseconds of fn() on the GPU (CUDA events, L2 flushed between calls, via
    triton.testing.do_bench); on the CPU the wall time of one call (smoke runs: not a measurement)."""
    if DEVICE == "cpu":
        t0 = time.perf_counter()
        fn()
        return (time.perf_counter() - t0) * 1e3
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def graphed(fn):
    """fn captured in a CUDA graph; returns its replay (GPU time without Python launch overhead)."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    def replay(keep=(graph, out)):  # the default argument keeps the graph and its outputs alive
        graph.replay()
    return replay


def peak_extra_bytes(fn) -> float:
    """Peak device bytes allocated by one call of fn beyond what was allocated before it (NaN on CPU)."""
    if DEVICE == "cpu":
        return float("nan")
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    del out
    return peak


def measure_ceilings() -> dict:
    """Measure dense bf16 GEMM TFLOP/s, copy TB/s and, where ``torch._scaled_mm`` runs (sm89+,
    gfx942), dense fp8 e4m3 GEMM TFLOP/s on this GPU. Only measured numbers are returned."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    out = {"bf16_tflops": 2 * n**3 / time_ms(lambda: a @ b) / 1e9}
    x = torch.empty(2 * 1024**3 // 4, device="cuda")
    y = torch.empty_like(x)
    out["copy_tbps"] = 2 * x.numel() * 4 / time_ms(lambda: y.copy_(x)) / 1e9
    fp8 = torch.float8_e4m3fnuz if torch.version.hip else torch.float8_e4m3fn
    a8, b8 = a.to(fp8), b.to(fp8).t()  # _scaled_mm wants b column-major
    one = torch.ones((), device="cuda")
    try:
        t8 = time_ms(lambda: torch._scaled_mm(a8, b8, one, one, out_dtype=torch.bfloat16))
    except RuntimeError as e:  # no fp8 GEMM on this GPU / build: nothing measured
        print(f"fp8 ceiling not measured: {e}")
    else:
        out["fp8_tflops"] = 2 * n**3 / t8 / 1e9
    return out


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if v is None or (isinstance(v, float) and v != v):
            return "-"
        return f"{v:.4g}" if isinstance(v, float) else str(v)
    cells = [[fmt(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(c), *(len(x[i]) for x in cells)) for i, c in enumerate(cols)]
    line = lambda xs: "| " + " | ".join(x.ljust(w) for x, w in zip(xs, widths)) + " |"
    sep = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(cols), sep] + [line(x) for x in cells])


def write_json(path: str | None, payload: dict) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(payload, f, indent=1)


if __name__ == "__main__":
    print(json.dumps(measure_ceilings() if DEVICE == "cuda" else "no GPU: nothing to measure"))
