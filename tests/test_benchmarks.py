"""benchmarks/run.py end to end on the CPU (--quick --cpu-smoke): every benchmark runs one tiny
case under Triton's interpreter in its own process, and the summary, JSON and status are written.

This keeps the benchmark scripts working code (the GPU numbers come from `python benchmarks/run.py`
on a GPU); it checks that they run, check their results against the oracles and report the pass's
swaps, not their speed.
"""
import csv
import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest
import torch

ROOT = pathlib.Path(__file__).resolve().parents[1]
EXPECTED = {"pass", "indexer", "paged_indexer", "sparse_attention", "select", "host"}
# sparse attention rows report max |out - fp64 oracle|: a bf16 output of |values| < 8 rounds by
# at most 2**-6; anything above that is a wrong result, not rounding
MAX_ERR = 2**-6


def check_ok(check: str) -> bool:
    """A row's check passed: "ok", or "max err E" with E <= MAX_ERR (NaN fails)."""
    if check.startswith("max err "):
        return float(check.split()[-1]) <= MAX_ERR
    return check == "ok"


def test_check_ok_threshold():
    assert check_ok("ok") and check_ok("max err 0.0039") and check_ok("max err 1.2e-05")
    assert not any(map(check_ok, ["max err 0.5", "max err nan", "max err inf", "FAIL", ""]))


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
            assert check_ok(r["check"]), r
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


def test_ceilings_are_measured_not_hard_coded():
    """Floors use measured ceilings only: no recorded fp8 number (it was never measured), and
    measure_ceilings returns what it timed, not a copy of a constant. (Read with ast: importing
    benchmarks/common.py would set its environment defaults in this process.)"""
    import ast
    tree = ast.parse((ROOT / "benchmarks" / "common.py").read_text())
    top = {n.targets[0].id: n for n in tree.body if isinstance(n, ast.Assign) and isinstance(n.targets[0], ast.Name)}
    assert set(ast.literal_eval(top["CEILINGS"].value)) == {"bf16_tflops", "copy_tbps"}
    (fn,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "measure_ceilings"]
    assert "CEILINGS" not in {n.id for n in ast.walk(fn) if isinstance(n, ast.Name)}


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


def _ncu_row(addr, src, samples, reason):
    return [hex(addr), src, str(samples), str(samples), str(samples)] + [str(samples if r == reason else 0)
                                                                         for r in ("barrier", "long_sb", "wait")]


def test_ncu_stall_summary_splits_the_main_loop(tmp_path):
    """benchmarks/ncu_profile.py stalls: prologue / loop phases / after, from a synthetic source export."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import ncu_profile
    header = ["Address", "Source", ncu_profile.SAMPLES, "Warp Stall Sampling (Not-issued Samples)", "# Samples",
              "stall_barrier", "stall_long_sb", "stall_wait"]
    rows = [_ncu_row(0x100, "LDG.E.U16 R1, desc[UR4][R2.64]", 7, "long_sb"),
            _ncu_row(0x110, "LDS.128 R4, [R5]", 3, "wait"),            # loop start (branch target)
            _ncu_row(0x120, "WARPGROUP.ARRIVE", 2, "wait"),
            _ncu_row(0x130, "WARPGROUP.DEPBAR.LE gsb0, 0x0", 11, "barrier"),
            _ncu_row(0x140, "BAR.SYNC.DEFER_BLOCKING 0x0", 5, "barrier"),
            _ncu_row(0x150, "@!P0 BRA 0x110", 1, "wait"),
            _ncu_row(0x160, "EXIT", 1, "wait")]
    path = tmp_path / "r.csv"
    with open(path, "w", newline="") as f:
        f.write('"Kernel Name","k",\n')
        csv.writer(f).writerows([header] + rows)
    s = ncu_profile.summarise(str(path), top=2)
    assert s["total"] == 30 and s["loop"] == (0x110, 0x150)
    assert s["regions"] == {"prologue": 7, "loop: loads and decode": 3, "loop: MMA wait": 13, "loop: epilogue": 6,
                            "after": 1}
    assert s["reasons"]["barrier"] == 16 and s["top"][0] == (11, "WARPGROUP.DEPBAR.LE gsb0, 0x0", "barrier")


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke (Triton interpreter)")
@pytest.mark.parametrize("args", [["paged", "2", "256", "16"], ["select", "5", "300", "8"]])
def test_ncu_profile_case_runs(args):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "ncu_profile.py"), "case", *args, "--calls", "1"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    assert f"{args[0]} {args[1]} {args[2]} top-{args[3]}: 1 calls, output" in p.stdout
