"""Public API of the pass: backend, install/uninstall/enabled, report, cache key, codegen."""
import os
import shutil

import pytest
import torch
import torch._inductor.config as inductor_config
from torch._dynamo.utils import counters as dynamo_counters
from torch._inductor.compile_fx import compile_fx
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch._inductor.utils import run_and_get_code

import inductor_dsa
from inductor_dsa import lowering
from inductor_dsa.lowering.graph_pass import ChainedPass, source_hash
from inductor_dsa.lowering.install import run_fx_graph
from pass_corpus import (NEAR_MISSES, deepgemm_ref_logits, make_official, make_ranges, nm_weights_before_relu,
                         official_fn, _qkw)
from pass_helpers import check_logits, check_topk, compile_run, oracle


def _global_backend(gm, example_inputs):
    """Inductor reading the global config (what the default "inductor" backend does), with
    code generation replaced by running the FX graph."""
    return compile_fx(gm, example_inputs, inner_compile=run_fx_graph)


def _official_args(seed=0):
    return make_official(1)(torch.float32, seed)


@pytest.fixture(autouse=True)
def _clean_config():
    before = inductor_config.joint_custom_pre_pass
    yield
    while inductor_dsa.lowering.is_installed():
        inductor_dsa.uninstall()
    inductor_config.joint_custom_pre_pass = before


# ---- real code generation ----------------------------------------------------------------------
def test_backend_generated_code_calls_indexer_topk():
    torch._dynamo.reset()
    lowering.reset()
    prev = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)  # the official code runs under a bf16 default dtype
    try:
        args = make_official(1)(torch.bfloat16, 0)
        f = torch.compile(official_fn, backend=inductor_dsa.backend)
        with torch.no_grad():
            out, code = run_and_get_code(f, *args)
    finally:
        torch.set_default_dtype(prev)
    assert any("torch.ops.inductor_dsa.indexer_topk" in c for c in code)
    assert dict(lowering.counters) == {"indexer_topk": 1}
    _, (logits64,) = oracle(official_fn, args)
    check_topk(out, logits64, out.shape[-1], post=True, rel_tol=3e-2)


def test_enabled_default_backend_generated_code_calls_indexer_logits():
    torch._dynamo.reset()
    lowering.reset()
    args = make_ranges(torch.float32, 0)
    with inductor_dsa.enabled(), torch.no_grad():
        out, code = run_and_get_code(torch.compile(deepgemm_ref_logits), *args)
    assert any("torch.ops.inductor_dsa.indexer_logits" in c for c in code)
    assert dict(lowering.counters) == {"indexer_logits": 1}
    ref, _ = oracle(deepgemm_ref_logits, args)
    check_logits(out, ref, deepgemm_ref_logits(*args))


def test_backend_takes_inductor_modes_and_options():
    """mode / options reach Inductor as for backend="inductor" (on a CPU, reduce-overhead's CUDA
    graphs are skipped, and that skip is counted), and the pass still swaps."""
    args = _official_args()
    for mode, skips in ((None, 0), ("reduce-overhead", 1)):
        dynamo_counters.clear()
        torch._dynamo.reset()
        lowering.reset()
        with torch.no_grad():
            out = torch.compile(official_fn, backend=inductor_dsa.backend, mode=mode)(*args)
        assert dict(lowering.counters) == {"indexer_topk": 1}, mode
        assert dynamo_counters["inductor"]["cudagraph_skips"] == skips, mode
        _, (logits64,) = oracle(official_fn, args)
        check_topk(out, logits64, out.shape[-1], post=True)
    for bad, msg in ((dict(mode="fast"), "Unrecognized mode=fast"),
                     (dict(options={"no_such_option": 1}), "no_such_option"),
                     (dict(options={"max_autotune": "yes"}), "max_autotune")):
        torch._dynamo.reset()
        with pytest.raises(Exception, match=msg):
            torch.compile(official_fn, backend=inductor_dsa.backend, **bad)(*args)


def test_near_miss_generated_code_is_plain_inductor():
    args = _qkw(torch.float32, 0)
    with torch.no_grad():
        ours, c1 = compile_run(nm_weights_before_relu, args, backend=inductor_dsa.backend)
        torch._dynamo.reset()
        plain = torch.compile(nm_weights_before_relu, backend="inductor")(*args)
    assert c1 == {}
    for a, b in zip(ours, plain):
        assert torch.equal(a, b)


