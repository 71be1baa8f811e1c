"""Whole models from transformers (issue 22): tiny random ``DeepseekV4ForCausalLM``,
``DeepseekV32ForCausalLM`` and ``GlmMoeDsaForCausalLM`` (2 layers, every layer with a DSA indexer:
V4's are compressed-sparse-attention layers), batch 2, run eagerly and under ``torch.compile`` with
the pass (default ``dynamic``: the first decode step compiles for one token, the second recompiles
with the cache length symbolic, later steps reuse it): a prefill, then cached decode steps fed the
same tokens.

What swaps: every layer's indexer top-k, in every compiled graph (prefill and decode), as
``inductor_dsa.indexer_topk`` -- V4's with the mask ``entry >= (position + 1) // 4`` built from
``position_ids``, V3.2 / GLM's with transformers' causal mask (``create_causal_mask`` builds it from
aranges as ``kv_idx <= q_idx`` offset by the cache length; the attention hands
``attention_mask[:, 0]`` to the indexer), both proven per-row key ranges; a left-padded batch adds
``attention_mask.bool()[b, kv_idx]``, data, which goes to the op's ``mask=``. Nothing else swaps:

* the sparse attention is not ``inductor_dsa::sparse_attention``, because none of these models
  gathers the selected keys. V3.2 / GLM scatter the indices into a ``[B, 1, S, T]`` boolean mask
  (``ones.scatter(-1, topk, False)``) and run dense eager/SDPA attention over every key with
  ``causal & ~index_mask``; V4 scatters them into a ``-inf`` block bias over the compressed
  entries, concatenates it to the sliding-window mask and runs dense attention with sinks over
  window + compressed keys. The sparse-attention pattern anchors on a gather of kv rows by the
  indices; a dense softmax under a mask scattered from indices is the same function, but no
  pattern reads it (it would need a proof that the scattered mask keeps exactly the indexed keys);
* the MoE routers' top-k (sigmoid scores plus a bias, no relu(q.k) head sum) stay as they are.

Backend: ``lowering.graph_only_backend`` (Inductor's graph passes with ours, then the FX graph
runs): the graph our pass rewrites is the one ``inductor_dsa.backend`` generates code for, and
Inductor's CPU code generation of these models costs minutes here (V3.2, prefill + 3 decode
steps: 270 s with the real backend, same swaps, logits within 1.2e-7 of eager).

Tolerance: logits within ``ATOL`` of eager. The fused op computes the indexer scores in another
order than eager (fp32 reassociation of a 32-term dot and a 16-head sum: below ~3e-6 of the row's
largest score); if two scores at the top-k boundary were
closer than that, the selected set could flip and the logits change by a few percent, a correct
result the test could not tell from a bug. So the test first checks its own premise on the eager
run: every row's k-th and (k+1)-th scores are ``MARGIN`` apart relative to the row's scale (16
index heads: with 4, exact ties at 0 -- every head's relu zero -- are common), so the same keys
must be selected, and the logits must agree to fp32 rounding. It also checks that the selection
matters: selecting every key changes the logits by far more than ``ATOL``.
"""
import os
import re

import pytest
import torch
import transformers
from packaging.version import Version
from torch._inductor.custom_graph_pass import CustomGraphPass
from torch.overrides import TorchFunctionMode
from transformers import (DeepseekV4ForCausalLM, DeepseekV32Config, DeepseekV32ForCausalLM, DynamicCache,
                          GlmMoeDsaConfig, GlmMoeDsaForCausalLM)
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Indexer
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaIndexer

from inductor_dsa import lowering
from inductor_dsa.lowering.install import with_ours
from pass_helpers import pass_only_backend
from transformers_configs import DSA_SMALL, v4_config

if Version(transformers.__version__) < Version("5.23"):  # the [test] extra's minimum
    # 5.17 (the GPU box's) runs other decode paths: fewer compiled graphs, no top-k in V4's decode steps
    raise ImportError(f"tests/test_models.py needs transformers >= 5.23 (pip install -e '.[test]'), found "
                      f"{transformers.__version__}")

ATOL = 1e-4      # logits are ~0.5 in magnitude; observed differences <= 3e-7
MARGIN = 1e-5    # top-k boundary gap / row's largest score that rules out a flipped selection
BATCH = 2


def _v4():
    # 40 tokens = 10 compressed entries (ratio 4), top-4 of them; decode stays inside window 11
    return DeepseekV4ForCausalLM(v4_config(index_topk=4, index_n_heads=16, hc_sinkhorn_iters=2)), 40, 2


