"""The package's layout rules, checked on the source (``ast``), no imports:

* no module imports another module's ``_private`` names (``from X import _name``) or reads them
  as attributes of an imported module (``X._name``);
* no library file is over 600 lines;
* no production module imports ``reference`` (the float64 oracles are for tests);
* the symbolic engine imports nothing of DSA (patterns, lowering, ops, kernels, ...).
"""
from __future__ import annotations

import ast
import os

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "inductor_dsa")
MAX_LINES = 600


def _modules():
    for root, _, files in os.walk(PKG):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                yield os.path.relpath(path, PKG).replace(os.sep, "/"), path


def _ours(n: ast.ImportFrom) -> bool:
    return n.level > 0 or (n.module or "").split(".")[0] == "inductor_dsa"


def _imported_modules(tree):
    """Names that imports bind to our own modules or their contents (``from . import ops``,
    ``import inductor_dsa.x as y``): ``name._private`` on these crosses a module boundary."""
    out = set()
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            out |= {a.asname or a.name.split(".")[0] for a in n.names if a.name.split(".")[0] == "inductor_dsa"}
        elif isinstance(n, ast.ImportFrom) and _ours(n):
            out |= {a.asname or a.name for a in n.names}
    return out


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def violations():
    found = []
    for rel, path in _modules():
        src = open(path).read()
        tree = ast.parse(src)
        n_lines = src.count("\n")
        if n_lines > MAX_LINES:
            found.append(f"{rel}: {n_lines} lines")
        mods = _imported_modules(tree)
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom):
                target = n.module or ""
                for a in n.names:
                    if _private(a.name) and _ours(n):
                        found.append(f"{rel}: from {'.' * n.level}{target} import {a.name}")
                parts = target.split(".") + [a.name for a in n.names]
                if "reference" in parts and rel != "reference.py":
                    found.append(f"{rel}: imports reference")
                if rel.startswith("symbolic/") and n.level >= 2:
                    found.append(f"{rel}: imports {'.' * n.level}{target} (outside the engine)")
            elif isinstance(n, ast.Import):
                for a in n.names:
                    if "reference" in a.name.split(".") or (rel.startswith("symbolic/")
                                                            and a.name.startswith("inductor_dsa")):
                        found.append(f"{rel}: import {a.name}")
            elif (isinstance(n, ast.Attribute) and _private(n.attr) and isinstance(n.value, ast.Name)
                  and n.value.id in mods):
                found.append(f"{rel}: {n.value.id}.{n.attr}")
    return found


def test_layout_rules():
    found = violations()
    assert not found, "layout violations:\n" + "\n".join(found)


def test_walker_sees_violations(tmp_path):
    """The walker itself: a private import, a private attribute of a module, a reference import."""
    tree = ast.parse("from .x import _y\nfrom torch import _C\nfrom . import ops\nimport torch\n"
                     "ops._op\ntorch._dynamo\n")
    mods = _imported_modules(tree)
    privs = [a.name for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and _ours(n)
             for a in n.names if _private(a.name)]
    attrs = [n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute) and n.value.id in mods]
    assert privs == ["_y"] and attrs == ["_op"]
