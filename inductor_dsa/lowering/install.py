"""Hooking the pass into Inductor: a backend, and install()/uninstall()/enabled() for "inductor"."""
from __future__ import annotations

import contextlib
import threading

import torch

from torch._inductor.custom_graph_pass import CustomGraphPass

from . import report
from ..kernels import autotune
from .graph_pass import ChainedPass, IndexerPass

PASS = IndexerPass()
_saved: list = []
_lock = threading.Lock()


def _config():
    import torch._inductor.config as cfg
    return cfg


def _contains_ours(p) -> bool:
    if p is PASS:
        return True
    if isinstance(p, ChainedPass):
        return _contains_ours(p.first) or _contains_ours(p.then)
    if isinstance(p, (list, tuple)):
        return any(_contains_ours(x) for x in p)
    return False


def with_ours(current):
    """The value of joint_custom_pre_pass that runs our pass, then ``current`` (whatever was there;
    unchanged when it already runs ours). Also what tests hand ``graph_only_backend``."""
    if current is None:
        return PASS
    if _contains_ours(current):
        return current
    if isinstance(current, (list, tuple)):
        current = _Seq(tuple(current))
    return ChainedPass(PASS, current)


class _Seq(CustomGraphPass):
    """A CustomGraphPass running a tuple of passes."""
    def __init__(self, passes):
        self.passes = passes

    def __call__(self, graph):
        for p in self.passes:
            p(graph)

    def uuid(self):
        ids = tuple(p.uuid() if hasattr(p, "uuid") else None for p in self.passes)
        return None if None in ids else ids


def install() -> None:
    """Add the pass to the default "inductor" backend (``torch.compile(model)``). Idempotent."""
    cfg = _config()
    with _lock:
        cur = cfg.joint_custom_pre_pass
        if _contains_ours(cur):
            return
        _saved.append(cur)
        cfg.joint_custom_pre_pass = with_ours(cur)


def uninstall() -> None:
    """Undo ``install()``, restoring whatever joint_custom_pre_pass was set before."""
    cfg = _config()
    with _lock:
        if not _contains_ours(cfg.joint_custom_pre_pass):
            return
        cfg.joint_custom_pre_pass = _saved.pop() if _saved else None


def is_installed() -> bool:
    return _contains_ours(_config().joint_custom_pre_pass)


@contextlib.contextmanager
def enabled():
    """``with inductor_dsa.enabled(): torch.compile(model)(x)`` - the pass only inside."""
    cfg = _config()
    with cfg.patch(joint_custom_pre_pass=with_ours(cfg.joint_custom_pre_pass)):
        yield


def backend(gm: torch.fx.GraphModule, example_inputs, *, mode: str | None = None, options: dict | None = None,
            **kwargs):
    """A torch.compile backend: Inductor with the inductor_dsa pass.

    ``torch.compile(model, backend=inductor_dsa.backend, mode=..., options=...)``: ``mode``
    ("reduce-overhead" = CUDA graphs, "max-autotune", ...) and ``options`` (Inductor config
    entries) mean what they mean for backend="inductor"; max-autotune also turns on the
    autotuning of our kernels' configs in this process (kernels/autotune.py).
    """
    from torch._inductor.compile_fx import compile_fx
    # backend="inductor"'s own wrapper turns mode + options into (validated) config patches
    patches = dict(torch._TorchCompileInductorWrapper(mode, options, None).config)
    if patches.get("max_autotune"):
        autotune.request_max_autotune()
    patches["joint_custom_pre_pass"] = with_ours(patches.get("joint_custom_pre_pass", _config().joint_custom_pre_pass))
    return compile_fx(gm, example_inputs, config_patches=patches, **kwargs)


def run_fx_graph(gm, example_inputs, **kwargs):
    """An Inductor ``inner_compile`` that skips code generation and runs the FX graph."""
    from torch._functorch.aot_autograd import make_boxed_func
    gm.recompile()
    return make_boxed_func(gm.forward)


def graph_only_backend(pre_pass=PASS):
    """A torch.compile backend that runs Inductor's graph passes (``pre_pass`` as the
    joint_custom_pre_pass; None: Inductor's own only) and then the FX graph as is, without code
    generation: the graph our pass rewrites is the one Inductor would generate code for, at a
    fraction of the CPU time. For tests and CPU smoke runs; ``backend`` is the real thing."""
    from torch._inductor.compile_fx import compile_fx

    def graph_only(gm, example_inputs):
        return compile_fx(gm, example_inputs, inner_compile=run_fx_graph,
                          config_patches={"joint_custom_pre_pass": pre_pass})
    return graph_only


BACKEND_NAME = "inductor_dsa"


def register_backend() -> None:
    """Name ``backend`` for ``torch.compile(model, backend="inductor_dsa")``, unless Dynamo already
    knows the name (from our ``torch_dynamo_backends`` entry point, which Dynamo loads itself)."""
    from torch._dynamo.backends import registry
    if BACKEND_NAME not in registry._BACKENDS:
        registry.register_backend(backend, name=BACKEND_NAME)


def _hook_output_code() -> None:
    """Show Inductor's generated code to ``report.on_output_code`` (what lets the report survive
    cache hits), keeping whatever hook was there (tests' ``run_and_get_code`` patch their own)."""
    from torch._inductor.graph import GraphLowering
    prev = GraphLowering.save_output_code
    if getattr(prev, "inductor_dsa", False):
        return

    def save_output_code(code: str) -> None:
        report.on_output_code(code)
        if prev is not None:
            prev(code)
    save_output_code.inductor_dsa = True
    GraphLowering.save_output_code = save_output_code


register_backend()
_hook_output_code()
