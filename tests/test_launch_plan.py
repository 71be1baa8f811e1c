"""Cached launch plans of the paged top-k (kernels/paged_launch.py, kernels/fastlaunch.py).

A plan is built once per key (shapes, dtypes, pointer alignments, device, config); later calls
reuse it. Checked: a reused plan makes the same launches (kernel, grid, every non-tensor
argument, options) as a freshly built one and returns identical results, equal to the oracle;
a key that differs in a launch-relevant way (cache alignment, config) gets its own plan; no
launch decision reads tensor data. On a GPU, the planned compiled-kernel path returns bitwise
what ``kernel[grid]`` launches return.
"""
import dataclasses

import pytest
import torch

from inductor_dsa.kernels import configs, fastlaunch, paged_launch
from conftest import DEVICE, misaligned_copy
from paged_cases import assert_paged_topk, make_case, paged_oracle, to_device

KERNELS = ("zero_kernel", "paged_scores_kernel", "paged_select_kernel", "list_merge_kernel", "list_rank_kernel")


class _Recorded:
    """A kernel whose launches are recorded (name, grid, non-tensor arguments, options), then run."""

    def __init__(self, fn, log):
        self.fn, self.log, self.arg_names, self.__name__ = fn, log, fn.arg_names, fn.__name__

    def __getitem__(self, grid):
        def run(*args, **options):
            self.log.append((self.__name__, tuple(grid),
                             tuple((n, a) for n, a in zip(self.arg_names, args) if not torch.is_tensor(a)),
                             tuple(sorted(options.items()))))
            return self.fn[grid](*args, **options)
        return run


@pytest.fixture
def log(monkeypatch):
    """Launches of the paged top-k kernels, recorded (all through kernel[grid], also on a GPU);
    plans are built fresh inside the test."""
    monkeypatch.setenv(fastlaunch.FAST_ENV, "0")
    out = []
    for n in KERNELS:
        monkeypatch.setattr(paged_launch, n, _Recorded(getattr(paged_launch, n), out))
    monkeypatch.setattr(paged_launch, "_PLANS", {})
    return out


def _set_cfg(monkeypatch, split: bool):
    """Chunks of 64 rows (every request split) or of 4096 (never split) on the device's config."""
    target = configs.target_for(torch.device(DEVICE))
    chunk = dict(bn=32, chunk_min=64, chunk_max=64, split_min=0) if split else dict(chunk_min=4096, chunk_max=4096)
    monkeypatch.setitem(configs.PAGED, target, dataclasses.replace(configs.PAGED[target], **chunk))


@pytest.mark.parametrize("split", [False, True])
def test_reused_plan_launches_and_results_equal_a_fresh_one(split, log, monkeypatch, gen):
    _set_cfg(monkeypatch, split)
    case = make_case(gen)
    args = (*to_device(case[:1]), None, *to_device(case[1:]), 24, "mxfp4", "fn")
    first = paged_launch.paged_topk(*args, programs=3)
    launches, log[:] = list(log), []
    assert len(paged_launch._PLANS) == 1
    second = paged_launch.paged_topk(*args, programs=3)
    assert log == launches and len(paged_launch._PLANS) == 1
    paged_launch._PLANS.clear()
    log[:] = []
    third = paged_launch.paged_topk(*args, programs=3)  # rebuilt
    assert log == launches
    names = [x[0] for x in launches]
    waves = names.count("paged_scores_kernel")
    ranked = split and case[0].shape[0] * case[0].shape[1] <= configs.PAGED[configs.target_for(torch.device(DEVICE))].rank_rows
    assert names == (["zero_kernel"] if split else []) + ["paged_scores_kernel", "paged_select_kernel"] * waves + (
        (["list_rank_kernel"] if ranked else ["list_merge_kernel"]) if split else [])
    assert waves > 1  # 3 programs per wave: several waves, so it0 differs between the launches
    for got in (second, third):
        assert all(torch.equal(x, y) for x, y in zip(got, first))
    assert_paged_topk(*first, paged_oracle(case, "mxfp4", "fn"), 24)


