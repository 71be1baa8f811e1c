"""Tensor-parallel indexer: partial scores over each rank's heads, ``dist.all_reduce``, mask, top-k.

Spawns 2 and 4 CPU ranks (gloo). Each rank compiles its shard of ``pass_corpus.TPIndexer``
and checks, itself: the swap was counted once under its pattern name, the indices are a valid
top-k of the float64 single-device oracle (all heads, no collective), and so are eager's. The
test then checks every rank returned the same indices (the collective was kept). Near-misses
(an all_reduce with op max, an op between the collective and the mask) must leave the graph
byte-for-byte unchanged and compute what eager computes; the functional collective and a
logits-only chain are matched too.
"""
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from pass_corpus import TPIndexer, make_tp_inputs, toy_call
from pass_helpers import SnapshotPass, check_topk, compile_run, oracle, pass_only_backend

import inductor_dsa
from inductor_dsa import lowering

PATTERN = "indexer_topk_all_reduce"
pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def _init(rank, world, tmp, device="cpu"):
    if device == "cuda":
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if device == "cuda" else "gloo",
                            init_method=f"file://{os.path.join(tmp, 'store')}", rank=rank, world_size=world)


def _full(dtype, device="cpu"):
    torch.manual_seed(0)
    return TPIndexer().to(device=device, dtype=dtype)


def _swap_worker(rank, world, tmp, dtype, codegen, device, dynamic):
    _init(rank, world, tmp, device)
    try:
        full = _full(dtype, device)
        m = full.shard(world, rank)
        args = tuple(a.to(device) for a in make_tp_inputs(full, dtype, seed=1))
        with torch.no_grad():
            eager = m(*args)
        out, counts = compile_run(m, args, backend=inductor_dsa.backend if codegen else pass_only_backend(),
                                  dynamic=dynamic)
        assert counts == {PATTERN: 1}, f"rank {rank}: {counts}"
        swaps = lowering.report().swaps
        assert "all_reduce sum of the partial scores" in swaps[0].region, str(lowering.report())
        (logits64,) = oracle(toy_call, (full, args))[1]
        tol = 3e-2 if dtype == torch.bfloat16 else 1e-3
        for idx in (out, eager):
            assert idx.dtype == torch.int64 and idx.shape == eager.shape
            check_topk(idx, logits64, idx.shape[-1], post=True, rel_tol=tol)
        torch.save(out.cpu(), os.path.join(tmp, f"out{rank}.pt"))
    finally:
        dist.destroy_process_group()


# 2 ranks: inductor_dsa.backend (real code generation); 4 ranks: the same Inductor pipeline with
# the generated code replaced by running the rewritten graph (pass_helpers.pass_only_backend), as
# 4 full Inductor compilations on a 2-core CI box take minutes; and dynamic=True (symbolic seqlen).
# NCCL: one GPU per rank.
@pytest.mark.parametrize("world,dtype,codegen,device,dynamic", [
    (2, torch.bfloat16, True, "cpu", None), (4, torch.float32, False, "cpu", True),
    pytest.param(2, torch.bfloat16, True, "cuda", None, marks=pytest.mark.skipif(
        torch.cuda.device_count() < 2 or not dist.is_nccl_available(), reason="needs 2 GPUs and NCCL")),
])
def test_tp_indexer_is_swapped_on_every_rank(world, dtype, codegen, device, dynamic, tmp_path):
    mp.spawn(_swap_worker, args=(world, str(tmp_path), dtype, codegen, device, dynamic), nprocs=world)
    outs = [torch.load(tmp_path / f"out{r}.pt") for r in range(world)]
    for o in outs[1:]:
        assert torch.equal(o, outs[0]), "ranks disagree: the scores were not summed across ranks"


NEAR_MISSES = [  # (name, TPIndexer knobs, phrase the debug report must contain, or None)
    ("all_reduce_max", dict(reduce_op=dist.ReduceOp.MAX), "all_reduce with op 'max'"),
    ("abs_after_all_reduce", dict(after=torch.abs), None),
]


def tp_logits(q, kv, weights, ratio=4):
    """Logits only: partial head sum, all_reduce, ratio mask (no top-k)."""
    seqlen = q.size(1)
    score = (torch.einsum("bshd,btd->bsht", q, kv).relu() * weights.unsqueeze(-1)).sum(dim=2)
    dist.all_reduce(score)
    hidden = torch.arange(kv.size(1)) >= torch.arange(1, seqlen + 1).unsqueeze(1) // ratio
    return score.masked_fill(hidden, float("-inf"))


def _near_miss_worker(rank, world, tmp):
    os.environ["INDUCTOR_DSA_DEBUG"] = "1"
    _init(rank, world, tmp)
    try:
        full = _full(torch.float32)
        args = make_tp_inputs(full, torch.float32, seed=2)
        for name, knobs, phrase in NEAR_MISSES:
            m = full.shard(world, rank, **knobs)
            snap = SnapshotPass()
            out, counts = compile_run(m, args, backend=pass_only_backend(snap))
            assert counts == {}, f"{name} was swapped: {counts}"
            assert snap.before and snap.before == snap.after, f"{name}: the pass changed the graph"
            with torch.no_grad():
                assert torch.equal(out, m(*args)), f"{name}: differs from eager"
            reasons = [r.reason for r in lowering.report().rejections]
            assert phrase is None or any(phrase in r for r in reasons), f"{name}: {reasons}"
        # the functional collective (no in-place write-back) is the same pattern
        m = full.shard(world, rank, functional=True)
        out, counts = compile_run(m, args)
        assert counts == {PATTERN: 1}, counts
        (logits64,) = oracle(toy_call, (full, args))[1]
        check_topk(out, logits64, out.shape[-1], post=True, rel_tol=1e-3)
        # logits only: the local head sum before the collective is swapped, the rest stays
        g = torch.Generator().manual_seed(3 + rank)
        q, kv, w = torch.randn(1, 36, 4, 32, generator=g), torch.randn(1, 9, 32), torch.randn(1, 36, 4, generator=g)
        dist.broadcast(kv, 0)
        out, counts = compile_run(tp_logits, (q, kv, w))
        assert counts == {"indexer_logits": 1}, counts
        with torch.no_grad():
            torch.testing.assert_close(out, tp_logits(q, kv, w), rtol=1e-4, atol=1e-4)
    finally:
        dist.destroy_process_group()


def test_tp_near_misses_are_untouched(tmp_path):
    mp.spawn(_near_miss_worker, args=(2, str(tmp_path)), nprocs=2)
