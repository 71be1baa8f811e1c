"""The indexer ops as torch.library ops: fake impls agree, torch.compile traces them by name."""
import pytest
import torch
from torch._inductor.utils import run_and_get_code

import inductor_dsa as idsa
from inductor_dsa import reference
from conftest import DEVICE


def _args(gen, t=6, n=9, h=2, d=16):
    q = torch.randn(t, h, d, generator=gen).bfloat16().to(DEVICE)
    k = torch.randn(n, d, generator=gen).bfloat16().to(DEVICE)
    w = torch.randn(t, h, generator=gen).to(DEVICE)
    ks, ke = (x.to(DEVICE) for x in reference.causal_ranges(t, n))
    return q, k, w, ks, ke


def test_opcheck(gen):
    q, k, w, ks, ke = _args(gen)
    torch.library.opcheck(torch.ops.inductor_dsa.indexer_logits.default, (q, None, k, None, w, ks, ke),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.inductor_dsa.indexer_topk.default, (q, None, k, None, w, ks, ke, 4),
                          test_utils=("test_schema", "test_faketensor"))
    torch.library.opcheck(torch.ops.inductor_dsa.logits_topk.default, (torch.randn(6, 9, generator=gen).to(DEVICE), ks, ke, 4),
                          test_utils=("test_schema", "test_faketensor"))


def test_compiled_call_names_the_op(gen):
    q, k, w, ks, ke = _args(gen)

    def fn(q, k, w, ks, ke):
        vals, idx = idsa.indexer_topk(q, k, w, 4, k_start=ks, k_end=ke)
        return vals * 2, idx

    torch._dynamo.reset()
    (vals, idx), codes = run_and_get_code(torch.compile(fn, fullgraph=True), q, k, w, ks, ke)
    assert any("inductor_dsa.indexer_topk" in c for c in codes)
    want_v, want_i = reference.indexer_topk(q.cpu(), k.cpu(), w.cpu(), 4, ks.cpu(), ke.cpu())
    msg = reference.topk_mismatch(idx.cpu(), reference.indexer_logits(q.cpu(), k.cpu(), w.cpu(), ks.cpu(), ke.cpu()), 4)
    assert msg is None, msg
    assert torch.allclose(vals.cpu(), 2 * want_v, rtol=1e-5, atol=1e-5)


def test_backward_raises_instead_of_a_silent_none(gen):
    """The ops are inference-only: eager and compiled, backward through them raises (never q.grad = None)."""
    q, k, w, ks, ke = _args(gen)
    q = q.detach().requires_grad_()

    def fn(q):
        vals, _ = idsa.indexer_topk(q, k, w, 4, k_start=ks, k_end=ke)
        return vals.sum() + q.sum()

    with torch.no_grad():
        assert not fn(q).requires_grad
    loss = fn(q)
    assert loss.requires_grad
    with pytest.raises(RuntimeError, match="indexer_topk has no backward"):
        loss.backward()
    torch._dynamo.reset()  # compiled: AOT autograd traces the backward at compile time and fails there
    with pytest.raises(Exception, match="indexer_topk has no backward"):
        torch.compile(fn, backend="aot_eager")(q).backward()


def test_ops_switch_to_the_inputs_gpu(monkeypatch):
    """The switching logic of ``ops._on_input_device`` without two GPUs (tests/test_devices.py runs
    the real thing): a GPU input that is not on the current device runs under torch.cuda.device of
    the input's device; one on the current device, or a CPU input, runs as is."""
    from inductor_dsa import ops
    entered = []

    class Switch:
        def __init__(self, dev):
            self.dev = dev

        def __enter__(self):
            entered.append(self.dev)

        def __exit__(self, *exc):
            return False

    class Input:
        def __init__(self, dev):
            self.device = torch.device(dev)

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(torch.cuda, "device", Switch)
    run = ops._on_input_device(lambda x, y: (x, y))
    for dev, want in (("cuda:1", [torch.device("cuda:1")]), ("cuda:0", []), ("cpu", [])):
        entered.clear()
        x = Input(dev)
        assert run(x, 7) == (x, 7)
        assert entered == want, dev


class _Log(torch.utils._python_dispatch.TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.ops = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(str(func))
        return func(*args, **(kwargs or {}))


def test_plain_eager_calls_skip_the_dispatcher_and_nothing_else_does(gen, monkeypatch):
    """A plain eager call runs the op's function directly (same result as through torch.ops);
    under a dispatch mode, with a tensor that needs grad, or with a tensor subclass, the call
    goes through the dispatcher (the mode sees the op; backward raises)."""
    from inductor_dsa import ops
    q, k, w, ks, ke = _args(gen)
    args = (q, None, k, None, w, ks, ke, 4)
    through = []
    monkeypatch.setattr(ops.indexer_topk, "packet", lambda *a: through.append(1) or torch.ops.inductor_dsa.indexer_topk(*a))
    direct = ops.indexer_topk(*args)
    assert through == []
    via = torch.ops.inductor_dsa.indexer_topk(*args)
    assert all(torch.equal(a, b) for a, b in zip(direct, via))
    with _Log() as log:
        ops.indexer_topk(*args)
    assert through == [1] and "inductor_dsa.indexer_topk.default" in log.ops
    wg = w.float().requires_grad_()
    vals, _ = ops.indexer_topk(q, None, k, None, wg, ks, ke, 4)
    assert through == [1, 1]
    with pytest.raises(RuntimeError, match="no backward"):
        vals.sum().backward()
    with torch.no_grad():
        ops.indexer_topk(q, None, k, None, wg, ks, ke, 4)
    assert through == [1, 1]
