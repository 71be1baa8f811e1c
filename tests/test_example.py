"""The V4 attention example (prefill + paged-cache decode) runs on the CPU-small config, passes its
checks and swaps the indexer.

Runs the example in a subprocess WITHOUT TRITON_INTERPRET (conftest sets it for the kernel tests;
under the interpreter the example's indexer would take minutes on a CPU), so on a CPU the
inductor_dsa ops run their fp64 reference: this tests the example and the graph pass, not the
Triton kernels (the kernel tests do that). Skips the default-torch.compile variant
(--skip-default) to stay under a minute; `python examples/deepseek_v4_attention.py` runs all three.
"""
import os
import pathlib
import subprocess
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_v4_attention_example():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = str(ROOT)  # this checkout's inductor_dsa, not an installed one
    args = ["--skip-default", "--iters", "1", "--sweep", "none"]
    if not torch.cuda.is_available():
        args += ["--device", "cpu"]
    p = subprocess.run([sys.executable, str(ROOT / "examples" / "deepseek_v4_attention.py"), *args],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    assert "swapped indexer_topk -> torch.ops.inductor_dsa.indexer_topk" in out, out
    assert "[v4] decode step 1/" in out, out  # decode ran on the paged MXFP4 cache, its checks in PASS
    assert "[v4] PASS" in out, out
