"""inductor_dsa: fused DeepSeek-V4 sparse-attention (DSA) kernels for torch.compile.

Public API: ``indexer_logits``, ``indexer_topk``, ``logits_topk`` (see ``inductor_dsa.indexer``), the paged
(decode) forms ``paged_indexer_logits``, ``paged_indexer_topk``, ``paged_gather`` (see
``inductor_dsa.paged``), ``sparse_attention`` (see ``inductor_dsa.attention``) and formats in
``inductor_dsa.formats``; ``autotune(True)`` times candidate kernel configs on this GPU (see
``inductor_dsa.kernels.autotune``). The float64 test oracles live in ``inductor_dsa.reference`` (not
imported by the package).
"""
import sys as _sys

from . import checks, formats
from .attention import sparse_attention
from .indexer import indexer_logits, indexer_topk, logits_topk
from .kernels.autotune import autotune
from .paged import paged_gather, paged_indexer_logits, paged_indexer_topk

__all__ = ["autotune", "checks", "formats", "indexer_logits", "indexer_topk", "logits_topk", "paged_indexer_logits",
           "paged_indexer_topk", "paged_gather", "sparse_attention"]
__version__ = "0.1.0"

# torch.compile integration (issue 4): the graph pass and how to turn it on. Imported on first use
# (``inductor_dsa.backend``, ``install()``, ...): the pass needs Inductor and Dynamo, which cost
# seconds to import, and users who only call the ops should not pay for them.
_LAZY = {"lowering": None, "patterns": None, "backend": "lowering", "enabled": "lowering", "install": "lowering",
         "uninstall": "lowering", "report": "lowering"}
__all__ += list(_LAZY)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    import importlib
    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    return module if _LAZY[name] is None else getattr(module, name)


# backend="inductor_dsa": the installed package's ``torch_dynamo_backends`` entry point names the
# backend for Dynamo; importing the pass names it too (a checkout on PYTHONPATH has no entry point),
# so import it now if Dynamo is already loaded (it then costs little).
if "torch._dynamo" in _sys.modules:
    from . import lowering  # noqa: E402,F401
