"""The package's layout rules, checked on the source (``ast``), no imports:

* no module imports another module's ``_private`` names (``from X import _name``) or reads them
  as attributes of an imported module (``X._name``);
* no library file is over 600 lines;
* no production module imports ``reference`` (the float64 oracles are for tests);
* the symbolic engine imports nothing of DSA (patterns, lowering, ops, kernels, ...);
* no file under tests/ imports a ``test_*`` module (``from test_x import ...``, ``import test_x``,
  also inside functions): shared helpers live in helper modules (``indexer_cases``,
  ``paged_cases``, ``attention_cases``, ``pass_helpers``, ...), shared fixtures in conftest.py.
"""
from __future__ import annotations

import ast
import os

TESTS = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(os.path.dirname(TESTS), "inductor_dsa")
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


def _test_module(name: str) -> bool:
    """``test_x``, ``tests.test_x`` (and their submodules): a test module, not a helper."""
    parts = name.split(".")
    if parts[0] == "tests":
        parts = parts[1:]
    return bool(parts) and parts[0].startswith("test_")


def imports_of_test_modules(tree):
    """The imports in ``tree`` (anywhere: module level or inside functions) of a test module."""
    found = []
    for n in ast.walk(tree):
        if isinstance(n, ast.Import):
            found += [f"import {a.name}" for a in n.names if _test_module(a.name)]
        elif isinstance(n, ast.ImportFrom):
            target = "." * n.level + (n.module or "")
            if n.module and _test_module(n.module):
                found.append(f"from {target} import {', '.join(a.name for a in n.names)}")
            elif n.level or n.module in (None, "tests"):   # from . import test_x / from tests import test_x
                found += [f"from {target} import {a.name}" for a in n.names if a.name.startswith("test_")]
    return found


def test_tests_import_no_test_module():
    found = []
    for root, _, files in os.walk(TESTS):
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, TESTS).replace(os.sep, "/")
                found += [f"tests/{rel}: {imp}" for imp in imports_of_test_modules(ast.parse(open(path).read()))]
    assert not found, "tests importing from test modules (move the helper to a helper module):\n" + "\n".join(found)


def test_test_import_walker_sees_violations():
    tree = ast.parse("import os, test_a\nimport tests.test_b as b\nfrom test_c import x\n"
                     "from tests.test_d import y\nfrom . import test_e\nfrom tests import test_f, helper\n"
                     "def f():\n    from test_g import z\n"
                     "from paged_cases import make_case\nimport torch.testing\nfrom pass_helpers import test_like\n")
    assert imports_of_test_modules(tree) == [
        "import test_a", "import tests.test_b", "from test_c import x", "from tests.test_d import y",
        "from . import test_e", "from tests import test_f", "from test_g import z"]


def test_validation_launches_nothing():
    """checks.py (validation) imports nothing from kernels/: the value check's counting kernel is
    launched by its caller (paged.py), which hands checks.paged_values the counts."""
    tree = ast.parse(open(os.path.join(PKG, "checks.py")).read())
    kernels = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and "kernels" in (n.module or "")]
    kernels += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names if "kernels" in a.name]
    assert not kernels, kernels
