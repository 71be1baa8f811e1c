"""Tiny configs of transformers' DSA models (random weights), shared by the module and whole-model tests."""
from transformers import DeepseekV4Config

DSA_SMALL = dict(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, q_lora_rank=32,
                 kv_lora_rank=32, qk_rope_head_dim=16, qk_nope_head_dim=16, v_head_dim=16, index_n_heads=4,
                 index_head_dim=32, index_topk=8, n_routed_experts=4, num_experts_per_tok=2,
                 moe_intermediate_size=32, intermediate_size=64, first_k_dense_replace=0,
                 max_position_embeddings=256)


def v4_config(**over):
    """A tiny DeepSeek-V4 config (random weights; index heads 4 x 32, top-8, CSA ratio 4)."""
    kw = dict(vocab_size=256, hidden_size=64, moe_intermediate_size=32, num_hidden_layers=2, num_attention_heads=4,
              head_dim=32, q_lora_rank=32, num_experts_per_tok=2, n_routed_experts=4,
              layer_types=["compressed_sparse_attention", "compressed_sparse_attention"],
              compress_rates={"compressed_sparse_attention": 4, "heavily_compressed_attention": 8}, hc_mult=2,
              sliding_window=16, o_groups=2, o_lora_rank=32, index_n_heads=4, index_head_dim=32, index_topk=8,
              num_nextn_predict_layers=0, qk_rope_head_dim=16, max_position_embeddings=256)
    return DeepseekV4Config(**(kw | over))
