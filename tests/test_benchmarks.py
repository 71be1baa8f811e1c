"""benchmarks/run.py end to end on the CPU (--quick --cpu-smoke): every benchmark runs one tiny
case under Triton's interpreter in its own process, and the summary, JSON and status are written.

This keeps the benchmark scripts working code (the GPU numbers come from `python benchmarks/run.py`
on a GPU); it checks that they run, check their results against the oracles and report the pass's
swaps, not their speed.
"""
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXPECTED = {"pass", "indexer", "paged_indexer", "sparse_attention"}


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke (Triton interpreter); on a GPU run benchmarks/run.py itself")
def test_run_all_benchmarks_cpu_smoke(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "run.py"), "--quick", "--cpu-smoke",
                        "--out", str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    assert p.returncode == 0, out
    res = json.loads((tmp_path / "results.json").read_text())
    assert res["mode"] == "smoke" and res["failed"] == [], out
    assert {n for n, b in res["benches"].items() if b["status"] == "ok"} == EXPECTED, res["benches"]
    assert "v4_example" not in res["benches"]  # opt-in (--with-example); tests/test_example.py runs it
    rows = res["rows"]
    assert {r["bench"] for r in rows if r.get("ours_ms")} == EXPECTED
    for r in rows:  # every primary row timed ours and eager, and its check passed
        if r.get("eager_ms") is not None:
            assert r["ours_ms"] > 0 and r["eager_ms"] > 0, r
            assert r["check"] == "ok" or r["check"].startswith("max err"), r
    # the pass benchmark compiled both ways; ours swapped the indexer in prefill and the paged
    # indexer in decode (the whole gather + MXFP4 chain), default none
    pass_rows = res["raw"]["pass"]["rows"]
    ours = [r for r in pass_rows if r["impl"].startswith("ours")]
    default = [r for r in pass_rows if r["impl"] == "torch.compile default"]
    assert len(ours) == len(default) == 2
    want = {"prefill": "indexer_topk", "decode": "paged_indexer_topk"}
    assert all(r["swaps"].get(want[r["case"].split()[0]], 0) >= 1 and r["check"] == "ok" for r in ours), ours
    assert all(r["swaps"] == {} and r["compile_s"] > 0 for r in default), default
    assert all("compile_overhead" in r for r in ours)
    assert "bench" in out and "ours_ms" in out  # the table was printed
    assert (tmp_path / "summary.png").exists() or "matplotlib is not installed" in out


def _run_py(*args, **popen):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.Popen([sys.executable, str(ROOT / "benchmarks" / "run.py"), *args], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **popen)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message on a machine without a GPU")
def test_run_without_gpu_points_to_cpu_smoke(tmp_path):
    p = _run_py("--out", str(tmp_path))
    out, _ = p.communicate(timeout=300)
    assert p.returncode == 2 and "--cpu-smoke" in out, out


def test_ctrl_c_ends_the_running_benchmark(tmp_path):
    """SIGINT to run.py (what Ctrl-C sends) ends the benchmark it runs, although that one is in its
    own process group (where the terminal's Ctrl-C does not reach it)."""
    p = _run_py("--quick", "--cpu-smoke", "--only", "pass", "--out", str(tmp_path))
    lines = []
    for line in p.stdout:
        lines.append(line)
        if "(limit" in line and "pid" in line:
            break
    child = int(lines[-1].rsplit("pid ", 1)[1].split(")")[0])
    os.kill(child, 0)  # running
    p.send_signal(signal.SIGINT)
    out = "".join(lines) + p.communicate(timeout=120)[0]
    assert p.returncode == 130 and "interrupted during pass" in out, out
    with pytest.raises(ProcessLookupError):
        os.kill(child, 0)