def test_plan_key_covers_alignment_config_and_data(log, monkeypatch, gen):
    """A 1-byte-offset cache (ALIGNED off) and a new config get their own plans; new context_lens
    and block-table values (same shapes) reuse the plan: launch decisions never read data."""
    case = make_case(gen)
    q, cache, w, bt, ctx = to_device(case)
    want = paged_launch.paged_topk(q, None, cache, w, bt, ctx, 24, "mxfp4", "fn")
    got = paged_launch.paged_topk(q, None, misaligned_copy(cache), w, bt, ctx, 24, "mxfp4", "fn")
    assert len(paged_launch._PLANS) == 2
    assert {dict(x[2])["ALIGNED"] for x in log if x[0] == "paged_scores_kernel"} == {True, False}
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    paged_launch.paged_topk(q, None, cache, w, bt, torch.zeros_like(ctx), 24, "mxfp4", "fn")
    assert len(paged_launch._PLANS) == 2
    _set_cfg(monkeypatch, split=False)
    got = paged_launch.paged_topk(q, None, cache, w, bt, ctx, 24, "mxfp4", "fn")
    assert len(paged_launch._PLANS) == 3
    assert_paged_topk(*got, paged_oracle(case, "mxfp4", "fn"), 24)


@pytest.mark.skipif(DEVICE != "cpu", reason="the interpreter path: every launch through kernel[grid]")
def test_interpreter_never_takes_the_compiled_path(log, gen):
    case = to_device(make_case(gen))
    for _ in range(2):
        paged_launch.paged_topk(case[0], None, *case[1:], 24, "mxfp4", "fn")
    plan = next(iter(paged_launch._PLANS.values()))
    assert all(launch.compiled is None for launch in plan.launches)


@pytest.mark.skipif(DEVICE == "cpu", reason="the compiled-kernel path exists on GPUs only")
@pytest.mark.parametrize("split", [False, True])
def test_compiled_path_equals_kernel_grid(split, monkeypatch, gen):
    _set_cfg(monkeypatch, split)
    case = make_case(gen)
    args = (*to_device(case[:1]), None, *to_device(case[1:]), 24, "mxfp4", "fn")
    monkeypatch.setattr(paged_launch, "_PLANS", {})
    monkeypatch.setenv(fastlaunch.FAST_ENV, "0")
    want = paged_launch.paged_topk(*args)
    want2 = paged_launch.paged_topk(*args)
    assert all(launch.compiled is None for launch in next(iter(paged_launch._PLANS.values())).launches)
    paged_launch._PLANS.clear()
    monkeypatch.setenv(fastlaunch.FAST_ENV, "1")
    paged_launch.paged_topk(*args)
    got = paged_launch.paged_topk(*args)  # through the compiled kernels
    assert all(launch.compiled is not None for launch in next(iter(paged_launch._PLANS.values())).launches)
    assert all(torch.equal(x, y) for x, y in zip(want, want2))
    assert all(torch.equal(x, y) for x, y in zip(got, want))
    assert_paged_topk(*got, paged_oracle(case, "mxfp4", "fn"), 24)


def test_direct_calls_only_where_their_argument_order_was_checked(monkeypatch):
    """The compiled kernel is called directly only on CUDA with a Triton in VERIFIED_TRITON, not under
    the interpreter and not with INDUCTOR_DSA_FAST_LAUNCH=0; everything else goes through kernel[grid]."""
    monkeypatch.setattr(configs, "interpreting", lambda: False)
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.delenv(fastlaunch.FAST_ENV, raising=False)
    for version, allowed in (("3.6.0", True), ("3.7.1", True), ("3.8.0", False), ("3.60.0", False), ("4.0.0", False)):
        monkeypatch.setattr(fastlaunch.triton, "__version__", version)
        assert fastlaunch._fast_allowed() is allowed, version
    monkeypatch.setattr(fastlaunch.triton, "__version__", "3.7.1")
    monkeypatch.setenv(fastlaunch.FAST_ENV, "0")
    assert not fastlaunch._fast_allowed()
    monkeypatch.delenv(fastlaunch.FAST_ENV)
    monkeypatch.setattr(torch.version, "hip", "6.4")
    assert not fastlaunch._fast_allowed()
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(configs, "interpreting", lambda: True)
    assert not fastlaunch._fast_allowed()
