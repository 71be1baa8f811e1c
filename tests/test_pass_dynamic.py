"""Dynamic shapes: the swap happens on symbolic graphs and sequence lengths do not recompile."""
import pytest
import torch

import inductor_dsa
from inductor_dsa import lowering
from pass_corpus import CASES, ToyIndexer, make_official, official_fn, toy_call
from pass_helpers import case_args, check_case, check_topk, compile_run, oracle

# Every prefill spelling also matches with all sizes symbolic (dynamic=True), except the one
# whose pre-relu scale is computed from a symbolic size at run time (a 0-d tensor of unknown
# sign): that one must be rejected there.
DYN = [c for c in CASES if c.name != "scaled_relu_logits"]


@pytest.mark.parametrize("case", DYN, ids=[c.name for c in DYN])
def test_spelling_matches_with_symbolic_sizes(case):
    args = case_args(case, torch.float32, seed=3)
    out, counts = compile_run(case.fn, args, dynamic=True)
    assert counts == case.swaps
    with torch.no_grad():
        eager = case.fn(*args)
    check_case(case, torch.float32, args, out, eager)


def test_symbolic_scale_before_relu_is_rejected():
    (case,) = [c for c in CASES if c.name == "scaled_relu_logits"]
    out, counts = compile_run(case.fn, case_args(case, torch.float32), dynamic=True)
    assert counts == {}


def _compilations_with_swaps():
    rep = lowering.report()
    return len(rep), sum(1 for c in rep if c.swaps)


def test_mark_dynamic_compiles_once_for_several_lengths():
    """Real Inductor code generation; three sequence lengths, sizes marked dynamic."""
    torch._dynamo.reset()
    lowering.reset()
    f = torch.compile(official_fn, backend=inductor_dsa.backend)
    for seqlen in (32, 48, 64):
        q, kv, w = make_official(1, seqlen=seqlen)(torch.float32, seqlen)
        for x in (q, kv, w):
            torch._dynamo.mark_dynamic(x, 1)
        with torch.no_grad():
            out = f(q, kv, w)
        _, (logits64,) = oracle(official_fn, (q, kv, w))
        check_topk(out, logits64, out.shape[-1], post=True)
    n, swapped = _compilations_with_swaps()
    assert n <= 2 and swapped == n, (n, swapped)


LENGTHS = (32, 48, 37, 64, 53, 80, 41, 72, 29, 60)   # ten sequence lengths, odd ones and tails too


def test_ten_lengths_compile_at_most_twice_and_always_swap(monkeypatch):
    """Real Inductor code generation on the module, no marks (automatic dynamic: static, then one
    dynamic graph): at most 2 compilations for 10 lengths, counted by a backend wrapping
    inductor_dsa.backend, every compilation swapped, and every call runs the fused top-k."""
    from inductor_dsa import fallback
    from inductor_dsa.kernels import indexer_launch as launch
    torch._dynamo.reset()
    lowering.reset()
    compiles, launches = [], []
    real, real_fb = launch.indexer_topk, fallback.logits_topk
    # the op runs the kernel (GPU tensors, or CPU under the interpreter) or, for CPU tensors on a
    # machine that does not interpret (a GPU box), the production fallback's select: count whichever ran
    monkeypatch.setattr(launch, "indexer_topk", lambda *a: launches.append(a[0].shape[0]) or real(*a))
    monkeypatch.setattr(fallback, "logits_topk", lambda *a: launches.append(a[0].shape[0]) or real_fb(*a))

    def counting_backend(gm, example_inputs):
        compiles.append(gm)
        return inductor_dsa.backend(gm, example_inputs)

    torch.manual_seed(0)
    m = ToyIndexer(dim=48, batch=1, max_len=80)
    f = torch.compile(m, backend=counting_backend)
    for seqlen in LENGTHS:
        g = torch.Generator().manual_seed(seqlen)
        x, qr = torch.randn(1, seqlen, 48, generator=g), torch.randn(1, seqlen, 48, generator=g)
        kv = torch.randn(1, seqlen // 4, 32, generator=g)
        with torch.no_grad():
            out = f(x, qr, kv)
        _, (logits64,) = oracle(toy_call, (m, (x, qr, kv)))
        check_topk(out, logits64, out.shape[-1], post=True)
    n, swapped = _compilations_with_swaps()
    assert len(compiles) <= 2 and n == len(compiles) and swapped == n, (len(compiles), n, swapped)
    assert launches == list(LENGTHS), launches   # one fused top-k per call, over that call's T rows