def _v32():
    cfg = DeepseekV32Config(**(DSA_SMALL | dict(index_n_heads=16, n_group=1, topk_group=1)))
    return DeepseekV32ForCausalLM(cfg), 19, 3


def _glm():
    cfg = GlmMoeDsaConfig(**(DSA_SMALL | dict(index_n_heads=16, n_group=1, topk_group=1,
                                              indexer_types=["full", "full"])))
    return GlmMoeDsaForCausalLM(cfg), 19, 3


MODELS = {"deepseek_v4": (_v4, DeepseekV4Indexer), "deepseek_v32": (_v32, DeepseekV32Indexer),
          "glm_moe_dsa": (_glm, GlmMoeDsaIndexer)}


def _randomise(model):
    """post_init zeroes the V4 compressors' position_bias and the sinks (torch.empty in __init__)
    and the hash routers' token -> expert table: random values, so they take part."""
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, t in list(model.named_parameters()) + list(model.named_buffers()):
            if name.endswith(("position_bias", "sinks")):
                t.copy_(torch.randn(t.shape, generator=g))
            elif name.endswith("tid2eid"):
                n = model.config.n_routed_experts
                t.copy_(torch.stack([torch.randperm(n, generator=g)[:t.shape[1]] for _ in range(t.shape[0])]))


class IndexerScores(TorchFunctionMode):
    """Records the input of every top-k with k = the indexer's (the routers use other k)."""

    def __init__(self, k):
        super().__init__()
        self.k, self.scores = k, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.topk, torch.Tensor.topk) and (args[1] if len(args) > 1 else kwargs.get("k")) == self.k:
            self.scores.append(args[0].detach().clone())
        return func(*args, **kwargs)


def _module_path(node):
    """'model.layers.0.self_attn.indexer': the innermost module of a node, from nn_module_stack."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return None
    path = list(stack.values())[-1][0]
    return ".".join(t for t in re.findall(r"[A-Za-z_]\w*|\d+", path.replace("L['self']", ""))
                    if t != "_modules")


class SwappedModules(CustomGraphPass):
    """Runs the pass and records, per compiled graph, the modules whose top-k it replaced (a top-k
    anchor is replaced when none of its outputs is used any more)."""

    def __init__(self):
        self.inner, self.graphs = with_ours(None), []

    def __call__(self, graph):
        anchors = [n for n in graph.nodes if n.target is torch.ops.aten.topk.default]
        self.inner(graph)
        live = set(graph.nodes)
        self.graphs.append(sorted(_module_path(n) for n in anchors
                                  if n not in live or all(not u.users for u in n.users)))

    def uuid(self):
        return None


def _check_gaps(scores, k):
    """Every row of every recorded indexer call with more than k visible keys has its k-th and
    (k+1)-th scores ``MARGIN`` apart (relative to its largest score); at least one such row."""
    rows_cut = 0
    for s in scores:
        for row in s.reshape(-1, s.shape[-1]).double():
            vis = row[torch.isfinite(row)].sort(descending=True).values
            if vis.numel() <= k:
                continue
            rows_cut += 1
            gap = (vis[k - 1] - vis[k]) / vis.abs().max()
            assert gap > MARGIN, f"top-k boundary gap {gap:.2e}: a near-tie could flip the selection"
    assert rows_cut > 0, "no row has more visible keys than k: the selection would not select"


def _run(model, ids, steps, fn=None):
    """Logits of a prefill of ``ids`` then ``steps`` cached decode steps fed ids[:, :1], ids[:, 1:2], ..."""
    fn = model if fn is None else fn
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        out = [fn(ids, cache=cache, use_cache=True).logits]
        for i in range(steps):
            out.append(fn(ids[:, i:i + 1], cache=cache, use_cache=True).logits)
    return out


@pytest.fixture(scope="module", params=sorted(MODELS))
def run(request):
    build, indexer_cls = MODELS[request.param]
    torch.manual_seed(0)
    model, seq, steps = build()
    model.eval()
    _randomise(model)
    indexers = {name: m for name, m in model.named_modules() if isinstance(m, indexer_cls)}
    ids = torch.randint(0, model.config.vocab_size, (BATCH, seq), generator=torch.Generator().manual_seed(2))
    k = model.config.index_topk
    with IndexerScores(k) as cap:
        eager = _run(model, ids, steps)
    for m in indexers.values():  # the same model selecting every key
        m.index_topk = 10 ** 6
    dense = _run(model, ids, 0)[0]
    for m in indexers.values():
        m.index_topk = k
    torch._dynamo.reset()
    lowering.reset()
    swapped = SwappedModules()
    debug = os.environ.get("INDUCTOR_DSA_DEBUG")
    os.environ["INDUCTOR_DSA_DEBUG"] = "1"  # record the rejections and their reasons
    try:
        compiled = _run(model, ids, steps, torch.compile(model, backend=pass_only_backend(swapped)))
    finally:
        if debug is None:
            del os.environ["INDUCTOR_DSA_DEBUG"]
        else:
            os.environ["INDUCTOR_DSA_DEBUG"] = debug
    return dict(name=request.param, eager=eager, dense=dense, compiled=compiled, scores=cap.scores, k=k,
                indexers=sorted(indexers), swapped=swapped.graphs, report=lowering.report(),
                counters=dict(lowering.counters), steps=steps)


def test_the_selection_is_unambiguous_and_matters(run):
    """The premise of the logits comparison: every indexer call (each layer, prefill and decode)
    has a clear gap at its top-k boundary, and the selection changes the model's output."""
    assert len(run["scores"]) == len(run["indexers"]) * (run["steps"] + 1)
    _check_gaps(run["scores"], run["k"])
    assert (run["dense"] - run["eager"][0]).abs().max() > 100 * ATOL


