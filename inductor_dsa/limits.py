"""Size limits of the fused ops, in one place: the input checks (``checks.py``), the pattern
recognisers (``patterns/``) and, later, the kernels read them from here."""

HEAD_DIM_MIN = 16      # head_dim: a power of two in [HEAD_DIM_MIN, HEAD_DIM_MAX]
HEAD_DIM_MAX = 512
MAX_HEADS = 256        # heads per op call: [1, MAX_HEADS]
TOPK_FUSED_MAX = 2048  # larger top-k: the logits kernel, then a device sort (ops.py)


def head_dim_ok(d: int) -> bool:
    """Whether ``d`` is a head_dim the kernels take (a power of two in the range above)."""
    return HEAD_DIM_MIN <= d <= HEAD_DIM_MAX and not d & (d - 1)
