"""Triton kernels, their launchers and per-target configs (gfx942, sm90)."""


def config_variants(target: str):
    """(family, config, AOT variants) of every shipped config and autotuning candidate of ``target``;
    config None: each operand format's shipped logits config."""
    from . import attention_launch, configs, indexer_launch, paged_launch
    families = (("indexer_logits", configs.INDEXER_LOGITS, indexer_launch.logits_aot_variants),
                ("select", configs.SELECT, indexer_launch.select_aot_variants),
                ("sparse_attention", configs.SPARSE_ATTENTION, attention_launch.sparse_attention_aot_variants),
                ("paged", configs.PAGED, paged_launch.aot_variants))
    for family, table, variants in families:
        shipped = None if family == "indexer_logits" else table[target]
        for cfg in [shipped] + [c for c in configs.CANDIDATES[family][target] if c != shipped]:
            yield family, cfg, variants(target, cfg)


def aot_variants(target: str):
    """Every shipped (kernel, config) for ``target``, then every autotuning candidate's, each
    distinct compile once (``python -m inductor_dsa.aot``); a candidate's name ends in its difference
    from the shipped config (logits candidates, which serve every operand format: in all its fields)."""
    from . import configs
    SHIPPED = {"select": configs.SELECT, "paged": configs.PAGED, "sparse_attention": configs.SPARSE_ATTENTION}
    seen = set()
    for family, cfg, variants in config_variants(target):
        shipped = SHIPPED[family][target] if family in SHIPPED else None  # logits: per format
        tag = "" if cfg is None or cfg == shipped else f" ({configs.describe(cfg, shipped)})"
        for name, fn, sig, consts, opts, spec in variants:
            key = compile_key(name, sig, consts, opts, spec)
            if key not in seen:
                seen.add(key)
                yield name + tag, fn, sig, consts, opts, spec


def compile_key(name, sig, consts, opts, spec) -> str:
    """What one AOT compile depends on (candidates differing only in launch-side fields share it)."""
    return repr((name, sig, consts, opts, spec))
