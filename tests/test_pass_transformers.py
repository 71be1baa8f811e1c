"""transformers' own DSA indexer modules (the installed package, never copies) under the backend:
swapped for the fused op, top-k checked against the float64 oracle of the same module."""
import pytest
import torch
from transformers import DeepseekV32Config, GlmMoeDsaConfig
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Indexer
from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer, DeepseekV32RotaryEmbedding
from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaIndexer, GlmMoeDsaRotaryEmbedding

from inductor_dsa import lowering
from pass_helpers import check_topk, compile_run, oracle
from transformers_configs import DSA_SMALL, v4_config


def _indexer_call(m, hidden, q_residual, position_ids):
    return m(hidden, q_residual, position_ids, None, 0)


def test_deepseek_v4_indexer_swaps_and_matches_the_oracle():
    torch.manual_seed(0)
    cfg = v4_config()
    m = DeepseekV4Indexer(cfg).eval()
    with torch.no_grad():
        m.position_bias.normal_()  # torch.empty in __init__ (the model's init fills it)
    s = 41  # 10 compressed keys, one position past the last window
    args = (m, torch.randn(1, s, cfg.hidden_size), torch.randn(1, s, cfg.q_lora_rank), torch.arange(s)[None])
    out, counts = compile_run(_indexer_call, args)
    assert counts == {"indexer_topk": 1}, counts
    _, (logits64,) = oracle(_indexer_call, args)
    check_topk(out, logits64, cfg.index_topk, post=True)


# ---- DeepSeek-V3.2 / GLM-MoE-DSA: relu(q @ k^T * scale), head sum as matmul(w.unsqueeze(-2), scores),
# int32 indices, the causal mask given to the module as a tensor
MODULES = {"deepseek_v32": (DeepseekV32Config, DeepseekV32Indexer, DeepseekV32RotaryEmbedding),
           "glm_moe_dsa": (GlmMoeDsaConfig, GlmMoeDsaIndexer, GlmMoeDsaRotaryEmbedding)}


def _dsa_args(name, s=19, seed=0):
    config_cls, indexer_cls, rope_cls = MODULES[name]
    torch.manual_seed(seed)
    cfg = config_cls(**DSA_SMALL)
    m = indexer_cls(cfg, 0).eval()
    hidden, q_resid, pos = torch.randn(1, s, cfg.hidden_size), torch.randn(1, s, cfg.q_lora_rank), torch.arange(s)[None]
    cos, sin = rope_cls(cfg)(hidden, pos)
    return cfg, (m, hidden, q_resid, cos, sin, pos)


def _causal_in_graph(m, hidden, q_resid, cos, sin, pos):
    """The causal mask built from one arange inside the compiled code (as a model's mask code does)."""
    i = torch.arange(hidden.shape[1], device=hidden.device)
    return m(hidden, q_resid, (cos, sin), (i[:, None] >= i[None, :])[None], pos)


def _bool_mask_input(m, hidden, q_resid, cos, sin, pos, mask):
    return m(hidden, q_resid, (cos, sin), mask, pos)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_v32_glm_indexer_swaps_and_matches_the_oracle(name):
    cfg, args = _dsa_args(name)
    out, counts = compile_run(_causal_in_graph, args)
    assert counts == {"indexer_topk": 1}, counts
    assert out.dtype == torch.int32 and out.shape == (1, 19, cfg.index_topk)
    _, (logits64,) = oracle(_causal_in_graph, args)
    check_topk(out, logits64, cfg.index_topk)


@pytest.mark.parametrize("name", sorted(MODULES))
def test_v32_glm_bf16_indexer_reads_q_k_under_their_upcasts(name):
    """A bf16 module computes matmul(q.float(), k.float()): the op takes the bf16 q and k (exact
    products, fp32 accumulation, the matrix units) rather than fp32 copies of them."""
    cfg, args = _dsa_args(name)
    args = (args[0].to(torch.bfloat16),) + tuple(a.to(torch.bfloat16) if a.is_floating_point() else a
                                                 for a in args[1:])
    out, counts = compile_run(_causal_in_graph, args)
    assert counts == {"indexer_topk": 1}, counts
    (swap,) = lowering.report().swaps
    q_line, k_line = (ln for ln in swap.region.split("\n") if ln.startswith(("  q ", "  k ")))
    assert " bfloat16 -> " in q_line and " bfloat16 -> " in k_line, swap.region
    _, (logits64,) = oracle(_causal_in_graph, args)
    check_topk(out, logits64, cfg.index_topk)


def _causal_padding_mask(s, seed, additive):
    """A random causal-plus-padding mask as transformers' mask utilities give it: [1, S, S], bool
    (True = visible) or additive float (0 visible, -inf or finfo.min hidden, some finite biases)."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.ones(s, s, dtype=torch.bool).tril() & (torch.rand(1, s, generator=g) > 0.3)  # left padding too
    keep[torch.arange(s), torch.arange(s)] = True  # every row sees itself
    if not additive:
        return keep[None]
    bias = torch.randn(s, s, generator=g) * (torch.rand(s, s, generator=g) < 0.2)  # a few finite biases
    fill = float("-inf") if additive == "inf" else torch.finfo(torch.float32).min
    return bias.masked_fill(~keep, fill)[None]


@pytest.mark.parametrize("additive", [False, "inf", "finfo"])
@pytest.mark.parametrize("name", sorted(MODULES))
def test_v32_glm_indexer_data_mask_swaps_and_matches_the_oracle(name, additive):
    """The causal mask passed in as data (bool masked_fill(~mask, -inf), or additive scores + mask):
    passed to the op's mask=, top-k checked against the float64 oracle of the same module."""
    s = 13
    cfg, args = _dsa_args(name, s=s)
    mask = _causal_padding_mask(s, seed=len(name), additive=additive)
    out, counts = compile_run(_bool_mask_input, args + (mask,))
    assert counts == {"indexer_topk": 1}, counts
    assert out.dtype == torch.int32 and out.shape == (1, s, cfg.index_topk)
    (swap,) = lowering.report().swaps
    assert "mask    data [1, r0, j0]" in swap.region, swap.region
    _, (logits64,) = oracle(_bool_mask_input, args + (mask,))
    check_topk(out, logits64, cfg.index_topk)


@pytest.mark.parametrize("additive", [False, "inf"])
def test_v32_indexer_batched_data_mask(additive):
    """Batch 2 (a per-batch key: one op call per batch), each request with its own mask [B, S, S]."""
    s = 13
    cfg, (m, *_) = _dsa_args("deepseek_v32", s=s)
    hidden, q_resid = torch.randn(2, s, cfg.hidden_size), torch.randn(2, s, cfg.q_lora_rank)
    pos = torch.arange(s)[None].expand(2, s)
    cos, sin = DeepseekV32RotaryEmbedding(cfg)(hidden, pos)
    mask = torch.cat([_causal_padding_mask(s, seed, additive) for seed in (1, 2)])
    args = (m, hidden, q_resid, cos, sin, pos, mask)
    out, counts = compile_run(_bool_mask_input, args)
    assert counts == {"indexer_topk": 1}, counts
    (swap,) = lowering.report().swaps
    assert "mask    data [b0, r0, j0]" in swap.region and "one call per batch" in swap.region, swap.region
    _, (logits64,) = oracle(_bool_mask_input, args)
    check_topk(out, logits64, cfg.index_topk)
