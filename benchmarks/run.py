"""Every kernel and pass benchmark in one command: one table, one JSON file, one PNG.

    python benchmarks/run.py --out bench_out            # GPU: sized for ~8 minutes on one H200
    python benchmarks/run.py --quick --out bench_out    # GPU: fewer cases, no torch.compile baselines
                                                        #      in the kernel benchmarks (~3 min)
    python benchmarks/run.py --quick --cpu-smoke --out d  # CPU: tiny sizes under Triton's interpreter
                                                        #      (what tests/test_benchmarks.py runs)

Each benchmark (bench_pass, bench_indexer, bench_paged_indexer, bench_sparse_attention, bench_select,
bench_host; the V4
example only with --with-example) runs in its own process with a time limit, most important first:
a crash, a CUDA device-side assert or a timeout is recorded as that benchmark's error and the
others still run. Everything stops at --budget seconds. Writes into DIR:
  results.json   environment, each benchmark's status / seconds / error, the table's rows and
                 each benchmark's own JSON
  <name>.json    what the benchmark wrote; <name>.log its output
  summary.png    speedup of ours over default torch.compile and over eager (needs matplotlib;
                 without it the run says so and writes no PNG)
Table: per case, ours (each variant of ours on its own line), eager and default torch.compile
milliseconds on the same inputs in the same process, the floor where the benchmark computes one
(see each benchmark's docstring), and its correctness check.
Exit status 1 if any benchmark failed (its results are still written); 2 without a GPU unless
--cpu-smoke; 130 on Ctrl-C, which also ends the running benchmark (its whole process group).
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def bench(name, script, full, quick, smoke, budget_s, optional=False):
    return dict(name=name, script=script, args={"full": full, "quick": quick, "smoke": smoke}, budget_s=budget_s,
                optional=optional)


BENCHES = [  # most important first; arguments per mode (None: not run in that mode)
    bench("pass", "benchmarks/bench_pass.py", [], ["--quick"], ["--smoke"], 200),
    bench("indexer", "benchmarks/bench_indexer.py", [], ["--quick"], ["--smoke"], 120),
    bench("paged_indexer", "benchmarks/bench_paged_indexer.py", ["--quick"], ["--quick", "--no-compile"],
          ["--smoke", "--no-compile"], 100),
    bench("sparse_attention", "benchmarks/bench_sparse_attention.py", [], ["--cases", "prefill", "--no-compile"],
          ["--smoke"], 100),
    bench("select", "benchmarks/bench_select.py", [], ["--no-fused"], ["--smoke"], 100),
    bench("host", "benchmarks/bench_host.py", [], ["--quick"], ["--smoke"], 100),
    # the V4 block example compiles a 3-layer block and a decode step twice at V4-Flash sizes:
    # minutes, so only with --with-example or --only v4_example
    bench("v4_example", "examples/deepseek_v4_attention.py", ["--sweep", "none", "--iters", "5"],
          ["--sweep", "none", "--iters", "3", "--skip-default"], None, 400, optional=True),
]
MIN_START_S = 30  # do not start a benchmark with less time than this left


def env_info(smoke: bool) -> dict:
    """GPU name and versions, read in a child process (this one never initialises CUDA)."""
    code = ("import json, platform, torch, triton; c = torch.cuda.is_available(); print(json.dumps(dict("
            "gpu=c, device=torch.cuda.get_device_name() if c else (platform.processor() or 'cpu'), "
            "torch=torch.__version__, triton=triton.__version__, cuda=torch.version.cuda, hip=torch.version.hip)))")
    try:
        out = subprocess.run([sys.executable, "-c", code], env=child_env(smoke), capture_output=True, text=True,
                             timeout=120, cwd=ROOT)
        info = json.loads(out.stdout.strip().splitlines()[-1])
    except Exception as e:  # noqa: BLE001 - the run goes on without it
        info = dict(device="unknown", error=f"{type(e).__name__}: {e}")
    info.update(python=platform.python_version(), host=platform.node())
    return info


def child_env(smoke: bool) -> dict:
    env = dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))
    if smoke:
        env.update(CUDA_VISIBLE_DEVICES="", TRITON_INTERPRET="1")
    return env


def run_one(spec, mode, out_dir: Path, deadline: float, smoke: bool) -> dict:
    """Run one benchmark in its own process group; returns its status record."""
    args = spec["args"][mode]
    name = spec["name"]
    left = deadline - time.time()
    if args is None:
        return dict(status="skipped", error=f"not run in {mode} mode")
    if left < MIN_START_S:
        return dict(status="skipped", error=f"time budget spent ({left:.0f} s left)")
    limit = min(spec["budget_s"], left)
    json_path, log_path = out_dir / f"{name}.json", out_dir / f"{name}.log"
    json_path.unlink(missing_ok=True)
    cmd = [sys.executable, str(ROOT / spec["script"]), *args, "--out", str(json_path)]
    t0 = time.time()
    with open(log_path, "w") as log:
        # its own process group (no terminal signals): ended as a whole, compile workers included
        p = subprocess.Popen(cmd, cwd=ROOT, env=child_env(smoke), stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        try:
            print(f"[run] {name}: {' '.join(cmd[1:])} (limit {limit:.0f} s, pid {p.pid})", flush=True)
            rc, status = p.wait(timeout=limit), None
        except subprocess.TimeoutExpired:
            rc, status = end_group(p), "timeout"
        except KeyboardInterrupt:
            end_group(p)
            raise
    rec = dict(seconds=round(time.time() - t0, 1), rc=rc, log=log_path.name, command=" ".join(cmd[1:]))
    tail = log_path.read_text(errors="replace").strip().splitlines()[-12:]
    if status is None and rc == 0 and json_path.exists():
        rec.update(status="ok", json=json_path.name)
    else:
        rec.update(status=status or "error", error=f"exit {rc}" if status is None else f"killed after {limit:.0f} s",
                   log_tail=tail)
        if json_path.exists():  # partial results, if the benchmark wrote any
            rec["json"] = json_path.name
    print(f"[run] {name}: {rec['status']} in {rec['seconds']} s" +
          ("" if rec["status"] == "ok" else "\n    " + "\n    ".join(tail)), flush=True)
    return rec


def end_group(p: subprocess.Popen) -> int:
    os.killpg(p.pid, signal.SIGKILL)
    return p.wait()


# ---- reading the benchmarks' own JSON into one table -------------------------------------------
def role(impl: str) -> str:
    """'ours' | 'eager' | 'compile' for an implementation label of any benchmark."""
    low = impl.lower()
    if low.startswith("eager"):
        return "eager"
    if "compile" in low and "inductor_dsa" not in low:
        return "compile"
    return "ours"


def raw_rows(name: str, data: dict) -> list[dict]:
    """(case, impl, ms, floor_ms, check, note) rows out of one benchmark's JSON."""
    if name == "v4_example":
        return [dict(case=f"V4 block {t['stage']} (S={data['cfg']['seq']})", impl=t["variant"], ms=t["ms"],
                     check="ok" if data["ok"] else "FAIL",
                     note=f"swaps prefill {data['prefill_swaps']}, decode {data['decode_swaps']}")
                for t in data["times"]]
    out = []
    for r in data.get("rows", data.get("results", [])):
        if "ms" not in r:
            out.append(dict(case=r.get("case", "?"), impl=r.get("impl", "?"), note=r.get("skipped", "")))
            continue
        check = r.get("check", "")
        if "max_err_vs_fp64" in r:
            check = f"max err {r['max_err_vs_fp64']:.2g}"
        note = ""
        if "swaps" in r:
            note = f"swaps {r['swaps'] or 'none'}"
            if "compile_overhead" in r:
                note += f", compile {r['compile_overhead']:+.0%}"
        out.append(dict(case=r["case"], impl=r["impl"], ms=r["ms"], floor_ms=r.get("floor_ms", r.get("floor ms")),
                        check=check, note=note))
    return out


