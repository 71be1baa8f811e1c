"""How far a matched top-k travels: the inductor_dsa source files whose functions run between the
pass's entry (``IndexerPass.__call__``) and the fused op's call, recorded with ``sys.setprofile``
while the pass rewrites one dense indexer case (``pass_corpus.fallback_causal``). ``DSA_FILES_MAX``
holds today's measured count of DSA files (lowering/, patterns/), so the walk cannot silently grow.
The engine (symbolic/) is the library they call, counted apart. ``PYTHONPATH=. python
tests/test_pass_walk.py`` prints the walk.

Before and after the renovation (issue 21), this instrument on both trees (before: a93d5cb):
9 files -> 17 in all; lowering/ + patterns/ 8 -> 6, but 3 of the 8 (interp.py, algebra.py,
masks.py) were the engine, so by role DSA 5 -> 6 files (37 -> 38 named functions) and engine
3 -> 10 (65 -> 81); other 1 -> 1 (checks.py, limits.py); 1395 -> 1576 return events (the issue's
"22 returns" was not this instrument's count).
"""
from __future__ import annotations

import os
import sys

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

import inductor_dsa
from inductor_dsa import lowering
from pass_corpus import _qkw, fallback_causal
from pass_helpers import compile_run

PKG = os.path.dirname(os.path.abspath(inductor_dsa.__file__))
OP = "inductor_dsa::indexer_topk"
DSA_FILES_MAX = 6  # measured (engine: 10 files, other: limits.py); lower it when the walk shrinks


class _Walk(CustomGraphPass):
    """Runs the pass under a profiler: ``calls`` lists (file under inductor_dsa/, function) in call
    order from the pass's entry until the first call of ``OP``; ``reached`` says whether it came."""

    def __init__(self):
        self.calls, self.reached = [], False

    def _profile(self, frame, event, arg):
        if event != "call" or self.reached:
            return
        code = frame.f_code
        if code.co_filename.startswith(PKG + os.sep):
            self.calls.append((os.path.relpath(code.co_filename, PKG), code.co_name))
        elif code.co_name == "__call__" and getattr(frame.f_locals.get("self"), "_qualified_op_name", None) == OP:
            self.reached = True

    def __call__(self, graph):
        sys.setprofile(self._profile)
        try:
            lowering.PASS(graph)
        finally:
            sys.setprofile(None)

    def uuid(self):
        return None


def measure() -> tuple[_Walk, dict]:
    """(the walk, {group: sorted distinct files}) for one compile of the case."""
    walk = _Walk()
    _, swaps = compile_run(fallback_causal, _qkw(torch.float32, 0), backend=lowering.graph_only_backend(walk))
    assert swaps.get("indexer_topk") == 1, swaps
    groups = {"dsa": set(), "engine": set(), "other": set()}
    for path, _ in walk.calls:
        top = path.split(os.sep)[0]
        groups["dsa" if top in ("lowering", "patterns") else "engine" if top == "symbolic" else "other"].add(path)
    return walk, {g: sorted(files) for g, files in groups.items()}


def test_walk_from_the_pass_to_the_op_stays_short():
    walk, groups = measure()
    assert walk.reached, f"{OP} was never called"
    assert walk.calls[0] == (os.path.join("lowering", "graph_pass.py"), "__call__")
    assert groups["engine"], "the proof runs in the engine"
    assert len(groups["dsa"]) <= DSA_FILES_MAX, groups["dsa"]


if __name__ == "__main__":
    w, g = measure()
    for group, files in g.items():
        named = {(p, fn) for p, fn in w.calls if p in files and not fn.startswith("<")}
        print(f"{group}: {len(files)} files, {len(named)} named functions")
        for f in files:
            funcs = sorted({fn for p, fn in w.calls if p == f and not fn.startswith("<")})
            print(f"  {f}: {len(funcs)} named functions: {', '.join(funcs)}")
