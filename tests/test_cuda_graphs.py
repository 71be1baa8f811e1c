"""GPU only: CUDA-graph capture and replay of every op, no host syncs in the ops' fast path,
and torch.compile(mode="reduce-overhead") of a module using the indexer (prefill + paged decode)
and sparse attention, replayed on new data against the fp64 oracle.

Run on a GPU machine: python -m pytest -q tests/test_cuda_graphs.py
"""
import contextlib

import pytest
import torch

import inductor_dsa as idsa
from inductor_dsa import checks, reference
from op_cases import cases, flat
from pass_helpers import check_topk
from attention_cases import assert_close
from paged_cases import assert_paged_topk, make_case, paged_oracle

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA / ROCm GPU")

CASES = cases("cuda") if torch.cuda.is_available() else []
IDS = [c.name for c in CASES]


def _warm(fn, *args):
    """Run fn on a side stream (kernel compilation, allocator warm-up), as torch.cuda.graph wants."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(*args)
        fn(*args)
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()


@contextlib.contextmanager
def sync_debug_error():
    """Any synchronising CUDA call inside raises RuntimeError."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        yield
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_graph_capture_and_replay(case):
    """Captured once (value checks on: skipped automatically while capturing), replayed on two fresh
    input sets and on an empty one (context_lens all 0 / empty ranges / all -1 indices)."""
    static = case.make(0)
    _warm(case.call, static)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = case.call(static)
    for seed, empty in ((1, False), (2, False), (3, True)):
        fresh = case.make(seed)
        if empty:
            case.empty(fresh)
        for k, v in fresh.items():
            static[k].copy_(v)
        g.replay()
        torch.cuda.synchronize()
        case.check(fresh, out)
    if case.name.startswith(("indexer_topk", "paged_indexer_topk")):
        assert (flat(out)[1] == -1).all()           # the empty replay selected nothing
    if case.name.startswith("sparse_attention"):
        assert (flat(out)[0] == 0).all()            # every slot -1: zeros


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_no_host_sync_without_value_checks(case):
    x = case.make(4)
    _warm(case.call, x)
    with checks.values(False), sync_debug_error():
        out = case.call(x)
    case.check(x, out)


@pytest.mark.parametrize("case", [c for c in CASES if c.name.startswith(("paged", "sparse"))],
                         ids=[c.name for c in CASES if c.name.startswith(("paged", "sparse"))])
def test_value_checks_are_the_only_sync(case):
    x = case.make(4)
    _warm(case.call, x)
    with sync_debug_error(), pytest.raises(RuntimeError, match="synchroniz"):
        case.call(x)


# --- torch.compile(mode="reduce-overhead"): CUDA graphs through Inductor ---------------------------

T, HI, DI, RATIO, TOPK = 64, 8, 64, 4, 8                    # prefill indexer (eager spelling, swapped)
B, N, H, D, PAGES, DTOPK = 3, 2, 8, 64, 3, 24              # paged decode indexer
AH, AD = 16, 64                                           # sparse attention over the decode top-k


class Layer(torch.nn.Module):
    """Prefill indexer written as eager model code (the pass swaps it), the paged decode indexer op,
    and sparse attention over the decode top-k."""

    def forward(self, q, kv, w, dq, cache, dw, bt, ctx, aq, akv, sink):
        s = torch.einsum("shd,td->sht", q, kv).relu()
        s = (s * w.unsqueeze(-1)).sum(1)
        t = torch.arange(T, device=q.device).unsqueeze(1)
        j = torch.arange(T // RATIO, device=q.device)
        s = s.masked_fill(j >= (t + 1) // RATIO, float("-inf"))
        prefill = s.topk(TOPK, dim=-1)
        dv, di = idsa.paged_indexer_topk(dq, cache, dw, bt, ctx, DTOPK)
        out, lse = idsa.sparse_attention(aq, akv, di, sink=sink, return_lse=True)
        return prefill.values, prefill.indices, dv, di, out, lse


def _layer_inputs(seed, zero_ctx=False, device="cuda"):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(T, HI, DI, generator=g)
    kv = torch.randn(T // RATIO, DI, generator=g)
    w = torch.randn(T, HI, generator=g)
    dq, cache, dw, bt, ctx = make_case(g, n=N, h=H, d=D, max_pages=PAGES, ctx=[1, 65, 190])
    if zero_ctx:
        ctx.zero_()
    aq = torch.randn(B, N, AH, AD, generator=g).bfloat16()
    akv = torch.randn(B, PAGES * 64, AD, generator=g).bfloat16()
    sink = torch.rand(AH, generator=g) + 1
    return [x.to(device) for x in (q, kv, w, dq, cache, dw, bt, ctx, aq, akv, sink)]


def _check_layer(x, got):
    q, kv, w, dq, cache, dw, bt, ctx, aq, akv, sink = (t.cpu() for t in x)
    pv, pi, dv, di, out, lse = (t.cpu() for t in got)
    t = torch.arange(T)
    ref = reference.indexer_logits(q, kv, w, torch.zeros(T, dtype=torch.int32), ((t + 1) // RATIO).int())
    check_topk(pi, ref, TOPK, values=pv)      # eager semantics: masked columns fill short rows
    assert_paged_topk(dv, di, paged_oracle((dq, cache, dw, bt, ctx), "mxfp4", "fn"), DTOPK)
    assert_close(aq, akv, di, sink, out, lse)


def run_layer(compiled, device, steps=6, zero_step=4):
    """Call ``compiled`` (a compiled Layer) on fresh inputs each step (context_lens all 0 at
    ``zero_step``) and check every result against the oracles."""
    for step in range(steps):
        x = _layer_inputs(step, zero_ctx=step == zero_step, device=device)
        got = [o.clone() for o in compiled(*x)]   # cudagraph-tree outputs are overwritten by the next replay
        _check_layer(x, got)
        if step == zero_step:
            assert (got[3] == -1).all() and (got[4] == 0).all() and torch.isneginf(got[5]).all()


@pytest.mark.parametrize("how", ["enabled", "backend"])
def test_compile_reduce_overhead_replays_new_data(how):
    """The pass inside ``enabled()`` with backend="inductor", or ``backend=inductor_dsa.backend``:
    mode="reduce-overhead" captures the whole layer (no cudagraph skip) either way."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    idsa.lowering.reset()
    counters.clear()
    backend = idsa.backend if how == "backend" else "inductor"
    with idsa.enabled() if how == "enabled" else contextlib.nullcontext(), torch.no_grad():
        run_layer(torch.compile(Layer(), backend=backend, mode="reduce-overhead", fullgraph=True), "cuda")
    rep = idsa.report()
    assert len(rep) == 1 and [s.op for s in rep.swaps] == ["torch.ops.inductor_dsa.indexer_topk"], rep
    assert counters["inductor"]["cudagraph_skips"] == 0, dict(counters["inductor"])