def summary_rows(results: dict) -> list[dict]:
    """One line per (benchmark, case, variant of ours); eager / compile on the case's first line."""
    rows = []
    for name, rec in results.items():
        if rec.get("status") != "ok" and not rec.get("data"):
            rows.append(dict(bench=name, case=f"{rec['status'].upper()}: {rec.get('error', '')}"))
            continue
        cases: dict = {}
        for r in raw_rows(name, rec["data"]):
            cases.setdefault(r["case"], []).append(r)
        for case, rs in cases.items():
            base = {role(r["impl"]): r for r in rs if role(r["impl"]) != "ours"}
            ours = [r for r in rs if role(r["impl"]) == "ours"] or [dict(impl="-")]
            for i, o in enumerate(ours):
                row = dict(bench=name, case=case, ours=o["impl"], ours_ms=o.get("ms"), floor_ms=o.get("floor_ms"),
                           check=o.get("check", ""), note=o.get("note", ""))
                if i == 0:
                    row.update(eager_ms=base.get("eager", {}).get("ms"), compile_ms=base.get("compile", {}).get("ms"))
                    extra = [f"{b['impl']}: {b['note']}" for b in base.values() if b.get("note")]
                    row["note"] = "; ".join(x for x in [row["note"], *extra] if x)
                if row.get("compile_ms") and row["ours_ms"]:
                    row["x_vs_compile"] = row["compile_ms"] / row["ours_ms"]
                if row.get("eager_ms") and row["ours_ms"]:
                    row["x_vs_eager"] = row["eager_ms"] / row["ours_ms"]
                if row["floor_ms"] and row["ours_ms"]:
                    row["x_floor"] = row["ours_ms"] / row["floor_ms"]
                rows.append(row)
        if rec.get("status") != "ok":
            rows.append(dict(bench=name, case=f"{rec['status'].upper()} (partial results above): {rec.get('error')}"))
    return rows


