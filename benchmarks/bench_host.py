"""Host time of one plain (eager, not graphed) paged top-k call, layer by layer, kernels stubbed and live.

    python benchmarks/bench_host.py [--smoke] [--calls 300] [--out results.json]

Host time per call = median over ``--calls`` back-to-back calls of the wall time of one call,
no sync in the loop (a GPU call returns once its launches are queued). Layers: the public
function with the value check off (``check_values=False``, what compiled code and CUDA graphs
run) and on (the eager default: one counting kernel and a sync), the ``torch.ops`` op (dispatch
+ metadata checks + launcher) and the launcher alone (``paged_launch.paged_topk``).

"stubbed": the paged kernels are replaced by no-ops in the launcher module (Python, checks,
planning, allocations and torch ops remain; Triton's launch path does not; after the first call
the no-ops stand in for compiled kernels, so the planned path is the one timed). Without a GPU it
runs on the CPU with the H200's launch plan (sm90 config, 132 SMs), a proxy for the H200's
host: this CPU is slower per Python operation, and Triton's launch cost is absent.
"live" (GPU only): the real launches, with the planned compiled-kernel path (``kernels/
fastlaunch.py``) and with every launch through ``kernel[grid]`` (``INDUCTOR_DSA_FAST_LAUNCH=0``);
"check" is whether both give bitwise equal outputs.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import DEVICE, env_line, table, write_json  # noqa: E402
import inductor_dsa  # noqa: E402
from inductor_dsa.kernels import configs, fastlaunch, paged_launch  # noqa: E402

H, D, ROW = 64, 128, 68  # MXFP4 keys: 68 B per row
CASES = [  # name, B, L, topk: unsplit (2 launches), split and ranked (4), a batch (4)
    ("B=1 L=1088 top-512", 1, 1088, 512),
    ("B=1 L=262144 top-1024", 1, 262144, 1024),
    ("B=64 L=32768 top-512", 64, 32768, 512),
]
KERNELS = ("zero_kernel", "paged_scores_kernel", "paged_select_kernel", "list_merge_kernel", "list_rank_kernel",
           "paged_check_kernel")


class _NoLaunch:
    """A kernel whose launches only count themselves (keeps the attributes the launch plans read);
    ``kernel[grid](...)`` returns a compiled-kernel stand-in whose ``run`` counts too, so later calls
    take ``fastlaunch.run``'s compiled path as on a GPU."""
    count = 0
    function, packed_metadata = 0, None

    def __init__(self, fn):
        self.arg_names, self.__name__ = fn.arg_names, fn.__name__

    def __getitem__(self, grid):
        return self._launch

    def _launch(self, *args, **kwargs):
        type(self).count += 1
        return self

    @classmethod
    def run(cls, *args):
        cls.count += 1


@contextlib.contextmanager
def stubbed():
    """The paged kernels as no-ops; without a GPU, planned as on the H200 (sm90, 132 SMs)."""
    saved = {n: getattr(paged_launch, n) for n in KERNELS}
    target, programs = configs.target_for, configs.wave_programs
    allowed, stream = fastlaunch._fast_allowed, fastlaunch.current_stream
    try:
        for n, fn in saved.items():
            setattr(paged_launch, n, _NoLaunch(fn))
        fastlaunch._fast_allowed = lambda: True
        if DEVICE == "cpu":
            configs.target_for = lambda device: "sm90"
            configs.wave_programs = lambda device, per_sm: 132 * per_sm
            fastlaunch.current_stream = lambda: 0
        paged_launch._PLANS.clear()
        yield
    finally:
        for n, fn in saved.items():
            setattr(paged_launch, n, fn)
        configs.target_for, configs.wave_programs = target, programs
        fastlaunch._fast_allowed, fastlaunch.current_stream = allowed, stream
        paged_launch._PLANS.clear()


@contextlib.contextmanager
def fast_launch(on: bool):
    """Planned compiled-kernel launches on or off (plans are rebuilt either way)."""
    old = os.environ.get(fastlaunch.FAST_ENV)
    os.environ[fastlaunch.FAST_ENV] = "1" if on else "0"
    paged_launch._PLANS.clear()
    try:
        yield
    finally:
        os.environ.pop(fastlaunch.FAST_ENV) if old is None else os.environ.update({fastlaunch.FAST_ENV: old})
        paged_launch._PLANS.clear()