def test_fx_graph_cache_stays_on(tmp_path, monkeypatch):
    """The pass's uuid keeps the FX graph cache usable: the second compile is a cache hit."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))
    args = _official_args()
    with inductor_config.patch(force_disable_caches=False, fx_graph_cache=True, fx_graph_remote_cache=False):
        dynamo_counters.clear()
        first, swaps = compile_run(official_fn, args, backend=inductor_dsa.backend)
        assert swaps == {"indexer_topk": 1}
        assert dynamo_counters["inductor"]["fxgraph_cache_bypass"] == 0
        second, swaps2 = compile_run(official_fn, args, backend=inductor_dsa.backend)
    assert dynamo_counters["inductor"]["fxgraph_cache_hit"] >= 1
    assert swaps2 == {}  # served from the cache: the pass did not run again
    assert torch.equal(first, second)


# ---- hooks -------------------------------------------------------------------------------------
class UserPass(CustomGraphPass):
    def __init__(self):
        self.calls = 0

    def __call__(self, graph):
        self.calls += 1

    def uuid(self):
        return "user-pass"


def _swaps_with_global_config():
    _, counts = compile_run(official_fn, _official_args(), backend=_global_backend)
    return counts.get("indexer_topk", 0)


def test_install_uninstall_enabled():
    assert not lowering.is_installed()
    assert _swaps_with_global_config() == 0
    inductor_dsa.install()
    inductor_dsa.install()  # idempotent
    assert _swaps_with_global_config() == 1
    inductor_dsa.uninstall()
    assert inductor_config.joint_custom_pre_pass is None
    assert _swaps_with_global_config() == 0
    with inductor_dsa.enabled():
        assert _swaps_with_global_config() == 1
    assert _swaps_with_global_config() == 0


def test_install_keeps_a_pass_that_was_there():
    user = UserPass()
    inductor_config.joint_custom_pre_pass = user
    inductor_dsa.install()
    assert _swaps_with_global_config() == 1 and user.calls == 1
    p = inductor_config.joint_custom_pre_pass
    assert isinstance(p, ChainedPass) and p.uuid() == (lowering.PASS.uuid(), "user-pass")
    inductor_dsa.uninstall()
    assert inductor_config.joint_custom_pre_pass is user


def test_uuid_hashes_sources():
    u = lowering.PASS.uuid()
    assert u == "inductor_dsa:" + source_hash() and len(u) > 40
    assert ChainedPass(lowering.PASS, lambda g: None).uuid() is None  # unknown pass: no caching


# ---- report ------------------------------------------------------------------------------------
def test_report_names_pattern_source_line_and_op(monkeypatch):
    monkeypatch.delenv("INDUCTOR_DSA_DEBUG", raising=False)
    compile_run(official_fn, _official_args())
    text = str(inductor_dsa.report())
    assert "indexer_topk -> torch.ops.inductor_dsa.indexer_topk" in text
    assert "pass_corpus.py" in text and "index_score.topk(min(index_topk, seqlen // ratio)" in text
    (swap,) = inductor_dsa.report().swaps
    assert swap.pattern == "indexer_topk" and "official_fn" in swap.source
    # without INDUCTOR_DSA_DEBUG nothing is recorded about rejections
    compile_run(nm_weights_before_relu, _qkw(torch.float32, 0))
    assert inductor_dsa.report().rejections == []


def test_debug_report_says_why(monkeypatch):
    monkeypatch.setenv("INDUCTOR_DSA_DEBUG", "1")
    (case,) = [c for c in NEAR_MISSES if c.name == "largest_false"]
    compile_run(case.fn, case.make(torch.float32, 0))
    text = str(inductor_dsa.report())
    assert "rejected near topk" in text and "largest=False" in text and "nm_smallest" in text


def test_training_graph_is_left_alone(monkeypatch):
    monkeypatch.setenv("INDUCTOR_DSA_DEBUG", "1")
    q, k, w = (t.requires_grad_() for t in _qkw(torch.float32, 0))
    torch._dynamo.reset()
    lowering.reset()
    out = torch.compile(chain_3d, backend=_pass_backend_training())(q, k, w)
    out.sum().backward()
    assert dict(lowering.counters) == {}
    assert any("training" in r.reason for r in inductor_dsa.report().rejections)
    assert q.grad is not None


def chain_3d(q, k, w):
    s = (torch.einsum("thd,kd->thk", q, k).relu() * w.unsqueeze(-1)).sum(1)
    return s.topk(4).values


def _pass_backend_training():
    from pass_helpers import pass_only_backend
    return pass_only_backend()


def test_uuid_changes_when_a_pattern_source_changes(tmp_path):
    pkg = tmp_path / "inductor_dsa"
    shutil.copytree(os.path.dirname(inductor_dsa.__file__), pkg,
                    ignore=shutil.ignore_patterns("__pycache__"))
    fresh = source_hash.__wrapped__  # source_hash is memoised per process
    assert fresh(str(pkg)) == source_hash()
    with open(pkg / "patterns" / "indexer.py", "a") as f:
        f.write("\n# a new spelling\n")
    assert fresh(str(pkg)) != source_hash()
