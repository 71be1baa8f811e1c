"""The V4 attention example runs on the CPU-small config, passes its checks and swaps the indexer.

Skips the default-torch.compile variant (--skip-default) to stay under a minute on a small CPU;
the full example (eager / default compile / inductor_dsa) is `python examples/deepseek_v4_attention.py`.
"""
import importlib.util
import pathlib

import torch

EXAMPLE = pathlib.Path(__file__).resolve().parents[1] / "examples" / "deepseek_v4_attention.py"


def test_v4_attention_example(capsys):
    spec = importlib.util.spec_from_file_location("deepseek_v4_attention", EXAMPLE)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    torch._dynamo.reset()
    rc = mod.main(["--device", "cpu", "--skip-default", "--iters", "1"])
    out = capsys.readouterr().out
    assert rc == 0, out
    assert "swapped indexer_topk -> torch.ops.inductor_dsa.indexer_topk" in out, out
    assert "[v4] PASS" in out, out