def make_case(b, length, dense: bool):
    """q, cache, weights, block table, context_lens; the cache uninitialised unless ``dense`` (live runs)."""
    g = torch.Generator(device=DEVICE).manual_seed(0)
    pages = length // 64
    cache = torch.empty((b * pages + 1, 64 * ROW), dtype=torch.uint8, device=DEVICE)
    if dense:
        cache.copy_(torch.randint(0, 256, cache.shape, device=DEVICE, generator=g, dtype=torch.uint8))
        cache[:, 64 * D // 2:] = torch.randint(122, 131, (cache.shape[0], 64 * D // 32), device=DEVICE,
                                               generator=g, dtype=torch.uint8)
    bt = torch.randperm(b * pages, device=DEVICE, generator=g).view(b, pages).to(torch.int32)
    ctx = (length - torch.arange(b, device=DEVICE) % 7).to(torch.int32)
    q = torch.randn(b, 1, H, D, device=DEVICE, generator=g).bfloat16()
    w = (torch.randn(b, 1, H, device=DEVICE, generator=g) * 0.01).bfloat16()
    return q, cache, w, bt, ctx


def host_us(fn, calls: int) -> float:
    """Median wall time of one call, microseconds (after warm-up calls; no sync between calls)."""
    for _ in range(max(20, calls // 10)):  # the CPU allocator's first large workspaces fault pages
        fn()
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    if DEVICE == "cuda":
        torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def layers(q, cache, w, bt, ctx, topk):
    """(label, call) of each layer, outermost first."""
    op = torch.ops.inductor_dsa.paged_indexer_topk
    return [
        ("public, check_values=False", lambda: inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk,
                                                                               check_values=False)),
        ("public, check_values=True", lambda: inductor_dsa.paged_indexer_topk(q, cache, w, bt, ctx, topk,
                                                                              check_values=True)),
        ("torch.ops op", lambda: op(q, None, cache, w, bt, ctx, topk, "mxfp4", "fn")),
        ("launcher", lambda: paged_launch.paged_topk(q, None, cache, w, bt, ctx, topk, "mxfp4", "fn")),
    ]


def bench_case(name, b, length, topk, calls, live: bool):
    rows = []
    case = make_case(b, length, dense=live)
    stats = {}
    with stubbed():
        n0 = _NoLaunch.count
        paged_launch.paged_topk(*case[:1], None, *case[1:], topk, "mxfp4", "fn", stats=stats)
        launches = _NoLaunch.count - n0
        for label, fn in layers(*case, topk):
            rows.append(dict(case=name, impl=f"ours: {label}, stubbed", us=host_us(fn, calls), launches=launches,
                             check="ok"))
    if live:
        with fast_launch(False):
            want = inductor_dsa.paged_indexer_topk(*case, topk, check_values=False)
            slow = {label: host_us(fn, calls) for label, fn in layers(*case, topk)}
        with fast_launch(True):
            got = inductor_dsa.paged_indexer_topk(*case, topk, check_values=False)
            got = inductor_dsa.paged_indexer_topk(*case, topk, check_values=False)  # the planned path
            same = all(torch.equal(x, y) for x, y in zip(got, want))
            for label, fn in layers(*case, topk):
                rows.append(dict(case=name, impl=f"ours: {label}, live", us=host_us(fn, calls), launches=launches,
                                 kernel_grid_us=slow[label], check="ok" if same else "FAIL: fast != kernel[grid]"))
    for r in rows:
        r["ms"] = r["us"] / 1e3
        print(f"  {r['impl']:45} {r['us']:8.1f} us" + (f"  (kernel[grid] launches: {r['kernel_grid_us']:.1f} us)"
                                                      if "kernel_grid_us" in r else ""), flush=True)
    print(f"{name}: plan {stats['plan']}, {launches} launches")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="first case only, fewer calls (CPU test)")
    ap.add_argument("--quick", action="store_true", help="fewer calls")
    ap.add_argument("--calls", type=int, default=None, help="timed calls per row (default 300; smoke 30)")
    ap.add_argument("--out", help="JSON results file")
    args = ap.parse_args()
    calls = args.calls or (30 if args.smoke else 100 if args.quick else 300)
    live = DEVICE == "cuda"
    print(env_line() + ("" if live else " -- CPU proxy: kernels stubbed, H200 launch plan; live rows need a GPU"))
    rows = []
    for name, b, length, topk in CASES[:1] if args.smoke else CASES:
        rows += bench_case(name, b, length, topk, calls, live)
    print(table(rows, ["case", "impl", "us", "kernel_grid_us", "launches", "check"]))
    write_json(args.out, dict(env=env_line(), calls=calls, rows=rows))


if __name__ == "__main__":
    main()
