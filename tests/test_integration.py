"""How a user meets the package: a light import, backend="inductor_dsa" by name, a report that
survives Inductor's caches, logs through TORCH_LOGS. Each check runs in a fresh Python process,
since what it checks (imports, registries, caches, log settings) is per process."""
import json
import os
import pathlib
import re
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


def python(code: str, **env) -> str:
    """Run ``code`` in a fresh interpreter (this checkout and tests/ importable); its stdout."""
    full = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), **env)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=full, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout + p.stderr


def test_import_leaves_the_pass_machinery_unloaded():
    """Calling the ops must not cost an Inductor / Dynamo import; the pass loads on first use."""
    out = python("import sys, inductor_dsa\n"
                 "heavy = ('torch._inductor', 'torch._dynamo', 'inductor_dsa.lowering', 'inductor_dsa.patterns')\n"
                 "print('loaded:', [m for m in heavy if m in sys.modules])\n"
                 "inductor_dsa.backend\n"
                 "print('after backend:', 'torch._inductor' in sys.modules)")
    assert "loaded: []" in out and "after backend: True" in out, out


def declared_backends() -> dict:
    """pyproject.toml's torch_dynamo_backends entry points (no tomllib: Python 3.10 is supported)."""
    text = (ROOT / "pyproject.toml").read_text()
    section = text.split("[project.entry-points.torch_dynamo_backends]\n", 1)[1].split("\n[", 1)[0]
    return dict(re.findall(r'^(\w+) = "([^"]+)"', section, re.M))


ENTRY_POINT = declared_backends()

# torch.compile(backend="inductor_dsa") before inductor_dsa is imported. An installed package has the
# entry point (CI's fresh venvs); a bare checkout gets the one pyproject declares, as Dynamo would see it.
BY_NAME = f"""
import importlib.metadata as md, sys, torch
try:
    md.distribution("inductor_dsa")
    print("entry point: installed")
except md.PackageNotFoundError:
    eps = md.EntryPoints([md.EntryPoint(n, v, "torch_dynamo_backends") for n, v in {ENTRY_POINT!r}.items()])
    md.entry_points = lambda group=None: eps if group == "torch_dynamo_backends" else md.EntryPoints([])
    print("entry point: from pyproject")
PRE
f = torch.compile(lambda x: x.relu() + 1, backend="inductor_dsa", mode=MODE)
f(torch.randn(8))
import inductor_dsa
print("compilations:", len(inductor_dsa.report()))
"""


@pytest.mark.parametrize("pre", ["assert 'inductor_dsa' not in sys.modules", "import torch._dynamo, inductor_dsa"])
def test_backend_by_name(pre):
    """By name, with or without importing inductor_dsa (and Dynamo) first; mode reaches the backend."""
    code = BY_NAME.replace("PRE", pre).replace("MODE", "'reduce-overhead'")
    out = python(code, TORCHINDUCTOR_FORCE_DISABLE_CACHES="1")
    assert "compilations: 1" in out, out  # our pass ran on the graph


CACHED_COMPILE = """
import json, torch
import inductor_dsa
from torch._dynamo.utils import counters
from pass_corpus import make_official, official_fn
args = make_official(1)(torch.float32, 0)
with torch.no_grad():
    torch.compile(official_fn, backend=inductor_dsa.backend)(*args)
print("RESULT", json.dumps(dict(aot_hit=counters["aot_autograd"]["autograd_cache_hit"],
                                fx_hit=counters["inductor"]["fxgraph_cache_hit"],
                                passes=dict(inductor_dsa.lowering.counters),
                                cached=[c.cached for c in inductor_dsa.report()],
                                swaps=[str(s) for s in inductor_dsa.report().swaps])))
"""


def _result(out):
    return json.loads(out.split("RESULT ", 1)[1].splitlines()[0])


def test_report_survives_cache_hits(tmp_path):
    """A second process served from the FX graph / AOTAutograd caches still lists the swap, with
    the source line recorded when it was compiled."""
    env = dict(TORCHINDUCTOR_CACHE_DIR=str(tmp_path), TORCHINDUCTOR_FORCE_DISABLE_CACHES="0")
    first = _result(python(CACHED_COMPILE, **env))
    second = _result(python(CACHED_COMPILE, **env))
    assert first["passes"] == {"indexer_topk": 1} and first["cached"] == [False], first
    assert second["aot_hit"] + second["fx_hit"] >= 1 and second["passes"] == {}, second  # the pass did not run
    assert second["cached"] == [True] and second["swaps"] == first["swaps"], second
    assert "official_fn" in second["swaps"][0] and "torch.ops.inductor_dsa.indexer_topk" in second["swaps"][0]


NEAR_MISS = """
import torch, inductor_dsa
from pass_corpus import nm_weights_before_relu, _qkw
torch.compile(nm_weights_before_relu, backend=inductor_dsa.lowering.graph_only_backend())(*_qkw(torch.float32, 0))
print("rejections:", len(inductor_dsa.report().rejections))
"""


@pytest.mark.parametrize("env", [{"TORCH_LOGS": "+inductor_dsa"}, {"INDUCTOR_DSA_DEBUG": "1"}, {}])
def test_rejections_through_torch_logs(env):
    """TORCH_LOGS="+inductor_dsa" logs why a candidate was rejected (and records it in the report);
    INDUCTOR_DSA_DEBUG=1 records it; neither: nothing is recorded."""
    base = {k: v for k, v in os.environ.items() if k not in ("TORCH_LOGS", "INDUCTOR_DSA_DEBUG")}
    p = subprocess.run([sys.executable, "-c", NEAR_MISS], cwd=ROOT, capture_output=True, text=True, timeout=600,
                       env=dict(base, PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests")]), **env))
    assert p.returncode == 0, p.stdout + p.stderr
    logged = "rejected near" in p.stderr
    assert logged == ("TORCH_LOGS" in env), p.stderr
    assert ("rejections: 0" in p.stdout) == (not env), p.stdout


def lambda_topk(q, k, w):
    scores = (q @ k.T.unsqueeze(0)).relu().mul(w.unsqueeze(-1)).sum(1)
    pick = lambda s: s.topk(4)  # noqa: E731 - the report names lambda_topk as the function
    return pick(scores).indices


def test_report_names_functions_not_lambdas():
    import torch
    import inductor_dsa
    from pass_helpers import compile_run
    q, k, w = (torch.randn(*s, generator=torch.Generator().manual_seed(0)) for s in ((8, 4, 16), (32, 16), (8, 4)))
    _, swaps = compile_run(lambda_topk, (q, k, w))
    (comp,) = inductor_dsa.report()
    (swap,) = comp.swaps
    assert swaps == {"indexer_topk": 1} and "in <lambda> called from lambda_topk: pick = lambda s" in swap.source, swap
    assert comp.graph == "lambda_topk (test_integration.py)" and str(inductor_dsa.report()).startswith(
        "[lambda_topk (test_integration.py)] 1 swap(s)")


def test_unwritable_cache_dir_does_not_fail_the_compilation(tmp_path, monkeypatch, caplog):
    """Recording swaps for cache hits is bookkeeping: where it cannot write, it warns."""
    from inductor_dsa.lowering.report import Swap, begin, on_output_code
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "file"))
    (tmp_path / "file").write_text("not a directory")
    begin("g").swaps.append(Swap("indexer_topk", "torch.ops.inductor_dsa.indexer_topk", "x.py:1 in f"))
    on_output_code("buf0 = torch.ops.inductor_dsa.indexer_topk.default(...)")
    assert "swap record for cache hits unusable" in caplog.text
