"""Triton kernels, their launchers and per-target configs (gfx942, sm90)."""


def aot_variants(target: str):
    """Every shipped (kernel, config) for ``target``, for ``python -m inductor_dsa.aot``."""
    from . import launch
    yield from launch.aot_variants(target)
    yield from launch.sparse_attention_aot_variants(target)
    from . import paged_launch
    yield from paged_launch.aot_variants(target)
