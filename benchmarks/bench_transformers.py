"""transformers' own DSA indexer modules (DeepSeek-V3.2, GLM-MoE-DSA) at DeepSeek-V3.2 size: eager,
default torch.compile and torch.compile with our backend, the same module and inputs (issue 22).

    python benchmarks/bench_transformers.py [--smoke] [--seq 8192 32768] [--out results.json]

The module is the installed package's class (never a copy), with DeepSeek-V3.2's sizes: hidden
7168, q_lora_rank 1536, 64 index heads of 128, top-2048, rope 64, bf16 weights, batch 1, no cache,
a bool causal mask [1, S, S] as the model passes it. One call = the whole forward (projections,
rope, scores, mask, top-k). Times: median ms of plain calls (do_bench; the calls are milliseconds
long, so launch overhead is noise). "swapped" is our pass's count of replaced indexers.
Checks: "rows_differing", the share of rows whose top-k set differs from default compile's (with
random weights many scores are exactly 0 -- every head's relu zero -- so sets differ among exact
ties; a tie-blind count), and "shortfall" (where eager runs), the worst gap between eager's k-th
score and the lowest score our top-k selected, relative to the row's largest: 0 means our set is
a top-k of eager's own fp32 scores ("compile_shortfall": default compile's, the yardstick: Inductor
computes the rope in fp32 without eager's bf16 rounding after each op, so its scores differ from
eager's at the bf16 level too). Floor: the scores'
2*S*S/2*H*D causal flops at the bf16 dense peak (common.CEILINGS), the projections excluded.
Eager and default compile materialise [S, H, S] fp32 scores (17 GB at S=8192, 275 GB at 32768):
an out-of-memory is reported as such. ``--smoke``: tiny sizes on the CPU (checks the script only).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from common import CEILINGS, DEVICE, env_line, table, time_ms, write_json  # noqa: E402
import inductor_dsa  # noqa: E402

MODELS = ("deepseek_v32", "glm_moe_dsa")


def indexer(model: str, smoke: bool):
    """(module, config) of the installed transformers indexer class at V3.2 size (tiny if smoke)."""
    if model == "deepseek_v32":
        from transformers import DeepseekV32Config as Config
        from transformers.models.deepseek_v32.modeling_deepseek_v32 import DeepseekV32Indexer as Indexer
    else:
        from transformers import GlmMoeDsaConfig as Config
        from transformers.models.glm_moe_dsa.modeling_glm_moe_dsa import GlmMoeDsaIndexer as Indexer
    size = (dict(hidden_size=64, q_lora_rank=32, index_n_heads=4, index_head_dim=32, index_topk=8, qk_rope_head_dim=16)
            if smoke else dict(hidden_size=7168, q_lora_rank=1536, index_n_heads=64, index_head_dim=128,
                               index_topk=2048, qk_rope_head_dim=64))
    cfg = Config(**size)
    dtype = torch.float32 if smoke else torch.bfloat16
    return Indexer(cfg, 0).eval().to(DEVICE, dtype), cfg


def inputs(cfg, s: int, dtype):
    g = torch.Generator().manual_seed(0)
    dev = lambda x: x.to(DEVICE, dtype)
    hidden = dev(torch.randn(1, s, cfg.hidden_size, generator=g))
    q_resid = dev(torch.randn(1, s, cfg.q_lora_rank, generator=g))
    angle = torch.arange(s)[:, None] * torch.rand(cfg.qk_rope_head_dim // 2, generator=g)[None]
    cos, sin = (dev(f(torch.cat([angle, angle], -1))[None]) for f in (torch.cos, torch.sin))
    mask = torch.ones(s, s, dtype=torch.bool).tril()[None].to(DEVICE)
    return hidden, q_resid, (cos, sin), mask, torch.arange(s, device=DEVICE)[None]


def _timed(fn):
    """(ms, output) of fn, or (None, reason) on an out-of-memory."""
    try:
        out = fn()
        return time_ms(fn, warmup=3, rep=20), out
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None, "out of memory"


class _TopkInput(torch.overrides.TorchFunctionMode):
    """Keeps the scores the module hands to ``topk`` (eager's fp32 index scores)."""
    scores = None

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in (torch.topk, torch.Tensor.topk):
            self.scores = args[0]
        return func(*args, **(kwargs or {}))


def _shortfall(indices, scores, k: int) -> float:
    """Worst (eager's k-th score - the lowest score a row selected) / the row's largest |score|,
    over rows with at least k visible keys: 0 = every selected key scores at least eager's k-th
    (the same set up to ties), a few 1e-7 = fp32 rounding at the boundary."""
    s = scores.reshape(-1, scores.shape[-1]).float()
    idx = indices.reshape(-1, indices.shape[-1]).long()
    full = torch.isfinite(s).sum(-1) >= k
    s, idx = s[full], idx[full]
    kth = s.topk(k, -1).values[:, -1]
    low = s.gather(1, idx).min(-1).values
    top = s.masked_fill(~torch.isfinite(s), 0).abs().amax(-1).clamp(min=1e-30)
    return ((kth - low) / top).clamp(min=0).max().item()


def _differing_rows(a, b) -> float:
    """Share of rows whose top-k index sets differ."""
    a, b = a.reshape(-1, a.shape[-1]).sort(-1).values, b.reshape(-1, b.shape[-1]).sort(-1).values
    return (a != b).any(-1).float().mean().item()


def run_case(model: str, s: int, smoke: bool) -> dict:
    torch._dynamo.reset()
    torch._inductor.config.force_disable_caches = True  # a cache hit would not run (or report) the pass
    m, cfg = indexer(model, smoke)
    args = inputs(cfg, s, next(m.parameters()).dtype)
    call = lambda f: (lambda: f(*args))
    with torch.no_grad():
        eager_ms, _ = _timed(call(m))
        scores = None
        if eager_ms is not None:
            with _TopkInput() as cap:
                m(*args)
            scores = cap.scores
        default = torch.compile(m)
        compile_ms, ref = _timed(call(default))
        inductor_dsa.lowering.reset()
        ours = torch.compile(m, backend=inductor_dsa.backend)
        ours_ms, out = _timed(call(ours))
    rep = inductor_dsa.report()
    for r in rep.rejections:
        print(f"  {model} S={s}: {r}")
    h, d = cfg.index_n_heads, cfg.index_head_dim
    floor_ms = 2 * s * s / 2 * h * d / (CEILINGS["bf16_tflops"] * 1e12) * 1e3
    row = dict(model=model, S=s, eager_ms=eager_ms, compile_ms=compile_ms, ours_ms=ours_ms,
               vs_compile=compile_ms / ours_ms if compile_ms and ours_ms else None, floor_ms=floor_ms,
               swapped=len(rep.swaps))
    if isinstance(ref, torch.Tensor) and isinstance(out, torch.Tensor):
        row["rows_differing"] = _differing_rows(out, ref)
    if scores is not None:
        for name, x in (("shortfall", out), ("compile_shortfall", ref)):
            if isinstance(x, torch.Tensor):
                row[name] = _shortfall(x, scores, x.shape[-1])
    return row


COLS = ["model", "S", "eager_ms", "compile_ms", "ours_ms", "vs_compile", "floor_ms", "swapped", "rows_differing",
        "shortfall", "compile_shortfall"]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smoke", action="store_true", help="tiny sizes (CPU, Triton's interpreter)")
    ap.add_argument("--seq", type=int, nargs="+", default=[8192, 32768])
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--out", help="write the rows as JSON here")
    args = ap.parse_args(argv)
    smoke = args.smoke or DEVICE == "cpu"
    seqs = [40] if smoke else args.seq
    print(f"# transformers indexers: {env_line()}", flush=True)
    rows = []
    for model in args.models:
        for s in seqs:
            rows.append(run_case(model, s, smoke))
            print(rows[-1], flush=True)
    print(table(rows, COLS))
    write_json(args.out, dict(env=env_line(), rows=rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