def plot(rows, env, path: Path):
    """Bars: speedup of ours over default torch.compile and over eager, per case. Returns a note."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib is not installed: no PNG written (pip install matplotlib)"
    pts = [r for r in rows if r.get("x_vs_compile") or r.get("x_vs_eager")]
    if not pts:
        return "nothing to plot"
    try:
        fig, ax = plt.subplots(figsize=(10, 0.45 * len(pts) + 1.5))
        labels = [f"{r['bench']}: {r['case']}"[:70] for r in pts]
        y = range(len(pts))
        ax.barh([i + 0.2 for i in y], [r.get("x_vs_compile") or 0 for r in pts], 0.4, label="vs default torch.compile")
        ax.barh([i - 0.2 for i in y], [r.get("x_vs_eager") or 0 for r in pts], 0.4, label="vs eager")
        ax.axvline(1.0, color="k", lw=0.8)
        ax.set_yticks(list(y), labels, fontsize=7)
        ax.set_xscale("log")
        ax.set_xlabel("speedup of ours (x)")
        ax.set_title(f"inductor_dsa: {env.get('device')}, torch {env.get('torch')}, triton {env.get('triton')}",
                     fontsize=9)
        ax.legend(fontsize=8)
        fig.tight_layout()
        fig.savefig(path, dpi=110)
        plt.close(fig)
    except Exception as e:  # noqa: BLE001 - a plotting problem must not lose the results
        return f"PNG failed: {type(e).__name__}: {e}"
    return f"wrote {path}"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="bench_out", help="output directory (created)")
    ap.add_argument("--quick", action="store_true", help="fewer cases, no compile baselines in kernel benchmarks")
    ap.add_argument("--cpu-smoke", action="store_true", help="tiny sizes on the CPU, Triton's interpreter")
    ap.add_argument("--budget", type=float, default=460.0, help="seconds for all benchmarks together")
    ap.add_argument("--only", default=None, help="comma-separated benchmark names (default: all but the example)")
    ap.add_argument("--with-example", action="store_true", help="also run examples/deepseek_v4_attention.py")
    args = ap.parse_args(argv)
    mode = "smoke" if args.cpu_smoke else "quick" if args.quick else "full"
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.time()
    deadline = t0 + args.budget
    env = env_info(args.cpu_smoke)
    if not args.cpu_smoke and env.get("gpu") is not True:
        print(f"[run] no GPU here ({env['device']}): the benchmarks need one. On a CPU, run\n"
              f"    python benchmarks/run.py --quick --cpu-smoke --out {out_dir}\n"
              "(tiny sizes under Triton's interpreter: it checks that the benchmarks run, its times mean nothing)",
              file=sys.stderr)
        return 2
    print(f"[run] {env['device']}, torch {env.get('torch')}, triton {env.get('triton')}; mode {mode}; "
          f"budget {args.budget:.0f} s; writing {out_dir}/", flush=True)
    only = set(args.only.split(",")) if args.only else None
    # Ctrl-C ends the run even where SIGINT came in ignored (a background job of a shell without
    # job control, e.g. `cmd &` in a script): Python then keeps SIG_IGN and never raises.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    results = {}
    for spec in BENCHES:
        if (only and spec["name"] not in only) or (not only and spec["optional"] and not args.with_example):
            continue
        try:
            rec = run_one(spec, mode, out_dir, deadline, args.cpu_smoke)
        except KeyboardInterrupt:
            print(f"[run] interrupted during {spec['name']}: it was ended; nothing more written", file=sys.stderr)
            return 130
        if rec.get("json"):
            try:
                rec["data"] = json.loads((out_dir / rec["json"]).read_text())
            except ValueError as e:
                rec.update(status="error", error=f"unreadable JSON: {e}")
        results[spec["name"]] = rec
    rows = summary_rows(results)
    from common import table  # noqa: E402 - only the table helper; no torch in this process before here
    cols = ["bench", "case", "ours", "ours_ms", "eager_ms", "compile_ms", "x_vs_compile", "x_vs_eager", "floor_ms",
            "x_floor", "check", "note"]
    print(f"\n{env['device']}, torch {env.get('torch')}, triton {env.get('triton')} "
          f"(ms: median per call; CPU smoke times are single calls under Triton's interpreter and mean nothing)")
    print(table(rows, cols))
    png = plot(rows, env, out_dir / "summary.png")
    print(f"[run] {png}")
    failed = [n for n, r in results.items() if r["status"] not in ("ok", "skipped")]
    payload = dict(env=env, mode=mode, seconds=round(time.time() - t0, 1), png=png, failed=failed,
                   benches={n: {k: v for k, v in r.items() if k != "data"} for n, r in results.items()},
                   rows=rows, raw={n: r.get("data") for n, r in results.items()})
    (out_dir / "results.json").write_text(json.dumps(payload, indent=1, default=str))
    print(f"[run] wrote {out_dir / 'results.json'}; {len(failed)} failed {failed or ''}; "
          f"{time.time() - t0:.0f} s", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
