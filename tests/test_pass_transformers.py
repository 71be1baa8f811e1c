"""transformers' own DSA indexer modules (the installed package, never copies) under the backend:
swapped for the fused op, top-k checked against the float64 oracle of the same module."""
import torch
from transformers import DeepseekV4Config
from transformers.models.deepseek_v4.modeling_deepseek_v4 import DeepseekV4Indexer

from pass_helpers import check_topk, compile_run, oracle


def v4_config(**over):
    """A tiny DeepSeek-V4 config (random weights; index heads 4 x 32, top-8, CSA ratio 4)."""
    kw = dict(vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              head_dim=32, q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=4,
              layer_types=["compressed_sparse_attention", "compressed_sparse_attention"],
              compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, hc_mult=2,
              sliding_window=16, o_groups=2, o_lora_rank=32, index_n_heads=4, index_head_dim=32, index_topk=8,
              num_nextn_predict_layers=0, qk_rope_head_dim=16, max_position_embeddings=256)
    return DeepseekV4Config(**(kw | over))


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