def test_logits_match_eager(run):
    for step, (want, got) in enumerate(zip(run["eager"], run["compiled"])):
        err = (got - want).abs().max().item()
        assert err <= ATOL, f"{run['name']} step {step}: logits differ from eager by {err:.2e}"


def test_every_indexer_layer_swapped_in_every_graph(run):
    """One indexer_topk per indexer layer in every compiled graph (named by module path); nothing
    else swapped (no sparse_attention: see the module docstring; routers' top-k untouched)."""
    graphs = run["swapped"]
    if run["name"] != "deepseek_v4":  # prefill, one-token decode, decode with a symbolic cache length
        assert len(graphs) == 3, f"{len(graphs)} compilations for a prefill and {run['steps']} decode steps"
    for g in graphs:
        assert g == run["indexers"], g
    assert len(run["report"]) == len(graphs)
    for comp in run["report"]:
        assert [s.pattern for s in comp.swaps] == ["indexer_topk"] * len(run["indexers"])
    assert run["counters"] == {"indexer_topk": len(run["indexers"]) * len(graphs)}


def test_deepseek_v32_left_padded_batch_swaps_with_the_padding_mask_as_data():
    """A batch of prompts of different lengths, left-padded with an ``attention_mask`` (what
    ``generate`` does): transformers' mask is ``(kv_idx <= q_idx) & attention_mask.bool()[b, kv_idx]``,
    a range ANDed with data. The indexers must still swap (the op's ``mask=`` reads the data mask),
    and the logits at the real tokens match eager."""
    torch.manual_seed(0)
    model, seq, _ = _v32()
    model.eval()
    ids = torch.randint(0, model.config.vocab_size, (BATCH, seq), generator=torch.Generator().manual_seed(3))
    pad = 5
    am = torch.ones(BATCH, seq, dtype=torch.long)
    am[0, :pad] = 0
    with torch.no_grad(), IndexerScores(model.config.index_topk) as cap:
        want = model(ids, attention_mask=am, cache=DynamicCache(config=model.config), use_cache=True).logits
    _check_gaps(cap.scores, model.config.index_topk)  # padded queries see no key: skipped
    torch._dynamo.reset()
    lowering.reset()
    swapped = SwappedModules()
    with torch.no_grad():
        got = torch.compile(model, backend=pass_only_backend(swapped))(
            ids, attention_mask=am, cache=DynamicCache(config=model.config), use_cache=True).logits
    indexers = sorted(n for n, m in model.named_modules() if isinstance(m, DeepseekV32Indexer))
    assert swapped.graphs == [indexers], swapped.graphs
    real = am.bool()
    assert (got - want)[real].abs().max() <= ATOL


def test_only_the_routers_are_rejected_and_the_reason_says_why(run):
    """The other top-k in these models are the MoE routers' (V4's hash routers have none): rejected
    because there is no relu(q.k) head sum, not for a mask they do not have."""
    reasons = {r.reason for comp in run["report"] for r in comp.rejections}
    assert reasons == (set() if run["name"] == "deepseek_v4" else {"no weighted sum over heads of relu(q.k)"})
